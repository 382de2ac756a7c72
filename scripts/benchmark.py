"""Throughput benchmark: the real trainers on real PTB, one table and one JSON file.

    make bench          # or: .venv/bin/python scripts/benchmark.py [--quick | --tune [CONFIG]]

Every words/sec figure is the median over timed windows of the trainer's own progress
events (`--log_every` steps each), the first window (tracing, warm-up) left out; for trainers
run side by side, all their words over the time all of them ran. The full mode runs every
row (small, medium and large: one process on all cores, 2 ranks of one thread, the PyTorch
peer) in 3 rounds, one after the other within each round, and gives each ratio as the median
of the ratios within a round, so that a drift of this shared machine's speed between rounds
does not become a speedup. Each config's single process is also given as its share of the
words/sec the fp32 matmul ceiling would allow (FLOPs per word below); the ceiling is the
fastest of the models' own matmul shapes and two square ones, measured in the same run. Each
config also runs in precision bf16 right after its fp32 run, beside PyTorch's autocast bf16,
with the bf16 ceiling and floor, and the CPU's bf16 units named.
"""
import argparse
import json
from collections import namedtuple
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import utils  # noqa: E402
utils.require_setup()  # a Python without .venv's TensorFlow stops here in one line
import numpy as np  # noqa: E402

from utils import child_env, config, import_tensorflow  # noqa: E402
from utils.config import DEFAULT_DATA_PATH  # noqa: E402
from scripts.record_env import cpu_model  # noqa: E402

VOCAB = 10000
SIZES = ("small", "medium", "large")


def flops_per_word(cfg, vocab=VOCAB):
    """Multiply-adds x 2 of one token's forward pass, x 3 for forward + backward."""
    h = cfg["hidden_size"]
    lstm = cfg["num_layers"] * 2 * (h + h) * 4 * h
    softmax = 2 * h * vocab
    return 3 * (lstm + softmax)


def matmul_shapes():
    """(m, n, k) of the products the three configs do most: the LSTM's gates for all time steps
    at once ([x, h] by the kernel) and the softmax's three (forward, its weight gradient, its
    input gradient), plus two square ones."""
    shapes = {(1024, 1024, 1024), (2048, 2048, 2048)}
    for size in SIZES:
        cfg = config.load_config(f"config_{size}")
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


def fwd_bwd(fn, variables):
    """A traced and warmed-up function that returns the gradients of fn() for variables."""
    tf = import_tensorflow()

    @tf.function
    def run():
        with tf.GradientTape() as tape:
            loss = fn()
        return tape.gradient(loss, variables)
    run()
    return run


def timed_alternately(runs, reps):
    """Median milliseconds of each run, timed in turns, so that a drift of the machine's speed
    hits all of them alike."""
    tf = import_tensorflow()
    samples = [[] for _ in runs]
    for _ in range(reps):
        for run, times in zip(runs, samples):
            t0 = time.perf_counter()
            tf.nest.map_structure(lambda v: v.numpy() if hasattr(v, "numpy") else v, run())
            times.append(time.perf_counter() - t0)
    return [1000 * statistics.median(times) for times in samples]


def profile_small(reps=15):
    """Where a small-config train step's time goes: the real step, and its parts alone."""
    tf = import_tensorflow()
    from utils import optimizers, train_steps
    from utils.model import bptt_lstm, build_model, sequence_loss
    cfg = config.load_config("config_small")
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
    per_round = [timed_alternately(list(parts.values()), reps) for _ in range(rounds)]
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


def ablations(reps=15):
    """The two CPU choices of utils/model.py against what they replaced, forward + backward.
    The two sides of each pair are timed in turns."""
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
    for label, steps, hidden in (("small", 20, 200), ("medium", 35, 650)):
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
        out.update({f"LSTM layer {label}: {name}": ms for name, ms in zip(paths, times)})
    return out


LAYERS = {"small": (200, 20), "medium": (650, 35)}  # units, steps; batch 20


def layer_vs_peer(peer, n_rounds, reps):
    """One LSTM layer's fwd+bwd, ours (bptt) and PyTorch's nn.LSTM, in turns for n_rounds:
    per size, the medians of each side and the median of the within-round ratios."""
    tf = import_tensorflow()
    from utils.model import bptt_lstm
    out = {}
    for label, (units, steps) in LAYERS.items():
        lstm = tf.keras.layers.LSTM(units, return_sequences=True, return_state=True)
        x = tf.random.normal([20, steps, units])
        h, c = tf.random.normal([20, units]), tf.random.normal([20, units])
        lstm(x)
        ours = fwd_bwd(lambda: tf.reduce_sum(bptt_lstm(lstm.cell, x, h, c)[0]),
                       lstm.trainable_variables)
        rounds = []
        for _ in range(n_rounds):
            ours_ms = timed_alternately([ours], reps)[0]
            peer_ms = json.loads(subprocess.run(
                [peer, PEER_SCRIPT, "--layer", str(units), str(steps), str(reps)], check=True,
                capture_output=True, text=True).stdout)["ms"]
            rounds.append((ours_ms, peer_ms))
        out[label] = {"ours_ms": statistics.median(r[0] for r in rounds),
                      "pytorch_ms": statistics.median(r[1] for r in rounds),
                      "ours_vs_pytorch": statistics.median(p / o for o, p in rounds),
                      "per_round_ms": rounds}
    return out


