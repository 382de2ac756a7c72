"""A results row that takes longer than one sitting: start it, or continue it, with one command.

    make reproduce CONFIG=config_medium          # = python scripts/reproduce.py start ...
    make reproduce-status CONFIG=config_medium   # = python scripts/reproduce.py status ...
    make reproduce-stop CONFIG=config_medium     # = python scripts/reproduce.py stop ...

`start` launches `mpirun -np NP lm_ptb_distributed.py` in the background (it outlives this
command, not the machine), with --resume when the run folder holds a run, appending its
output to <run>/train.log, and records the start (time, commit, CPU, command) as a segment.
It returns once the trainer's own output tells how the start went: its first progress line,
or its error and exit code (a checkpoint that does not fit, a changed config, a folder it
cannot write), or its line saying the run is finished.
`status` says whether it runs, the epoch reached and the ETA, and copies the logs that the
results table reads, and train.log, into results/runs/<size>-<NP>workers/ (kind "running"
while it runs, "partial" when stopped before its last epoch, "full" when done), ready to commit.
Checkpoints stay in runs/ (about 80 MB for medium; not in git).
`stop` sends SIGTERM to the ranks: each ends its step, and rank 0 says which checkpoint is kept.
A start that finds no run folder where results/ holds an unfinished run's logs (its machine
ended, checkpoints and all) moves those logs to <row>-lost-<its start>/, a partial run, and
starts from epoch 0; if that run's folder exists under another --runs_dir, it refuses instead.
`shared "what"` records in the current segment what else ran on the machine beside the run
(its times per epoch are not those of an idle machine then), for the provenance.
"""
import argparse
import contextlib
import datetime
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import utils  # noqa: E402
utils.require_setup()  # a Python without .venv's TensorFlow stops here in one line
from data.ptb import DataError, check_shardable  # noqa: E402
from scripts.record_env import cpu_model, record  # noqa: E402
from scripts.results.common import epoch_time, newest_config  # noqa: E402
from utils import KERNEL_DEFAULTS, cli, config  # noqa: E402

DEFAULT_RUNS_DIR = os.path.join(REPO, "runs", "reproduce")  # the Makefile's RUNS ?= runs
# How long a start waits for the trainer's first progress line (log_every 100 steps: large in
# fp32 on a 2-core AVX2 host takes about 200 s to it, and its start-up is under a minute)
FIRST_LINE_WAIT_S = 900
# A checkpoint every this many steps inside an epoch too, so that a sitting's end loses minutes,
# not up to an epoch (large on a 2-core AVX2 host: 48-66 minutes an epoch, 4-5 per 100 steps); a
# resume continues from it exactly (docs/training.md). --set checkpoint_every=N overrides it.
STEP_CHECKPOINTS = 100
STOP_WAIT_S = 300  # a step, a save in progress, or a validation under way (large: minutes)
# TensorFlow's settings that choose its kernels (not the precision), which the trainer command
# does not show: a sitting records those it ran with, utils' defaults included (oneDNN on every
# x86 CPU since 2026-11-27; before, TensorFlow's: on only with AVX-512 VNNI or newer).
KERNEL_SETTINGS = ("TF_ENABLE_ONEDNN_OPTS",)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("action", choices=("start", "status", "stop", "shared"))
    p.add_argument("what", nargs="?", help="shared: what ran beside the run")
    p.add_argument("--config", default="config_medium")
    p.add_argument("--np", type=int, default=2, help="Horovod workers on this host")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default=None,
                   help="the matmuls' precision (default: the config's); a bf16 or fp16 run has folders "
                        "of its own")
    p.add_argument("--data_path", default=config.DEFAULT_DATA_PATH)
    p.add_argument("--seed", type=int, default=None,
                   help=f"passed to the trainer (default: its {cli.DEFAULT_SEED}); a run of "
                        "another seed has folders of its own")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="passed to the trainer (bounded runs in the tests)")
    p.add_argument("--wait_s", type=float, default=FIRST_LINE_WAIT_S,
                   help="start: how long to wait for the trainer's first progress line")
    p.add_argument("--change_config", action="store_true",
                   help="passed to the trainer at this start: resume under a changed config")
    p.add_argument("--runs_dir", default=DEFAULT_RUNS_DIR)
    p.add_argument("--results_dir", default=os.path.join(REPO, "results", "runs"))
    return p.parse_intermixed_args(argv)


