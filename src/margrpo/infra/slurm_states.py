"""Job states as Snakemake's SLURM plugin should read them: every job ends for Snakemake within a bounded time, and a
job given up on has ended in SLURM before Snakemake hears of it (so its retry never runs beside it).

snakemake-executor-plugin-slurm 2.8.0 reads `sacct`'s (or `squeue`'s) state word by exact match against its list
of failures, takes UNKNOWN for success, and keeps waiting on anything else. On a real cluster that leaves a
workflow waiting forever, each reproduced on the test cluster (scripts/slurm-cluster.sh, SLURM 22.05, accounting):
- `scancel`: sacct writes "CANCELLED by 0" (the uid), which matches nothing: the job looks running;
- a preemption under PreemptMode=CANCEL ends the job PREEMPTED, which the plugin keeps waiting on;
- a node failure of a job SLURM does not requeue (`--no-requeue`, JobRequeue=0) stays NODE_FAIL, which the plugin
  keeps waiting on while its own `requeue` setting is on (the profile's);
- UNKNOWN (a state sacct could not read) is reported as success, whatever the job did;
- a job that the status command no longer lists (squeue forgets a job MinJobAge after it ends) is waited on, and so
  is one it never listed: sacct lists a job once slurmctld has sent it to slurmdbd, which it does when the job is
  eligible to run, so a job held before that (`scontrol hold` right after the submission) is never listed;
- a job a person or an admin paused: held (`scontrol hold`: PENDING, reason JobHeldAdmin or JobHeldUser), requeued
  in held state (`scontrol requeuehold`: REQUEUE_HOLD, which squeue shows as PENDING "job requeued in held state"),
  SPECIAL_EXIT (`requeuehold state=specialexit`; sacct shows both as PENDING), SUSPENDED (`scontrol suspend`), or
  STOPPED (SIGSTOP): each waits for a person, and the plugin counts it as live with no bound.

`JobStates.settle` rewrites one status query's answer before the plugin reads it. "CANCELLED by <uid>" becomes
CANCELLED (a failure the plugin names). A state that ends nothing by itself (PREEMPTED, NODE_FAIL, UNKNOWN, a job gone
from the listing, a state word the plugin does not know) reads as PENDING while SLURM may still requeue the job, for
`patience` seconds. A paused job reads as PENDING too: after `patience` seconds it is named in the log (its state, the
reason, and the command that lets it go on), and after `held_patience` seconds it is given up. A job never listed is
read as the controller has it once the controller shows it paused, and from then until the status command lists it. A
job given up on is cancelled (`scancel`) and reads as PENDING until the controller (`squeue`, not sacct: sacct writes
CANCELLED while the job's processes still run, COMPLETING) shows it ended or no longer knows it; only then does it read
as FAILED: Snakemake retries it (the profile's retries) or stops. The job is marked given up in its Comment before the
scancel (infra.slurm.mark_given_up), so a train job that was running saves its state and ends resumable, not as after a
person's scancel: its retry resumes it, as it does one that was not running. A job that SLURM requeues, or a person
lets go on, in time (PENDING, RUNNING again) is never failed.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

# The states the plugin already reads right: success, its failures, and the states of a job still to run.
ENDED = {"COMPLETED", "BOOT_FAIL", "CANCELLED", "DEADLINE", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "ERROR"}
LIVE = {
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_FED", "RESIZING", "SIGNALING",
    "STAGE_OUT",
}  # fmt: skip
# States a person or an admin put a job in and only they end: what lets each go on.
PAUSED = {
    "REQUEUE_HOLD": "scontrol release {job}",
    "SPECIAL_EXIT": "scontrol release {job}",
    "SUSPENDED": "scontrol resume {job}",
    "STOPPED": "scancel --signal=CONT {job}",
}
HELD = "scontrol release {job}"  # a PENDING job held (is_held)
UNSETTLED_AS = "PENDING"  # what a job not yet given up on reads as, whatever holds it


def state_word(state: str) -> str:
    """sacct's state without its decorations: "CANCELLED by 1000" -> CANCELLED, "RUNNING+" -> RUNNING."""
    return state.split(" ", 1)[0].rstrip("+").upper() if state.strip() else "UNKNOWN"


