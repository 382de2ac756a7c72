# The two commands of the README's quick start, and the list of the rest:
#   make train   set up, then train the small config with 2 Horovod workers on this host
#   make test    set up, then run the whole test suite
#   make help    every target, a line each (from the `## ` remark on its line)
# Offline machines: PTB_DATA_PATH=/path/to/ptb make ...   (a folder with ptb.{train,valid,test}.txt)
# RUNS (default runs) holds the run folders; ARGS adds trainer flags (--set num_epochs=1, say);
# TESTS narrows make test (TESTS="-m smoke": the quick-start check scripts/fresh_machine.sh runs).
# BENCH_ARGS adds benchmark flags (--configs tests/config_tiny.py --steps 300 --rounds 1: a check
# that every row runs, in minutes; tests/test_benchmark.py runs it).
# TEST_WORKERS: test files run side by side in this many pytest workers (pytest-xdist; 0: in one
# process). Most tests wait on their processes (timeouts, restarts, daemons) part of the time.
PTB_DATA_PATH ?= data/ptb
export PTB_DATA_PATH
CONFIG ?= config_small
NP ?= 2
# PRECISION=bf16 or fp16 (or fp32) overrides the config's matmul precision (docs/precision.md);
# a bf16 or fp16 run has a folder of its own (runs/config_small-np2-bf16)
PRECISION ?=
PY := .venv/bin/python
AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
RUNS ?= runs
ARGS ?=
BENCH_ARGS ?=
TEST_WORKERS ?= 2
# runs/config_small-np2; a config given as a path (tests/config_tiny.py) is named by its file
RUN_DIR = $(RUNS)/$(notdir $(basename $(CONFIG)))-$(1)$(if $(filter bf16 fp16,$(PRECISION)),-$(PRECISION))
PRECISION_SET = $(if $(PRECISION),--set "precision='$(PRECISION)'")
# A second `make train` continues the first run instead of refusing its folder, whatever point
# it stopped at (before its first checkpoint, --resume starts afresh and says so).
RESUME = $(if $(wildcard $(call RUN_DIR,$(1))/metrics.jsonl $(call RUN_DIR,$(1))/checkpoints),--resume)

.PHONY: help train test setup slurm data single bench bench-against bench-quick bench-tune results timing netstudy compare peer reproduce reproduce-status reproduce-stop venv-tf2.15 gpu-build-check chaos horovod-wheel horovod-wheel-check
train: setup data  ## train CONFIG (config_small) with NP (2) Horovod workers on this host
	mpirun $(AS_ROOT) -np $(NP) -bind-to none -map-by slot \
	    $(PY) lm_ptb_distributed.py --config $(CONFIG) --data_path $(PTB_DATA_PATH) \
	    --output_dir $(call RUN_DIR,np$(NP)) $(call RESUME,np$(NP)) $(PRECISION_SET) $(ARGS)

help:  ## this list
	@awk -F':.*## ' '/^[a-z0-9.-]+:.*## / {printf "  make %-20s %s\n", $$1, $$2}' \
	    $(firstword $(MAKEFILE_LIST))

single: setup data  ## train CONFIG in one process (lm_ptb.py)
	$(PY) lm_ptb.py --config $(CONFIG) --data_path $(PTB_DATA_PATH) --output_dir $(call RUN_DIR,single) \
	    $(call RESUME,single) $(PRECISION_SET) $(ARGS)

test: setup data slurm  ## the whole test suite; TESTS narrows it (TESTS="-m smoke")
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(TESTS)

setup:  ## Open MPI, TensorFlow and the patched Horovod into .venv (scripts/setup.sh)
	scripts/setup.sh

# The patched Horovod for another project: its wheel into WHEEL_DIR, with the lines that install
# it; the check installs it beside TensorFlow alone in a new venv outside the repository and
# runs a 2-rank Keras 3 model.fit there (docs/keras3.md#using-this-horovod-in-another-project).
WHEEL_DIR ?= dist
horovod-wheel:  ## the patched Horovod's wheel into WHEEL_DIR (dist), and how to install it
	scripts/setup.sh --wheel-to "$(WHEEL_DIR)"

