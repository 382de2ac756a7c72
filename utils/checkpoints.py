"""Checkpoints at epoch ends and, with checkpoint_every, inside epochs; and resume.

A checkpoint holds the model, the optimizer with its step counter (which also seeds the dropout
masks), the epochs done, the config it was trained with and, for one saved inside an epoch, the
position in it: steps done, the epoch's summed training loss so far and the LSTM state of every
row of the global batch.
"""
import glob
import json
import os
import re
import shutil
import sys
from typing import NamedTuple

import tensorflow as tf

from data import ptb
from utils import config
from utils.errors import ConfigError, OutputError, first_line, os_reason
from utils.logs import PREFIX, parse_line
from utils.optimizers import KERAS3
from utils.pointers import (IN_EPOCH, checkpoint_files, checkpoint_folder, listed,
                            newest_checkpoint, pointer_damage, write_pointer)
from utils.signals import signals_deferred

VOCAB_FILE = "vocab.txt"  # beside the checkpoints: the words of the model's ids
DATA_PATH_FILE = "data_path.txt"  # the corpus folder it last trained on, for evaluate.py
RUN_CONFIG_KEY = "run_config/.ATTRIBUTES/VARIABLE_VALUE"  # the config, as JSON, in a checkpoint
# The optimizer's step counter, a key of every checkpoint, named apart by each Keras
STEP_KEYS = {"3": "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
             "2": "optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"}


def refuse_other_keras(reader, path):
    """One line when the checkpoint was written under the other Keras: Keras 3 and tf-keras name
    the model's and the optimizer's variables apart, so it would not load (or not all of it)."""
    ours = "3" if KERAS3 else "2"
    for keras, key in STEP_KEYS.items():
        if keras != ours and reader.has_tensor(key):
            raise ConfigError(f"checkpoint {path} was written by code on "
                              f"{'Keras 3' if keras == '3' else 'tf-keras (Keras 2)'}, and this "
                              f"process runs {'Keras 3' if KERAS3 else 'tf-keras'}, which names "
                              f"the variables apart; run with PTB_KERAS={keras} to resume or "
                              "evaluate it (docs/keras3.md)")


class Position(NamedTuple):
    """Where a run resumes: after `epochs_done` epochs and `step` steps of the next one, with
    that epoch's summed training loss so far and the LSTM state of the global batch (a list of
    [batch_size, ...] arrays, tf.nest.flatten order; None at an epoch start). `finished`: the
    run has trained and tested all its epochs; nothing is left to do."""
    epochs_done: int
    step: int = 0
    loss_sum: float = 0.0
    state: list = None
    finished: bool = False

    def rows_of(self, rank, size):
        """This position for worker `rank` of `size`: its rows [rank*B/size, (rank+1)*B/size)
        of the global batch's state, whatever the number of workers that saved it."""
        if self.state is None:
            return self
        rows = len(self.state[0]) // size
        return self._replace(state=[a[rank * rows:(rank + 1) * rows] for a in self.state])


class _InEpoch(tf.Module):
    def __init__(self, state_template):
        super().__init__()
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        self.state = [tf.Variable(tf.zeros_like(t), trainable=False)
                      for t in tf.nest.flatten(state_template)]


