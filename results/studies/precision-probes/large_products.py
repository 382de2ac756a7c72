"""The large products of a train step (forward, weight gradient, input gradient) in fp32 and
bf16: ms, median of 10."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from scripts.record_env import cpu_model  # noqa: E402
from utils import import_tensorflow, training  # noqa: E402

tf = import_tensorflow()


def timed(fn, reps=10):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn().numpy()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


print(f"{cpu_model()}; bf16 units: {', '.join(training.bf16_units()) or 'none'}")
for rows, features, outputs in ((700, 1500, 6000), (700, 1500, 10000), (400, 200, 10000)):
    for dtype in (tf.float32, tf.bfloat16):
        x = tf.cast(tf.random.normal([rows, features]), dtype)
        grad = tf.cast(tf.random.normal([rows, outputs]), dtype)
        weight = tf.Variable(tf.cast(tf.random.normal([features, outputs]), dtype))
        parts = {"forward": lambda: tf.matmul(x, weight),
                 "weight gradient (transpose_a)": lambda: tf.matmul(x, grad, transpose_a=True),
                 "input gradient (transpose_b)": lambda: tf.matmul(grad, weight, transpose_b=True)}
        cells = ", ".join(f"{name} {timed(tf.function(fn)):6.1f}" for name, fn in parts.items())
        print(f"{rows} x {features} by {features} x {outputs}, {dtype.name:8}: {cells} ms",
              flush=True)