horovod-wheel-check: horovod-wheel  ## that wheel beside TensorFlow alone in a new venv: a 2-rank model.fit
	$(PY) scripts/horovod_wheel_check.py "$(WHEEL_DIR)"

slurm:  ## slurm-wlm and munge, for the Slurm test (as root or with sudo)
	scripts/setup_slurm.sh

data: setup  ## md5-check PTB in PTB_DATA_PATH, downloading it first if missing
	$(PY) -m data.ptb --data_path $(PTB_DATA_PATH)

bench: setup data peer  ## words/sec of each config: 1 process, 2 workers, fp32 and bf16, PyTorch beside
	$(PY) scripts/bench/full.py --data_path $(PTB_DATA_PATH) $(if $(AGAINST),--against $(AGAINST)) \
	    $(BENCH_ARGS)

# TensorFlow 2.15's stack (before 2.21) in .venv-tf2.15, Horovod built and patched as for .venv:
# the benchmark's comparison, `make bench AGAINST=.venv-tf2.15/bin/python`.
venv-tf2.15:  ## TensorFlow 2.15's stack in .venv-tf2.15, for make bench AGAINST=...
	VENV=.venv-tf2.15 PYTHON=python3.11 REQUIREMENTS=scripts/requirements-tf2.15.txt \
	    NO_DEPS_REQUIREMENTS= scripts/setup.sh

# Only the rows run against another stack, in turns over 3 rounds: AGAINST is an interpreter, or
# another checkout (another commit) with its own .venv, whose own trainers then run.
bench-against: setup data  ## only the rows compared with AGAINST (an interpreter or a checkout)
	$(PY) scripts/bench/against.py --against "$(AGAINST)" --data_path $(PTB_DATA_PATH) \
	    --out runs/bench-against.json $(BENCH_ARGS)

bench-quick: setup data peer  ## a shorter make bench
	$(PY) scripts/bench/full.py --quick --data_path $(PTB_DATA_PATH) $(if $(AGAINST),--against $(AGAINST)) \
	    $(BENCH_ARGS)

# PyTorch for the benchmark's peer rows, in a venv of its own made by the Python that setup
# chose for .venv (any of 3.10-3.13); if it cannot be installed, the benchmark says so in one
# line and prints the rest. PEER_INSTALL=no makes the venv only (the fresh Debian 13 check).
peer: setup  ## PyTorch CPU in .venv-peer, the benchmark's peer
	@test -x .venv-peer/bin/python || \
	    "$$($(PY) -c 'import sys; print(sys._base_executable)')" -m venv .venv-peer
	@$(if $(filter no,$(PEER_INSTALL)),true,.venv-peer/bin/python -c "import torch" 2>/dev/null || \
	    .venv-peer/bin/python -m pip install -q -r requirements-peer.txt || \
	    echo "peer: PyTorch not installed into .venv-peer; the benchmark leaves out its rows")

# Horovod's settings for 2 ranks on this host, one config: make bench-tune CONFIG=config_large
# (a config given as a path, tests/config_tiny.py, is named by its file: bench-tune-tiny.json)
BENCH_TUNE_NAME = $(patsubst config_%,%,$(notdir $(basename $(CONFIG))))
bench-tune: setup data  ## Horovod's settings for 2 ranks on this host, for CONFIG
	$(PY) scripts/bench/tune.py --config $(CONFIG) --data_path $(PTB_DATA_PATH) \
	    --out runs/bench-tune-$(BENCH_TUNE_NAME).json $(BENCH_ARGS)

