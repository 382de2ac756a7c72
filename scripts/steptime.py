"""Train-step time of a few variants (another venv, another environment variable, another
thread count), timed in close turns: one long-lived process per variant, each running a short
burst of steps in turn, many times. Pairs seconds apart see the same machine, so a drift of
this shared VM's speed over minutes cancels out of the ratios, which a run per variant cannot do.

    .venv/bin/python scripts/steptime.py --variant "2.21=.venv/bin/python" \\
        --variant "2.15=.venv-tf2.15/bin/python" --variant "no oneDNN=.venv/bin/python:TF_ENABLE_ONEDNN_OPTS=0"

A variant is LABEL=PYTHON[:NAME=VALUE,...] (TF_NUM_INTEROP_THREADS=1, say, for its own thread
count); ratios are against the first variant's step time
(above 1: slower). Random ids, the config's real shapes; the steps are the trainers' own.
With --loop a burst is the trainers' own epoch loop (loop.train_epoch) over that many
real PTB windows instead: the step plus what the trainer does around it.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import utils  # noqa: E402
utils.require_setup()  # a Python without .venv's TensorFlow stops here in one line

from utils import child_env  # noqa: E402
from utils.config import ConfigError, load_config  # noqa: E402


def parse_variant(text):
    """'label=python[:NAME=VALUE,...]' -> (label, python, {NAME: VALUE})."""
    label, sep, rest = text.partition("=")
    python, _, assignments = rest.partition(":")
    env = dict(a.split("=", 1) for a in assignments.split(",") if "=" in a)
    if not sep or not label or not python or len(env) != len([a for a in assignments.split(",")
                                                              if a]):
        raise ConfigError(f"--variant {text!r}: write LABEL=PYTHON or "
                          "LABEL=PYTHON:NAME=VALUE,NAME=VALUE")
    return label, python, env


class _Quiet:
    """train_epoch's log, for a burst: progress lines are not wanted."""
    def progress(self, *args, **kwargs):
        pass


def serve(config_name, overrides, threads, batch, data_path=None):
    """A worker: build the model and its train step, warm up, then on each 'N' line from the
    driver run N steps (with data_path: train_epoch over N real windows, each burst at the
    next ones) and answer with the seconds they took."""
    from utils import import_tensorflow
    tf = import_tensorflow()  # before the modules that import it
    from utils import optimizers, train_steps
    from utils.model import build
    # a variant may set TensorFlow's own TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS
    if "TF_NUM_INTRAOP_THREADS" not in os.environ:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    if "TF_NUM_INTEROP_THREADS" not in os.environ:
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    cfg = load_config(config_name, overrides)
    batch = batch or cfg["batch_size"]
    model = build(cfg, 10000)  # the config's model: another one is timed the same way
    step = train_steps.make_train_step(model, optimizers.make_optimizer(cfg))
    ids = tf.random.stateless_uniform([batch, cfg["num_steps"]], [1, 2], maxval=10000,
                                      dtype=tf.int32)
    state = model.zero_state(batch)
    for _ in range(3):  # tracing and warm-up
        loss, state = step(ids, ids, state)
    float(loss)
    if data_path:
        return serve_loop(step, model, cfg, batch, data_path)
    print(f"ready TensorFlow {tf.__version__}", flush=True)
    for line in sys.stdin:
        t0 = time.perf_counter()
        for _ in range(int(line)):
            loss, state = step(ids, ids, state)
        float(loss)
        print(time.perf_counter() - t0, flush=True)


def serve_loop(step, model, cfg, batch, data_path):
    import tensorflow as tf
    from data import ptb
    from utils import loop
    x, y = ptb.windows(ptb.load_corpus(data_path).train, batch, cfg["num_steps"], "train")
    at = 0
    print(f"ready TensorFlow {tf.__version__}", flush=True)
    for line in sys.stdin:
        n = int(line)
        at = at if at + n <= len(x) else 0
        t0 = time.perf_counter()
        loop.train_epoch(step, model, x[at:at + n], y[at:at + n], 0,
                             dict(cfg, batch_size=batch, steps_per_epoch=n), _Quiet(),
                             log_every=n)
        print(time.perf_counter() - t0, flush=True)
        at += n


