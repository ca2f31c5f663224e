"""GRPO steps of the real-scale policies on one GPU: time, throughput, memory, rollout efficiency.

Builds NOVA-0.6B (NovaConfig defaults = nova-d48w1024-sd512, with a Phi-2-sized text encoder and an
SD-sized VAE) and Harmon-1.5B (HarmonConfig defaults: Qwen2.5-1.5B + MAR-H + KL-16) with RANDOM
weights: nothing is downloaded or read. The tokenizer is a word-level stand-in (the tests' kind:
the words of the prompts and of Harmon's chat template, Qwen's chat special tokens), so a prompt is
about as many tokens as with the real tokenizers; the ids index the full-size embedding tables. The
adaLN-zero heads get a little noise, as in the tests, so the gradient reaches the AR model.

Sampling, the GRPO settings (3 prompts x 4 images, |M| = 12, |T| = 10, micro-batches, Harmon's frozen
LLM) and the variants come from config/paper-{nova,harmon}.yaml via `train_spec`, as a real run gets
them; `committed` is fix with loss_tokens: committed. The reward is the images' mean brightness:
this measures the trainer, not a scorer. Per (policy, variant): one warm-up step, then `--steps`
timed steps; each policy is built once and reset to its initial weights for each variant. Peak memory
is torch.cuda.max_memory_allocated and max_memory_reserved (the caching allocator's take), reset per run
(on CPU the process's max RSS, which never resets);
the rollout's FLOPs are counted with FlopCounterMode on one rollout (`rollout_and_score`: generate +
reward + MTE / Sim masks) and divided by its time alone, as a fraction of a large square matmul's
TFLOP/s measured in the same run (bf16 on CUDA, fp32 on CPU).
A run that runs out of GPU memory gives an "oom" row and the others go ahead. `--gradient-checkpointing`
sets the policy's `gradient_checkpointing` setting (PolicySettings), or its config's where one exists; the
row says "unsupported" where none does.

    python benchmarks/real_scale.py [--policies nova,harmon] [--variants grpo,fix,mte,sim,committed]
        [--steps 3] [--micro-batches N] [--replay-chunk N] [--device cuda] [--precision bf16]
        [--gradient-checkpointing] [--tiny] [--threads N] [--out FILE.json]
"""

import argparse
import gc
import json
import resource
import tempfile
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from torch.utils.flop_counter import FlopCounterMode

from margrpo.experiment.config import load_config, train_spec
from margrpo.grpo.rollout import SamplingConfig
from margrpo.grpo.trainer import GRPOConfig, GRPOTrainer
from margrpo.plan.stand_ins import PROMPTS, brightness, stand_in_tokenizer  # the memory plan takes them too
from margrpo.policy.settings import PolicySettings
from margrpo.prompts.suites import PromptSet

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "grpo": ("grpo", {}),
    "fix": ("fix", {}),
    "mte": ("mte", {}),
    "sim": ("sim", {}),
    "committed": ("fix", {"loss_tokens": "committed"}),
}
# --tiny: the tests' sizes, so both policies run on a CPU in seconds; the schedule shrinks to fit
TINY_SAMPLING = {"ar_steps": 4, "diffusion_steps": 5}
TINY_GRPO = {"mask_steps": 2, "diffusion_steps": 3}


def build_nova(tiny: bool):
    from diffusers import AutoencoderKL
    from transformers import PhiConfig, PhiModel

    from margrpo.policy.nova import NovaConfig, NovaPolicy

    if tiny:
        config = NovaConfig(
            image_size=(64, 64),
            text_token_dim=16,
            text_token_len=8,
            video_base_size=(1, 2, 2),
            image_base_size=(4, 4),
            width=32,
            num_heads=4,
            video_depth=1,
            image_depth=2,
            head_depth=2,
            head_width=32,
        )
        phi = PhiConfig(
            vocab_size=64,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            max_position_embeddings=16,
            partial_rotary_factor=0.5,
        )
        vae = dict(block_out_channels=(8, 8, 8, 8), layers_per_block=1, norm_num_groups=4, sample_size=64)
    else:  # Phi-2 (microsoft/phi-2) and the SD VAE NOVA ships
        config = NovaConfig()
        phi = PhiConfig(
            vocab_size=51200,
            hidden_size=2560,
            intermediate_size=10240,
            num_hidden_layers=32,
            num_attention_heads=32,
            partial_rotary_factor=0.4,
            max_position_embeddings=2048,
        )
        vae = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32, sample_size=512)
    phi._attn_implementation = "sdpa"
    vae = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        latent_channels=4,
        **vae,
    )
    return NovaPolicy(config, PhiModel(phi), vae, stand_in_tokenizer())