# A results row of many hours (medium: 39 epochs), in the background; run again to continue it
# from its last checkpoint after a stop. reproduce-status: epoch reached, ETA, logs to results/.
# reproduce-stop: each rank ends its step and the newest checkpoint is kept.
# Its checkpoints go to $(RUNS)/reproduce: where the checkout does not outlive the machine, point
# RUNS at a disk that does (RUNS=/mnt/keep make reproduce ...), the same for every sitting.
# Its logs are copied into $(RESULTS) (results/runs): a run training from a clone of its own
# (the large row's: docs/training.md) reports into the work tree's with RESULTS=<its path>.
# ARGS: --set KEY=VALUE and --change_config, passed to the trainer.
REPRODUCE_RUNS = $(abspath $(RUNS))/reproduce
RESULTS ?= results/runs
# SEED: the trainer's --seed (default 1234); each seed's run has its folders of its own.
REPRODUCE_RUN = --config $(CONFIG) --np $(NP) $(if $(PRECISION),--precision $(PRECISION)) \
	$(if $(SEED),--seed $(SEED))
reproduce: setup data  ## start or continue a results row in the background (RUNS, CONFIG, NP, PRECISION, SEED)
	$(PY) scripts/reproduce.py start $(REPRODUCE_RUN) \
	    --data_path $(PTB_DATA_PATH) --runs_dir $(REPRODUCE_RUNS) --results_dir $(abspath $(RESULTS)) $(ARGS)

reproduce-status:  ## its epoch, perplexity and ETA; copies its logs to results/
	@$(PY) scripts/reproduce.py status $(REPRODUCE_RUN) \
	    --runs_dir $(REPRODUCE_RUNS) --results_dir $(abspath $(RESULTS))

reproduce-stop:  ## stop it after the current step, keeping the newest checkpoint
	@$(PY) scripts/reproduce.py stop $(REPRODUCE_RUN) \
	    --runs_dir $(REPRODUCE_RUNS)

results: setup  ## rebuild README's results table and results/README.md from results/
	$(PY) scripts/results/build.py

# Each config's time per epoch in one process against 2 workers, bounded runs in turns over 3
# rounds (about 25 min on 2 cores), kept in $(RESULTS); on an idle machine only (it refuses
# another; TIMING_ARGS='--force "what runs"' marks the figures as shared). TIMING_ARGS: --configs,
# --rounds, --steps (docs/performance.md). Then `make results` puts them in README's table.
TIMING_ARGS ?=
timing: setup data  ## time/epoch of 1 process and of 2 workers in turns, on an idle machine
	$(PY) scripts/results/timing.py --data_path $(PTB_DATA_PATH) --results $(abspath $(RESULTS)) \
	    $(TIMING_ARGS)

netstudy: setup data  ## what a slower network costs 2 workers (docs/network.md)
	$(PY) scripts/netstudy.py --data_path $(PTB_DATA_PATH)

# GPU=1 setup built up to the device in a fresh Debian 13 root with CUDA 12.4, and a 2-rank run of
# that build on the CPU against the CPU build's (as root; gigabytes of downloads; docs/gpu.md).
gpu-build-check:  ## GPU=1 setup built up to the device in a fresh root (docs/gpu.md)
	scripts/gpu_build_check.sh

# Horovod against tf.distribute, 2 workers, side by side in turns (as root: network namespaces).
compare: setup data  ## Horovod against tf.distribute, 2 workers in turns (as root)
	$(PY) scripts/compare.py --data_path $(PTB_DATA_PATH)

# Faults on a schedule (docs/reliability.md): about 10 minutes of a tiny config under SIGKILL,
# SIGSTOP, SIGTERM, kills during saves and resets, a cut link, a full disk and hosts that leave,
# then the checks; as root (network namespaces, a tmpfs). CHAOS_ARGS="--seed 7 --launcher mpirun"
chaos: setup data  ## faults in a row against the elastic trainer, then the checks (as root)
	$(PY) scripts/chaos.py --data_path $(PTB_DATA_PATH) --results results/studies/chaos $(CHAOS_ARGS)
