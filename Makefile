# The two commands of the README:  `make run` (the whole toy experiment)  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: run test test-fast test-slurm install evaluators report report-html clean-results lint toy-weights toy-weights-check

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, from the exact pin (a CPU wheel here); the constraints keep every later resolution on it
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)          ## every table and figure of the toy reproduction under results/
	$(BIN)/python -m margrpo.experiment.config_checks $(SNAKEMAKE_ARGS)  # YTE and duplicate keys refused before Snakemake reads a config
	$(BIN)/snakemake --cores all $(SNAKEMAKE_ARGS)

report: $(STAMP)       ## regenerate tables and figures from cached results (no training reruns)
	$(BIN)/python -m margrpo.experiment.config_checks $(SNAKEMAKE_ARGS)
	$(BIN)/snakemake --cores all --rerun-triggers mtime $(SNAKEMAKE_ARGS)

REPORT_HTML ?= results/report.html
report-html: $(STAMP)  ## Snakemake's HTML report of the last run (tables, figures, captions, rule graph, runtimes)
	$(BIN)/snakemake --report $(REPORT_HTML) $(SNAKEMAKE_ARGS)

# pytest-xdist: TEST_WORKERS processes, each taking whole test files (their module fixtures are built once)
TEST_WORKERS ?= 2
XDIST := -n $(TEST_WORKERS) --dist loadfile

test: $(STAMP)         ## the full test suite, including the end-to-end smoke workflow
	$(BIN)/pytest -q -m "not slurm" $(XDIST) $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/pytest -q -m "not slow and not slurm" $(XDIST) $(PYTEST_ARGS)

test-slurm: $(STAMP)   ## GRPO jobs through the SLURM profile on a two-node SLURM cluster in network namespaces (root)
	$(BIN)/pytest -q -m slurm $(PYTEST_ARGS)

LINTED := src tests benchmarks scripts
lint: $(STAMP)         ## ruff's formatter and linter (pyproject.toml), then Snakemake's linter
	$(BIN)/ruff format --check $(LINTED)
	$(BIN)/ruff check $(LINTED)
	$(BIN)/snakemake --lint

toy-weights: $(STAMP)  ## train the toy's shared stages of config/config.yaml here and pack them into the package's release
	# the target before --config: --config takes every word after it as a name=value pair
	$(BIN)/snakemake trained_toy_stages --cores all $(SNAKEMAKE_ARGS) --config toy_weights=train
	$(BIN)/margrpo pack-weights --config config/config.yaml $(PACK_ARGS)

toy-weights-check: $(STAMP)  ## after a change of a shipped stage's code: keep the release current if no number moved
	$(BIN)/margrpo refresh-release --config config/config.yaml

evaluators:            ## the real-scale evaluator stack in its own venv (.venv-eval); not needed for the toy run
	bash scripts/install-evaluators.sh

clean-results:
	rm -rf results logs timings .snakemake
