"""The matmul floor: a train step's matmuls and nothing else, each kind timed alone, in fp32 and
in bf16, the least time a step could take at this machine's matmul speeds, against the
ceilings. Alone, in about 4 minutes for the three configs:

    .venv/bin/python scripts/bench/floor.py [--configs CONFIG ...]
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.bench import common  # noqa: E402
from scripts.bench.ceiling import ceiling_rows, matmul_gflops, matmul_shapes  # noqa: E402
from scripts.bench.common import VOCAB  # noqa: E402
from scripts.record_env import cpu_model  # noqa: E402
from utils import config, import_tensorflow  # noqa: E402


def flops_per_word(cfg, vocab=VOCAB):
    """Multiply-adds x 2 of one token's forward pass, x 3 for forward + backward."""
    h = cfg["hidden_size"]
    lstm = cfg["num_layers"] * 2 * (h + h) * 4 * h
    softmax = 2 * h * vocab
    return 3 * (lstm + softmax)


def matmul_floor(cfg, reps=15, rounds=5, dtype="fp32"):
    """A train step's matmuls and nothing else, in ms: each kind timed alone (all kinds in
    turns, `rounds` times, medians) and summed over the layers. The least time a step could take
    at this machine's matmul speeds, however fused or cheap the rest became. The recurrent
    products are one chain per layer, as the time steps run one after another: forward h.R and
    backward dz.R^T alternate, so one feeds the next with no other op between them. A floor
    within a few %, not exact: inside the real step small's softmax part, its loss included,
    ran in 12.4 ms against 12.7-12.9 ms for its 3 products alone (AMD EPYC with AVX-512).
    dtype "bf16": the same products on bf16 operands, as precision="bf16" runs them (its weights
    cast from fp32 variables, which is not counted here)."""
    tf = import_tensorflow()
    from utils.model import COMPUTE_DTYPES
    b, t, h = cfg["batch_size"], cfg["num_steps"], cfg["hidden_size"]
    def rand(*shape):
        return tf.cast(tf.random.normal(shape), COMPUTE_DTYPES[dtype])

    def weight(*shape):  # a variable, as in the model: a constant operand ran 4 % slower here
        return tf.Variable(rand(*shape))

    recurrent, recurrent_t, h0 = weight(h, 4 * h), rand(4 * h, h), rand(b, h)
    rows, d_z, kernel = rand(b * t, h), rand(b * t, 4 * h), weight(h, 4 * h)
    softmax, d_logits = weight(h, VOCAB), rand(b * t, VOCAB)

    def recurrent_chain():  # the backward product as utils/model.py takes it in each precision
        out = h0
        for _ in range(t):
            out = tf.matmul(out, recurrent)
            out = tf.matmul(out, recurrent_t) if dtype == "fp32" else \
                tf.matmul(out, recurrent, transpose_b=True)
        return out

    def layer_products():  # as utils/model.py's bptt_lstm: its input projection and gradients
        return (tf.matmul(rows, kernel), tf.matmul(rows, d_z, transpose_a=True),
                tf.matmul(rows, d_z, transpose_a=True), tf.matmul(d_z, kernel, transpose_b=True))

    def softmax_products():  # the Dense layer's forward and its two gradients
        return (tf.matmul(rows, softmax), tf.matmul(d_logits, softmax, transpose_b=True),
                tf.matmul(rows, d_logits, transpose_a=True))

    parts = {name: tf.function(fn, autograph=False) for name, fn in (
        ("recurrent chain of one layer", recurrent_chain),
        ("one layer's 4 large products", layer_products),
        ("softmax's 3 products", softmax_products))}
    for fn in parts.values():
        fn()
    per_round = [common.timed_alternately(list(parts.values()), reps) for _ in range(rounds)]
    out = {name: statistics.median(r[i] for r in per_round) for i, name in enumerate(parts)}
    layers = cfg["num_layers"]
    out["step floor"] = (layers * (out["recurrent chain of one layer"]
                                   + out["one layer's 4 large products"])
                         + out["softmax's 3 products"])
    return out


def floor_row(size, floor, gflops, cfg):
    """The floor, and the share of the ceiling a step taking just that long would be at."""
    gflops_at_floor = flops_per_word(cfg) * cfg["batch_size"] * cfg["num_steps"] / \
        floor["step floor"] / 1e6
    return (f"{size}, a train step's matmuls alone (the floor)",
            f"{floor['step floor']:.1f} ms = {gflops_at_floor:,.0f} GFLOP/s: at most "
            f"{100 * gflops_at_floor / gflops:.0f} % of ceiling")


def floor_rows(size, floor, gflops, cfg):
    """The floor's parts, then the floor."""
    return [(f"{size}, matmuls alone: {name}", f"{ms:.2f} ms")
            for name, ms in floor.items() if name != "step floor"] + \
        [floor_row(size, floor, gflops, cfg)]


def main(argv=None):
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    configs = common.checked_configs(args.configs) or common.DEFAULT_CONFIGS
    cores, cpu = common.cores(), cpu_model()
    print(f"a train step's matmuls alone, fp32 and bf16, {cores} cores, {cpu}; ms, medians of "
          "5 rounds in turns")
    rows, result = [], {"cores": cores, "cpu": cpu}
    for dtype in ("fp32", "bf16"):
        rates = matmul_gflops(matmul_shapes(configs.values()), dtype=dtype)
        gflops = max(rates.values())
        prefix = "" if dtype == "fp32" else "bf16_"
        rows += ceiling_rows(rates, dtype)
        result[f"{prefix}matmul_gflops"] = gflops
        for size, name in configs.items():
            cfg = config.load_config(name)
            floor = result[f"{size}_{prefix}matmul_floor_ms"] = matmul_floor(cfg, dtype=dtype)
            rows += floor_rows(f"{size}{', bf16' if prefix else ''}", floor, gflops, cfg)
    print("\n".join(common.table_lines(rows)))
    common.write_result(result, args.out)


if __name__ == "__main__":
    main()
