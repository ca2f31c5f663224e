"""`margrpo plan` (margrpo.plan): the per-GPU memory plan from fake tensors. Its --test mode on tiny policies (the
fake step against the same step on real tensors; the old setting against the new one), its composition arithmetic,
the tape's check, and the CUDA autocast policy it applies on CPU."""

import json
import os
import subprocess
import sys

import pytest
import torch

from margrpo.plan import composition
from margrpo.plan.cuda_autocast import CudaAutocast
from margrpo.plan.step import Run, Step
from margrpo.plan.tape import Tape, recording, stand_in_attention


def test_test_mode_agrees_with_real_tensors_and_predicts_the_old_setting_larger(repo, tmp_path):
    out = tmp_path / "plan.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo / "src"), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "margrpo",
            "plan",
            "--test",
            "--validate",
            "--rollout-steps",
            "0",
            "--json",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(out.read_text())
    # the fake step's peak is the real step's, to 10% (the same ledger on real tensors: exactly, so far)
    v = report["validation"]
    assert abs(v["ratio_peak"] - 1) < 0.10 and abs(v["ratio_step"] - 1) < 0.10, v
    # and the step's growth is what torch's profiler records the CPU allocator doing, to 2%, where tensors dominate
    # (the small NOVA: a 318 MiB step, measured 0.989 under AVX-512 and AVX2); on the tiny policies the kernels' own
    # temporaries, which no op returns, weigh more (1.000 under AVX-512, 0.853 under AVX2: 0.6 MiB of 4)
    small = report["validation_small"]
    assert abs(small["ratio_allocated"] - 1) < 0.02 and small["allocated_step"] > 100 * 2**20, small
    assert abs(v["ratio_allocated"] - 1) < 0.25, v
    for name in ("nova", "harmon"):
        rows = report["policies"][name]["rows"]
        new = {r["gpus"]: r for r in rows if r["setting"] == "new"}
        old = next(r for r in rows if r["setting"] == "old")
        assert set(new) == {1, 3, 8} and old["gpus"] == 1
        for r in rows:  # the parts add up to the peak, and the allowance is what the docstring says
            parts = sum(
                r[k]
                for k in (
                    "trained",
                    "frozen",
                    "grads",
                    "optimizer",
                    "reference",
                    "record",
                    "activations",
                    "gathered",
                    "rewards",
                )
            )
            assert r["allowance"] == int(2 * 2**30 + 0.10 * parts) and r["total"] == parts + r["allowance"]
        steps = report["policies"][name]["steps"]
        record = [steps[f"grpo/{s}"]["peaks"]["replay"][1]["record"] for s in ("new", "old")]
        assert record[1] == pytest.approx(3 * record[0], rel=0.01)  # 3 prompts' record instead of 1
        # the replay holds 6 images x |M| = 2 chosen steps per backward instead of 4 x 1: about 3x the activations
        ratio = old["act_replay"] / new[1]["act_replay"]
        assert 2.4 < ratio < 3.3, ratio
        assert old["total"] > new[1]["total"]
        # sharded over 8 GPUs, the trained weights, gradients and AdamW state shrink 8x
        assert new[8]["trained"] == pytest.approx(new[1]["trained"] / 8, rel=0.01)
        assert new[8]["optimizer"] == pytest.approx(new[1]["optimizer"] / 8, rel=0.01)
    assert "| grpo | 3 x 4, mb 2, chunk all | 1 |" in run.stdout


def _step(replay_chunk, stat=300, **kinds):
    peaks = {p: (sum(kinds.values()), dict(kinds)) for p in composition.PHASES}
    sizes = {
        "fsdp": 400,
        "fsdp_trained": 400,
        "root": 40,
        "root_trained": 40,
        "unit": 80,
        "unit_trained": 80,
        "reference": 400,
        "trained": 400,
        "frozen": 1000,
        "buffers": 8,
        "groups": 6,
        "mask_steps": 12,
        "stat": stat,  # the probe's snapshot (grpo.grad_variance on)
    }
    return Step(Run("nova", "grpo", replay_chunk=replay_chunk), True, peaks, sizes, 0.0, 0.0)