PEER_SCRIPT = os.path.join(REPO, "scripts", "peer_pytorch.py")
BF16 = ("--set", "precision='bf16'")  # a trainer's (or the peer's) flags for bf16


def find_peer(path):
    """The PyTorch peer's interpreter, or None with one line saying why (the rest still runs)."""
    if not path:
        return None
    try:
        probe = subprocess.run([path, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True, timeout=120)
        why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    except OSError as e:
        probe, why = None, str(e)
    if probe is not None and probe.returncode == 0:
        print(f"  peer: PyTorch {probe.stdout.strip()} ({path})", flush=True)
        return path
    print(f"  peer: no PyTorch at {path} ({why}); the PyTorch rows are left out "
          "(`make bench` installs it into .venv-peer from requirements-peer.txt)", flush=True)
    return None


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
             "35 forward recurrent products alone": forward_products,
             "35 backward recurrent products alone": backward_products,
             "4 large products (input projection, 2 weight gradients, input gradient)":
                 large_products}
    for run in parts.values():
        run()
    return dict(zip(parts, timed_alternately(list(parts.values()), reps)))


def eval_cost(data_path, train_steps, eval_windows):
    """What the per-epoch validation costs against a training epoch, for medium and large, in
    one process: the training epoch as the median step time x the steps of an epoch, the
    validation at batch 1 x 35 (timed over `eval_windows` windows, scaled to the whole set)
    and in the training layout (whole set)."""
    tf = import_tensorflow()
    from data import ptb
    from utils import loop, optimizers, train_steps
    from utils.model import build_model
    corpus = ptb.load_corpus(data_path)
    out = {}
    for name in ("config_medium", "config_large"):
        cfg = config.load_config(name)
        model = build_model(cfg, len(corpus.vocab))
        step = train_steps.make_train_step(model, optimizers.make_optimizer(cfg))
        xs, ys = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"])
        state, times = model.zero_state(cfg["batch_size"]), []
        for k in range(train_steps + 1):  # the first one traces
            t0 = time.perf_counter()
            loss, state = step(tf.constant(xs[k]), tf.constant(ys[k]), state)
            float(loss)
            times.append(time.perf_counter() - t0)
        row = {"train_epoch_s": statistics.median(times[1:]) * len(xs)}
        eval_step = train_steps.make_eval_step(model)
        for layout, (batch, steps) in (("batch 1 x 35", (1, 35)),
                                       ("training layout", (cfg["batch_size"], cfg["num_steps"]))):
            vx, vy = ptb.windows(corpus.valid, batch, steps)
            n = min(len(vx), eval_windows)
            loop.evaluate(eval_step, model, vx[:1], vy[:1], dict(cfg, eval_steps=1))  # trace
            t0 = time.perf_counter()
            loop.evaluate(eval_step, model, vx, vy, dict(cfg, eval_steps=n))
            row[f"valid_s, {layout}"] = (time.perf_counter() - t0) * len(vx) / n
            row[f"valid_share, {layout}"] = row[f"valid_s, {layout}"] / row["train_epoch_s"]
        out[name] = row
    return out


def run_trainer(launcher, config_name, steps, log_every, data_path, extra=(), copies=1):
    """Run `copies` of a trainer side by side for `steps` steps each; returns (words/sec, how it
    was measured, peak RSS MB of one trainer, rank 0 under mpirun). One trainer: the median of
    its windows. Several: all their words while all of them run, over that time, so that a copy
    still starting or already done does not count as running beside the others."""
    with tempfile.TemporaryDirectory() as tmp:
        outs = [os.path.join(tmp, str(i)) for i in range(copies)]
        cmds = [[*launcher, "--config", config_name, "--data_path", data_path, "--output_dir", out,
                 "--set", f"steps_per_epoch={steps}", "--set", "num_epochs=1",
                 "--set", "eval_steps=1", "--log_every", str(log_every), *extra] for out in outs]
        procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  env=child_env()) for cmd in cmds]
        for cmd, proc in zip(cmds, procs):
            stderr = proc.communicate()[1]
            if proc.returncode:
                raise SystemExit(f"benchmark run failed: {' '.join(cmd)}\n{stderr.decode()}")
        runs = [read_progress(os.path.join(out, "metrics.jsonl")) for out in outs]
    rss = max(r.peak_rss_mb for r in runs)
    if copies == 1:
        times, done, words, _ = runs[0]
        windows = [(b - a) * words / (t1 - t0)
                   for a, b, t0, t1 in zip(done, done[1:], times, times[1:])]
        return statistics.median(windows), f"median of {len(windows)} windows", rss
    start, end = max(r.times[0] for r in runs), min(r.times[-1] for r in runs)
    if end - start < 1:
        raise SystemExit(f"benchmark: the {copies} copies of {config_name} did not run together")
    words = sum((np.interp(end, times, done) - np.interp(start, times, done)) * per_step
                for times, done, per_step, _ in runs)
    return words / (end - start), f"{copies} copies together for {end - start:.1f} s", rss


