"""Models that wait without computing, for the tests that must land a signal in a long step or
a long validation: `build`'s every training step sleeps SLOW_STEP_S (3 s), longer than the
second Open MPI's mpirun leaves its ranks between passing on a SIGTERM and its SIGKILL, as a
large step on a CPU is (test_reproduce.py's stop); `build_slow_eval`'s every evaluation window
sleeps SLOW_WINDOW_S, so a validation of 40 windows lasts 4 s at no CPU cost (test_resume.py's
stops during validation once ran 8,000 real windows for that: 228 CPU s in one test)."""
import os
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


def build_recorded(cfg, vocab_size):
    """build_slow_eval whose every window, of an evaluation or of a training step, also appends
    "<pid> eval|train <time>" to the file named by $PTB_TEST_CALLS as it runs: which process
    validates at a resume, and when each starts training (test_resume.py)."""
    model = build_model(cfg, vocab_size)
    call, path = model.call, os.environ["PTB_TEST_CALLS"]

    def recorder(kind, seconds):
        def record(x):
            time.sleep(seconds)
            with open(path, "a") as f:
                f.write(f"{os.getpid()} {kind} {time.time()}\n")
            return x
        return record

    def recorded_call(inputs, state, training=False, noise_seed=None):
        record = recorder("train", 0) if training else recorder("eval", SLOW_WINDOW_S)
        inputs = tf.ensure_shape(tf.numpy_function(record, [inputs], inputs.dtype), inputs.shape)
        return call(inputs, state, training=training, noise_seed=noise_seed)

    model.call = recorded_call
    return model