def names(args):
    """(the run folder, the results folder) of this config, worker count, precision and seed."""
    size = os.path.basename(args.config).removesuffix(".py").removeprefix("config_")
    reduced = f"-{args.precision}" if args.precision in ("bf16", "fp16") else ""
    seed = f"-seed{args.seed}" if other_seed(args) else ""
    return (os.path.join(args.runs_dir, f"{size}-np{args.np}{reduced}{seed}"),
            os.path.join(args.results_dir, f"{size}-{args.np}workers{reduced}{seed}"))


def other_seed(args):
    """Whether the run has a --seed other than the trainer's default."""
    return args.seed is not None and args.seed != cli.DEFAULT_SEED


def make_command(args, settings=None, checkout=REPO, sets=(), target="reproduce"):
    """The make command that starts or continues this run; RUNS too where it is not the default,
    since the same command without it refuses to start the run again elsewhere, the kernel
    settings its last sitting ran with where they are not what the trainers set by default, the
    checkout it trains from where that is not this one (a clone of its own), and the --set
    values it last started with (without them a resume goes back to the config's num_epochs,
    or refuses a changed key)."""
    runs_dir = os.path.abspath(args.runs_dir)
    trainer_args = shlex.join(word for item in sets for word in ("--set", item))
    return " ".join([*([f"cd {checkout} &&"] if checkout != REPO else []),
                     *(f"{name}={value}" for name, value in (settings or {}).items()
                       if KERNEL_DEFAULTS.get(name) != value),
                     f"make {target} CONFIG={args.config}",
                     *([f"NP={args.np}"] if args.np != 2 else []),
                     *([f"PRECISION={args.precision}"] if args.precision != "fp32" else []),
                     *([f"SEED={args.seed}"] if other_seed(args) else []),
                     *([f"RUNS={os.path.dirname(runs_dir)}"] if runs_dir != DEFAULT_RUNS_DIR
                       else []),
                     *([f"ARGS={shlex.quote(trainer_args)}"] if trainer_args and
                       target == "reproduce" else [])])


def continue_command(args, run_dir):
    """The make command that continues the run in run_dir, from what its newest sitting
    recorded: its checkout, kernel settings and --set values."""
    segment = last_segment(run_dir)
    return make_command(args, segment.get("settings", {}), run_checkout(segment),
                        given_sets(segment))


def last_segment(run_dir):
    """The newest sitting's record in run_dir/segments.jsonl ({} if none)."""
    try:
        with open(os.path.join(run_dir, "segments.jsonl")) as f:
            return json.loads(f.read().splitlines()[-1])
    except (OSError, IndexError, ValueError):
        return {}


def given_sets(segment):
    """The --set values a sitting was started with on reproduce's command line. A sitting
    recorded before they were kept apart: the trainer command's --set values past the two that
    trainer_command adds itself (precision, which PRECISION gives, and checkpoint_every)."""
    if "sets" in segment:
        sets = segment["sets"]
    else:
        words = shlex.split(segment.get("command", ""))
        sets = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--set"][2:]
        sets = [s for s in sets if not s.startswith("precision=")]
    last = {s.split("=", 1)[0].strip(): s for s in sets}  # a key given twice: the trainer's last
    return list(last.values())


def running(run_dir):
    """pid of the run's mpirun if it is alive, else None."""
    try:
        with open(os.path.join(run_dir, "pid")) as f:
            pid = int(f.read())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return pid if b"lm_ptb_distributed.py" in f.read() else None


def trainer_command(args, run_dir):
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "-np", str(args.np), "-bind-to", "none", "-map-by", "slot",
            sys.executable, "lm_ptb_distributed.py", "--config", args.config,
            "--data_path", args.data_path, "--output_dir", run_dir, "--log_every", "100",
            "--set", f"precision={args.precision!r}",
            "--set", f"checkpoint_every={STEP_CHECKPOINTS}",
            *[f for s in args.set for f in ("--set", s)],
            *(["--seed", str(args.seed)] if args.seed is not None else [])]


