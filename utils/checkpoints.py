"""Checkpoints at epoch ends (model, optimizer with its step counter, epochs done), and resume."""
import glob
import os
import shutil
import sys

import tensorflow as tf

from data import ptb

from utils.cli import signals_deferred
from utils.config import ConfigError
from utils.logs import OutputError, first_line, os_reason


VOCAB_FILE = "vocab.txt"  # beside the checkpoints: the words of the model's ids


class Checkpoints:
    def __init__(self, output_dir, model, optimizer, vocab, keep=3):
        self.output_dir = output_dir
        self.vocab = vocab
        self.vocab_path = os.path.join(output_dir, VOCAB_FILE)
        self.epochs_done = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                              epochs_done=self.epochs_done)
        self.folder = os.path.join(output_dir, "checkpoints")
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.folder, max_to_keep=keep)

    def start(self, resume):
        """Epochs already done: restored with --resume; else 0, refusing to mix with a past run."""
        if resume:
            if os.path.exists(self.vocab_path) and ptb.read_vocab(self.vocab_path) != self.vocab:
                raise ConfigError(f"--resume: the vocabulary of --data_path differs from the "
                                  f"run's {self.vocab_path}; resume with the data it was "
                                  "trained on")
            return self.restore_latest()
        earlier = [p for p in (self.folder, os.path.join(self.output_dir, "metrics.jsonl"))
                   if os.path.exists(p)]
        if earlier:
            raise ConfigError(f"--output_dir {self.output_dir} holds an earlier run "
                              f"({', '.join(os.path.basename(p) for p in earlier)}); pass --resume "
                              "to continue it, or choose another --output_dir")
        return 0

    def save(self, epochs_done):
        """Write a checkpoint. TensorFlow writes the files first and moves the `checkpoint`
        pointer last, and signals wait until it is done, so the latest one is always whole."""
        with signals_deferred():
            self._remove_partial()
            try:
                if not os.path.exists(self.vocab_path):
                    ptb.write_vocab(self.vocab_path, self.vocab)
                self.epochs_done.assign(epochs_done)
                return self.manager.save(checkpoint_number=epochs_done)
            except (OSError, tf.errors.OpError) as e:  # no space, quota, I/O error, read-only
                self._remove_partial()
                kept = self.manager.latest_checkpoint
                kept = (f"the newest complete checkpoint, {kept}, is kept" if kept else
                        "no earlier checkpoint exists")
                raise OutputError(f"cannot write checkpoint {epochs_done} in {self.folder} "
                                  f"({os_reason(e)}); {kept}; free space (or make the folder "
                                  "writable), then rerun with --resume") from None

    def _remove_partial(self):
        """Drop temp files of a save that a SIGKILL interrupted (never the pointer's target)."""
        for path in glob.glob(os.path.join(self.folder, "*_temp*")):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

    def restore_latest(self):
        """Restore the newest checkpoint that loads; returns the number of epochs it had
        finished. A damaged one (a truncated file, say) is named in a warning and skipped for
        the one before it; one saved for another model size stops with the config to use."""
        if self.manager.latest_checkpoint is None:
            raise ConfigError(f"--resume: no checkpoint in {self.folder}; drop --resume to start "
                              "afresh or point --output_dir at the run to continue")
        damaged = []
        for path in reversed(self.manager.checkpoints):  # newest first
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except (ValueError, AssertionError) as e:
                # The half-matched checkpoint object would warn about every unrestored value.
                tf.get_logger().setLevel("ERROR")
                raise ConfigError(f"--resume: checkpoint {path} does not fit this config "
                                  f"({first_line(e)}); resume with the config it was trained "
                                  "with") from None
            except (IndexError, tf.errors.OpError) as e:  # unreadable: try the one before
                damaged.append((path, first_line(e)))
                continue
            for bad, why in damaged:
                print(f"warning: checkpoint {bad} is damaged ({why}); resuming from {path}",
                      file=sys.stderr, flush=True)
            return int(self.epochs_done.numpy())
        raise ConfigError(f"--resume: no checkpoint in {self.folder} loads (damaged: "
                          f"{', '.join(os.path.basename(p) for p, _ in damaged)}); start afresh "
                          "in another --output_dir or "
                          "restore the files from a backup")