def is_held(reason: str) -> bool:
    """squeue's reason for a held job: JobHeldUser, JobHeldAdmin, "job requeued in held state", "launch failed
    requeued held" (SLURM's own hold of a batch job it could not start)."""
    return "held" in reason.lower()


def controller_view(jobs: Iterable[str], run=subprocess.run) -> dict[str, tuple[str, str]] | None:
    """{job: (state, reason)} as slurmctld has them now (`squeue`), None when it did not answer. A job it no longer
    knows (purged MinJobAge after its end) is left out: it is not running."""
    jobs = sorted(set(jobs))
    cmd = ["squeue", "--noheader", "--states=all", "--format=%i|%T|%r", f"--jobs={','.join(jobs)}"]
    try:
        out = run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:  # every id forgotten by slurmctld: "Invalid job id specified"; else no answer
        if "Invalid job id" not in out.stderr:
            return None
        if len(jobs) == 1:
            return {}
        views = [controller_view([job], run) for job in jobs]  # which of them it forgot: one by one
        return None if None in views else {job: seen for view in views for job, seen in view.items()}
    view = {}
    for line in out.stdout.splitlines():
        job, state, reason = (line.split("|", 2) + ["", ""])[:3]
        if job.strip():
            view[job.strip()] = (state_word(state), reason.strip())
    return view