def build_harmon(tiny: bool):
    from margrpo.policy.harmon import HarmonConfig, HarmonPolicy

    config = HarmonConfig()
    if tiny:
        llm = dict(
            model_type="qwen2",
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            tie_word_embeddings=True,
        )
        config = HarmonConfig(
            llm=llm,
            encoder_width=32,
            encoder_depth=1,
            encoder_heads=4,
            decoder_width=32,
            decoder_depth=1,
            decoder_heads=4,
            buffer_size=4,
            num_classes=10,
            pos_embed_size=16,
            image_size=32,
            head_width=32,
            head_depth=2,
            vae_channels=(8, 8, 16),
            vae_layers_per_block=1,
            vae_latent_channels=4,
            vae_norm_groups=4,
        )
    return HarmonPolicy(config, stand_in_tokenizer())


def build_policy(name: str, tiny: bool, device: torch.device):
    """A fresh random policy on `device`."""
    torch.manual_seed(0)
    with torch.device(device):
        policy = {"nova": build_nova, "harmon": build_harmon}[name](tiny)
    with torch.no_grad():  # adaLN-zero heads output 0 at init: give them an output that depends on z
        for p in policy.head_parameters():
            p.add_(0.02 * torch.randn_like(p))
    return policy


_BUILT: dict[str, tuple] = {}  # the one policy in memory and its initial weights (on the CPU)


def initial_policy(name: str, tiny: bool, device: torch.device, checkpointing: bool):
    """The policy with its initial weights, all trainable (the trainer freezes parts of it), and the checkpointing
    state. Built once per policy and reset for each later variant: a full-size random init takes tens of seconds."""
    if name in _BUILT:
        policy, weights = _BUILT[name]
        policy.load_state_dict(weights)
    else:
        _BUILT.clear()  # the last policy's memory first
        gc.collect()
        policy = build_policy(name, tiny, device)
        _BUILT[name] = policy, {k: v.detach().to("cpu", copy=True) for k, v in policy.state_dict().items()}
    policy.requires_grad_(True).train()
    return policy, switch_checkpointing(policy, checkpointing)


def switch_checkpointing(policy, on: bool) -> str:
    """Set a `gradient_checkpointing` switch of the policy or its config where one exists."""
    for owner in (policy, getattr(policy, "config", None)):
        if owner is not None and hasattr(owner, "gradient_checkpointing"):
            owner.gradient_checkpointing = on
            return "on" if on else "off"
    return "unsupported" if on else "off"


def make_trainer(name: str, variant: str, args, device: torch.device, out: str) -> tuple[GRPOTrainer, str]:
    config = load_config(ROOT / "config" / f"paper-{name}.yaml")
    base, overrides = VARIANTS[variant]
    spec = train_spec(config, name, "hps", base, overrides)
    sampling = SamplingConfig(**{**spec["sampling"], **(TINY_SAMPLING if args.tiny else {})})
    spec["grpo"].update(TINY_GRPO if args.tiny else {})
    if args.per_gpu:  # one process's share of the official run: batch_prompts / train_processes (1 prompt x 4 images)
        spec["grpo"]["batch_prompts"] //= config["train_processes"] * config["train_nodes"]
    for key in ("micro_batches", "replay_chunk"):  # --micro-batches / --replay-chunk: the paper config's unless given
        if getattr(args, key):
            spec["grpo"][key] = getattr(args, key)
    spec.setdefault("policy", {})["gradient_checkpointing"] = args.gradient_checkpointing
    ckpt = "on" if args.gradient_checkpointing else "off"
    policy, policy_ckpt = initial_policy(name, args.tiny, device, args.gradient_checkpointing)
    ckpt = ckpt if ckpt == "on" else policy_ckpt
    prompts = PromptSet(PROMPTS, [{}] * len(PROMPTS))
    cfg = GRPOConfig.from_spec(spec, precision=args.precision)
    settings = PolicySettings.from_spec(spec)
    accelerator = Accelerator(cpu=device.type == "cpu")
    return GRPOTrainer(
        policy, brightness, prompts, prompts, sampling, cfg, out, accelerator, policy_settings=settings
    ), ckpt


