"""Ideas for small's step tried on 2026-11-24 (issue #30), each against the current path, timed
in turns (5 rounds of 20-30 reps, medians; scripts/bench/common.py's timed_alternately):
    .venv/bin/python scripts/probes/small_step_tries.py"""
import os
import statistics
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
import utils  # noqa: E402
tf = utils.import_tensorflow()  # as the trainers start it, before the modules that load it
import numpy as np  # noqa: E402
from scripts.bench.common import fwd_bwd, timed_alternately  # noqa: E402
from utils import config  # noqa: E402
from utils.model import _transposed, bptt_lstm, build_model, sequence_loss  # noqa: E402
from utils.optimizers import make_optimizer  # noqa: E402
from utils.train_steps import make_train_step  # noqa: E402


def compare(title, runs, reps=30, rounds=5):
    for run in runs.values():
        run()
    per_round = [timed_alternately(list(runs.values()), reps) for _ in range(rounds)]
    print(title)
    for i, name in enumerate(runs):
        ms = [r[i] for r in per_round]
        print(f"  {name:<44} {statistics.median(ms):7.2f} ms  {[round(m, 2) for m in ms]}")


def block_lstm(cell, x, h, c):
    """TensorFlow's fused BlockLSTMV2 op (gate order i, f, g, o as Keras), no peepholes."""
    zeros = tf.zeros([cell.units])
    _, cs, _, _, _, _, hs = tf.raw_ops.BlockLSTMV2(
        seq_len_max=tf.constant(x.shape[1], tf.int64), x=tf.transpose(x, [1, 0, 2]), cs_prev=c,
        h_prev=h, w=tf.concat([cell.kernel, cell.recurrent_kernel], 0), wci=zeros, wcf=zeros,
        wco=zeros, b=cell.bias, cell_clip=0.0, use_peephole=False)
    return tf.transpose(hs, [1, 0, 2]), hs[-1], cs[-1]


def lstm_layer():
    lstm = tf.keras.layers.LSTM(200, return_sequences=True, return_state=True)
    x, h, c = tf.random.normal([20, 20, 200]), tf.random.normal([20, 200]), tf.random.normal([20, 200])
    lstm(x)
    cell, variables = lstm.cell, lstm.trainable_variables
    for name, fn in (("outputs", lambda o: o[0]), ("last c", lambda o: o[2])):
        diff = tf.reduce_max(tf.abs(fn(bptt_lstm(cell, x, h, c)) - fn(block_lstm(cell, x, h, c))))
        print(f"BlockLSTMV2 against bptt_lstm, forward, {name}: max difference {float(diff):.1e}")
    weights = tf.random.normal([20, 20, 200])
    grads = []
    for run in (bptt_lstm, block_lstm):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(run(cell, x, h, c)[0] * weights)
        grads.append(tape.gradient(loss, variables))
    for v, a, b in zip(variables, *grads):
        rel = float(tf.reduce_max(tf.abs(a - b)) / tf.reduce_max(tf.abs(a)))
        print(f"BlockLSTMV2 against bptt_lstm, gradient of {v.name}: max relative difference {rel:.2f}")

    @tf.function(jit_compile=True)
    def xla_bptt():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(bptt_lstm(cell, x, h, c)[0])
        return tape.gradient(loss, variables)
    compare("one small LSTM layer (20 x 20 x 200), fwd+bwd", {
        "bptt_lstm (ours)": fwd_bwd(lambda: tf.reduce_sum(bptt_lstm(cell, x, h, c)[0]), variables),
        "bptt_lstm under XLA (jit_compile)": xla_bptt,
        "tf.raw_ops.BlockLSTMV2 and its gradient": fwd_bwd(
            lambda: tf.reduce_sum(block_lstm(cell, x, h, c)[0]), variables)})


def softmax():
    cfg = config.load_config("config_small")
    model = build_model(cfg, 10000)
    targets = tf.constant(np.random.RandomState(0).randint(0, 10000, (20, 20)), tf.int32)
    hidden = tf.random.normal([20, 20, 200])
    rows, w = tf.reshape(hidden, [400, 200]), model.softmax.kernel
    d_logits = tf.random.normal([400, 10000])
    compare("small's softmax: the real part against its products alone; the input gradient's product", {
        "softmax projection + loss, fwd+bwd (the model's)": fwd_bwd(
            lambda: sequence_loss(model.softmax(hidden), targets), model.softmax.trainable_variables),
        "its 3 products alone": tf.function(lambda: (
            tf.matmul(rows, w), tf.matmul(d_logits, w, transpose_b=True),
            tf.matmul(rows, d_logits, transpose_a=True)), autograph=False),
        "d_logits . W^T (transpose_b, as autodiff)": tf.function(
            lambda: tf.matmul(d_logits, w, transpose_b=True), autograph=False),
        "d_logits . W^T (W transposed first)": tf.function(
            lambda: tf.matmul(d_logits, _transposed(w)), autograph=False)})
    step = make_train_step(model, make_optimizer(cfg))
    state, variables = model.zero_state(20), model.trainable_variables
    seed = tf.constant([1, 2], tf.int64)

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            loss = sequence_loss(model(targets, state, training=True, noise_seed=seed)[0], targets)
        return tape.gradient(loss, variables)
    grads = gradients()
    optimizer = make_optimizer(cfg)

    @tf.function
    def update():
        optimizer.apply_gradients(zip(grads, variables))
    compare("small's train step and its parts", {
        "whole train step": lambda: step(targets, targets, state),
        "forward and gradients, no update": gradients,
        "forward only": tf.function(lambda: sequence_loss(
            model(targets, state, training=True, noise_seed=seed)[0], targets)),
        "update only (clip by global norm, SGD)": update}, reps=20)


def main():
    lstm_layer()
    softmax()


if __name__ == "__main__":
    main()