def start(args):
    """Goes to the background once main() has checked the config and the worker count, and
    watches the job for its first seconds, so a run that cannot start says so here."""
    run_dir, results_dir = names(args)
    pid = running(run_dir)
    if pid:
        status = make_command(args, checkout=run_checkout(last_segment(run_dir)),
                              target="reproduce-status")
        print(f"reproduce: already running (mpirun pid {pid}); `{status}` says where it is")
        return 0
    resume = holds_a_run(run_dir)
    if not resume:
        problem = set_aside_lost_attempt(run_dir, results_dir)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    os.makedirs(run_dir, exist_ok=True)
    command = trainer_command(args, run_dir)
    if resume:
        command.append("--resume")
    if args.change_config:
        command.append("--change_config")
    env = record()
    segment = {"started_utc": env.pop("date_utc"), **env,
               "epochs_done_at_start": checkpoint_epochs(run_dir),
               "command": shlex.join(command), "sets": args.set}
    settings = {name: os.environ[name] for name in KERNEL_SETTINGS if name in os.environ}
    if settings:
        segment["settings"] = settings
    with open(os.path.join(run_dir, "segments.jsonl"), "a") as f:
        f.write(json.dumps(segment) + "\n")
    log_path = os.path.join(run_dir, "train.log")
    with open(log_path, "a") as log:
        offset = log.tell()
        job = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    with open(os.path.join(run_dir, "pid"), "w") as f:
        f.write(str(job.pid))
    code, line = first_report(job, log_path, offset, args.wait_s)
    if code:
        print(f"error: the run ended (exit {code}): {line}; fix that and run the same command "
              f"again (the whole output: {shown(run_dir)}/train.log)", file=sys.stderr)
        return 1
    what = ("finished" if job.poll() is not None else "resumed" if resume else "started")
    print(f"reproduce: {what} {args.config} with {args.np} worker{'s' if args.np > 1 else ''}"
          + ("" if what == "finished" else f" in the background (pid {job.pid})")
          + f"; its {'last' if what == 'finished' else 'first'} line: {line}; "
          f"log {shown(run_dir)}/train.log")
    return 0


def first_report(job, log_path, offset, wait_s):
    """(exit code, line) once the trainer's output past `offset` tells how the start went: its
    first progress line (0), or, if it ended, its error (from first_reason) and exit code, or
    its last line where it ended well (a finished run says so); (0, a note) if neither came
    within wait_s."""
    deadline = time.monotonic() + wait_s
    while True:
        code = job.poll()
        with open(log_path, errors="replace") as f:
            f.seek(offset)
            lines = [line.strip() for line in f]
        progress = next((line for line in lines if "| step " in line), None)
        if progress:
            return 0, progress
        if code is not None:
            said = [line for line in lines if line.startswith("[ptb]")]
            return (code, first_reason(lines)) if code else (0, said[-1] if said else "no line")
        if time.monotonic() > deadline:
            return 0, f"none yet after {wait_s:g} s (`make reproduce-status` follows it)"
        time.sleep(0.5)


def run_checkout(segment):
    """The checkout a sitting trained from (its venv's Python in the recorded command: a clone
    of its own for a run longer than the code stays still), else this one."""
    words = shlex.split(segment.get("command", ""))
    python = next((w for w in words if w.endswith("/.venv/bin/python")), None)
    return os.path.dirname(os.path.dirname(os.path.dirname(python))) if python else REPO


def output_dir(command):
    """The --output_dir of a recorded trainer command."""
    words = shlex.split(command)
    return words[words.index("--output_dir") + 1]