def timed(fn, device: torch.device) -> float:
    """Wall seconds of fn, synchronising CUDA before and after."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def matmul_tflops(device: torch.device) -> float:
    """A large square matmul's TFLOP/s: bf16 on CUDA, fp32 on CPU (the ceiling the rollout is compared to)."""
    n, dtype, repeats = (8192, torch.bfloat16, 20) if device.type == "cuda" else (1024, torch.float32, 5)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    timed(lambda: a @ b, device)
    return 2 * n**3 * repeats / timed(lambda: [a @ b for _ in range(repeats)], device) / 1e12


def peak_memory_mb(device: torch.device) -> tuple[float, float]:
    """Peak (allocated, reserved) MiB: what tensors held and what the caching allocator took from the GPU (the plan's
    allowance covers the difference). On CPU both are the process's max RSS, which never resets."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, torch.cuda.max_memory_reserved(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    return rss, rss


def run(name: str, variant: str, args, device: torch.device, peak_tflops: float) -> dict:
    """One (policy, variant): warm-up step, `steps` timed steps, then one rollout timed and one counted."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="real_scale-") as out:  # the trainer writes nothing unless it saves
        trainer, ckpt = make_trainer(name, variant, args, device, out)
    build_s = time.perf_counter() - t0
    firsts = []  # warm-up: allocator, kernels, optimizer state; its replay runs on the rollout's weights
    # the lambda binds the trainer now (a default argument): `del trainer` below removes the name, not the object
    warmup_s = timed(lambda t=trainer: firsts.append(t.train_step()), device)
    first = firsts[0]
    seconds = sum(timed(trainer.train_step, device) for _ in range(args.steps)) / args.steps
    memory, reserved = peak_memory_mb(device)
    rollout_s = timed(trainer.rollout_and_score, device)
    with FlopCounterMode(display=False) as counter:
        trainer.rollout_and_score()
    tflop = counter.get_total_flops() / 1e12
    images = trainer.cfg.batch_prompts * trainer.cfg.group_size
    del trainer
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {
        "policy": name,
        "variant": variant,
        "s_per_step": seconds,
        "images_per_s": images / seconds,
        "peak_mem_mb": memory,
        "peak_reserved_mb": reserved,
        "build_s": build_s,
        "warmup_s": warmup_s,
        "rollout_s": rollout_s,
        "rollout_tflop": tflop,
        "rollout_tflops": tflop / rollout_s,
        "matmul_tflops": peak_tflops,
        "fraction": tflop / rollout_s / peak_tflops,
        "gradient_checkpointing": ckpt,
        "images_per_step": images,
        "first_ratio_min": first["ratio_min"],
        "first_ratio_max": first["ratio_max"],
    }


def run_or_oom(name: str, variant: str, args, device: torch.device, peak_tflops: float) -> dict:
    """`run`, or a row saying it ran out of GPU memory (the other runs still go ahead)."""
    try:
        return run(name, variant, args, device, peak_tflops)
    except torch.cuda.OutOfMemoryError:
        pass
    gc.collect()  # outside the except block: its traceback no longer holds the trainer
    reached = torch.cuda.max_memory_allocated(device) / 2**20  # what was held when the next allocation failed
    torch.cuda.empty_cache()
    print(f"{name} {variant}: out of GPU memory (held {reached:.0f} MB at the failing allocation)", flush=True)
    return {
        "policy": name,
        "variant": variant,
        "error": "out of memory",
        "oom_held_mb": reached,
        **{h: None for h, _ in COLUMNS[2:]},
    }


