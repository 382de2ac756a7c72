"""What the benchmark's modes share: the configs they run, the trainer rows and how a row is run
and timed, the rounds, the table and the JSON file.

Every words/sec figure is the median over timed windows of the trainer's own progress events
(`--log_every` steps each), the first window (tracing, warm-up) left out; for trainers run side
by side, all their words over the time all of them ran. Rows run in rounds, one after the other
within each round, and each ratio is the median of the ratios within a round, so that a drift
of this shared machine's speed between rounds does not become a speedup.
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

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
import utils  # noqa: E402
utils.require_setup()  # a Python without .venv's TensorFlow stops here in one line
import numpy as np  # noqa: E402

from utils import child_env, config, import_tensorflow  # noqa: E402
from utils.config import DEFAULT_DATA_PATH  # noqa: E402
from utils.errors import ConfigError  # noqa: E402

VOCAB = 10000
SIZES = ("small", "medium", "large")
PEER_SCRIPT = os.path.join(REPO, "scripts", "peer_pytorch.py")
BF16 = ("--set", "precision='bf16'")  # a trainer's (or the peer's) flags for bf16
# steps a run, at 10 steps a window (the first one, tracing, left out); a config other than the
# three runs small's
STEPS = {"small": 600, "medium": 100, "large": 60}


def config_name(size_or_config):
    """The config of a size (config_small for small), or a config's name or path as given."""
    return f"config_{size_or_config}" if size_or_config in SIZES else size_or_config


def label(name):
    """A config's label in the rows and JSON keys: small for config_small, tiny for
    tests/config_tiny.py."""
    base = os.path.splitext(os.path.basename(name))[0]
    return base[len("config_"):] if base.startswith("config_") else base


def configs_of(names):
    """label: config name or path, in order."""
    return {label(config_name(n)): config_name(n) for n in names}


DEFAULT_CONFIGS = configs_of(SIZES)


def checked_configs(names):
    """configs_of(names), each config loaded once: a name or file that is no config, or not a
    valid one, stops the benchmark here in one line, not in a trainer's traceback later."""
    if not names:
        return None
    configs = configs_of(names)
    for name in configs.values():
        try:
            config.load_config(name)
        except ConfigError as e:
            raise SystemExit(f"error: {e}")
    return configs


def steps_of(configs, steps=None, table=STEPS):
    """label: steps of each trainer run of the config: `steps` (--steps), or the table's."""
    return {size: steps or table.get(size, table["small"]) for size in configs}


def parser(description, data=False, out="bench.json", configs=True):
    """--configs (`configs`), --data_path (`data`: the modes that train) and --out (`out`: the
    JSON file in runs/, None for a mode that writes none)."""
    p = argparse.ArgumentParser(description=description)
    if configs:
        p.add_argument("--configs", nargs="+", metavar="CONFIG",
                       help="the configs of the rows instead of small, medium and large: sizes, "
                            "or configs' names or paths; the first takes small's place (its "
                            "1-rank rows, its step profile). tests/config_tiny.py with --steps "
                            "300 --rounds 1: the whole benchmark in minutes")
    if data:
        p.add_argument("--data_path", default=DEFAULT_DATA_PATH)
    if out:
        p.add_argument("--out", default=os.path.join(REPO, "runs", out))
    return p


def add_runs_flags(p, rounds=3, steps="600, 100 and 60 for small, medium and large"):
    """--steps and --rounds, of the modes that run trainers."""
    p.add_argument("--steps", type=int, help=f"steps of every trainer run ({steps})")
    p.add_argument("--rounds", type=int, help=f"rounds of every row in turns ({rounds})")


def launchers():
    """(one process, mpirun, the distributed trainer): the launchers of the rows."""
    mpirun = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
              "--oversubscribe", "-bind-to", "none"]
    return [sys.executable], mpirun, [sys.executable, "lm_ptb_distributed.py"]


def cores():
    return len(os.sched_getaffinity(0))


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


def half_batch(config_name):
    """Trainer flags for what each of 2 ranks runs: half the global batch on one thread."""
    return ("--threads", "1", "--set",
            f"batch_size={config.load_config(config_name)['batch_size'] // 2}")


def no_allreduce_bound(py, config_name, steps):
    """A run of 2 plain trainers at once, each as one of 2 ranks but without the allreduce: the
    most 2 ranks can reach on these cores."""
    return (py + ["lm_ptb.py"], config_name, steps, half_batch(config_name), 2)