def test_per_gpu_composition():
    kinds = dict(
        trained=400, encoders=1000, buffers=8, reference=400, grad=400, optim=800, act=5000, cast=200, record=100
    )
    step = _step(None, **kinds)  # all |M| chosen steps in one backward: every backward reduces
    one = composition.per_gpu(step, 1, "full_shard", rewards=50)
    assert one["trained"] == 400 and one["grads"] == 400 and one["activations"] == 5200 and one["gathered"] == 0
    ddp = composition.per_gpu(step, 4, "replicate", rewards=50)
    assert ddp["gathered"] == 400 and ddp["trained"] == 400  # DDP's buckets: one more copy of the gradients
    zero3 = composition.per_gpu(step, 4, "full_shard", rewards=50)
    assert (zero3["trained"], zero3["grads"], zero3["optimizer"], zero3["reference"]) == (100, 100, 200, 100)
    assert zero3["frozen"] == 1008  # the encoders outside the AR and head, and buffers, stay whole
    assert zero3["activations"] == 5200  # autocast's bf16 weight copies, as on one process (one mechanism)
    # replay: the root and two block groups gathered in fp32, the reference's as well, one group's gradient
    # (bf16 + fp32)
    assert zero3["gathered"] == (40 + 2 * 80) * 2 + 80 * 6 // 4
    zero2 = composition.per_gpu(step, 4, "shard_grad_op", rewards=50)
    assert zero2["gathered"] == 400 + (40 + 2 * 80) + 80 * 6 // 4  # the whole policy stays gathered in fp32
    # the gradient-variance probe's snapshot of the gradients it reads: whole, or this process's shards under FSDP
    assert (one["probe"], ddp["probe"], zero3["probe"], zero2["probe"]) == (300, 300, 75, 75)
    off = composition.per_gpu(_step(None, stat=0, **kinds), 4, "full_shard", rewards=50)
    assert off["probe"] == 0 and off["total"] < zero3["total"]
    assert "grad var probe" in composition.table(
        [{**zero3, "variant": "grpo", "batch": "1", "gpus": 4, "sharding": "full_shard"}]
    )
    assert "grad var probe" not in composition.table(
        [{**off, "variant": "grpo", "batch": "1", "gpus": 4, "sharding": "full_shard"}]
    )
    for r in (one, ddp, zero3, zero2):
        tensors = sum(r[k] for k in composition.PARTS)
        assert r["total"] == tensors + int(composition.ALLOWANCE_FIXED + composition.ALLOWANCE_SHARE * tensors)
        assert r["rewards"] == 50
    assert zero3["phase"] == zero2["phase"] == "replay"  # where the gradient's reduce-scatter adds its transient
    # a chunked replay reduces only at its last chunk: until then FSDP holds the whole gradient (fp32)
    chunked = composition.per_gpu(_step(1, **kinds), 4, "full_shard", rewards=50)
    assert chunked["grads"] == 400 and chunked["trained"] == 100


def test_tape_replays_in_order_and_refuses_another_path():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def step(x):
        n = int(x.sum())
        return x.nonzero().shape[0] + n + len(x[x > 0].tolist())

    x = torch.tensor([0, 2, 3, 0])
    recorder = Tape()
    with recorder, recording(cheap=False):
        expected = step(x)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_x = mode.from_tensor(x)
        with Tape(list(recorder.values)) as replay:
            assert step(fake_x) == expected
        assert not replay.queue
        with Tape(list(reversed(recorder.values))), pytest.raises(RuntimeError, match="another path"):
            step(fake_x)


def test_the_narrow_runs_attention_is_met_again_where_backward_recomputes():
    """recording(cheap=True): the stand-in attention in the forward pass and again where backward recomputes a
    checkpointed block, run_blocks' (recomputing_under) and transformers' own (stand_in_attention), or checkpoint
    refuses the recomputed tensors."""
    from transformers import Qwen2Config, Qwen2Model

    from margrpo.policy.checkpointing import run_blocks
    from margrpo.policy.layers import Block

    torch.manual_seed(0)
    blocks, x = [Block(8, 2, fused=True)], torch.randn(2, 5, 8, requires_grad=True)
    llm = Qwen2Model(
        Qwen2Config(
            vocab_size=16,
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            attn_implementation="sdpa",
        )
    )
    llm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    stand_in_attention(llm)
    with recording(cheap=True):
        y = run_blocks(blocks, x, checkpointing=True)
        z = llm(inputs_embeds=x).last_hidden_state
        (y.sum() + z.sum()).backward()
    assert not torch.allclose(y, run_blocks(blocks, x))  # not the real attention


def test_cuda_autocast_policy():
    """CUDA's lists, not the CPU's: norms, softmax and exp in fp32, matmuls in bf16, sums of bf16 in fp32, and one
    cached bf16 copy of a weight that requires grad for the whole region."""
    linear, norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)
    x = torch.randn(4, 8)
    amp = CudaAutocast()
    with torch.autocast("cpu", dtype=torch.bfloat16), amp:
        y = linear(x)
        assert y.dtype == torch.bfloat16
        assert (
            norm(y).dtype == torch.float32 and y.softmax(-1).dtype == torch.float32 and y.exp().dtype == torch.float32
        )
        assert y.sum().dtype == torch.float32 and torch.nn.functional.gelu(y).dtype == torch.bfloat16
        linear(x)
        assert len(amp.cache) == 2  # the weight's and the bias's copies, made once for the region
    with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU's own policy keeps the norm in bf16
        assert norm(linear(x)).dtype == torch.bfloat16
