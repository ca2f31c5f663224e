"""`executor: margrpo-slurm`: Snakemake's SLURM executor (snakemake-executor-plugin-slurm, pinned) whose jobs all
end for Snakemake within a bounded time (margrpo.infra.slurm_states: "CANCELLED by <uid>", PREEMPTED under
PreemptMode=CANCEL, NODE_FAIL without a requeue, UNKNOWN, a job the status command forgot).

Everything else is the SLURM plugin's own: its settings under this executor's prefix (`--margrpo-slurm-requeue`,
`--margrpo-slurm-status-command`, ...), its submission and its status queries. One setting is added,
`--margrpo-slurm-patience` (seconds a job may sit in a state that ends nothing before it is reported failed).
The status answer is rewritten where the plugin reads it, its module's `query_job_status`: the plugin's version is
checked, so an upgrade that moves it fails here, by name, and not silently.
"""

from dataclasses import dataclass, field
from importlib.metadata import version

import snakemake_executor_plugin_slurm as slurm
from snakemake_executor_plugin_slurm import common_settings  # noqa: F401 (a plugin's required attribute)
from snakemake_interface_common.exceptions import WorkflowError

from margrpo.infra.slurm_states import JobStates

PINNED = "2.8.0"  # the version whose status path this wraps (constraints.txt)
PLUGIN_QUERY = getattr(slurm, "query_job_status", None)  # the plugin's own, wrapped by each executor made here


@dataclass
class ExecutorSettings(slurm.ExecutorSettings):
    patience: int = field(  # a plain type: Snakemake passes it to argparse as the converter
        default=600,
        metadata={
            "help": "Seconds a job may stay PREEMPTED, NODE_FAIL, UNKNOWN or unlisted (states that end nothing by "
            "themselves, while SLURM may still requeue the job) before it is reported to Snakemake as failed.",
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
        super().__post_init__(test_mode)
        self.job_states = JobStates(self.workflow.executor_settings.patience, self.logger.warning)

        async def settled_query(command: str, logger):
            states, seconds = await PLUGIN_QUERY(command, logger)
            return (None, None) if states is None else (self.job_states.settle(states), seconds)

        slurm.query_job_status = settled_query  # the name check_active_jobs calls
