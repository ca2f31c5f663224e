"""Per GPU: the one-process step composed with N processes and a sharding (replicate, full_shard, shard_grad_op),
part by part, plus the reward models' weights and an allowance for what fake tensors cannot see; the Markdown
table of the rows."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from margrpo.plan.ledger import GiB

if TYPE_CHECKING:
    from margrpo.plan.step import Step

LIMITS = {"80 GiB": 80 * GiB, "139 GiB": 139 * GiB}  # H100 80 GB, and the H200 the paper batch ran out of memory on
# Not measured (no GPU here). The CUDA context takes ~0.5-0.7 GiB on Hopper (CUDA 12+, lazy module loading); cuBLAS /
# cuBLASLt workspaces 32 MiB a handle and stream; SDPA's backward and cuDNN's convolutions (the VAE) take workspace
# through the caching allocator; NCCL's buffers some hundred MiB with N > 1: a fixed 2 GiB covers them with room. The
# caching allocator keeps freed and split blocks reserved: 10% of the tensor peak (fragmentation of a training step
# with changing shapes is commonly 5-15%).
ALLOWANCE_FIXED, ALLOWANCE_SHARE = 2 * GiB, 0.10

SHARDINGS = ("replicate", "full_shard", "shard_grad_op")
PHASES = ("rollout", "replay", "optimizer")
PARTS = (
    "trained",
    "frozen",
    "grads",
    "optimizer",
    "reference",
    "record",
    "activations",
    "gathered",
    "probe",
    "rewards",
)


def per_gpu(step: Step, n: int, sharding: str, rewards: int) -> dict:
    """The predicted per-GPU peak of `step` run by n processes under `sharding`, by part (bytes); the rules:
    margrpo.plan.command's docstring."""
    s = step.sizes
    fsdp = n > 1 and sharding != "replicate"
    share = 1 / n if fsdp else 1.0
    chunked = step.run.replay_chunk is not None and step.run.replay_chunk < s["mask_steps"]

    phases = {}
    for phase in PHASES:
        if phase not in step.peaks:
            continue
        got = Counter(step.peaks[phase][1])
        # FSDP accumulates the unsynchronised chunks' gradients unsharded, in fp32, until the last chunk reduces
        grads = 1.0 if phase == "replay" and chunked else share
        parts = {
            "trained": got["trained"] * share,
            "frozen": got["frozen"] * share + got["encoders"] + got["buffers"],
            "grads": got["grad"] * grads,
            "optimizer": got["optim"] * share,
            "reference": got["reference"] * share,
            "record": got["record"],
            "activations": got["act"] + got["cast"],  # autocast's bf16 weight copies, under FSDP too
        }
        gathered = 0
        if n > 1 and sharding == "replicate":
            gathered = s["fsdp_trained"]  # DDP's gradient buckets
        elif fsdp and phase != "optimizer":
            # gathered in fp32 (autocast casts per op): the whole policy (shard_grad_op) or the root and two groups
            held = s["fsdp"] if sharding == "shard_grad_op" else s["root"] + 2 * s["unit"]
            ref = s["root"] + 2 * s["unit"] if s["reference"] and phase == "replay" else 0
            grads = max(s["unit_trained"], s["root_trained"]) * 6 // 4 if phase == "replay" else 0  # bf16 + fp32
            gathered = held + ref + grads
        parts["gathered"] = gathered
        # the gradient-variance probe (grpo.grad_variance): a snapshot of the gradients it reads, held between the
        # replay's micro-batches; this process's shards under FSDP
        parts["probe"] = s.get("stat", 0) * share if phase == "replay" else 0
        parts["rewards"] = rewards
        parts = {k: int(parts[k]) for k in PARTS}
        tensors = sum(parts.values())
        parts["allowance"] = int(ALLOWANCE_FIXED + ALLOWANCE_SHARE * tensors)
        phases[phase] = parts | {"total": tensors + parts["allowance"]}
    worst = max(phases, key=lambda p: phases[p]["total"])
    out = dict(
        phases[worst],
        phase=worst,
        act_rollout=phases["rollout"]["activations"] + phases["rollout"]["record"],
        act_replay=phases["replay"]["activations"] + phases["replay"]["record"],
    )
    return out


COLUMNS = [
    ("trained", "trained"),
    ("frozen", "frozen+buf"),
    ("grads", "grads"),
    ("optimizer", "AdamW"),
    ("reference", "KL ref"),
    ("rewards", "rewards"),
    ("act_rollout", "rollout act"),
    ("act_replay", "replay act"),
    ("gathered", "FSDP/DDP"),
    ("allowance", "allowance"),
    ("total", "peak / GPU"),
]


def table(rows: list[dict], unit: int = GiB) -> str:
    """Markdown: one row per (variant, setting, GPUs), parts in GiB (MiB: `unit`), the verdicts against 80 and 139
    GiB."""
    name = "GiB" if unit == GiB else "MiB"
    columns = COLUMNS
    if any(r.get("probe") for r in rows):  # the gradient-variance probe's snapshot, where grpo.grad_variance is on
        columns = [*COLUMNS[:-2], ("probe", "grad var probe"), *COLUMNS[-2:]]
    head = (
        ["variant", "batch / GPU", "GPUs", "sharding"]
        + [f"{h} {name}" for _, h in columns]
        + ["phase", "80 GiB", "139 GiB"]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["variant"], r["batch"], str(r["gpus"]), r["sharding"]] + [f"{r[k] / unit:.1f}" for k, _ in columns]
        cells += [r["phase"]] + [
            ("fits, " if r["total"] <= v else "OOM, ") + f"{(v - r['total']) / GiB:+.1f}" for v in LIMITS.values()
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
