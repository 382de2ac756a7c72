# The two commands of the README's quick start:
#   make train   set up, then train the small config with 2 Horovod workers on this host
#   make test    set up, then run the whole test suite
# Offline machines: PTB_DATA_PATH=/path/to/ptb make ...   (a folder with ptb.{train,valid,test}.txt)
PTB_DATA_PATH ?= data/ptb
export PTB_DATA_PATH
CONFIG ?= config_small
NP ?= 2
PY := .venv/bin/python
AS_ROOT := $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
RUN_DIR = runs/$(CONFIG)-$(1)
# A second `make train` continues the first run's checkpoints instead of refusing its folder.
RESUME = $(if $(wildcard $(call RUN_DIR,$(1))/checkpoints/checkpoint),--resume)

.PHONY: train test setup data single bench bench-quick bench-tune results netstudy
train: setup data
	mpirun $(AS_ROOT) -np $(NP) -bind-to none -map-by slot \
	    $(PY) lm_ptb_distributed.py --config $(CONFIG) --data_path $(PTB_DATA_PATH) \
	    --output_dir $(call RUN_DIR,np$(NP)) $(call RESUME,np$(NP))

single: setup data
	$(PY) lm_ptb.py --config $(CONFIG) --data_path $(PTB_DATA_PATH) --output_dir $(call RUN_DIR,single) \
	    $(call RESUME,single)

test: setup data
	$(PY) -m pytest -q

setup:
	scripts/setup.sh

data: setup
	$(PY) -m data.ptb --data_path $(PTB_DATA_PATH)

bench: setup data
	$(PY) scripts/benchmark.py --data_path $(PTB_DATA_PATH)

bench-quick: setup data
	$(PY) scripts/benchmark.py --quick --data_path $(PTB_DATA_PATH)

bench-tune: setup data
	$(PY) scripts/benchmark.py --tune --data_path $(PTB_DATA_PATH) --out runs/bench-tune.json

results: setup
	$(PY) scripts/results.py build

netstudy: setup data
	$(PY) scripts/netstudy.py --data_path $(PTB_DATA_PATH)
