# The two commands of the README's quick start:
#   make train   set up, then train the small config with 2 Horovod workers on this host
#   make test    set up, then run the whole test suite
# Offline machines: PTB_DATA_PATH=/path/to/ptb make ...   (a folder with ptb.{train,valid,test}.txt)
# RUNS (default runs) holds the run folders; ARGS adds trainer flags (--set num_epochs=1, say);
# TESTS narrows make test (TESTS="-m smoke": the quick-start check scripts/fresh_machine.sh runs).
# TEST_WORKERS: test files run side by side in this many pytest workers (pytest-xdist; 0: in one
# process). Most tests wait on their processes (timeouts, restarts, daemons) part of the time.
PTB_DATA_PATH ?= data/ptb
export PTB_DATA_PATH
CONFIG ?= config_small
NP ?= 2
# PRECISION=bf16 (or fp32) overrides the config's matmul precision (docs/precision.md); a bf16
# run has a folder of its own (runs/config_small-np2-bf16)
PRECISION ?=
PY := .venv/bin/python
AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
RUNS ?= runs
ARGS ?=
TEST_WORKERS ?= 2
# runs/config_small-np2; a config given as a path (tests/config_tiny.py) is named by its file
RUN_DIR = $(RUNS)/$(notdir $(basename $(CONFIG)))-$(1)$(if $(filter bf16,$(PRECISION)),-bf16)
PRECISION_SET = $(if $(PRECISION),--set "precision='$(PRECISION)'")
# A second `make train` continues the first run instead of refusing its folder, whatever point
# it stopped at (before its first checkpoint, --resume starts afresh and says so).
RESUME = $(if $(wildcard $(call RUN_DIR,$(1))/metrics.jsonl $(call RUN_DIR,$(1))/checkpoints),--resume)

.PHONY: train test setup slurm data single bench bench-quick bench-tune results netstudy compare peer reproduce reproduce-status reproduce-stop venv-tf2.15 gpu-build-check chaos
train: setup data
	mpirun $(AS_ROOT) -np $(NP) -bind-to none -map-by slot \
	    $(PY) lm_ptb_distributed.py --config $(CONFIG) --data_path $(PTB_DATA_PATH) \
	    --output_dir $(call RUN_DIR,np$(NP)) $(call RESUME,np$(NP)) $(PRECISION_SET) $(ARGS)

single: setup data
	$(PY) lm_ptb.py --config $(CONFIG) --data_path $(PTB_DATA_PATH) --output_dir $(call RUN_DIR,single) \
	    $(call RESUME,single) $(PRECISION_SET) $(ARGS)

test: setup data slurm
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(TESTS)

setup:
	scripts/setup.sh

slurm:
	scripts/setup_slurm.sh

data: setup
	$(PY) -m data.ptb --data_path $(PTB_DATA_PATH)

bench: setup data peer
	$(PY) scripts/benchmark.py --data_path $(PTB_DATA_PATH) $(if $(AGAINST),--against $(AGAINST))

# TensorFlow 2.15's stack (before 2.21) in .venv-tf2.15, Horovod built and patched as for .venv:
# the benchmark's comparison, `make bench AGAINST=.venv-tf2.15/bin/python`.
venv-tf2.15:
	VENV=.venv-tf2.15 PYTHON=python3.11 REQUIREMENTS=scripts/requirements-tf2.15.txt \
	    NO_DEPS_REQUIREMENTS= scripts/setup.sh

bench-quick: setup data peer
	$(PY) scripts/benchmark.py --quick --data_path $(PTB_DATA_PATH) $(if $(AGAINST),--against $(AGAINST))

# PyTorch for the benchmark's peer rows, in a venv of its own made by the Python that setup
# chose for .venv (any of 3.10-3.13); if it cannot be installed, the benchmark says so in one
# line and prints the rest. PEER_INSTALL=no makes the venv only (the fresh Debian 13 check).
peer: setup
	@test -x .venv-peer/bin/python || \
	    "$$($(PY) -c 'import sys; print(sys._base_executable)')" -m venv .venv-peer
	@$(if $(filter no,$(PEER_INSTALL)),true,.venv-peer/bin/python -c "import torch" 2>/dev/null || \
	    .venv-peer/bin/python -m pip install -q -r requirements-peer.txt || \
	    echo "peer: PyTorch not installed into .venv-peer; the benchmark leaves out its rows")

# Horovod's settings for 2 ranks on this host, one config: make bench-tune CONFIG=config_large
bench-tune: setup data
	$(PY) scripts/benchmark.py --tune $(patsubst config_%,%,$(CONFIG)) --data_path $(PTB_DATA_PATH) \
	    --out runs/bench-tune-$(patsubst config_%,%,$(CONFIG)).json

# A results row of many hours (medium: 39 epochs), in the background; run again to continue it
# from its last checkpoint after a stop. reproduce-status: epoch reached, ETA, logs to results/.
# reproduce-stop: each rank ends its step and the newest checkpoint is kept.
# Its checkpoints go to $(RUNS)/reproduce: where the checkout does not outlive the machine, point
# RUNS at a disk that does (RUNS=/mnt/keep make reproduce ...), the same for every sitting.
REPRODUCE_RUNS = $(abspath $(RUNS))/reproduce
reproduce: setup data
	$(PY) scripts/reproduce.py start --config $(CONFIG) --np $(NP) $(if $(PRECISION),--precision $(PRECISION)) \
	    --data_path $(PTB_DATA_PATH) --runs_dir $(REPRODUCE_RUNS)

reproduce-status:
	@$(PY) scripts/reproduce.py status --config $(CONFIG) --np $(NP) $(if $(PRECISION),--precision $(PRECISION)) \
	    --runs_dir $(REPRODUCE_RUNS)

reproduce-stop:
	@$(PY) scripts/reproduce.py stop --config $(CONFIG) --np $(NP) $(if $(PRECISION),--precision $(PRECISION)) \
	    --runs_dir $(REPRODUCE_RUNS)

results: setup
	$(PY) scripts/results.py build

netstudy: setup data
	$(PY) scripts/netstudy.py --data_path $(PTB_DATA_PATH)

# GPU=1 setup built up to the device in a fresh Debian 13 root with CUDA 12.4, and a 2-rank run of
# that build on the CPU against the CPU build's (as root; gigabytes of downloads; docs/gpu.md).
gpu-build-check:
	scripts/gpu_build_check.sh

# Horovod against tf.distribute, 2 workers, side by side in turns (as root: network namespaces).
compare: setup data
	$(PY) scripts/compare.py --data_path $(PTB_DATA_PATH)

# Faults on a schedule (docs/reliability.md): about 10 minutes of a tiny config under SIGKILL,
# SIGSTOP, SIGTERM, kills during saves and resets, a cut link, a full disk and hosts that leave,
# then the checks; as root (network namespaces, a tmpfs). CHAOS_ARGS="--seed 7 --launcher mpirun"
chaos: setup data
	$(PY) scripts/chaos.py --data_path $(PTB_DATA_PATH) --results results/studies/chaos $(CHAOS_ARGS)
