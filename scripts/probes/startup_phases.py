"""The start-up of lm_ptb_distributed.py timed phase by phase in each rank: seconds in
download_on_chief, load_corpus, check_ranks_agree, build, distributed_optimizer and
resume_together, then from after the imports to the first epoch, where it exits. From the repo:
  mpirun --allow-run-as-root --oversubscribe -bind-to none -np 2 .venv/bin/python \\
      scripts/probes/startup_phases.py --config tests/config_tiny.py \\
      --data_path ../shared/data/ptb --output_dir /tmp/su"""
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
import horovod_steps  # noqa: E402
import lm_ptb_distributed  # noqa: E402
from data import ptb  # noqa: E402
from utils import training  # noqa: E402

START = time.monotonic()
PHASES = []


def timed(module, name, label=None):
    inner = getattr(module, name)

    def wrapper(*args, **kwargs):
        began = time.monotonic()
        try:
            return inner(*args, **kwargs)
        finally:
            PHASES.append((label or name, round(time.monotonic() - began, 2)))
    setattr(module, name, wrapper)


def first_epoch(*args, **kwargs):
    PHASES.append(("to the first epoch", round(time.monotonic() - START, 2)))
    print(PHASES, file=sys.stderr, flush=True)
    raise SystemExit(0)


for step in ("download_on_chief", "check_ranks_agree", "distributed_optimizer",
             "resume_together"):
    timed(horovod_steps, step)
timed(ptb, "load_corpus")
timed(lm_ptb_distributed, "build")
training.train_epoch = first_epoch
lm_ptb_distributed.main(sys.argv[1:])