def trainer_runs(configs, steps, launchers, peer):
    """name: (launcher, config, steps, extra flags, copies side by side) of every trainer row,
    for `configs` (label: config); the 1-rank rows are the first config's (small's)."""
    py, mpirun, dist = launchers
    first, first_name = next(iter(configs.items()))
    n_first = steps[first]
    runs = {  # name: (launcher, config, steps, extra flags, copies side by side)
        f"{first}_1rank_1thread": (mpirun + ["-np", "1"] + dist, first_name, n_first // 2,
                                   ("--threads", "1"), 1),
        # what each of the 2 ranks runs: half the rows, one core
        f"{first}_1rank_1thread_half_batch": (mpirun + ["-np", "1"] + dist, first_name,
                                              n_first // 2, half_batch(first_name), 1),
    }
    for size, name in configs.items():  # one process on all cores against 2 ranks of one
        n = steps[size]                   # thread, each config
        runs[f"{size}_single_all_cores"] = (py + ["lm_ptb.py"], name, n, (), 1)
        # small's 2 ranks run half the steps, as before; large's 60 are few windows already
        n_ranks = n if size == "large" else n // 2
        runs[f"{size}_2ranks_1thread"] = (mpirun + ["-np", "2"] + dist, name,
                                          n_ranks, ("--threads", "1"), 1)
        runs[f"{size}_2procs_half_batch_no_allreduce"] = no_allreduce_bound(py, name, n_ranks)
        # precision bf16, right after its fp32 run in each round
        runs[f"{size}_single_bf16"] = (py + ["lm_ptb.py"], name, n, BF16, 1)
        if peer:  # the same model in PyTorch, timed in the same rounds, right after ours
            runs[f"{size}_pytorch"] = ([peer, PEER_SCRIPT], name, n, (), 1)
            runs[f"{size}_pytorch_bf16"] = ([peer, PEER_SCRIPT], name, n, BF16, 1)
    return runs


def run_trainer(launcher, config_name, steps, log_every, data_path, extra=(), copies=1):
    """Run `copies` of a trainer side by side for `steps` steps each; returns (words/sec, how it
    was measured, peak RSS MB of one trainer, rank 0 under mpirun). One trainer: the median of
    its windows. Several: all their words while all of them run, over that time, so that a copy
    still starting or already done does not count as running beside the others. Copies whose
    start-ups differed by about their whole run did not run together for a second: they run
    again with twice the steps, twice at most."""
    for attempt in range(3):
        runs = run_copies(launcher, config_name, steps, log_every, data_path, extra, copies)
        rss = max(r.peak_rss_mb for r in runs)
        if copies == 1:
            times, done, words, _ = runs[0]
            windows = [(b - a) * words / (t1 - t0)
                       for a, b, t0, t1 in zip(done, done[1:], times, times[1:])]
            return statistics.median(windows), f"median of {len(windows)} windows", rss
        start, end = max(r.times[0] for r in runs), min(r.times[-1] for r in runs)
        if end - start >= 1:
            words = sum((np.interp(end, times, done) - np.interp(start, times, done)) * per_step
                        for times, done, per_step, _ in runs)
            return words / (end - start), f"{copies} copies together for {end - start:.1f} s", rss
        if attempt < 2:
            print(f"benchmark: the {copies} copies of {config_name} ran together for "
                  f"{max(end - start, 0):.1f} s only; again with {2 * steps} steps each",
                  file=sys.stderr, flush=True)
            steps *= 2
    raise SystemExit(f"benchmark: the {copies} copies of {config_name} did not run together "
                     f"for a second ({max(end - start, 0):.1f} s), even with {steps} steps; "
                     "give them more --steps")


def run_copies(launcher, config_name, steps, log_every, data_path, extra, copies):
    """The progress of `copies` runs of a trainer started side by side (a failed one exits)."""
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
        return [read_progress(os.path.join(out, "metrics.jsonl")) for out in outs]


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


def log_every(steps):
    """Steps a timed window: 10, or fewer in a run too short for 3 windows of 10 (the first
    window, tracing, is left out)."""
    return max(1, min(10, steps // 3))


def run_rounds(runs, n_rounds, data_path):
    """Rounds of all runs in turn: speedups are then medians of ratios within a round, so a
    drift of the machine's speed between rounds cancels out. Returns (the rounds, per run:
    median wps and what was measured)."""
    rounds = [{} for _ in range(n_rounds)]
    for i, measured in enumerate(rounds):
        for name, (launcher, cfg_name, n, extra, copies) in runs.items():
            wps, how, rss = run_trainer(launcher, cfg_name, n, log_every(n), data_path, extra,
                                        copies)
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


def table_lines(rows):
    """(label, value) rows as printed: labels padded to the longest, two spaces before the
    value however wide either is."""
    rows = list(rows)
    width = max(len(name) for name, _ in rows)
    return [f"  {name:<{width}}  {value}" for name, value in rows]


def write_result(result, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"  written to {path}")
