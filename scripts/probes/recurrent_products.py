"""35 recurrent products of one LSTM layer (batch 20), forward h.R and backward dz.R^T by a
transposed copy of R or by transpose_b, in fp32 and bf16: ms for the 35, median of 20."""
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
from scripts.probes.precision_probe import header, tf, timed  # noqa: E402


def products(units, dtype):
    def rand(*shape):
        return tf.cast(tf.random.normal(shape), dtype)
    kernel, kernel_t = tf.Variable(rand(units, 4 * units)), tf.Variable(rand(4 * units, units))
    h, dz = rand(20, units), rand(20, 4 * units)
    return {"forward": lambda: tf.add_n([tf.matmul(h, kernel) for _ in range(35)]),
            "backward by a transposed copy":
                lambda: tf.add_n([tf.matmul(dz, kernel_t) for _ in range(35)]),
            "by transpose_b":
                lambda: tf.add_n([tf.matmul(dz, kernel, transpose_b=True) for _ in range(35)])}


def main():
    header()
    for units in (200, 650, 1500):
        for dtype in (tf.float32, tf.bfloat16):
            cells = ", ".join(f"{name} {timed(tf.function(fn), reps=20):6.2f} ms"
                              for name, fn in products(units, dtype).items())
            print(f"units {units:4} {dtype.name:8}: {cells}", flush=True)


if __name__ == "__main__":
    main()