Progress = namedtuple("Progress", "times steps words_per_step peak_rss_mb")


def read_progress(metrics_path):
    """(times, steps done, words per step, peak RSS MB) of a run, from its first progress
    event on: the steps before it include the tracing."""
    with open(metrics_path) as f:
        events = [json.loads(line) for line in f]
    progress = [e for e in events if e["event"] == "progress"]
    cfg = progress[0]["config"]
    rss = max(e["peak_rss_mb"] for e in events if e["event"] == "epoch")
    return Progress([e["time"] for e in progress], [e["step"] for e in progress],
                    cfg["batch_size"] * cfg["num_steps"], rss)


def run_rounds(runs, n_rounds, data_path):
    """Rounds of all runs in turn: speedups are then medians of ratios within a round, so a
    drift of the machine's speed between rounds cancels out. Returns (the rounds, per run:
    median wps and what was measured)."""
    rounds = [{} for _ in range(n_rounds)]
    for i, measured in enumerate(rounds):
        for name, (launcher, cfg_name, n, extra, copies) in runs.items():
            wps, how, rss = run_trainer(launcher, cfg_name, n, 10, data_path, extra, copies)
            measured[name] = {"wps": wps, "measured": how, "peak_rss_mb": rss}
            print(f"  round {i + 1}, {name}: {wps:,.0f} wps ({how}), peak RSS {rss:,.0f} MB",
                  flush=True)
    summary = {}
    for name in runs:
        per_round = [r[name] for r in rounds if name in r]
        summary[name] = {"wps": statistics.median(r["wps"] for r in per_round),
                         "measured": [r["measured"] for r in per_round],
                         "peak_rss_mb": max(r["peak_rss_mb"] for r in per_round),
                         "wps_per_round": [r["wps"] for r in per_round]}
    return rounds, summary


def median_ratio(rounds, a, b):
    return statistics.median(r[a]["wps"] / r[b]["wps"] for r in rounds)


def half_batch(config_name):
    """Trainer flags for what each of 2 ranks runs: half the global batch on one thread."""
    return ("--threads", "1", "--set",
            f"batch_size={config.load_config(config_name)['batch_size'] // 2}")


def no_allreduce_bound(py, config_name, steps):
    """A run of 2 plain trainers at once, each as one of 2 ranks but without the allreduce: the
    most 2 ranks can reach on these cores."""
    return (py + ["lm_ptb.py"], config_name, steps, half_batch(config_name), 2)


# steps a tune run (2 ranks; the single process runs twice as many, at twice the speed)
TUNE_STEPS = {"small": 300, "medium": 60, "large": 30}
FUSE_ALL = 512 * 1024 * 1024  # above large's 264 MB of gradients: one allreduce a step


def tune_variants(size):
    """name: (mpirun flags, trainer flags) of 2 ranks x 1 thread. Small keeps the variants of its
    earlier runs; medium and large, whose gradients pass the 64 MB fusion buffer several times a
    step, try one buffer for all of them, none, a shorter cycle, and the embedding's gradient
    allreduced dense instead of gathered. Every size also tries 2 threads a rank: 4 threads on 2
    cores, so that one rank's matmuls may use a core the other leaves idle."""
    fast = ["-x", "HOROVOD_CYCLE_TIME=0.2", "-x", "HOROVOD_FUSION_THRESHOLD=0"]
    variants = {"default": ([], ()), "2 threads a rank (--threads 2)": ([], ("--threads", "2"))}
    if size == "small":
        variants.update({
            "HOROVOD_CYCLE_TIME=0.2": (fast[:2], ()),
            "HOROVOD_FUSION_THRESHOLD=0": (fast[2:], ()),
            "both of these": (fast, ()),
            "fp16_allreduce=True": ([], ("--set", "fp16_allreduce=True")),
            "reduce_type='param' (every 10 steps)": ([], ("--set", "reduce_type='param'")),
        })
    else:
        variants.update({
            "HOROVOD_FUSION_THRESHOLD=512 MB": (["-x", f"HOROVOD_FUSION_THRESHOLD={FUSE_ALL}"], ()),
            "HOROVOD_FUSION_THRESHOLD=0": (fast[2:], ()),
            "HOROVOD_CYCLE_TIME=0.2": (fast[:2], ()),
            "sparse_as_dense=True": ([], ("--set", "sparse_as_dense=True")),
        })
    return variants


