"""Models that wait without computing, for the tests that must land a signal in a long step or
a long validation: `build`'s every training step sleeps SLOW_STEP_S (3 s), longer than the
second Open MPI's mpirun leaves its ranks between passing on a SIGTERM and its SIGKILL, as a
large step on a CPU is (test_reproduce.py's stop); `build_slow_eval`'s every evaluation window
sleeps SLOW_WINDOW_S, so a validation of 40 windows lasts 4 s at no CPU cost (test_resume.py's
stops during validation once ran 8,000 real windows for that: 228 CPU s in one test)."""
import time

import tensorflow as tf

from utils.model import build_model

SLOW_STEP_S = 3
SLOW_WINDOW_S = 0.1


def _slowed(cfg, vocab_size, in_training, seconds):
    model = build_model(cfg, vocab_size)
    call = model.call

    def sleep(x):
        time.sleep(seconds)
        return x

    def slow_call(inputs, state, training=False, noise_seed=None):
        if training == in_training:
            inputs = tf.ensure_shape(tf.numpy_function(sleep, [inputs], inputs.dtype),
                                     inputs.shape)
        return call(inputs, state, training=training, noise_seed=noise_seed)

    model.call = slow_call
    return model


def build(cfg, vocab_size):
    return _slowed(cfg, vocab_size, in_training=True, seconds=SLOW_STEP_S)


def build_slow_eval(cfg, vocab_size):
    return _slowed(cfg, vocab_size, in_training=False, seconds=SLOW_WINDOW_S)