def set_aside_lost_attempt(run_dir, results_dir):
    """Before a start from epoch 0: logs in results_dir of an earlier start whose run folder,
    checkpoints and all, is gone (it was on a machine that ended) are a lost attempt: they move
    to a folder of their own as a partial run, so the new run's logs do not overwrite them.
    Returns a problem to report instead if that run's folder still exists elsewhere (RUNS
    pointing at another disk than at its start: resuming it is what was meant)."""
    path = os.path.join(results_dir, "run.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        run = json.load(f)
    if run.get("kind") == "full" or not run.get("segments"):
        return None  # a finished run is replaced by a new one's logs, as a reproduction should
    first = run["segments"][0]
    earlier = output_dir(first["command"])
    if os.path.abspath(earlier) != os.path.abspath(run_dir) and holds_a_run(earlier):
        return (f"{shown(results_dir)} is the run in {earlier}, not in {shown(run_dir)}; "
                "continue it with the RUNS it started with (its parent's parent), or move "
                f"{shown(results_dir)} aside to start another")
    epochs = sum(e["event"] == "epoch" for e in events(results_dir))
    stamp = first["started_utc"].replace(" ", "-").replace(":", "")
    lost = f"{results_dir}-lost-{stamp}"
    run["kind"] = "partial"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")
    run["lost"] = (f"after {epochs} epochs: no checkpoint of it at a start on {now} UTC "
                   f"({cpu_model()}); its run folder {earlier} ended with its machine")
    os.rename(results_dir, lost)
    with open(os.path.join(lost, "run.json"), "w") as f:
        json.dump(run, f, indent=1)
    print(f"reproduce: no checkpoint of the earlier run ({epochs} epochs, started "
          f"{first['started_utc']} UTC, folder {earlier}); its logs are kept as a partial run in "
          f"{shown(lost)}, and this run starts again from epoch 0")
    return None


def holds_a_run(run_dir):
    """Whether a trainer has written in run_dir: then --resume continues it (or, stopped before
    its first checkpoint, starts it afresh), where a plain start would refuse the folder."""
    return any(os.path.exists(os.path.join(run_dir, name))
               for name in ("metrics.jsonl", "checkpoints"))


def shown(path):
    return os.path.relpath(path, REPO) if path.startswith(REPO + os.sep) else path


def first_reason(lines):
    """What a failed start says, from its lines of output: the trainer's first `error:` line
    (rank 0's own, not another rank's "another rank stopped"), else the first paragraph of
    mpirun's last boxed message (between lines of dashes), else the last line."""
    errors = [line for line in lines if line.startswith("error:")]
    own = [line for line in errors if not line.startswith("error: another rank stopped")]
    if errors:
        return (own or errors)[0].removeprefix("error:").strip()
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"-"}]
    if len(rules) >= 2:
        box = lines[rules[-2] + 1:rules[-1]]
        paragraph = " ".join(box[:box.index("")] if "" in box else box).rstrip(":")
        if paragraph:
            return paragraph
    return next((line for line in reversed(lines) if line), "no output")


