"""Where a MAR policy's compute goes: the diffusion head's share of the parameters, of a rollout's FLOPs
and of a GRPO step's, for the toy policies of a config and for NOVA-0.6B / Harmon-1.5B at their paper
schedules, and the MTE / +Fix step ratio that those shares predict (design.md §3.9, Algorithm 2).

The paper's story rests on a light head: "the mismatch in parameter scale between large-scale AR
transformer and lightweight diffusion head", and MTE's extra trajectories are head-only, so "negligible".
This prints how light the head is, per policy, in the terms that decide the cost.

Counting. FlopCounterMode (matmuls and attention; elementwise work is not counted) around one AR forward
and one head call per image, on the meta device for the real models (no weights, no GPU, seconds) and on
CPU for the toy; the real models' AR forward depends on how many tokens are known (NOVA's MAE encoder and
Harmon's MAR encoder + LLM see only the known ones), so it is counted per component at each AR step's
sequence lengths, mirroring their `ar_forward`. Per image, with g = 2 branches under CFG and u_k the
tokens still unknown before AR step k, L = sum_k c_k the tokens committed, f = |M|/K. A training rollout runs
the head on every unknown token at the chosen AR steps (the completion mask the loss runs over) and on the
committed ones at the others; a plain generation (validation, evaluation) on every unknown token everywhere:

    rollout        g * [sum_k AR_k + (L + f * sum_k (u_k - c_k)) T H]      (plain: g * sum_k [AR_k + u_k T H])
    replay (+Fix)  g * |M|/K * sum_k [3 AR_k + 2 u_k |T| H]     (backward: 2x for the AR, 1x for the frozen head)
    reference KL   g * |M|/K * sum_k [AR_k + u_k |T| H]
    MTE extra      g * (S - 1) * |M|/K * sum_k u_k [T H + 2 top_frac |T| H]

(expectations over the uniformly chosen |M| AR steps). For the toy the model is checked against the
FLOPs counted around real `GRPOTrainer.train_step`s of +Fix and +MTE, and the CPU time of those steps is
measured in the same run (one thread, the two trainers stepping in turn; `--no-steps` skips this).

    python benchmarks/policy_cost.py [--config config/config.yaml] [--steps 3] [--no-real] [--test]

`--test`: shares only (toy counted at random init, real models on meta), no timed steps: what the test runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from margrpo.experiment.config import load_config  # noqa: E402
from margrpo.grpo.rollout import SamplingConfig, unknown_after_steps  # noqa: E402
from margrpo.policy import ToyMAR, ToyMARConfig  # noqa: E402
from margrpo.policy.base import TextCondition  # noqa: E402
from margrpo.world import prompt_vocabulary  # noqa: E402

PROMPT = "a red circle on the left of a blue square"


def counted(fn) -> int:
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@dataclass
class Costs:
    """One image's FLOPs in one guidance branch: AR forward per AR step, head call per token row."""

    name: str
    ar_params: int
    head_params: int
    ar: list[float]  # [K] AR forward at each step
    head_row: float  # one head call, one token row
    unknown: list[int]  # [K] tokens still unknown before each step
    T: int  # diffusion steps of the rollout
    branches: int  # 2 with CFG

    @property
    def param_share(self) -> float:
        return self.head_params / (self.ar_params + self.head_params)

    def rollout(self, M: int | None = None) -> tuple[float, float]:
        """(AR, head) FLOPs of one image's rollout: a training one at |M| chosen AR steps, or (None) a plain one."""
        L = self.unknown[0]
        rows = sum(self.unknown) if M is None else L + M / len(self.ar) * (sum(self.unknown) - L)
        return self.branches * sum(self.ar), self.branches * rows * self.T * self.head_row

    def step(self, M: int, U: int, S: int = 1, top_frac: float = 0.0, kl: bool = True) -> tuple[float, float]:
        """(AR, head) FLOPs of one image's +Fix GRPO step (S > 1: +MTE), expected over the chosen AR steps."""
        f = M / len(self.ar)
        ar_roll, head_roll = self.rollout(M)
        ar = ar_roll + self.branches * f * sum(self.ar) * (3 + kl)
        head = head_roll + self.branches * f * sum(self.unknown) * U * self.head_row * (2 + kl)
        head += self.branches * (S - 1) * f * sum(self.unknown) * self.head_row * (self.T + 2 * top_frac * U)
        return ar, head


def toy_costs(name: str, policy: ToyMAR, sampling: SamplingConfig) -> Costs:
    torch.manual_seed(0)
    cond = policy.prepare_condition(policy.encode_prompts([PROMPT]))
    L, D = policy.seq_len, policy.token_dim
    unknown = [L] + unknown_after_steps(L, sampling.ar_steps, policy.mask_rounding)[:-1]
    with torch.no_grad():
        tokens, known = torch.randn(1, L, D), torch.zeros(1, L, dtype=torch.bool)
        A = counted(lambda: policy.ar_forward(tokens, known, cond))  # the toy's AR sees every position: one cost
        z = policy.ar_forward(tokens, known, cond)[0]
        H = counted(lambda: policy.head(torch.randn(L, D), torch.full((L,), 500.0), z)) / L
    return Costs(
        name,
        _n(policy.ar_parameters()),
        _n(policy.head_parameters()),
        [A] * len(unknown),
        H,
        unknown,
        sampling.diffusion_steps,
        2 if sampling.cfg_scale != 1 else 1,
    )