def tune(args, launchers, n_rounds=3):
    """Horovod's settings for 2 ranks sharing one CPU host, each against the defaults, in
    turns, with the single process and the no-allreduce bound of the full mode beside them."""
    py, mpirun, dist = launchers
    size, steps = args.tune, TUNE_STEPS[args.tune]
    cfg_name = f"config_{size}"
    runs = {f"{size}, 2 ranks, {name}": (mpirun + ["-np", "2"] + x + dist, cfg_name, steps,
                                        ("--threads", "1") + flags, 1)
            for name, (x, flags) in tune_variants(size).items()}
    bound = f"{size}, 2 processes x 1 thread, half batch each, no allreduce (the bound)"
    runs[bound] = no_allreduce_bound(py, cfg_name, steps)
    single = f"{size}, single process (reference)"
    runs[single] = (py + ["lm_ptb.py"], cfg_name, 2 * steps, (), 1)
    rounds, summary = run_rounds(runs, n_rounds, args.data_path)
    default = f"{size}, 2 ranks, default"
    print(f"\n2 ranks x 1 thread on one host, {len(os.sched_getaffinity(0))} cores, {cpu_model()} "
          f"({n_rounds} rounds in turns; ratios are medians of within-round ratios)")
    for name in runs:
        print(f"  {name:<70} {summary[name]['wps']:6,.0f} wps  "
              f"{median_ratio(rounds, name, default):.2f}x the default  "
              f"{median_ratio(rounds, name, single):.2f}x the single process")
    return {"config": size, "cpu": cpu_model(), "rounds": rounds, **summary}


# the rows run with --against too: each config's single process in fp32 and in bf16, and small's
# 2 ranks
AGAINST_ROWS = tuple(f"{size}_{row}" for size in SIZES for row in ("single_all_cores",
                                                                    "single_bf16")) + (
    "small_2ranks_1thread",)
TRAINERS = ("lm_ptb.py", "lm_ptb_distributed.py")

# "TensorFlow X, Keras Y, Python Z" as a trainer of that checkout sees it: its utils first (which
# picks the Keras), then Horovod (which the trainers need)
STACK_PROBE = """
import sys
from utils import import_tensorflow
tf = import_tensorflow()
import horovod.tensorflow
keras = tf.keras.__name__.split(".")[0]
name = "tf-keras" if keras == "tf_keras" else "Keras"
print(f"TensorFlow {tf.__version__}, {name} {__import__(keras).__version__}, "
      f"Python {sys.version.split()[0]}")
"""


def stack(python, code):
    r = subprocess.run([python, "-c", STACK_PROBE], capture_output=True, text=True, cwd=code,
                       env=child_env(TF_CPP_MIN_LOG_LEVEL="3"))
    if r.returncode:
        raise SystemExit(f"error: {python} cannot import TensorFlow and Horovod in {code} "
                         f"({(r.stderr.strip().splitlines() or ['no output'])[-1]}); make it "
                         "with `make venv-tf2.15`, or scripts/setup.sh in that checkout")
    return r.stdout.strip()


def this_stack():
    return stack(sys.executable, REPO)


def against_target(against):
    """(its interpreter, its checkout) of --against: an interpreter runs this checkout's code; a
    checkout (a directory with its own .venv) runs its own code with its own venv."""
    if os.path.isdir(against):
        python = os.path.join(against, ".venv", "bin", "python")
        if not os.access(python, os.X_OK):
            raise SystemExit(f"error: --against {against} is a directory without .venv/bin/python;"
                             " run scripts/setup.sh in that checkout first")
        return python, os.path.abspath(against)
    return against, REPO