COLUMNS = [
    ("policy", "{}"),
    ("variant", "{}"),
    ("s_per_step", "{:.3f}"),
    ("images_per_s", "{:.2f}"),
    ("peak_mem_mb", "{:.0f}"),
    ("peak_reserved_mb", "{:.0f}"),
    ("rollout_s", "{:.3f}"),
    ("rollout_tflops", "{:.4g}"),
    ("fraction", "{:.3f}"),
    ("gradient_checkpointing", "{}"),
    ("images_per_step", "{}"),
    ("build_s", "{:.1f}"),
    ("warmup_s", "{:.1f}"),
    ("first_ratio_min", "{:.6f}"),
    ("first_ratio_max", "{:.6f}"),
]


def print_table(rows: list[dict]) -> None:
    cells = [[h for h, _ in COLUMNS]] + [
        [f.format(r[h]) if r[h] is not None else "oom" for h, f in COLUMNS] for r in rows
    ]
    widths = [max(len(c[i]) for c in cells) for i in range(len(COLUMNS))]
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", default="nova,harmon")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--precision", default="bf16", choices=["bf16", "no"])
    p.add_argument("--gradient-checkpointing", action="store_true", help="where the trainer or policy has the switch")
    p.add_argument(
        "--replay-chunk", type=int, default=None, help="grpo.replay_chunk: chosen AR steps per backward (default: all)"
    )
    p.add_argument("--micro-batches", type=int, default=None, help="grpo.micro_batches (default: the paper config's)")
    p.add_argument(
        "--per-gpu",
        action="store_true",
        help="one process's share of the paper config's batch (its "
        "batch_prompts / train_processes): what each GPU of the official 3-GPU run rolls out and replays",
    )
    p.add_argument("--tiny", action="store_true", help="tiny random policies (tests, CPU)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's; 1 with --tiny)")
    p.add_argument("--out", default=None, help="write every number as JSON here")
    args = p.parse_args()
    policies, variants = args.policies.split(","), args.variants.split(",")
    unknown = sorted(set(policies) - {"nova", "harmon"}) + sorted(set(variants) - set(VARIANTS))
    if unknown or args.steps < 1:
        p.error(f"unknown policies/variants {unknown}" if unknown else "--steps must be >= 1")
    device = torch.device(args.device)
    if args.threads or args.tiny:  # one thread keeps a tiny run fair on a shared machine, as the tests
        torch.set_num_threads(args.threads or 1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    peak = matmul_tflops(device)
    print(
        f"device {name}; matmul {peak:.4g} TFLOP/s ({'bf16' if device.type == 'cuda' else 'fp32'}); "
        f"precision {args.precision}; {args.steps} timed step(s) after one warm-up"
        f"{'; tiny policies' if args.tiny else ''}",
        flush=True,
    )
    rows = []
    for n in policies:
        for v in variants:  # each row is printed and saved as it finishes: a run cut off by a time limit keeps them
            rows.append(run_or_oom(n, v, args, device, peak))
            print(
                " ".join(f"{h}={f.format(rows[-1][h]) if rows[-1][h] is not None else 'oom'}" for h, f in COLUMNS),
                flush=True,
            )
            if args.out:
                Path(args.out).write_text(
                    json.dumps(
                        {
                            "device": name,
                            "matmul_tflops": peak,
                            "precision": args.precision,
                            "steps": args.steps,
                            "tiny": args.tiny,
                            "micro_batches": args.micro_batches,
                            "replay_chunk": args.replay_chunk,
                            "rows": rows,
                        },
                        indent=1,
                    )
                    + "\n"
                )
    print_table(rows)


if __name__ == "__main__":
    main()
