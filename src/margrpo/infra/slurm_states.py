"""Job states as Snakemake's SLURM plugin should read them: every job ends for Snakemake within a bounded time.

snakemake-executor-plugin-slurm 2.8.0 reads `sacct`'s (or `squeue`'s) state word by exact match against its list
of failures, takes UNKNOWN for success, and keeps waiting on anything else. On a real cluster that leaves a
workflow waiting forever, each reproduced on the test cluster (scripts/slurm-cluster.sh, with accounting):
- `scancel`: sacct writes "CANCELLED by 0" (the uid), which matches nothing: the job looks running;
- a preemption under PreemptMode=CANCEL ends the job PREEMPTED, which the plugin keeps waiting on;
- a node failure of a job SLURM does not requeue (`--no-requeue`, JobRequeue=0) stays NODE_FAIL, which the plugin
  keeps waiting on while its own `requeue` setting is on (the profile's);
- UNKNOWN (a state sacct could not read) is reported as success, whatever the job did;
- a job that the status command no longer lists (squeue forgets a job MinJobAge after it ends) is waited on.

`JobStates.settle` rewrites one status query's answer before the plugin reads it: "CANCELLED by <uid>" becomes
CANCELLED (a failure the plugin names); a state that ends nothing by itself (PREEMPTED, NODE_FAIL, UNKNOWN, a job
gone from the listing, a state word the plugin does not know) reads as PENDING while SLURM may still requeue the
job, and as FAILED once it has lasted `patience` seconds: Snakemake then retries the job (the profile's retries)
or stops, and a retried train job resumes from its last checkpoint. A job that SLURM requeues in time (PENDING,
RUNNING again) is never failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

# The states the plugin already reads right: success, its failures, and the states of a job still to run.
ENDED = {"COMPLETED", "BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "ERROR"}
LIVE = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING",
    "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT",
}  # fmt: skip
UNSETTLED_AS = "PENDING"  # what a state that ends nothing by itself reads as while it may still be requeued


def state_word(state: str) -> str:
    """sacct's state without its decorations: "CANCELLED by 1000" -> CANCELLED, "RUNNING+" -> RUNNING."""
    return state.split(" ", 1)[0].rstrip("+").upper() if state.strip() else "UNKNOWN"


class JobStates:
    """The states of one workflow's jobs across status queries: when each job entered the state it is stuck in."""

    def __init__(
        self, patience: float, warn: Callable[[str], None] = log.warning, clock: Callable[[], float] = time.time
    ):
        if patience <= 0:
            raise ValueError(f"patience must be > 0 seconds, got {patience}")
        self.patience, self.warn, self.clock = patience, warn, clock
        self.stuck_since: dict[str, tuple[str, float]] = {}  # job id -> (the state, when it was first seen)
        self.watched: set[str] = set()  # jobs listed and not yet ended: one the listing drops is stuck "GONE"
        self.failed: set[str] = set()

    def settle(self, states: dict[str, str]) -> dict[str, str]:
        """One status query's {job id: state} as the plugin should read it (see the module's docstring)."""
        now, settled = self.clock(), {}
        gone = {job: "GONE" for job in self.watched if job not in states}  # listed before, not now
        for job, state in {**gone, **{job: state_word(s) for job, s in states.items()}}.items():
            if state in LIVE or state in ENDED:
                self.stuck_since.pop(job, None)
                if state in ENDED:  # the plugin ends it now: no longer ours to watch
                    self.watched.discard(job)
                else:
                    self.watched.add(job)
                settled[job] = state
                continue
            first, since = self.stuck_since.get(job, (None, now))
            if first != state:  # stuck from now on, in this state
                self.stuck_since[job], since = (state, now), now
            if now - since < self.patience:
                self.watched.add(job)
                settled[job] = UNSETTLED_AS
                continue
            if job not in self.failed:
                what = "gone from the status listing" if state == "GONE" else state
                self.warn(
                    f"SLURM job {job}: {what} for {now - since:.0f} s (patience {self.patience:.0f} s) and not "
                    "requeued; reported to Snakemake as FAILED (a retry submits it again, and a train job resumes "
                    "from its checkpoint)"
                )
                self.failed.add(job)
            self.watched.discard(job)
            settled[job] = "FAILED"
        return settled
