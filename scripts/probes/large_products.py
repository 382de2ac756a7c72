"""The large products of a train step (forward, weight gradient, input gradient) in fp32 and
bf16: ms, median of 10."""
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
from scripts.probes.precision_probe import header, tf, timed  # noqa: E402

SHAPES = ((700, 1500, 6000), (700, 1500, 10000), (400, 200, 10000))  # rows, features, outputs


def products(rows, features, outputs, dtype):
    x = tf.cast(tf.random.normal([rows, features]), dtype)
    grad = tf.cast(tf.random.normal([rows, outputs]), dtype)
    weight = tf.Variable(tf.cast(tf.random.normal([features, outputs]), dtype))
    return {"forward": lambda: tf.matmul(x, weight),
            "weight gradient (transpose_a)": lambda: tf.matmul(x, grad, transpose_a=True),
            "input gradient (transpose_b)": lambda: tf.matmul(grad, weight, transpose_b=True)}


def main():
    header()
    for rows, features, outputs in SHAPES:
        for dtype in (tf.float32, tf.bfloat16):
            parts = products(rows, features, outputs, dtype)
            cells = ", ".join(f"{name} {timed(tf.function(fn), reps=10):6.1f}"
                              for name, fn in parts.items())
            print(f"{rows} x {features} by {features} x {outputs}, {dtype.name:8}: {cells} ms",
                  flush=True)


if __name__ == "__main__":
    main()