class Checkpoints:
    def __init__(self, output_dir, model, optimizer, corpus, cfg, seed=None, keep=3):
        """corpus: a ptb.Corpus (its vocabulary and folder are kept with the run); cfg: the
        resolved config and seed: --seed (which draws the weights and the dropout masks), both
        saved in every checkpoint and checked at a resume."""
        self.output_dir = output_dir
        self.cfg = cfg if seed is None else dict(cfg, seed=seed)
        self.vocab = corpus.vocab
        self.data_path = corpus.path
        self.vocab_path = os.path.join(output_dir, VOCAB_FILE)
        self.optimizer = optimizer
        self.epochs_done = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.in_epoch = _InEpoch(model.zero_state(cfg["batch_size"]))  # the global batch's
        # never restored, always this run's: a resume reads the saved one (saved_config)
        self.run_config = tf.Variable(json.dumps(self.cfg, sort_keys=True), dtype=tf.string,
                                      trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                              epochs_done=self.epochs_done,
                                              in_epoch=self.in_epoch, run_config=self.run_config)
        # Restored apart, so that a checkpoint written before checkpoint_every existed (without
        # in_epoch) still loads, and must match in everything else.
        self._core = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                         epochs_done=self.epochs_done)
        self.folder = checkpoint_folder(output_dir)
        self.keep = keep
        self.reread()
        self.restored = self.restored_config = None  # a resume's checkpoint and its config

    def reread(self):
        """The lists of checkpoints on disk, read anew. Each manager reads its folder's list once
        and writes it back at every save: a process that starts saving later (an elastic worker
        made rank 0) must read it first, or it drops the checkpoints saved meanwhile from the
        list, and an older one could no longer stand in for a damaged newest one. A manager
        whose pointer file is damaged is not made (TensorFlow's would raise, or drop the list):
        only the chief saves, after its resume has written the pointer anew (start)."""
        self.manager, self.in_epoch_manager = (
            None if pointer_damage(folder) else
            tf.train.CheckpointManager(self.checkpoint, folder, max_to_keep=keep)
            for folder, keep in ((self.folder, self.keep),
                                 (os.path.join(self.folder, IN_EPOCH), 2)))

    def start(self, resume, change_config=False):
        """Epochs already done: restored with --resume, which starts afresh where no checkpoint
        was saved yet (a run stopped in its first epoch, or never started), so that the same
        command continues a run whatever point it stopped at; without --resume, 0, refusing to
        mix with a past run. Says in one line which it did. A resume under another config than
        the checkpoint's says what changed, and refuses what would make it another run unless
        change_config (config.check_resume); a finished run says so and trains nothing. A
        resume with no checkpoint left of epochs the log records refuses, keeping the log."""
        if resume:
            if os.path.exists(self.vocab_path) and ptb.read_vocab(self.vocab_path) != self.vocab:
                raise ConfigError(f"--resume: the vocabulary of --data_path differs from the "
                                  f"run's {self.vocab_path}; resume with the data it was "
                                  "trained on")
            candidates = newest_first(self.folder)
            if not candidates:
                self._refuse_dropping_logged_epochs()
                print(f"{PREFIX} --resume: no checkpoint in {self.folder} yet, so this run "
                      "starts afresh", flush=True)
                # a damaged pointer beside no checkpoint kept its manager from being made: the
                # first save would fail after an epoch's training
                self._rewrite_damaged_pointers()
                os.makedirs(self.output_dir, exist_ok=True)
                self._record_data_path()
                return Position(0)
            position, changed = self.restore_latest(candidates, change_config)
            self._rewrite_damaged_pointers()
            self._record_data_path()  # the folder it trains on now, if the corpus moved
            if changed:
                print(f"{PREFIX} {changed}", flush=True)
            if position.finished:
                return position
            where = f"epoch {position.epochs_done + 1} step {position.step}" if position.step \
                else f"the end of epoch {position.epochs_done}"
            print(f"{PREFIX} --resume: continuing from {self.restored} ({where})", flush=True)
            return position
        earlier = [p for p in (self.folder, os.path.join(self.output_dir, "metrics.jsonl"))
                   if os.path.exists(p)]
        if earlier:
            raise ConfigError(f"--output_dir {self.output_dir} holds an earlier run "
                              f"({', '.join(os.path.basename(p) for p in earlier)}); pass --resume "
                              "to continue it, or choose another --output_dir")
        # The run's folder from here on: a save inside the first epoch may come before the
        # first line of the log, which used to make the folder.
        os.makedirs(self.output_dir, exist_ok=True)
        self._record_data_path()
        return Position(0)

    def saved_config(self, reader):
        """The config a checkpoint (its tf.train.load_checkpoint reader) was trained with: its
        own, or for one saved before checkpoints held it, the newest of the run's metrics.jsonl
        ({} if neither is there). Raises one of UNREADABLE where the checkpoint is damaged."""
        if reader.has_tensor(RUN_CONFIG_KEY):
            return json.loads(reader.get_tensor(RUN_CONFIG_KEY))
        logged = [e for e in self._events() if "config" in e]
        return {k: v for k, v in logged[-1]["config"].items() if k != "name"} if logged else {}

    def _refuse_dropping_logged_epochs(self):
        """A resume that finds no checkpoint starts afresh, and its log rewritten from epoch 0
        would drop what it records: refused where that is a finished epoch (the checkpoints were
        deleted, or the folder copied without them), so the earlier run's record is kept. The
        progress lines of a first epoch stopped before its first checkpoint are dropped, as
        that epoch is trained again."""
        done = [e["epoch"] for e in self._events() if e.get("event") in ("epoch", "test")]
        if done:
            log = os.path.join(self.output_dir, "metrics.jsonl")
            raise ConfigError(f"--resume: no checkpoint in {self.folder}, but {log} records "
                              f"{max(done)} epoch{'s' * (max(done) != 1)} of an earlier run, "
                              "which a start afresh would overwrite; restore its checkpoints to "
                              "continue it, or move metrics.jsonl aside (or choose another "
                              "--output_dir) to start a new run")

    def _rewrite_damaged_pointers(self):
        """After a resume that read the checkpoints by their files (newest_first), their pointer
        files written anew, listing them: TensorFlow's managers read them to save, and each
        later reader finds the checkpoints again."""
        folders = [f for f in (self.folder, os.path.join(self.folder, IN_EPOCH))
                   if pointer_damage(f)]
        for folder in folders:
            try:
                write_pointer(folder, checkpoint_files(folder))
            except OSError as e:
                raise OutputError(f"cannot write the pointer file in {folder} ({os_reason(e)}); "
                                  "make sure the folder is writable, then rerun with --resume") \
                    from None
        if folders:
            self.reread()

    def _events(self):
        try:
            # a byte that is not UTF-8 spoils its line alone, as a line cut short does
            with open(os.path.join(self.output_dir, "metrics.jsonl"), encoding="utf-8",
                      errors="replace") as f:
                return [e for e in map(parse_line, f) if e]
        except OSError:
            return []

    def _check_schedule(self, position):
        """A resume's num_epochs against the epochs done: fewer is refused, as many is the end
        (finished if the test was logged, else only the test is left)."""
        done, wanted = position.epochs_done, self.cfg["num_epochs"]
        if done > wanted or done == wanted and position.step:
            raise ConfigError(f"--resume: the run has trained {done} epochs"
                              f"{f' and {position.step} steps' if position.step else ''}, more "
                              f"than num_epochs={wanted}; resume with num_epochs="
                              f"{done + bool(position.step)} or more, or evaluate it as it is "
                              "(evaluate.py perplexity)")
        # the test of the model resumed from: one of a later epoch (its checkpoint deleted or
        # damaged since) scored another model
        tests = [e for e in self._events() if e.get("event") == "test" and e.get("epoch") == done]
        if done == wanted and tests:
            print(f"{PREFIX} --resume: the run in {self.output_dir} is finished: {done} epoch{'s' * (done != 1)}, "
                  f"test ppl {tests[-1]['test_ppl']:.2f}; to train it further give a larger "
                  "num_epochs (--set num_epochs=N), or start a new run in another --output_dir",
                  flush=True)
            return position._replace(finished=True)
        return position

    def _record_data_path(self):
        try:
            ptb.write_whole(os.path.join(self.output_dir, DATA_PATH_FILE), self.data_path + "\n")
        except OSError as e:
            raise OutputError(f"cannot write in --output_dir {self.output_dir} ({os_reason(e)}); "
                              "make sure the folder is writable, or choose another") from None

    def save(self, epochs_done):
        """The checkpoint of an epoch end, numbered by the epochs done."""
        self.epochs_done.assign(epochs_done)
        self.in_epoch.step.assign(0)
        return self._write(self.manager, epochs_done, f"checkpoint {epochs_done}")

    def save_in_epoch(self, epochs_done, step, loss_sum, state):
        """A checkpoint `step` steps into the epoch after `epochs_done`, numbered by the
        optimizer's step; state: the LSTM state of the global batch (any nesting)."""
        self.epochs_done.assign(epochs_done)
        self.in_epoch.step.assign(step)
        self.in_epoch.loss_sum.assign(loss_sum)
        for variable, value in zip(self.in_epoch.state, tf.nest.flatten(state)):
            variable.assign(value)
        number = int(self.optimizer.iterations.numpy())
        return self._write(self.in_epoch_manager, number,
                           f"checkpoint of epoch {epochs_done + 1} step {step}")

    def _write(self, manager, number, what):
        """TensorFlow writes the files first and moves the `checkpoint` pointer last, and
        signals wait until it is done, so the latest one is always whole."""
        with signals_deferred():
            self._remove_partial()
            try:
                if not os.path.exists(self.vocab_path):
                    ptb.write_vocab(self.vocab_path, self.vocab)
                return manager.save(checkpoint_number=number)
            except (OSError, tf.errors.OpError) as e:  # no space, quota, I/O error, read-only
                self._remove_partial()
                kept = newest_checkpoint(self.folder)  # of either kind: an epoch's or a step's
                kept = (f"the newest complete checkpoint, {kept}, is kept" if kept else
                        "no earlier checkpoint exists")
                reason = os_reason(e)
                fix = ("free space" if "space" in reason or "quota" in reason.lower() else
                       "make sure the folder exists and is writable")
                raise OutputError(f"cannot write {what} in {self.folder} ({reason}); {kept}; "
                                  f"{fix}, then rerun with --resume") from None

    def _remove_partial(self):
        """Drop temp files of a save that a SIGKILL interrupted (never the pointer's target)."""
        for folder in (self.folder, os.path.join(self.folder, IN_EPOCH)):
            for path in glob.glob(os.path.join(folder, "*_temp*")):
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    def restore_latest(self, candidates, change_config=False):
        """Restore the newest of the checkpoints `candidates` (newest_first) that loads; returns
        its Position and the line of what changed in the config since (config.check_resume,
        None if nothing did), and keeps its path and config (restored, restored_config). A
        damaged one (a file cut short or overwritten, say) is named in a warning and skipped for
        the one before it: every read of a checkpoint is in this one loop, and every check of
        the one read (its Keras and fp16's loss scale before the restore; the config and the
        schedule after it), so that they are made on the one restored, and a refusal comes
        after "reading it instead", never after "resuming from it". One saved for another model
        size stops with the config to use."""
        damaged = []
        for path in candidates:  # newest first
            try:
                reader = tf.train.load_checkpoint(path)
                refuse_other_keras(reader, path)
                saved = self.saved_config(reader)
                config.check_loss_scaling_kept(saved, self.cfg)
                # the in-epoch values are read just below, not by _core: no warning about them
                self._core.restore(path).assert_existing_objects_matched().expect_partial()
                tf.train.Checkpoint(in_epoch=self.in_epoch).restore(path).expect_partial()
                changed = config.check_resume(saved, self.cfg, change_config)
                position = self._check_schedule(self.position(path))
            except ConfigError:
                warn_damaged(damaged, f"reading {path} instead")
                raise
            except (ValueError, AssertionError) as e:
                warn_damaged(damaged, f"reading {path} instead")
                # The half-matched checkpoint object would warn about every unrestored value.
                tf.get_logger().setLevel("ERROR")
                raise ConfigError(f"--resume: checkpoint {path} does not fit this config "
                                  f"({first_line(e)}); resume with the config it was trained "
                                  "with") from None
            except UNREADABLE as e:  # damaged: try the one before
                damaged.append((path, first_line(e)))
                continue
            warn_damaged(damaged, f"resuming from {path}")
            self.restored, self.restored_config = path, saved
            return position, changed
        raise ConfigError(f"--resume: no checkpoint in {self.folder} loads (damaged: "
                          f"{', '.join(os.path.basename(p) for p, _ in damaged)}); start afresh "
                          "in another --output_dir or "
                          "restore the files from a backup")

    def position(self, path):
        epochs = int(self.epochs_done.numpy())
        if os.path.dirname(path) != os.path.join(self.folder, IN_EPOCH):
            return Position(epochs)
        return Position(epochs, int(self.in_epoch.step.numpy()),
                        float(self.in_epoch.loss_sum.numpy()),
                        [v.numpy() for v in self.in_epoch.state])