def events(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def checkpoint_epochs(run_dir):
    """Epochs in the newest checkpoint (saved before each epoch's validation, so it can be one
    ahead of the epoch lines), 0 if none."""
    try:
        with open(os.path.join(run_dir, "checkpoints", "checkpoint")) as f:
            return int(f.readline().split('"')[1].rsplit("-", 1)[1])
    except (OSError, IndexError, ValueError):
        return 0


def status(args):
    run_dir, results_dir = names(args)
    log = events(run_dir)
    if not log:
        print(f"reproduce: no run of {args.config} in {run_dir} yet; `make reproduce "
              f"CONFIG={args.config}` starts it")
        return 1
    done = any(e["event"] == "test" for e in log)
    alive = bool(running(run_dir))
    command = continue_command(args, run_dir)
    print(status_line(command, log, alive))
    keep(run_dir, results_dir, command, "full" if done else
         "running" if alive else "partial")
    return 0


def time_left(epochs, cfg):
    """The epochs left at the median of the epochs done (a sitting shared with tests runs slower:
    the median, not the mean), for a status line with no progress line to take an ETA from."""
    timed = [e for e in epochs if "epoch_time_s" in e]
    if not timed:
        return ""
    median = epoch_time({"kind": "partial", "events": timed})  # the results table's own median
    return (f", about {median * (cfg['num_epochs'] - len(epochs)) / 3600:.0f} h of training left "
            f"at its median epoch ({median / 60:.0f} min)")


def status_line(command, log, alive):
    """One line on a run from its metrics events, and whether its job is alive; `command`: the
    make command that continues it."""
    epochs = [e for e in log if e["event"] == "epoch"]
    cfg = newest_config(log)  # a resume may have lengthened it, as the results table reads it
    precision = f" ({cfg['precision']})" if cfg.get("precision", "fp32") != "fp32" else ""
    line = f"reproduce: {cfg['name']}{precision}, {len(epochs)} of {cfg['num_epochs']} epochs"
    if epochs:
        line += f", last valid ppl {epochs[-1]['valid_ppl']:.2f}"
    tests = [e for e in log if e["event"] == "test"]
    if tests:
        return line + f", test ppl {tests[-1]['test_ppl']:.2f}: done"
    last = log[-1]
    if not alive:
        return line + f", stopped; `{command}` continues it{time_left(epochs, cfg)}"
    if last["event"] == "epoch" and len(epochs) == cfg["num_epochs"]:
        return line + ", running the test evaluation"
    if last["event"] == "epoch":  # resumed or validated, no progress line of the next epoch yet
        return line + f", running epoch {last['epoch'] + 1}{time_left(epochs, cfg)}"
    # the trainer's own estimate, evaluation not counted
    return line + f", running epoch {last['epoch']} (step {last['step']}), " \
        f"ETA {last['eta_s'] / 3600:.1f} h"


def stop(args):
    """SIGTERM to the run's ranks, not to its mpirun: Open MPI's mpirun passes a SIGTERM on a
    second late and SIGKILLs the ranks a second after (odls_base_sigkill_timeout), before a large
    step on a CPU ends. Each rank ends its step or its save; rank 0 says what is kept."""
    run_dir, _ = names(args)
    pid = running(run_dir)
    if not pid:
        print(f"reproduce: {args.config} is not running; "
              f"`{continue_command(args, run_dir)}` continues it")
        return 0
    for rank in children(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while running(run_dir) and time.monotonic() < deadline:
        time.sleep(0.5)
    if running(run_dir):
        print(f"error: the run did not stop within {STOP_WAIT_S} s of SIGTERM; `kill -KILL "
              f"-{pid}` ends it (losing the steps since its last checkpoint)", file=sys.stderr)
        return 1
    with open(os.path.join(run_dir, "train.log")) as f:
        said = [line.strip() for line in f if line.startswith("error: stopped by")]
    print(f"reproduce: {said[-1] if said else 'stopped'}")
    return 0


def children(pid):
    """The processes whose parent is `pid` (mpirun's ranks on this host)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append(int(entry))
    return found


def shared(args):
    """Add `what` to the newest segment's list of what shared the machine with the run."""
    run_dir, _ = names(args)
    path = os.path.join(run_dir, "segments.jsonl")
    if not args.what or not os.path.exists(path):
        print("error: usage: reproduce.py shared --config C \"what ran beside it\" (for a run "
              "that has started)", file=sys.stderr)
        return 2
    with open(path) as f:
        segments = [json.loads(line) for line in f]
    segments[-1].setdefault("shared", []).append(args.what)
    with open(path + ".tmp", "w") as f:
        f.write("".join(json.dumps(s) + "\n" for s in segments))
    os.replace(path + ".tmp", path)
    return 0


def keep(run_dir, results_dir, command, kind):
    """Copy what the results table reads, and the console's log (each sitting's resume and stop
    lines), so the logs can be committed as the run goes."""
    os.makedirs(results_dir, exist_ok=True)
    for name in ("metrics.jsonl", "train.log"):
        with contextlib.suppress(FileNotFoundError):  # a run started by hand has no train.log
            shutil.copyfile(os.path.join(run_dir, name), os.path.join(results_dir, name))
    with open(os.path.join(run_dir, "segments.jsonl")) as f:
        segments = [json.loads(line) for line in f]
    first = segments[0]
    run = {"kind": kind, "command": first["command"],
           "env": {"date_utc": first["started_utc"],
                   **{k: v for k, v in first.items()
                      if k not in ("started_utc", "epochs_done_at_start", "command")}},
           "segments": segments,
           "resume": command}
    beside = [f"{s['started_utc']} segment: {'; '.join(s['shared'])}"
              for s in segments if s.get("shared")]
    if beside:
        run["note"] = "Beside the run, the machine also ran: " + " | ".join(beside)
    with open(os.path.join(results_dir, "run.json"), "w") as f:
        json.dump(run, f, indent=1)


def main(argv=None):
    args = parse_args(argv)
    try:
        cfg = config.load_config(args.config, args.set)  # a typo in --config is named as such
        args.precision = args.precision or cfg["precision"]
        if args.np < 1:
            raise config.ConfigError(f"--np must be 1 or more, got {args.np}")
        if args.action == "start":
            check_shardable(cfg["batch_size"], args.np, cfg["backward_passes_per_step"])
        return {"start": start, "status": status, "stop": stop,
                "shared": shared}[args.action](args)
    except (config.ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
