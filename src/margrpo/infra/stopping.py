"""When a training job should save and stop before it is cut: its SLURM time limit draws nearer than one more step,
its validation and a save, or the job was told to go (SIGTERM from a preemption, a requeue, `scancel` or the SLURM
profile's warning signal, `--signal=TERM@300`; SIGUSR1 where a site sends it, though it kills the jobstep plugin's
Snakemake of a one-node job (docs/real-scale.md); SIGINT, Ctrl-C at a terminal: a second Ctrl-C interrupts at once,
as Python's own handler does). The trainer asks between steps (and, through `signalled`, at fixed points inside
one); the job then exits with `EXIT_RESUMABLE`, or requeues itself (infra.slurm.after_stop), and the run resumes
from that checkpoint when it is started again.

One request arrives more than once: Ctrl-C reaches every process of the terminal's process group and the
launcher forwards it too; srun passes a `scancel --signal` on while slurmd signals the step's tasks as well (two
SIGTERMs 0.1 s apart, measured). A copy of the first signal within `REPEAT_S` is the same request, not a second
one."""

from __future__ import annotations

import signal
import threading
import time

from margrpo.infra.slurm import job_end_time, seconds_left

EXIT_RESUMABLE = 75  # EX_TEMPFAIL: the run saved and stopped; run the same command again to go on
MARGIN_S = 30.0  # SLURM ends a job at its limit give or take its own polling; the process's exit takes some too
# a second SIGINT sooner than this after the first is a copy of it (terminal group + launcher, srun's forward): a
# person pressing Ctrl-C again, because the save seems slow, does so seconds later
REPEAT_S = 1.5
SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class StopRequest:
    """Why the job should stop now (`reason`), or None. The time limit is read from SLURM by the one process that
    asks it (`read_limit`: the main process); signals are caught wherever this is made, from then until `close`:
    make it before the model is built and close it after the process's last collective."""

    def __init__(self, read_limit: bool, margin_s: float = MARGIN_S):
        self.margin_s = margin_s
        self.end_time = job_end_time() if read_limit else None
        self.signalled: str | None = None
        self.signalled_at: float | None = None  # time.monotonic() of the first signal: how long a save took after it
        self._first_sigint: float | None = None
        self._previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        now = time.monotonic()
        if signum == signal.SIGINT:
            if self._first_sigint is not None and now - self._first_sigint >= REPEAT_S:
                # asked twice: the user will not wait for a save
                signal.signal(signal.SIGINT, self._previous.pop(signal.SIGINT))
                raise KeyboardInterrupt
            self._first_sigint = self._first_sigint or now
        if self.signalled is None:
            self.signalled, self.signalled_at = signal.Signals(signum).name, now

    def reason(self, next_seconds: float) -> str | None:
        """Why to stop before a step expected to take `next_seconds` (the step, its validation and a save)."""
        if self.signalled:
            return f"{self.signalled} received"
        if seconds_left(self.end_time) < next_seconds + self.margin_s:
            self.end_time = job_end_time()  # read again: `scontrol update TimeLimit=` may have moved it
            left = seconds_left(self.end_time)
            if left < next_seconds + self.margin_s:
                return f"{left:.0f} s left before the job's time limit; a step and a save take ~{next_seconds:.0f} s"
        return None

    def since_signal(self) -> str:
        """How long ago the first signal came (for the stop's log line: does a save fit SLURM's grace?), or ""."""
        return "" if self.signalled_at is None else f"; saved {time.monotonic() - self.signalled_at:.1f} s after it"

    def close(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
