"""35 recurrent products of one LSTM layer (batch 20), forward h.R and backward dz.R^T by a
transposed copy of R or by transpose_b, in fp32 and bf16: ms for the 35, median of 20."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..")))
from scripts.record_env import cpu_model  # noqa: E402
from utils import import_tensorflow, training  # noqa: E402

tf = import_tensorflow()


def timed(fn, reps=20):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn().numpy()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


print(f"{cpu_model()}; bf16 units: {', '.join(training.bf16_units()) or 'none'}")
for units in (200, 650, 1500):
    for dtype in (tf.float32, tf.bfloat16):
        def rand(*shape):
            return tf.cast(tf.random.normal(shape), dtype)
        kernel, kernel_t = tf.Variable(rand(units, 4 * units)), tf.Variable(rand(4 * units, units))
        h, dz = rand(20, units), rand(20, 4 * units)
        forward = tf.function(lambda: tf.add_n([tf.matmul(h, kernel) for _ in range(35)]))
        copy = tf.function(lambda: tf.add_n([tf.matmul(dz, kernel_t) for _ in range(35)]))
        flag = tf.function(lambda: tf.add_n([tf.matmul(dz, kernel, transpose_b=True)
                                             for _ in range(35)]))
        print(f"units {units:4} {dtype.name:8}: forward {timed(forward):6.2f} ms, backward by a "
              f"transposed copy {timed(copy):6.2f} ms, by transpose_b {timed(flag):6.2f} ms",
              flush=True)