def start_worker(label, python, env, args):
    cmd = [python, os.path.abspath(__file__), "--serve", "--config", args.config,
           *(f"--set={item}" for item in args.set),
           "--threads", str(args.threads), "--batch_size", str(args.batch_size),
           *(["--loop", "--data_path", args.data_path] if args.loop else [])]
    try:
        proc = subprocess.Popen(cmd, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=child_env(TF_CPP_MIN_LOG_LEVEL="3", **env))
    except OSError as e:
        raise SystemExit(f"error: variant {label!r}: cannot run {python} ({e.strerror}); give "
                         "a Python with TensorFlow, e.g. .venv/bin/python") from None
    first = proc.stdout.readline().strip()
    if not first.startswith("ready"):
        raise SystemExit(f"error: variant {label!r} ({python}) did not start: {first or 'no output'}")
    return proc, first.removeprefix("ready ")


def measure(variants, args):
    """Rounds of one burst per variant, the order rotated each round; per variant the median ms
    a step and the median of its within-round ratios to the first variant."""
    workers = [start_worker(label, python, env, args) for label, python, env in variants]
    bursts = {label: [] for label, _, _ in variants}
    try:
        for r in range(args.rounds):
            order = list(range(len(variants)))
            order = order[r % len(order):] + order[:r % len(order)]
            for i in order:
                proc = workers[i][0]
                proc.stdin.write(f"{args.steps}\n")
                proc.stdin.flush()
                bursts[variants[i][0]].append(1000 * float(proc.stdout.readline()) / args.steps)
    finally:
        for proc, _ in workers:
            proc.stdin.close()
            proc.wait()
    first = variants[0][0]
    return {label: {"stack": stack, "env": env, "python": python,
                    "ms_per_step": statistics.median(bursts[label]),
                    "vs_first": statistics.median(b / a for a, b in zip(bursts[first],
                                                                         bursts[label])),
                    "bursts_ms": bursts[label]}
            for (label, python, env), (_, stack) in zip(variants, workers)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variant", action="append", default=[], help="LABEL=PYTHON[:NAME=VALUE,...]")
    p.add_argument("--config", default="config_small")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value in every variant, as the trainers' --set does "
                        "(precision='bf16', say)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--batch_size", type=int, default=0, help="0: the config's")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--steps", type=int, default=10, help="steps a burst")
    p.add_argument("--loop", action="store_true",
                   help="time the trainers' epoch loop over real PTB windows, not the step alone")
    p.add_argument("--data_path", default=os.environ.get("PTB_DATA_PATH", "data/ptb"))
    p.add_argument("--out", default="")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return serve(args.config, args.set, args.threads, args.batch_size,
                     args.data_path if args.loop else None)
    try:
        load_config(args.config, args.set)  # a bad name or value: one line, before any worker
        variants = [parse_variant(v) for v in args.variant]
        if len(variants) < 2:
            raise ConfigError("give two --variant or more: the first is what the others are "
                              "measured against")
        if args.loop:
            from data import ptb
            if ptb.missing_files(args.data_path):
                raise ConfigError(f"--loop: no PTB files in {args.data_path}; give --data_path "
                                  "or PTB_DATA_PATH (make data fetches them)")
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    from scripts.record_env import cpu_model
    result = measure(variants, args)
    what = "train_epoch loop (real windows)" if args.loop else "train step"
    sets = "".join(f" --set {item}" for item in args.set)
    print(f"{args.config}{sets} {what}, {args.threads} threads, {cpu_model()}, {args.rounds} "
          f"rounds of {args.steps} steps in turns; ratio: median of within-round ratios to the "
          "first")
    for label, r in result.items():
        extra = " ".join(f"{k}={v}" for k, v in r["env"].items())
        print(f"  {label:<24} {r['ms_per_step']:7.1f} ms  {r['vs_first']:.3f}x  ({r['stack']}"
              f"{', ' + extra if extra else ''})")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"config": args.config, "set": args.set, "what": what,
                       "threads": args.threads, "cpu": cpu_model(), "rounds": args.rounds,
                       "steps": args.steps, "variants": result}, f, indent=1)
    return result


if __name__ == "__main__":
    main()
