# MAR-GRPO: the whole experiment as one DAG.  `snakemake --cores all` runs the toy world;
# `--configfile config/paper-nova.yaml --workflow-profile workflow/profiles/slurm` the paper.
# profiles/ (beside this file) links to workflow/profiles/: Snakemake loads profiles/default by itself.
from snakemake.utils import min_version

min_version("9.0")


configfile: os.path.join(workflow.basedir, "config/config.yaml")  # found from any --directory


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/release.smk"
include: "workflow/rules/warmup.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/estimators.smk"
include: "workflow/rules/select.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/related.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),
