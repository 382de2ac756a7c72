"""A model whose every training step sleeps SLOW_STEP_S (3 s), longer than the second Open MPI's
mpirun leaves its ranks between passing on a SIGTERM and its SIGKILL, as a large step on a CPU
is (test_reproduce.py's stop)."""
import time

import tensorflow as tf

from utils.model import build_model

SLOW_STEP_S = 3


def _sleep(x):
    time.sleep(SLOW_STEP_S)
    return x


def build(cfg, vocab_size):
    model = build_model(cfg, vocab_size)
    call = model.call

    def slow_call(inputs, state, training=False, noise_seed=None):
        if training:
            inputs = tf.ensure_shape(tf.numpy_function(_sleep, [inputs], inputs.dtype),
                                     inputs.shape)
        return call(inputs, state, training=training, noise_seed=noise_seed)

    model.call = slow_call
    return model
