"""What every job of scripts/results/ reads of the runs under results/runs/ (a folder each,
with its metrics.jsonl and run.json): the runs loaded, their epochs, times, precision, Keras and
seed, and the marked block of a page that a job rewrites."""
import json
import os
import re
import shlex
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
import utils  # noqa: E402
utils.require_setup()  # a Python without .venv's TensorFlow stops here in one line
from utils.cli import DEFAULT_SEED  # noqa: E402  the trainers' --seed, where a run gave none
from utils.logs import whole_epoch_s  # noqa: E402
RESULTS = os.path.join(REPO, "results")
RUNS = os.path.join(RESULTS, "runs")  # the training runs: a folder each, with run.json


CONFIGS = ("config_small", "config_medium", "config_large")


TRAIN_TOKENS = 929589  # ptb.train.txt with <eos>; checked by tests/test_reader.py


def load(name, runs=None):
    """The run kept in results/runs/NAME (or in the folder `runs`)."""
    folder = os.path.join(runs or RUNS, name)
    with open(os.path.join(folder, "run.json")) as f:
        run = json.load(f)
    events = read_events(folder)
    run.update(name=name, events=events, config=newest_config(events),
               workers=events[0]["world_size"])
    return run


def load_all(runs=None):
    runs = runs or RUNS
    return [load(n, runs) for n in sorted(os.listdir(runs))
            if os.path.isfile(os.path.join(runs, n, "run.json"))]


def read_events(path):
    """The events of a metrics.jsonl, or of the one in folder `path`."""
    path = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    with open(path) as f:
        return [json.loads(line) for line in f]


def newest_config(events):
    """The config a run trains under now, from its metrics events: a resume may have lengthened
    the schedule, or changed more with --change_config, and logged the config it went on with.
    scripts/reproduce.py's status line reads it here too."""
    return [e["config"] for e in events if "config" in e][-1]


def full_epoch_steps(cfg):
    return (TRAIN_TOKENS // cfg["batch_size"] - 1) // cfg["num_steps"]


def epoch_time(run):
    """Median seconds per epoch: measured epochs, or step time x steps of a full epoch; None
    for a run started again that has not finished its first epoch yet."""
    if run["kind"] != "bounded":
        seconds = [whole_epoch_s(e) for e in run["events"] if e["event"] == "epoch"]
        return statistics.median(seconds) if seconds else None
    progress = [e for e in run["events"] if e["event"] == "progress"]
    step_s = [(b["time"] - a["time"]) / (b["step"] - a["step"])
              for a, b in zip(progress, progress[1:]) if b["step"] > a["step"]]
    return statistics.median(step_s) * full_epoch_steps(run["config"])


def epoch_count(run):
    return sum(e["event"] == "epoch" for e in run["events"])


def last(run, event, key):
    values = [e[key] for e in run["events"] if e["event"] == event]
    return values[-1] if values else None


def epoch_ends(events):
    """Epoch -> its last "epoch" event (an epoch trained twice: the later one)."""
    return {e["epoch"]: e for e in events if e["event"] == "epoch"}


def longest_trained(runs, name, workers):
    """The config's trained (not bounded) run with most epochs with that many workers, or None."""
    trained = [r for r in runs if r["config"]["name"] == name and r["workers"] == workers
               and r["kind"] != "bounded"]
    return max(trained, key=epoch_count) if trained else None


def longest_runs(runs):
    """Per config, its trained (not bounded) runs with most epochs: 2 workers, then 1 process."""
    return {name: [r for r in (longest_trained(runs, name, w) for w in (2, 1)) if r]
            for name in CONFIGS}


def machine(runs):
    cpus = sorted({f"{r['env']['cpu']}, {r['env']['cores']} cores" for r in runs if r})
    return "; ".join(cpus) or "—"


def precision(run):
    return run["config"].get("precision", "fp32")  # runs logged before the key: fp32


def keras(run):
    """"Keras 3" for a run on TensorFlow's own Keras 3 (its environment records Keras 3.x), else
    "tf-keras": the runs from before Keras 3 was the default recorded no Keras."""
    return "Keras 3" if str(run.get("env", {}).get("keras", "")).startswith("3") else "tf-keras"


def keras3_only(runs):
    return [r for r in runs if keras(r) == "Keras 3"]


def tf_keras_only(runs):
    return [r for r in runs if keras(r) == "tf-keras"]


def fp32_only(runs):
    return [r for r in runs if precision(r) == "fp32"]


def seed_of(run):
    """The --seed its command gave the trainer (the trainers' default where none)."""
    words = shlex.split(run.get("command", ""))
    return int(words[words.index("--seed") + 1]) if "--seed" in words else DEFAULT_SEED


def is_seed_run(run):
    """A run of `make reproduce SEED=N`, one of a row's several seeds (folder ...-seedN)."""
    return re.search(r"-seed\d+$", run["name"]) is not None


def seed_runs(runs):
    return [r for r in runs if is_seed_run(r)]


def replace_block(text, begin, end, lines):
    if begin not in text:
        sys.exit(f"error: no {begin} marker where the table goes")
    head, rest = text.split(begin, 1)
    return head + "\n".join([begin, *lines, end]) + rest.split(end, 1)[1]


def rewrite_block(path, begin, end, lines):
    """The page at `path` with `lines` between its markers `begin` and `end`."""
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(replace_block(text, begin, end, lines))