def nova_costs(sampling: SamplingConfig) -> Costs:
    """NOVA-0.6B on meta: video encoder once per prompt (not counted); image encoder = MAE half over
    [c; known tokens] + half over [c; all L]; the 3 x 1280 diffusion MLP per token row."""
    import real_scale

    with torch.device("meta"):
        nova = real_scale.build_nova(tiny=False)
        tr = nova.transformer
        Lt, Wt = nova.config.text_token_len, tr.text_embed.weight.shape[-1]
        c = nova.prepare_condition(TextCondition(torch.zeros(1, Lt, Wt), torch.ones(1, Lt, dtype=torch.bool))).context
        blocks, W, Lc = tr.image_encoder.blocks, c.shape[-1], c.shape[1]
        L, D, split = nova.seq_len, nova.token_dim, len(blocks) // 2

        def block(n):
            return counted(lambda: blocks[0](torch.zeros(1, Lc + n, W)))

        unknown = [L] + unknown_after_steps(L, sampling.ar_steps, nova.mask_rounding)[:-1]
        embed = counted(lambda: tr.image_encoder.patch_embed(torch.zeros(1, L, D)))
        full = split * block(L)
        ar = [embed + (len(blocks) - split) * block(L - u) + full for u in unknown]
        H = counted(lambda: nova.head(torch.zeros(64, D), torch.full((64,), 500.0), torch.zeros(64, W))) / 64
        return Costs(
            "NOVA-0.6B",
            _n(nova.ar_parameters()),
            _n(nova.head_parameters()),
            ar,
            H,
            unknown,
            sampling.diffusion_steps,
            2,
        )


def harmon_costs(sampling: SamplingConfig) -> Costs:
    """Harmon-1.5B on meta: MAR encoder over [buffers; known], the Qwen2.5-1.5B LLM over [prompt; known;
    buffers] (its layers called one by one: the rotary table does not run on meta), MAR decoder over
    [buffers; all L]; MAR's 3 x 1536 DiffLoss MLP per token row."""
    import real_scale

    with torch.device("meta"):
        harmon = real_scale.build_harmon(tiny=False)
        m, llm = harmon.mar, harmon.llm.model
        Lt = harmon.encode_prompts([PROMPT]).hidden.shape[1]
        nb, L, D = harmon.config.buffer_size, harmon.seq_len, harmon.token_dim
        We, Wd = m.encoder_blocks[0].norm1.normalized_shape[0], m.decoder_blocks[0].norm1.normalized_shape[0]
        Hl, hd = llm.config.hidden_size, llm.config.hidden_size // llm.config.num_attention_heads

        def llm_layer(S):
            rope = (torch.zeros(1, S, hd), torch.zeros(1, S, hd))
            return counted(lambda: llm.layers[0](torch.zeros(1, S, Hl), position_embeddings=rope))

        def enc(S):
            return counted(lambda: m.encoder_blocks[0](torch.zeros(1, S, We)))

        dec = counted(lambda: m.decoder_blocks[0](torch.zeros(1, nb + L, Wd)))
        unknown = [L] + unknown_after_steps(L, sampling.ar_steps, harmon.mask_rounding)[:-1]
        ar = [
            len(m.encoder_blocks) * enc(nb + L - u)
            + len(llm.layers) * llm_layer(Lt + L - u + nb)
            + len(m.decoder_blocks) * dec
            for u in unknown
        ]
        H = counted(lambda: harmon.head(torch.zeros(64, D), torch.full((64,), 500.0), torch.zeros(64, Wd))) / 64
        return Costs(
            "Harmon-1.5B",
            _n(harmon.ar_parameters()),
            _n(harmon.head_parameters()),
            ar,
            H,
            unknown,
            sampling.diffusion_steps,
            2,
        )


def _n(params) -> int:
    return sum(p.numel() for p in params)


def report(c: Costs, grpo: dict, S: int, top_frac: float) -> dict:
    M, U = grpo["mask_steps"], grpo["diffusion_steps"]
    ar_r, head_r = c.rollout(M)
    fix_ar, fix_head = c.step(M, U)
    mte_ar, mte_head = c.step(M, U, S, top_frac)
    h_step = fix_head / (fix_ar + fix_head)
    row = {
        "policy": c.name,
        "head_params": c.head_params,
        "param_share": c.param_share,
        "rollout_head_share": head_r / (ar_r + head_r),
        "step_head_share": h_step,
        "K": len(c.ar),
        "M": M,
        "ratio_model": (mte_ar + mte_head) / (fix_ar + fix_head),
        "rollout_gflop": (ar_r + head_r) / 1e9,
        "step_gflop": (fix_ar + fix_head) / 1e9,
    }
    print(
        f"{c.name:>12}: head {c.head_params / 1e6:7.2f}M of {(c.ar_params + c.head_params) / 1e6:8.2f}M AR + head "
        f"parameters ({row['param_share']:.1%}); K={row['K']}, T={c.T}, |M|={M}, |T|={U}; head share of a rollout's "
        f"FLOPs {row['rollout_head_share']:.1%}, "
        f"of a +Fix step's {h_step:.1%}; MTE/Fix FLOPs (S={S}, k={top_frac}) {row['ratio_model']:.3f}; "
        f"per image: rollout {row['rollout_gflop']:.2f}, "
        f"+Fix step {row['step_gflop']:.2f} GFLOP"
    )
    return row


