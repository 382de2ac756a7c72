"""Models that wait without computing: `build`'s every training step sleeps SLOW_STEP_S (3 s),
longer than the second Open MPI's mpirun leaves its ranks between passing on a SIGTERM and its
SIGKILL, as a large step on a CPU is (test_reproduce.py's stop); `build_recorded`'s every
evaluation window sleeps SLOW_WINDOW_S, so that a validation of 40 windows lasts 4 s at no CPU
cost, and records when it ran (test_resume.py's test of who validates at a resume)."""
import os
import time

import tensorflow as tf

from utils.model import build_model

SLOW_STEP_S = 3
SLOW_WINDOW_S = 0.1


def build(cfg, vocab_size):
    model = build_model(cfg, vocab_size)
    call = model.call

    def sleep(x):
        time.sleep(SLOW_STEP_S)
        return x

    def slow_call(inputs, state, training=False, noise_seed=None):
        if training:
            inputs = tf.ensure_shape(tf.numpy_function(sleep, [inputs], inputs.dtype),
                                     inputs.shape)
        return call(inputs, state, training=training, noise_seed=noise_seed)

    model.call = slow_call
    return model


def build_recorded(cfg, vocab_size):
    """A model whose every window, of an evaluation (sleeping SLOW_WINDOW_S first) or of a
    training step, appends "<pid> eval|train <time>" to the file named by $PTB_TEST_CALLS as it
    runs: which process validates at a resume, and when each starts training (test_resume.py)."""
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