class JobStates:
    """The states of one workflow's jobs across status queries: what each job is stuck in since when, and which jobs
    were cancelled and not yet seen ended.

    `look(jobs)` is the controller's view (`controller_view`); `cancel(jobs)` sends `scancel`."""

    def __init__(
        self,
        patience: float,
        held_patience: float | None = None,
        *,
        look: Callable[[list[str]], dict[str, tuple[str, str]] | None] = controller_view,
        cancel: Callable[[list[str]], None] = lambda jobs: None,
        warn: Callable[[str], None] = log.warning,
        clock: Callable[[], float] = time.time,
    ):
        held_patience = patience if held_patience is None else held_patience
        if patience <= 0 or held_patience < patience:
            raise ValueError(f"patience must be > 0 seconds and held_patience >= it, got {patience}, {held_patience}")
        self.patience, self.held_patience = patience, held_patience
        self.look, self.cancel, self.warn, self.clock = look, cancel, warn, clock
        # job id -> (what it is stuck in, since when, the command that lets it go on where a person paused it)
        self.stuck_since: dict[str, tuple[str, float, str | None]] = {}
        self.watched: set[str] = set()  # jobs listed and not yet ended: one the listing drops is stuck "GONE"
        self.read_from_controller: set[str] = set()  # paused jobs the status command has not listed (yet)
        self.named: set[str] = set()  # paused jobs named in the log, in the state they are stuck in
        self.cancelled: dict[str, tuple[str, float]] = {}  # job id -> (what it was stuck in, how long) at the scancel
        self.failed: set[str] = set()

    def settle(self, states: dict[str, str], unlisted: Iterable[str] = ()) -> dict[str, str]:
        """One status query's {job id: state} as the plugin should read it (see the module's docstring); `unlisted`:
        the workflow's active jobs that `states` leaves out."""
        now, settled = self.clock(), {}
        listed = {job: state_word(s) for job, s in states.items()}
        self.read_from_controller.difference_update(listed)
        from_controller = sorted(self.read_from_controller)
        never_listed = [job for job in unlisted if job not in listed and job not in self.watched]
        words = {**{job: "GONE" for job in self.watched if job not in listed}, **listed}
        # the controller's word where the listing cannot tell: why a job is PENDING (sacct shows a hold as PENDING),
        # whether a cancelled job has ended, and what a job the listing never showed is in
        ask = [j for j, w in words.items() if j not in self.failed and (w in PAUSED or w == "PENDING")]
        ask += from_controller + never_listed + list(self.cancelled)
        view = self.look(ask) if ask else {}
        for job in from_controller:  # unlisted since the controller showed it paused: the controller's word
            words[job] = "PENDING" if view is None else (view[job][0] if job in view else "GONE")
        for job in never_listed:
            state, reason = (view or {}).get(job, ("", ""))
            if state in PAUSED or (state == "PENDING" and is_held(reason)):
                self.read_from_controller.add(job)
                words[job] = state
        give_up = []
        for job, word in words.items():
            if job in self.failed:
                settled[job] = "FAILED"  # reported once; the plugin has ended it
            elif job in self.cancelled:
                settled[job] = self._confirm(job, view)
            elif word in ENDED:
                self._forget(job)
                settled[job] = word
            else:
                self.watched.add(job)
                stuck = self._stuck_in(job, word, view)
                if stuck is None:
                    self.stuck_since.pop(job, None)
                    settled[job] = word if word in LIVE else UNSETTLED_AS
                    continue
                (what, action), settled[job] = stuck, UNSETTLED_AS
                first, since, _ = self.stuck_since.get(job, (None, now, None))
                if first != what:  # stuck from now on, in this state
                    self.stuck_since[job], since = (what, now, action), now
                    self.named.discard(job)
                if action and now - since >= self.patience and job not in self.named:
                    self.named.add(job)
                    self.warn(
                        f"SLURM job {job} is {what} for {now - since:.0f} s, waiting for a person: "
                        f"`{action.format(job=job)}` lets it go on, `scancel {job}` fails it for Snakemake now; "
                        f"else it is cancelled and reported failed after {self.held_patience:.0f} s in this state"
                    )
                if now - since >= (self.held_patience if action else self.patience):
                    self.cancelled[job] = (what, now - since)
                    give_up.append(job)
        if give_up:  # a pending job ends at once: confirmed in this query; a running one in a later one
            self.cancel(give_up)
            view = self.look(give_up)
            settled.update({job: self._confirm(job, view, just_sent=True) for job in give_up})
        return settled

    def _stuck_in(self, job: str, word: str, view) -> tuple[str, str | None] | None:
        """What the job is stuck in and the command that lets it go on (None where no person can); None if live."""
        if view is None and word == "PENDING" and self.stuck_since.get(job, ("", 0, None))[2]:
            return self.stuck_since[job][0], self.stuck_since[job][2]  # no answer from the controller: as it was
        state, reason = (view or {}).get(job, (word, ""))
        action = PAUSED.get(state) or (HELD if state == "PENDING" and is_held(reason) else None)
        if action:
            return state + (f" ({reason})" if reason not in ("", "None") else ""), action
        if state in LIVE:
            return None
        return ("gone from the status listing" if word == "GONE" else word), None

    def _confirm(self, job: str, view: dict[str, tuple[str, str]] | None, just_sent: bool = False) -> str:
        """FAILED once the controller shows the cancelled job ended (or forgot it); PENDING while it still runs."""
        if view is None:
            return UNSETTLED_AS  # no answer: asked again at the next query
        state = view.get(job, ("forgotten by slurmctld", ""))[0]
        if state in LIVE or state in PAUSED:
            if not just_sent and state != "COMPLETING":
                self.cancel([job])  # a scancel that did not take (slurmctld busy, a requeue in between)
            return UNSETTLED_AS
        what, lasted = self.cancelled.pop(job)
        self._forget(job)
        self.failed.add(job)
        self.warn(
            f"SLURM job {job}: {what} for {lasted:.0f} s (patience {self.patience:.0f} s, "
            f"{self.held_patience:.0f} s for a paused job); cancelled, and ended ({state}); reported to Snakemake "
            "as FAILED (a retry submits it again; a train job that was running saved at the scancel and is a "
            "cancelled one: docs/real-scale.md, How a job stops)"
        )
        return "FAILED"

    def _forget(self, job: str) -> None:
        self.stuck_since.pop(job, None)
        self.read_from_controller.discard(job)
        self.named.discard(job)
        self.watched.discard(job)