def toy_steps(policy_cfg: ToyMARConfig, sampling: SamplingConfig, grpo: dict, steps: int, variant_mte: dict) -> dict:
    """FLOPs counted and CPU seconds of real +Fix and +MTE steps, the trainers stepping in turn."""
    from grpo_step import PROMPTS, reward

    from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
    from margrpo.prompts.suites import PromptSet

    fields = set(GRPOConfig.__dataclass_fields__)
    ps = PromptSet(PROMPTS, [{}] * len(PROMPTS))

    def trainer(variant):
        torch.manual_seed(0)
        cfg = GRPOConfig(**{k: v for k, v in {**grpo, **variant, "steps": steps + 2}.items() if k in fields})
        return GRPOTrainer(ToyMAR(policy_cfg), reward, ps, ps, sampling, cfg, tempfile.mkdtemp())

    fix, mte = trainer({"freeze_head": True}), trainer({"freeze_head": True, **variant_mte})
    flops, cpu = {"fix": [], "mte": []}, {"fix": [], "mte": []}
    for step in range(steps + 1):
        for name, t in (("fix", fix), ("mte", mte)):
            t0 = time.process_time()
            if step == 0:  # warm-up, counted: the FLOPs do not depend on allocator state
                flops[name].append(counted(t.train_step))
            else:
                t.train_step()
                cpu[name].append(time.process_time() - t0)
    n = grpo["batch_prompts"] * grpo["group_size"]
    return {
        "fix_gflop": flops["fix"][0] / n / 1e9,
        "mte_gflop": flops["mte"][0] / n / 1e9,
        "fix_cpu": statistics.median(cpu["fix"]),
        "mte_cpu": statistics.median(cpu["mte"]),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "config/config.yaml"))
    p.add_argument("--steps", type=int, default=3, help="timed +Fix / +MTE steps of the ladder's toy policy")
    p.add_argument("--no-steps", action="store_true", help="skip the counted and timed toy steps")
    p.add_argument("--no-real", action="store_true", help="skip NOVA / Harmon")
    p.add_argument("--test", action="store_true", help="shares only: no timed steps")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    config = load_config(args.config)
    grpo = dict(config["grpo"], precision=config["mixed_precision"])
    mte = config["variants"]["mte"]
    S, top_frac = mte.get("trajectories", 4), mte.get("top_frac", 0.3)
    print(
        f"config {args.config}: GRPO |M| = {grpo['mask_steps']}, |T| = {grpo['diffusion_steps']}, "
        f"{grpo['batch_prompts']} x {grpo['group_size']} images; "
        f"MTE S = {S}, k = {top_frac}; FLOPs per image, CFG branches included"
    )
    toys = {}
    for name, spec in config["policies"].items():
        if spec.get("kind") != "toy":
            continue
        cfg = ToyMARConfig(head_type=spec.get("head", "flow"), vocab=prompt_vocabulary(), **spec.get("model", {}))
        sampling = SamplingConfig(**spec.get("sampling", {}))
        toys[name] = (cfg, sampling, report(toy_costs(name, ToyMAR(cfg), sampling), grpo, S, top_frac))
    if not args.no_real:
        for path, build in (("config/paper-nova.yaml", nova_costs), ("config/paper-harmon.yaml", harmon_costs)):
            paper = load_config(ROOT / path)
            spec = next(iter(paper["policies"].values()))
            report(build(SamplingConfig(**spec.get("sampling", {}))), paper["grpo"], S, top_frac)
    if args.test or args.no_steps:
        return
    ladder = config["experiments"]["ladder"]["policies"][0]
    cfg, sampling, row = toys[ladder]
    m = toy_steps(cfg, sampling, grpo, args.steps, {"trajectories": S, "top_frac": top_frac})
    print(
        f"{ladder} GRPO step, counted on the real code path (one step; model in brackets): +Fix {m['fix_gflop']:.2f} "
        f"[{row['step_gflop']:.2f}] GFLOP per image, MTE/Fix FLOPs {m['mte_gflop'] / m['fix_gflop']:.3f} "
        f"[{row['ratio_model']:.3f}]"
    )
    print(
        f"{ladder} GRPO step CPU time (median of {args.steps}, {args.threads} thread): +Fix {m['fix_cpu']:.3f} s, "
        f"+MTE {m['mte_cpu']:.3f} s "
        f"-> MTE/Fix {m['mte_cpu'] / m['fix_cpu']:.3f}"
    )


if __name__ == "__main__":
    main()
