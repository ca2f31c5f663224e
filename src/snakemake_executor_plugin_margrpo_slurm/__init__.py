"""`executor: margrpo-slurm`: Snakemake's SLURM executor (snakemake-executor-plugin-slurm, pinned) whose jobs all
end for Snakemake within a bounded time (margrpo.infra.slurm_states: "CANCELLED by <uid>", PREEMPTED under
PreemptMode=CANCEL, NODE_FAIL without a requeue, UNKNOWN, a job the status command forgot or never listed, a job held
or suspended),
and whose jobs given up on are cancelled, and seen ended, before they are reported failed.

Everything else is the SLURM plugin's own: its settings under this executor's prefix (`--margrpo-slurm-requeue`,
`--margrpo-slurm-status-command`, ...), its submission, its status queries and its `scancel`. Three settings are
added: `--margrpo-slurm-patience` (seconds a job may sit in a state that ends nothing before it is given up),
`--margrpo-slurm-held-patience` (the same for a job a person paused: held, requeue-held, suspended) and
`--margrpo-slurm-max-status-interval` (the longest wait between two status queries).
The status answer is rewritten where the plugin reads it, its module's `query_job_status`: the plugin's version is
checked, so an upgrade that moves it fails here, by name, and not silently.
"""

import shutil
from dataclasses import dataclass, field
from importlib.metadata import version

import snakemake_executor_plugin_slurm as slurm
from snakemake_executor_plugin_slurm import (
    _status_lookup_ids,
    common_settings,  # noqa: F401 (a plugin's required attribute)
)
from snakemake_executor_plugin_slurm.job_cancellation import cancel_slurm_jobs
from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo

from margrpo.infra.slurm import mark_given_up
from margrpo.infra.slurm_states import JobStates

PINNED = "2.8.0"  # the version whose status path this wraps (constraints.txt)
PLUGIN_QUERY = getattr(slurm, "query_job_status", None)  # the plugin's own, wrapped by each executor made here
# what this executor runs on the host Snakemake runs on (the plugin's submission, status query, account guess and
# scancel; infra.slurm's mark); srun runs inside the jobs
SUBMIT_HOST_COMMANDS = ("sbatch", "sacct", "squeue", "scancel", "scontrol")


def missing_slurm_commands() -> list[str]:
    return [command for command in SUBMIT_HOST_COMMANDS if shutil.which(command) is None]


@dataclass
class ExecutorSettings(slurm.ExecutorSettings):
    patience: int = field(  # a plain type: Snakemake passes it to argparse as the converter
        default=600,
        metadata={
            "help": "Seconds a job may stay PREEMPTED, NODE_FAIL, UNKNOWN or unlisted (states that end nothing by "
            "themselves, while SLURM may still requeue the job) before it is given up: cancelled, and reported to "
            "Snakemake as failed once SLURM shows it ended. A held or suspended job is named in the log after it.",
            "env_var": False,
            "required": False,
        },
    )
    held_patience: int = field(
        default=3600,
        metadata={
            "help": "Seconds a job may stay held (PENDING JobHeldUser / JobHeldAdmin, REQUEUE_HOLD, SPECIAL_EXIT), "
            "SUSPENDED or STOPPED (states a person ends) before it is given up as one past --margrpo-slurm-patience "
            "is; at least that patience.",
            "env_var": False,
            "required": False,
        },
    )

    max_status_interval: int = field(
        default=180,
        metadata={
            "help": "The longest wait in seconds between two status queries. The SLURM plugin adds 10 s to the wait "
            "after each query in which no job finished, up to 180 s: a job is seen ended up to that long after it "
            "ended. Lower it where jobs are short (the test cluster: 5), keep it where sacct is slow to answer.",
            "env_var": False,
            "required": False,
        },
    )


class Executor(slurm.Executor):
    def __post_init__(self, test_mode: bool = False):
        if version("snakemake-executor-plugin-slurm") != PINNED or PLUGIN_QUERY is None:
            raise WorkflowError(
                f"executor margrpo-slurm wraps snakemake-executor-plugin-slurm {PINNED}'s status query; "
                f"{version('snakemake-executor-plugin-slurm')} is installed (constraints.txt pins {PINNED})"
            )
        missing = missing_slurm_commands()
        if missing:  # else the first submission fails with a bare "No such file or directory: 'sacct'"
            raise WorkflowError(
                f"executor margrpo-slurm: {', '.join(missing)} not on PATH: run Snakemake where SLURM's commands are "
                "(a cluster's login node), or without --profile workflow/profiles/slurm"
            )
        settings = self.workflow.executor_settings
        try:
            self.job_states = JobStates(
                settings.patience, settings.held_patience, cancel=self.cancel_given_up, warn=self.logger.warning
            )
        except ValueError as e:
            raise WorkflowError(f"--margrpo-slurm-patience / --margrpo-slurm-held-patience: {e}") from None
        super().__post_init__(test_mode)

        async def settled_query(command: str, logger):
            states, seconds = await PLUGIN_QUERY(command, logger)
            if states is None:
                return None, None
            unlisted = [j for j in self.active_ids if not any(i in states for i in _status_lookup_ids(j))]
            return self.job_states.settle(states, unlisted), seconds

        slurm.query_job_status = settled_query  # the name check_active_jobs calls

    active_ids: list[str] = []  # the jobs of the status check under way: the query tells which it did not list

    async def check_active_jobs(self, active_jobs):
        self.active_ids = [job.external_jobid for job in active_jobs]
        async for job in super().check_active_jobs(active_jobs):
            yield job
        # a job cancelled and not yet seen ended: looked at again after the first interval, not the plugin's growing
        # one (the status thread may run before __post_init__ has made job_states)
        settings = self.workflow.executor_settings
        if getattr(self, "job_states", None) and self.job_states.cancelled:
            self.next_seconds_between_status_checks = settings.init_seconds_before_status_checks or 40
        if settings.max_status_interval:  # the plugin's growing wait, bounded
            self.next_seconds_between_status_checks = min(
                self.next_seconds_between_status_checks, settings.max_status_interval
            )

    def cancel_given_up(self, jobs: list[str]) -> None:
        """The plugin's own `scancel` of jobs given up on; one that fails is sent again at the next status query."""
        mark_given_up(jobs)  # not a person's scancel: the job ends resumable and its retry goes on (infra.slurm)
        try:
            cancel_slurm_jobs([SubmittedJobInfo(None, job) for job in jobs], self._submitted_job_clusters, self.logger)
        except (WorkflowError, OSError) as e:  # OSError: scancel gone from PATH since the start
            self.logger.warning(f"SLURM jobs {', '.join(jobs)} given up on: {e}; sent again at the next status query")
