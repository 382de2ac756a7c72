"""Runs a trainer that waits at a given point of its training for the test to act on it:
`python tests/pause_at.py FOLDER POINT SCRIPT ARGS...`, under the trainer's own launcher. A test
that stops a run sends its signal while the run waits, so the signal lands at that point every
time, not wherever the run had got to when a poll of its files saw the point pass (a poll that
came 15 steps late once failed a test on a loaded machine).

POINT is one of
    progress:E:S  after the progress line of epoch E step S (every process: each logs it)
    save:E:S      after the checkpoint S steps into epoch E (every process: each takes part)
    save:E        after the checkpoint of the end of epoch E (the chief, which alone writes it)
    validate:E    in the first window of the validation after that checkpoint (the chief)

There each process writes FOLDER/paused-RANK (its pid) and waits until a stop signal arrives, or
until FOLDER/go exists (the test froze or killed a peer: this process goes on). A SIGINT or
SIGTERM stops the trainer there by its own handler, as at any other moment: at once between the
steps, at the end of the window in a validation (the trainer holds signals during a window); a
SIGKILL or SIGSTOP acts there. A process waits once, and not at all once FOLDER/go exists (a
worker that joins later goes by). The trainer runs unchanged but for the wait.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  the Keras before TensorFlow, as every script does
utils.import_tensorflow()  # as the trainer it runs starts it, before the modules below
from utils import checkpoints, logs, loop, signals  # noqa: E402
from tests.helpers import launcher_rank, run_runner  # noqa: E402

WAIT_S = 300  # a test that never acts: the run ends in one line instead of waiting for ever
USAGE = "usage: python tests/pause_at.py FOLDER POINT SCRIPT [ARGS...]"
POINTS = {"progress": (2,), "save": (1, 2), "validate": (1,)}  # how many numbers each takes


def parse(point):
    """("save", 3, 15) for save:3:15."""
    kind, *numbers = point.split(":")
    if len(numbers) not in POINTS.get(kind, ()) or not all(n.isdigit() for n in numbers):
        sys.exit(f"tests/pause_at.py: unknown point {point!r}\n{USAGE}")
    return (kind, *map(int, numbers))


def waiter(folder):
    """The wait at the point, once."""
    go = os.path.join(folder, "go")
    waited = []

    def wait():
        if waited or os.path.exists(go):
            return
        waited.append(True)
        marker = os.path.join(folder, f"paused-{launcher_rank()}")
        with open(marker + ".tmp", "w") as f:
            f.write(f"{os.getpid()}\n")
        os.replace(marker + ".tmp", marker)  # whole when it appears
        deadline = time.monotonic() + WAIT_S
        # Between the steps the handler raises out of the sleep; where the trainer holds
        # signals (a validation window) it records the signal, which this loop sees.
        while not os.path.exists(go) and signals.received() is None:
            if time.monotonic() > deadline:
                sys.exit(f"error: tests/pause_at.py: nothing came in {WAIT_S} s at the pause")
            time.sleep(0.02)
    return wait


def after_progress(reached):
    progress = logs.RunLog.progress

    def logged(log, epoch, step, *args, **kwargs):
        progress(log, epoch, step, *args, **kwargs)
        reached("progress", epoch + 1, step)
    logs.RunLog.progress = logged


def after_saves(reached, epochs_saved):
    """After the checkpoint of an epoch's end (Checkpoints.save, the chief's) and after one
    inside an epoch (the `save` every process's train_epoch calls); epochs_saved: the epoch
    ends this process has saved, in order."""
    save, train_epoch = checkpoints.Checkpoints.save, loop.train_epoch

    def saved(self, epochs_done):
        path = save(self, epochs_done)
        epochs_saved.append(epochs_done)
        reached("save", epochs_done)
        return path

    def train_epoch_saving(*args, save=None, **kwargs):
        def saving(epoch, done, *rest):
            result = save(epoch, done, *rest)
            reached("save", epoch + 1, done)
            return result
        return train_epoch(*args, save=save and saving, **kwargs)
    checkpoints.Checkpoints.save, loop.train_epoch = saved, train_epoch_saving


def in_validation(reached, epochs_saved):
    """In the first window of a validation (the test's windows are eval_batch_size rows)."""
    evaluate = loop.evaluate

    def evaluate_pausing(eval_step, model, x, y, cfg, *args, **kwargs):
        if x.shape[1] != cfg["eval_batch_size"] and epochs_saved:
            def step(*step_args):
                reached("validate", epochs_saved[-1])  # waits once, at the first window
                return eval_step(*step_args)
            return evaluate(step, model, x, y, cfg, *args, **kwargs)
        return evaluate(eval_step, model, x, y, cfg, *args, **kwargs)
    loop.evaluate = evaluate_pausing


def setup(folder, point):
    os.makedirs(folder, exist_ok=True)
    target, wait, epochs_saved = parse(point), waiter(folder), []

    def reached(*where):
        if where == target:
            wait()
    after_progress(reached)
    after_saves(reached, epochs_saved)
    in_validation(reached, epochs_saved)


if __name__ == "__main__":
    run_runner(setup, USAGE, args=2)
