"""Checkpoints at epoch ends: model, optimizer and the number of epochs done."""
import os

import tensorflow as tf

from utils.config import ConfigError


class Checkpoints:
    def __init__(self, output_dir, model, optimizer, keep=3):
        self.epochs_done = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                              epochs_done=self.epochs_done)
        self.folder = os.path.join(output_dir, "checkpoints")
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.folder, max_to_keep=keep)

    def save(self, epochs_done):
        self.epochs_done.assign(epochs_done)
        return self.manager.save(checkpoint_number=epochs_done)

    def restore_latest(self):
        """Restore the newest checkpoint; returns the number of epochs it had finished."""
        path = self.manager.latest_checkpoint
        if path is None:
            raise ConfigError(f"--resume: no checkpoint in {self.folder}; drop --resume to start "
                              "afresh or point --output_dir at the run to continue")
        try:
            self.checkpoint.restore(path).assert_existing_objects_matched()
        except (ValueError, AssertionError, tf.errors.OpError) as e:
            first = str(e).strip().splitlines()[0][:200]
            raise ConfigError(f"--resume: checkpoint {path} does not fit this config ({first}); "
                              "resume with the config it was trained with") from None
        return int(self.epochs_done.numpy())