def other_stack(against):
    """this_stack() of --against, and its commit if it is another checkout."""
    python, code = against_target(against)
    if code == REPO:
        return stack(python, code)
    commit = subprocess.run(["git", "-C", code, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "no git"
    return f"{stack(python, code)}, at {commit}"


def with_runs_against(runs, against, stack):
    """The runs, each of AGAINST_ROWS followed by the same run on --against's stack (its
    interpreter, and its trainers if it is another checkout)."""
    python, code = against_target(against)
    out = {}
    for name, (launcher, *rest) in runs.items():
        out[name] = (launcher, *rest)
        if name in AGAINST_ROWS:
            out[f"{name} ({stack})"] = ([python if part == sys.executable else
                                         os.path.join(code, part) if part in TRAINERS else part
                                         for part in launcher], *rest)
    return out


def table_lines(rows):
    """(label, value) rows as printed: labels padded to the longest."""
    width = max(len(label) for label, _ in rows)
    return [f"  {label:<{width}}  {value}" for label, value in rows]


def write_result(result, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"  written to {path}")


def trainer_runs(sizes, steps, launchers, peer):
    """name: (launcher, config, steps, extra flags, copies side by side) of every trainer row."""
    py, mpirun, dist = launchers
    n_small = steps["small"]
    runs = {  # name: (launcher, config, steps, extra flags, copies side by side)
        "small_1rank_1thread": (mpirun + ["-np", "1"] + dist, "config_small", n_small // 2,
                                ("--threads", "1"), 1),
        # what each of the 2 ranks runs: half the rows, one core
        "small_1rank_1thread_half_batch": (mpirun + ["-np", "1"] + dist, "config_small",
                                           n_small // 2, half_batch("config_small"), 1),
    }
    for size in sizes:  # one process on all cores against 2 ranks of one thread, each config
        n = steps[size]
        runs[f"{size}_single_all_cores"] = (py + ["lm_ptb.py"], f"config_{size}", n, (), 1)
        # small's 2 ranks run half the steps, as before; large's 60 are few windows already
        n_ranks = n if size == "large" else n // 2
        runs[f"{size}_2ranks_1thread"] = (mpirun + ["-np", "2"] + dist, f"config_{size}",
                                          n_ranks, ("--threads", "1"), 1)
        runs[f"{size}_2procs_half_batch_no_allreduce"] = no_allreduce_bound(py, f"config_{size}",
                                                                            n_ranks)
        # precision bf16, right after its fp32 run in each round
        runs[f"{size}_single_bf16"] = (py + ["lm_ptb.py"], f"config_{size}", n, BF16, 1)
        if peer:  # the same model in PyTorch, timed in the same rounds, right after ours
            runs[f"{size}_pytorch"] = ([peer, PEER_SCRIPT], f"config_{size}", n, (), 1)
            runs[f"{size}_pytorch_bf16"] = ([peer, PEER_SCRIPT], f"config_{size}", n, BF16, 1)
    return runs


def against_ratios(rounds, stack):
    """Ours / theirs, the median of the within-round ratios, for each AGAINST_ROWS row run."""
    return {"stack": stack, "ours": this_stack(), "ratios": {
        name: median_ratio(rounds, name, f"{name} ({stack})") for name in AGAINST_ROWS
        if name in rounds[0]}}


def measure_against(args, steps, launchers, cores):
    """--against_only: the AGAINST_ROWS rows alone, ours and --against's in turns, in rounds."""
    from utils.hardware import bf16_units
    if not args.against:
        raise SystemExit("error: --against_only needs --against (an interpreter, or a checkout "
                         "with its own .venv); e.g. make bench-against AGAINST=../other-checkout")
    stack = other_stack(args.against)
    runs = {name: run for name, run in trainer_runs(SIZES, steps, launchers, None).items()
            if name in AGAINST_ROWS}
    rounds, summary = run_rounds(with_runs_against(runs, args.against, stack), args.rounds,
                                 args.data_path)
    return {"cores": cores, "cpu": cpu_model(), "bf16_units": bf16_units(),
            "rounds": args.rounds, **summary, "against": against_ratios(rounds, stack)}


def against_rows(result):
    """(label, value) rows of the --against comparison: each row's words/sec on both stacks,
    the within-round ratios and their median."""
    stack, ours = result["against"]["stack"], result["against"]["ours"]
    rows = [("ours / against", f"{ours} / {stack}")]
    for name, ratio in result["against"]["ratios"].items():
        theirs = result[f"{name} ({stack})"]
        per_round = ", ".join(f"{a / b:.2f}" for a, b in zip(result[name]["wps_per_round"],
                                                             theirs["wps_per_round"]))
        rows.append((f"{name}, ours / against",
                     f"{result[name]['wps']:,.0f} / {theirs['wps']:,.0f} wps: {ratio:.2f}x "
                     f"(rounds: {per_round})"))
    return rows


def measure_all(args, sizes, steps, launchers, cores):
    """The full benchmark (or --quick): the ceilings, floors, profiles and every trainer row in
    rounds, and the ratios between rows; the result that write_result keeps."""
    from utils.hardware import bf16_units
    peer = find_peer(args.peer_python)
    against = other_stack(args.against) if args.against else None
    rates = matmul_gflops(matmul_shapes())
    gflops = max(rates.values())
    rates_bf16 = matmul_gflops(matmul_shapes(), dtype="bf16")
    gflops_bf16 = max(rates_bf16.values())
    reps = 9 if args.quick else 15
    n_rounds = 1 if args.quick else 3
    profile = profile_small(reps)
    ablation = ablations(reps)
    evaluation = eval_cost(args.data_path, *((4, 100) if args.quick else (8, 300)))
    result = {"cores": cores, "cpu": cpu_model(), "bf16_units": bf16_units(),
              "matmul_gflops": gflops, "matmul_gflops_by_shape": rates,
              "bf16_matmul_gflops": gflops_bf16, "bf16_matmul_gflops_by_shape": rates_bf16,
              "small_step_profile_ms": profile, "valid_eval_cost": evaluation,
              "ablation_fwd_bwd_ms": ablation}
    for size in sizes:  # the words/sec each config would reach at the matmul ceiling
        result[f"{size}_flops_per_word"] = flops_per_word(config.load_config(f"config_{size}"))
        result[f"{size}_wps_ceiling"] = gflops * 1e9 / result[f"{size}_flops_per_word"]
        result[f"{size}_matmul_floor_ms"] = matmul_floor(config.load_config(f"config_{size}"),
                                                         reps, n_rounds + 2)
        result[f"{size}_bf16_matmul_floor_ms"] = matmul_floor(
            config.load_config(f"config_{size}"), reps, n_rounds + 2, dtype="bf16")
        result[f"{size}_bf16_wps_ceiling"] = gflops_bf16 * 1e9 / result[f"{size}_flops_per_word"]
    runs = trainer_runs(sizes, steps, launchers, peer)
    if against:
        runs = with_runs_against(runs, args.against, against)
    rounds, summary = run_rounds(runs, n_rounds, args.data_path)
    result.update(summary)
    if against:
        result["against"] = against_ratios(rounds, against)
    if peer:
        result["layer_vs_pytorch"] = layer_vs_peer(peer, n_rounds, reps)
        for size in sizes:
            result[f"{size}_single_vs_pytorch"] = median_ratio(
                rounds, f"{size}_single_all_cores", f"{size}_pytorch")
            result[f"{size}_bf16_vs_pytorch_bf16"] = median_ratio(
                rounds, f"{size}_single_bf16", f"{size}_pytorch_bf16")
            result[f"{size}_pytorch_bf16_vs_fp32"] = median_ratio(
                rounds, f"{size}_pytorch_bf16", f"{size}_pytorch")
    for size in sizes:
        result[f"{size}_bf16_vs_fp32"] = median_ratio(rounds, f"{size}_single_bf16",
                                                      f"{size}_single_all_cores")
        result[f"{size}_bf16_share_of_bf16_ceiling"] = \
            result[f"{size}_single_bf16"]["wps"] / result[f"{size}_bf16_wps_ceiling"]
    for size in sizes:
        result[f"{size}_share_of_ceiling"] = \
            result[f"{size}_single_all_cores"]["wps"] / result[f"{size}_wps_ceiling"]
        two, single = f"{size}_2ranks_1thread", f"{size}_single_all_cores"
        no_allreduce = f"{size}_2procs_half_batch_no_allreduce"
        result[f"{size}_2ranks_vs_single_process"] = median_ratio(rounds, two, single)
        result[f"{size}_no_allreduce_vs_single_process"] = median_ratio(rounds, no_allreduce, single)
        result[f"{size}_2ranks_vs_no_allreduce"] = median_ratio(rounds, two, no_allreduce)
    result["small_2_vs_1_rank_speedup"] = median_ratio(rounds, "small_2ranks_1thread",
                                                       "small_1rank_1thread")
    result["rounds"] = n_rounds
    return result


def report_rows(result, sizes):
    """(label, value) rows of a full or quick result, as printed: from the result alone, so a
    kept result (results/bench/*.json) gives its rows again."""
    peer = "layer_vs_pytorch" in result
    against = result.get("against", {}).get("stack")
    rates, rates_bf16 = result["matmul_gflops_by_shape"], result["bf16_matmul_gflops_by_shape"]
    gflops, gflops_bf16 = result["matmul_gflops"], result["bf16_matmul_gflops"]
    evaluation, profile = result["valid_eval_cost"], result["small_step_profile_ms"]
    ablation = result["ablation_fwd_bwd_ms"]
    rows = ceiling_rows(rates) + ceiling_rows(rates_bf16, "bf16") + [
        ("bf16 units of this CPU (/proc/cpuinfo)", ", ".join(result["bf16_units"]) or
         "none: bf16 is emulated")]
    for size in sizes:
        rows += [
            (f"{size}: FLOPs per word (fwd + bwd)", f"{result[f'{size}_flops_per_word'] / 1e6:.1f} MFLOP"),
            (f"{size}: words/sec at that ceiling", f"{result[f'{size}_wps_ceiling']:,.0f} wps"),
            (f"{size}, single process, all cores", f"{result[f'{size}_single_all_cores']['wps']:,.0f} wps "
                                                    f"({100 * result[f'{size}_share_of_ceiling']:.0f} % of ceiling)"),
            floor_row(size, result[f"{size}_matmul_floor_ms"], gflops,
                      config.load_config(f"config_{size}")),
            (f"{size}, 2 ranks x 1 thread", f"{result[f'{size}_2ranks_1thread']['wps']:,.0f} wps"),
            (f"{size}, 2 ranks x 1 thread / single process",
             f"{result[f'{size}_2ranks_vs_single_process']:.2f}x"),
            (f"{size}, 2 processes x 1 thread, half batch, no allreduce",
             f"{result[f'{size}_2procs_half_batch_no_allreduce']['wps']:,.0f} wps "
             f"({result[f'{size}_no_allreduce_vs_single_process']:.2f}x the single process): "
             "the bound for 2 ranks"),
            (f"{size}, 2 ranks x 1 thread / that bound", f"{result[f'{size}_2ranks_vs_no_allreduce']:.2f}x"),
        ]
    for size in sizes:
        cfg = config.load_config(f"config_{size}")
        rows += [
            (f"{size}, single process, bf16", f"{result[f'{size}_single_bf16']['wps']:,.0f} wps "
                                               f"({100 * result[f'{size}_bf16_share_of_bf16_ceiling']:.0f} % "
                                               "of the bf16 ceiling)"),
            (f"{size}, bf16 / fp32 (single process)", f"{result[f'{size}_bf16_vs_fp32']:.2f}x"),
            (f"{size}, fp32 floor / bf16 floor (the most bf16 could gain on matmuls alone)",
             f"{result[f'{size}_matmul_floor_ms']['step floor'] / result[f'{size}_bf16_matmul_floor_ms']['step floor']:.2f}x"),
            floor_row(f"{size}, bf16", result[f"{size}_bf16_matmul_floor_ms"], gflops_bf16, cfg),
        ]
        if peer:
            rows += [(f"{size}, bf16 / PyTorch's autocast bf16",
                      f"{result[f'{size}_bf16_vs_pytorch_bf16']:.2f}x (PyTorch autocast / its "
                      f"fp32: {result[f'{size}_pytorch_bf16_vs_fp32']:.2f}x)")]
    rows += [
        ("small, 1 rank x 1 thread", f"{result['small_1rank_1thread']['wps']:,.0f} wps"),
        ("small, 2 ranks x 1 thread / 1 rank x 1 thread", f"{result['small_2_vs_1_rank_speedup']:.2f}x"),
        ("small, 1 rank x 1 thread, half batch", f"{result['small_1rank_1thread_half_batch']['wps']:,.0f} wps"
                                                  " (alone on the machine)"),
        ("peak RSS, small single / rank 0 of 2", f"{result['small_single_all_cores']['peak_rss_mb']:,.0f}"
                                               f" / {result['small_2ranks_1thread']['peak_rss_mb']:,.0f} MB"),
    ]
    if peer:
        for size in sizes:
            rows.append((f"{size}, PyTorch (same model, all cores)",
                         f"{result[f'{size}_pytorch']['wps']:,.0f} wps"))
            rows.append((f"{size}, single process / PyTorch",
                         f"{result[f'{size}_single_vs_pytorch']:.2f}x"))
        for size, r in result["layer_vs_pytorch"].items():
            rows.append((f"one {size} LSTM layer fwd+bwd, ours / PyTorch's",
                         f"{r['ours_ms']:.1f} / {r['pytorch_ms']:.1f} ms: "
                         f"{r['ours_vs_pytorch']:.2f}x PyTorch's speed"))
    for name, r in evaluation.items():
        rows.append((f"{name[7:]}: valid evaluation / training epoch",
                     f"batch 1 x 35: {r['valid_s, batch 1 x 35']:.0f} s "
                     f"({100 * r['valid_share, batch 1 x 35']:.1f} %), training layout: "
                     f"{r['valid_s, training layout']:.0f} s "
                     f"({100 * r['valid_share, training layout']:.1f} %) "
                     f"of {r['train_epoch_s']:.0f} s"))
    if against:
        rows += against_rows(result)
    rows += [(f"small step profile: {name}", f"{ms:.1f} ms") for name, ms in profile.items()]
    rows += [(f"fwd+bwd {name}", f"{ms:.1f} ms") for name, ms in ablation.items()]
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="fewer steps, one round, no large rows; under 4 minutes")
    p.add_argument("--tune", nargs="?", const="small", choices=SIZES,
                   help="only Horovod's settings for 2 ranks on this host, for one config (small "
                        "if none: about 15 minutes; large: 12 to 35, by CPU)")
    p.add_argument("--ceiling", action="store_true",
                   help="only the fp32 matmul rates the ceiling is taken from (under a minute)")
    p.add_argument("--floor", action="store_true",
                   help="only each config's matmuls timed alone, in fp32 and in bf16, the least "
                        "time a train step could take here, against the ceilings (about 4 "
                        "minutes)")
    p.add_argument("--profile-layer", action="store_true",
                   help="only where one medium LSTM layer's time goes (under a minute)")
    p.add_argument("--data_path", default=DEFAULT_DATA_PATH)
    p.add_argument("--out", default=os.path.join(REPO, "runs", "bench.json"))
    p.add_argument("--peer_python", default=os.path.join(REPO, ".venv-peer", "bin", "python"),
                   help="interpreter with PyTorch for the peer rows ('' to leave them out)")
    p.add_argument("--against", default="",
                   help="another venv's interpreter (another TensorFlow, say: make venv-tf2.15), "
                        "or another checkout with its own .venv (another commit: its trainers "
                        "run): each config's single process in fp32 and bf16 and small's 2 ranks "
                        "run on it too, in turns with ours, and their ratios")
    p.add_argument("--against_only", action="store_true",
                   help="only those rows, ours and --against's, in --rounds rounds (5-6 minutes "
                        "a round on a 2-core EPYC with avx512_bf16)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of --against_only")
    args = p.parse_args(argv)
    sizes = ("small", "medium") if args.quick else SIZES
    # steps a run, at 10 steps a window (the first one, tracing, left out)
    # (quick: enough for the bound's 2 copies to run together for seconds on the fastest CPU)
    steps = {"small": 300, "medium": 60} if args.quick else \
        {"small": 600, "medium": 100, "large": 60}
    py = [sys.executable]
    mpirun = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
              "--oversubscribe", "-bind-to", "none"]
    dist = [sys.executable, "lm_ptb_distributed.py"]
    cores = len(os.sched_getaffinity(0))
    if args.tune:
        return write_result(tune(args, (py, mpirun, dist)), args.out)
    if args.ceiling:
        rates = matmul_gflops(matmul_shapes())
        print(f"fp32 matmul, {cores} cores, {cpu_model()}; GFLOP/s, median of 10")
        for shape, rate in rates.items():
            print(f"  {shape:<28} {rate:6.0f}")
        for label, value in ceiling_rows(rates):
            print(f"  {label}  {value}")
        return write_result({"cores": cores, "cpu": cpu_model(), "matmul_gflops": max(rates.values()),
                             "matmul_gflops_by_shape": rates}, args.out)
    if args.floor:
        print(f"a train step's matmuls alone, fp32 and bf16, {cores} cores, {cpu_model()}; ms, "
              "medians of 5 rounds in turns")
        rows, result = [], {"cores": cores, "cpu": cpu_model()}
        for dtype in ("fp32", "bf16"):
            rates = matmul_gflops(matmul_shapes(), dtype=dtype)
            gflops = max(rates.values())
            prefix = "" if dtype == "fp32" else "bf16_"
            rows += ceiling_rows(rates, dtype)
            result[f"{prefix}matmul_gflops"] = gflops
            for size in SIZES:
                cfg = config.load_config(f"config_{size}")
                floor = result[f"{size}_{prefix}matmul_floor_ms"] = matmul_floor(cfg, dtype=dtype)
                rows += floor_rows(f"{size}{', bf16' if prefix else ''}", floor, gflops, cfg)
        print("\n".join(table_lines(rows)))
        return write_result(result, args.out)
    if args.profile_layer:
        print(f"one medium LSTM layer (20 x 35 x 650), {cores} cores, {cpu_model()}; ms, median "
              "of 15, parts timed in turns")
        for name, ms in layer_profile().items():
            print(f"  {name:<72} {ms:6.1f}")
        return None

    if args.against_only:
        result = measure_against(args, steps, (py, mpirun, dist), cores)
        print(f"\nours against {result['against']['stack']} ({cores} cores, {cpu_model()}, "
              f"bf16 units: {', '.join(result['bf16_units']) or 'none'}; {args.rounds} rounds in "
              "turns; ratios are medians of within-round ratios)")
        print("\n".join(table_lines(against_rows(result))))
        return write_result(result, args.out)
    result = measure_all(args, sizes, steps, (py, mpirun, dist), cores)
    print(f"\nbenchmark ({'quick' if args.quick else 'full'}, {cores} cores, {cpu_model()}, "
          f"{result['rounds']} round{'s' if result['rounds'] > 1 else ''}; ratios are medians "
          "of within-round ratios)")
    print("\n".join(table_lines(report_rows(result, sizes))))
    write_result(result, args.out)


if __name__ == "__main__":
    main()