# What reading a damaged checkpoint raises (a data file cut short: IndexError, "Read less bytes
# than requested")
UNREADABLE = (IndexError, tf.errors.OpError)
EPOCHS_KEY = "epochs_done/.ATTRIBUTES/VARIABLE_VALUE"
IN_EPOCH_STEP_KEY = "in_epoch/step/.ATTRIBUTES/VARIABLE_VALUE"


def newest_first(folder):
    """The run's checkpoints in `folder` (its epoch ends) and in IN_EPOCH there (its saves inside
    an epoch), as their pointer files list them, the newest first: the one order of "newest"
    for a resume and for evaluate.py. Newest is furthest in the training: the epochs done, then
    the steps into the next epoch, as each checkpoint records them; not the files' times, which
    a copy of the run folder changes. One that cannot be read (damaged) keeps its place by its
    name: an epoch end is numbered by its epochs done, a save inside an epoch by the optimizer's
    step, which the epoch's steps (read from a checkpoint that has them) turn into a place."""
    ends = listed(folder)
    inside = listed(os.path.join(folder, IN_EPOCH))
    recorded = {path: _position(path) for path in ends + inside}
    steps = _steps_per_epoch(recorded)

    def where(path):
        if recorded[path]:
            return recorded[path][:2]
        number = _number(path)
        if path in ends:
            return number, 0
        return divmod(number, steps) if steps else (0, number)
    return sorted(ends + inside, key=where, reverse=True)


