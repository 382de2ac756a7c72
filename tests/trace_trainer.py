"""Runs a trainer and writes, one line each, the epoch-loop events of this process in the order
they happen: `python tests/trace_trainer.py TRACE_FILE SCRIPT ARGS...`, under the trainer's own
launcher. The events: `train N` (epoch N's steps), `save N` (the checkpoint of N epochs),
`validate`, `test`, `log epoch N`, `log test` and `wait` (a wait for rank 0's or the others'
checkpoint and evaluation, as the step watchdog is told of it). Each line starts with this
process's rank as its launcher numbers it; the trainer runs unchanged but for the recording.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  the Keras before TensorFlow, as every script does
utils.import_tensorflow()  # as the trainer it runs starts it, before the modules below
from utils import checkpoints, logs, loop, watchdog  # noqa: E402
from tests.helpers import launcher_rank, run_runner  # noqa: E402


def recorder(path):
    def record(event):
        with open(path, "a") as f:
            f.write(f"{launcher_rank()} {event}\n")
    return record


def trace(record):
    """Wrap the functions and methods the trainers' loops call, each recording its event."""
    def around(owner, name, event):
        original = getattr(owner, name)

        def traced(*args, **kwargs):
            said = event(*args, **kwargs)
            if said:
                record(said)
            return original(*args, **kwargs)
        setattr(owner, name, traced)

    around(loop, "train_epoch", lambda step, model, x, y, epoch, *a, **k: f"train {epoch + 1}")
    # the test reads eval_batch_size streams (1), a validation the training layout's rows
    around(loop, "evaluate", lambda step, model, x, y, cfg, *a, **k:
           "test" if x.shape[1] == cfg["eval_batch_size"] else "validate")
    around(checkpoints.Checkpoints, "save", lambda self, epochs: f"save {epochs}")
    around(logs.RunLog, "epoch", lambda self, epoch, *a, **k: f"log epoch {epoch + 1}")
    around(logs.RunLog, "test", lambda self, *a, **k: "log test")
    around(watchdog.Watchdog, "expect", lambda self, what, *a, **k:
           "wait" if what.startswith("the wait for") else None)


if __name__ == "__main__":
    run_runner(lambda path: trace(recorder(path)),
               "usage: python tests/trace_trainer.py TRACE_FILE SCRIPT [ARGS...]")
