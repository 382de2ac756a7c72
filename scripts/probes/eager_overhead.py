"""Per-step eager work of train_epoch around the compiled step (slicing one window out of the
epoch's tensors, adding the loss to the pending sum), in microseconds, median of 5 x 2000; run
with .venv's and .venv-tf2.15's Python in turns (results/stack/stack-tf2.21/eager-1934/):
    .venv/bin/python scripts/probes/eager_overhead.py"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import utils  # noqa: E402
tf = utils.import_tensorflow()  # as the trainers start it: oneDNN on, notes held back
import numpy as np  # noqa: E402


def main(steps=2000):
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    x = tf.constant(np.zeros((steps, 20, 20), np.int32))
    y = tf.constant(np.zeros((steps, 20, 20), np.int32))
    loss = tf.constant(1.0)
    samples = []
    for _ in range(6):
        pending = tf.constant(0.0)
        t0 = time.perf_counter()
        for step in range(steps):
            _ = x[step], y[step]  # the slicing is what is timed
            pending += loss
        float(pending)
        samples.append((time.perf_counter() - t0) / steps * 1e6)
    print(f"TensorFlow {tf.__version__}: {statistics.median(samples[1:]):.1f} us per step")


if __name__ == "__main__":
    main()