def _number(path):
    """N of a checkpoint named ckpt-N (0 for another name)."""
    number = re.search(r"-(\d+)$", path)
    return int(number.group(1)) if number else 0


# The optimizer's own step count in a checkpoint: a LossScaleOptimizer's (fp16) is its inner
# optimizer's, which counts the steps it took (a skipped step is not one)
STEP_COUNTS = ("optimizer/inner_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE",
               *STEP_KEYS.values())


def _position(path):
    """(epochs done, steps into the next epoch, the optimizer's step count or None) that the
    checkpoint records; None if it cannot be read."""
    try:
        reader = tf.train.load_checkpoint(path)
        into = int(reader.get_tensor(IN_EPOCH_STEP_KEY)) \
            if reader.has_tensor(IN_EPOCH_STEP_KEY) else 0
        key = next((k for k in STEP_COUNTS if reader.has_tensor(k)), None)
        return (int(reader.get_tensor(EPOCHS_KEY)), into,
                int(reader.get_tensor(key)) if key else None)
    except (*UNREADABLE, ValueError):
        return None


def _steps_per_epoch(recorded):
    """An epoch's training steps, from a checkpoint that records them: its optimizer step count
    less its steps into the epoch, over its epochs done; None if none does."""
    for position in recorded.values():
        if position and position[0] and position[2] is not None:
            return (position[2] - position[1]) // position[0]
    return None


def warn_damaged(damaged, instead):
    """A line for each damaged checkpoint newer than the one taken, saying what is done instead."""
    for path, why in damaged:
        print(f"warning: checkpoint {path} is damaged ({why}); {instead}", file=sys.stderr,
              flush=True)
