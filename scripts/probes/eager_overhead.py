"""Per-step eager work of train_epoch around the compiled step (slicing one window out of the
epoch's tensors, adding the loss to the pending sum), in microseconds, median of 5 x 2000."""
import os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import utils
tf = utils.import_tensorflow()  # as the trainers start it: oneDNN on, notes held back
import numpy as np
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)
x = tf.constant(np.zeros((2000, 20, 20), np.int32))
y = tf.constant(np.zeros((2000, 20, 20), np.int32))
loss = tf.constant(1.0)
samples = []
for _ in range(6):
    pending = tf.constant(0.0)
    t0 = time.perf_counter()
    for step in range(2000):
        a, b = x[step], y[step]
        pending += loss
    float(pending)
    samples.append((time.perf_counter() - t0) / 2000 * 1e6)
print(f"TensorFlow {tf.__version__}: {statistics.median(samples[1:]):.1f} us per step")
