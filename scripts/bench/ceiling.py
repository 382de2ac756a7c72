"""The matmul ceiling: GFLOP/s of TensorFlow's matmul on the shapes the configs' train steps
multiply most, and two square ones, on all cores; the fastest is the ceiling that make bench
gives each config's words/sec as a share of. Alone, in under a minute:

    .venv/bin/python scripts/bench/ceiling.py [--configs CONFIG ...]
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.bench import common  # noqa: E402
from scripts.bench.common import VOCAB  # noqa: E402
from scripts.record_env import cpu_model  # noqa: E402
from utils import config, import_tensorflow  # noqa: E402


def matmul_shapes(names=tuple(common.DEFAULT_CONFIGS.values())):
    """(m, n, k) of the products the configs (the three by default) do most: the LSTM's gates
    for all time steps at once ([x, h] by the kernel) and the softmax's three (forward, its
    weight gradient, its input gradient), plus two square ones."""
    shapes = {(1024, 1024, 1024), (2048, 2048, 2048)}
    for name in names:
        cfg = config.load_config(name)
        tokens, h = cfg["batch_size"] * cfg["num_steps"], cfg["hidden_size"]
        shapes |= {(tokens, 4 * h, 2 * h), (tokens, VOCAB, h), (h, VOCAB, tokens),
                   (tokens, h, VOCAB)}
    return sorted(shapes)


def matmul_gflops(shapes, reps=10, dtype="fp32"):
    """GFLOP/s of one TensorFlow matmul per shape on `dtype` operands ("fp32" or "bf16"), all
    cores, median of `reps`. The fastest is the ceiling: a single square size is not one (2048²
    ran at 131 GFLOP/s on an AMD EPYC whose medium model did 139)."""
    tf = import_tensorflow()
    from utils.model import COMPUTE_DTYPES
    rates = {}
    for m, n, k in shapes:
        a, b = (tf.cast(tf.random.normal(s), COMPUTE_DTYPES[dtype]) for s in ([m, k], [k, n]))
        mm = tf.function(lambda a=a, b=b: tf.matmul(a, b), autograph=False)
        mm().numpy()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            mm().numpy()
            times.append(time.perf_counter() - t)
        rates[f"{m}x{k} by {k}x{n}"] = 2 * m * n * k / statistics.median(times) / 1e9
    return rates


def ceiling_rows(rates, dtype="fp32"):
    best = max(rates, key=rates.get)
    return [(f"{dtype} matmul ceiling (best of {len(rates)} shapes, all cores)",
             f"{rates[best]:,.0f} GFLOP/s ({best})")]


def main(argv=None):
    args = common.parser(__doc__.splitlines()[0]).parse_args(argv)
    configs = common.checked_configs(args.configs) or common.DEFAULT_CONFIGS
    rates = matmul_gflops(matmul_shapes(configs.values()))
    cores, cpu = common.cores(), cpu_model()
    print(f"fp32 matmul, {cores} cores, {cpu}; GFLOP/s, median of 10")
    print("\n".join(common.table_lines((shape, f"{rate:6.0f}") for shape, rate in rates.items())))
    for row, value in ceiling_rows(rates):
        print(f"  {row}  {value}")
    common.write_result({"cores": cores, "cpu": cpu, "matmul_gflops": max(rates.values()),
                         "matmul_gflops_by_shape": rates}, args.out)


if __name__ == "__main__":
    main()
