"""Where the time goes: a train step's parts, the CPU choices of utils/model.py against what
they replaced, and (alone, in under a minute) one LSTM layer's parts, medium's by default:

    .venv/bin/python scripts/bench/profiles.py [--configs CONFIG]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.bench import common  # noqa: E402  (first: a Python without TensorFlow stops there)
import numpy as np  # noqa: E402
from scripts.bench.common import VOCAB, fwd_bwd, timed_alternately  # noqa: E402
from scripts.record_env import cpu_model  # noqa: E402
from utils import config, import_tensorflow  # noqa: E402


def profile_small(reps=15, name="config_small"):
    """Where a train step's time goes (small's by default): the real step, and its parts
    alone."""
    tf = import_tensorflow()
    from utils import optimizers, train_steps
    from utils.model import bptt_lstm, build_model, sequence_loss
    cfg = config.load_config(name)
    b, t, h = cfg["batch_size"], cfg["num_steps"], cfg["hidden_size"]
    model = build_model(cfg, VOCAB)
    step = train_steps.make_train_step(model, optimizers.make_optimizer(cfg))
    x = tf.constant(np.random.RandomState(0).randint(0, VOCAB, (b, t)), tf.int32)
    hidden = tf.random.normal([b, t, h])
    state = model.zero_state(b)
    step(x, x, state)
    parts = {
        "whole train step": lambda: step(x, x, state),
        "softmax projection + loss, fwd+bwd": fwd_bwd(
            lambda: sequence_loss(model.softmax(hidden), x), model.softmax.trainable_variables),
        "one LSTM layer, fwd+bwd": fwd_bwd(
            lambda: tf.reduce_sum(bptt_lstm(model.lstms[0].cell, hidden, *state[0])[0]),
            model.lstms[0].trainable_variables),
    }
    return dict(zip(parts, timed_alternately(list(parts.values()), reps)))


def ablations(layers, reps=15):
    """The two CPU choices of utils/model.py against what they replaced, forward + backward,
    the LSTM's for each of `layers` (label: (units, steps), batch 20). The two sides of each
    pair are timed in turns."""
    tf = import_tensorflow()
    from utils.model import bptt_lstm, sequence_loss, unrolled_lstm

    logits = tf.Variable(tf.random.normal([20, 20, VOCAB]))
    targets = tf.constant(np.random.RandomState(0).randint(0, VOCAB, (20, 20)), tf.int32)
    sparse = lambda: tf.reduce_sum(tf.reduce_mean(  # noqa: E731
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits), 0))
    out = dict(zip(["loss: sparse_softmax_cross_entropy", "loss: logsumexp - target logit"],
                   timed_alternately([fwd_bwd(sparse, [logits]),
                                      fwd_bwd(lambda: sequence_loss(logits, targets), [logits])],
                                     reps)))
    for size, (hidden, steps) in layers.items():
        lstm = tf.keras.layers.LSTM(hidden, return_sequences=True, return_state=True)
        x = tf.random.normal([20, steps, hidden])
        h = c = tf.zeros([20, hidden])
        lstm(x)
        paths = {"tf.keras.layers.LSTM": lambda: lstm(x, initial_state=[h, c]),
                 "unrolled, autodiff": lambda: unrolled_lstm(lstm.cell, x, h, c),
                 "bptt (ours)": lambda: bptt_lstm(lstm.cell, x, h, c)}
        times = timed_alternately([fwd_bwd(lambda run=run: tf.reduce_sum(run()[0]),
                                           lstm.trainable_variables) for run in paths.values()],
                                  reps)
        out.update({f"LSTM layer {size}: {name}": ms for name, ms in zip(paths, times)})
    return out


def layers_of(configs):
    """label: (units, steps) of the first two configs' LSTM layers (small's and medium's by
    default), which the ablations and the PyTorch layer rows time at batch 20."""
    return {size: (cfg["hidden_size"], cfg["num_steps"]) for size, cfg in
            ((size, config.load_config(name)) for size, name in list(configs.items())[:2])}


def layer_profile(reps=15, units=650, steps=35):
    """Where one medium LSTM layer's fwd+bwd time goes, each part alone, all timed in turns: the
    whole layer, its forward (input projection and the sequential loop), the 35 recurrent
    products alone (forward), the backward's 35 products alone, and the 4 large products."""
    tf = import_tensorflow()
    from utils.model import _input_projection, _recurrence, _transposed, bptt_lstm
    lstm = tf.keras.layers.LSTM(units, return_sequences=True, return_state=True)
    x = tf.random.normal([20, steps, units])
    h, c = tf.random.normal([20, units]), tf.random.normal([20, units])
    lstm(x)
    cell = lstm.cell
    rows, dz = tf.random.normal([20 * steps, units]), tf.random.normal([20 * steps, 4 * units])

    @tf.function
    def forward():
        _, z_x = _input_projection(x, cell.kernel, cell.bias)
        return _recurrence(z_x, h, c, cell.recurrent_kernel)[0][-1]

    @tf.function
    def forward_products():
        out = h
        for _ in range(steps):
            out = tf.matmul(out, cell.recurrent_kernel)[:, :units]
        return out

    @tf.function
    def backward_products():
        recurrent_t, out = _transposed(cell.recurrent_kernel), dz[:20]
        for _ in range(steps):
            out = tf.tile(tf.matmul(out, recurrent_t), [1, 4])
        return out

    @tf.function
    def large_products():
        return [tf.matmul(rows, cell.kernel), tf.matmul(rows, dz, transpose_a=True),
                tf.matmul(rows, dz, transpose_a=True), tf.matmul(dz, cell.kernel,
                                                                 transpose_b=True)]
    parts = {"whole layer, fwd+bwd": fwd_bwd(lambda: tf.reduce_sum(
                 bptt_lstm(cell, x, h, c)[0]), lstm.trainable_variables),
             "forward (projection + loop)": forward,
             f"{steps} forward recurrent products alone": forward_products,
             f"{steps} backward recurrent products alone": backward_products,
             "4 large products (input projection, 2 weight gradients, input gradient)":
                 large_products}
    for run in parts.values():
        run()
    return dict(zip(parts, timed_alternately(list(parts.values()), reps)))


def main(argv=None):
    args = common.parser(__doc__.splitlines()[0], out=None).parse_args(argv)
    size, name = next(iter((common.checked_configs(args.configs) or
                            common.configs_of(["medium"])).items()))
    cfg = config.load_config(name)
    units, steps = cfg["hidden_size"], cfg["num_steps"]
    print(f"one {size} LSTM layer (20 x {steps} x {units}), {common.cores()} cores, "
          f"{cpu_model()}; ms, median of 15, parts timed in turns")
    print("\n".join(common.table_lines(
        (part, f"{ms:6.1f}") for part, ms in layer_profile(units=units, steps=steps).items())))


if __name__ == "__main__":
    main()
