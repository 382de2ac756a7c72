"""make timing: each config's time per epoch in one process (lm_ptb.py) against 2 workers
(mpirun -np 2 lm_ptb_distributed.py), timed in turns on an idle machine.

    python scripts/results/timing.py [--configs small medium large] [--rounds 3] [--steps N]
        [--precision bf16] [--force "what else runs"] [--data_path PATH] [--results results/runs]

For each config, ROUNDS rounds; in each, a bounded run of each side, the side that goes first
alternating from round to round (one process first in round 1), so that a drift of the
machine's speed falls on both sides alike. A run trains STEPS steps of one epoch (the config's
own flags otherwise, as README's rows), logging 10 windows; its time per epoch is the median
step time of its windows after the first (the first holds the tracing) times the steps of the
config's full PTB epoch (common.epoch_time, as every bounded run). Each run is kept as
results/runs/CONFIG-timing-ID-rN-1process|2workers (kind bounded, run.json's "timing" block);
the runs of one measurement share their ID, environment record, commit and date. `make
results` then puts each config's median over the rounds, and the median of the rounds' ratios
(1 process / 2 workers, within a round), into README's row of that config, precision and Keras.

It starts only on an idle machine: a load average above 0.5 per core, more than a quarter of
the cores busy over a 2-second look, or another training (a trainer, mpirun, horovodrun, the
benchmark) running stops it in one line. --force NOTE starts it anyway and marks the figures as
shared, NOTE saying what else ran; a run beside which other processes used more than 0.1 of a
core on average is marked shared too (run.json: the CPU seconds they used).
"""
import argparse
import datetime
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.results.common import REPO, RUNS, epoch_time, load  # noqa: E402
from scripts.results.record import environment, keep  # noqa: E402
from utils.config import DEFAULT_DATA_PATH, load_config  # noqa: E402
from utils.errors import ConfigError  # noqa: E402

# steps of each run: 30-60 s of steps a run on a 2-core CPU (small ~0.1 s a step, medium ~0.5,
# large ~0.8-1), 10 log windows; a config other than the three runs small's
STEPS = {"small": 400, "medium": 80, "large": 48}
SIZES = tuple(STEPS)
WINDOWS = 10
MAX_LOAD_PER_CORE = 0.5  # the 1-minute load average
MAX_BUSY_SHARE = 0.25  # of all cores, over the look before the start
LOOK_S = 2.0
MAX_OTHERS_CORES = 0.1  # other processes' CPU during a run, in cores on average
# another training: one of these launchers, or a Python running one of these scripts (horovodrun
# is a Python script too)
LAUNCHERS = {"mpirun", "orterun", "prterun", "srun"}
TRAINING_SCRIPTS = {"lm_ptb.py", "lm_ptb_distributed.py", "lm_ptb_elastic.py",
                    "lm_ptb_tf_distribute.py", "horovodrun", "benchmark.py", "timing.py",
                    "peer_pytorch.py"}
SIDES = ("1process", "2workers")
SIDE_WORDS = {"1process": "1 process", "2workers": "2 workers"}


def config_name(size_or_config):
    return f"config_{size_or_config}" if size_or_config in SIZES else size_or_config


def label(config):
    """small for config_small, tiny for tests/config_tiny.py."""
    base = os.path.splitext(os.path.basename(config))[0]
    return base[len("config_"):] if base.startswith("config_") else base


# --- is the machine idle -------------------------------------------------------------------

def cpu_busy_ticks():
    """(busy, total) clock ticks of all cores since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    total = sum(ticks[:8])  # guest time is counted in user already
    return total - idle, total


def process_ticks():
    """pid -> (CPU clock ticks so far, its command line's words) of every process here."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().decode(errors="replace").split("\0")[:-1]
        except OSError:
            continue  # ended meanwhile
        found[int(pid)] = (int(fields[11]) + int(fields[12]), words)  # utime, stime
    return found


def own_tree():
    """This process and its ancestors (make, a shell, pytest): not "another" training."""
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            break
    return pids


def short(words, width=60):
    """A command line on one line (a `python -c` program may hold newlines), cut to width."""
    command = " ".join(" ".join(words).split()) or "?"
    return command if len(command) <= width else command[:width - 3] + "..."


def is_training(words):
    """A trainer, a launcher of one, the benchmark or another timing, by its command line's
    words (scripts/bench/ holds the benchmark's modes); not an editor or a pager of one."""
    program = os.path.basename(words[0]) if words else ""
    if program in LAUNCHERS:
        return True
    return program.startswith("python") and any(
        os.path.basename(w) in TRAINING_SCRIPTS or "scripts/bench/" in w for w in words[1:])


def machine_state(look_s=LOOK_S):
    """What the machine is doing: its load average per core, the share of its cores busy over
    a look of look_s seconds, the processes that used a fifth of a core or more meanwhile, and
    the trainings (by their command lines) running other than this one."""
    cores = os.cpu_count()
    hz = os.sysconf("SC_CLK_TCK")
    mine = own_tree()
    before, busy0 = process_ticks(), cpu_busy_ticks()
    time.sleep(look_s)
    after, busy1 = process_ticks(), cpu_busy_ticks()
    busy_share = (busy1[0] - busy0[0]) / max(busy1[1] - busy0[1], 1)
    users = sorted(((after[p][0] - before[p][0]) / hz / look_s, p, after[p][1])
                   for p in after.keys() & before.keys() if p not in mine)
    busy = [f"pid {p} at {share:.0%} of a core: {short(c)}"
            for share, p, c in reversed(users) if share >= 0.2][:6]
    trainings = [f"pid {p}: {short(c)}" for p, (_, c) in sorted(after.items())
                 if p not in mine and is_training(c)]
    return {"load_per_core": round(os.getloadavg()[0] / cores, 2),
            "busy_share": round(busy_share, 2), "busy": busy, "trainings": trainings}


def why_not_idle(state):
    """The reasons the machine is not idle, as words; empty when it is."""
    reasons = []
    trainings = state["trainings"]
    if trainings:
        more = f"; {len(trainings) - 3} more" if len(trainings) > 3 else ""
        reasons.append("another training runs (" + "; ".join(trainings[:3]) + more + ")")
    if state["busy_share"] > MAX_BUSY_SHARE:
        reasons.append(f"{state['busy_share']:.0%} of the cores were busy over {LOOK_S:.0f} s"
                       + (" (" + "; ".join(state["busy"]) + ")" if state["busy"] else ""))
    if state["load_per_core"] > MAX_LOAD_PER_CORE:
        reasons.append(f"the load average is {state['load_per_core']:.2f} per core (at most "
                       f"{MAX_LOAD_PER_CORE})")
    return reasons


# --- the runs ------------------------------------------------------------------------------

def trainer_flags(config, steps, data_path, output_dir, precision=None):
    """A bounded run: one epoch of `steps` steps in WINDOWS log windows; evaluation cut to one
    window, since only the training steps are timed; the config's precision, or `precision`."""
    chosen = ["--set", f"precision='{precision}'"] if precision else []
    return ["--config", config, "--data_path", data_path, *chosen, "--set", "num_epochs=1",
            "--set", f"steps_per_epoch={steps}", "--set", "eval_steps=1",
            "--log_every", str(max(steps // WINDOWS, 1)), "--output_dir", output_dir]


def command(side, flags):
    """One process: lm_ptb.py; 2 workers: README's mpirun line (the table's rows' launcher)."""
    if side == "1process":
        return [sys.executable, "lm_ptb.py", *flags]
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, "-np", "2", "-bind-to", "none", "-map-by", "slot",
            sys.executable, "lm_ptb_distributed.py", *flags]


def children_cpu_s():
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_one(cmd, log_path):
    """Runs cmd (its output to log_path); its wall seconds and the CPU seconds all other
    processes used meanwhile (the machine's busy time less this run's own)."""
    hz = os.sysconf("SC_CLK_TCK")
    busy0, own0, t0 = cpu_busy_ticks()[0], children_cpu_s(), time.monotonic()
    with open(log_path, "w") as log:
        code = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    others = (cpu_busy_ticks()[0] - busy0) / hz - (children_cpu_s() - own0)
    if code:
        with open(log_path) as f:
            tail = f.read().splitlines()[-15:]
        print("\n".join(tail), file=sys.stderr)
        sys.exit(f"error: a timing run failed (exit {code}): {shlex.join(cmd)}; its output's "
                 f"end is above, all of it in {log_path}")
    return wall, max(others, 0.0)


def plan(configs, rounds):
    """(config, round, side) in the order they run: a config's rounds in a row, the side that
    goes first alternating from round to round."""
    return [(config, n, side) for config in configs for n in range(1, rounds + 1)
            for side in sorted(SIDES, key=lambda side: side != first_side(n))]


def first_side(n):
    """The side that goes first in round n: one process in the odd rounds."""
    return SIDES[(n - 1) % 2]


def median_step_s(run):
    """The median seconds of a step over the run's log windows after the first."""
    progress = [e for e in run["events"] if e["event"] == "progress"]
    return statistics.median((b["time"] - a["time"]) / (b["step"] - a["step"])
                             for a, b in zip(progress, progress[1:]) if b["step"] > a["step"])


def words_per_sec(run):
    """Words a second of the run's timed steps (both workers' for 2: the batch is global)."""
    return run["config"]["batch_size"] * run["config"]["num_steps"] / median_step_s(run)


def eta_s(order, walls, done):
    """Seconds left: each run to come as long as its config's runs so far, or all runs'."""
    mean = {c: statistics.mean(w for (c2, _, _), w in zip(order, walls) if c2 == c)
            for c in {c for c, _, _ in order[:done]}}
    overall = statistics.mean(walls)
    return sum(mean.get(c, overall) for c, _, _ in order[done:])


def run_names(args, configs):
    """The measurement's id (its UTC minute), its runs in order, and each run's folder name."""
    measurement = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d-%H%M")
    order = plan(configs, args.rounds)
    kind = f"-{args.precision}" if args.precision else ""
    names = [f"{label(c)}{kind}-timing-{measurement}-r{n}-{side}" for c, n, side in order]
    taken = [n for n in names if os.path.exists(os.path.join(args.results, n))]
    if taken:
        sys.exit(f"error: {os.path.join(args.results, taken[0])} exists (a measurement started "
                 "this minute); wait a minute and start again")
    return measurement, order, names


def steps_of(args, config):
    """--steps, or the config's own (a config other than the three: small's)."""
    return args.steps or STEPS.get(label(config), STEPS["small"])


def time_and_keep(args, planned, name, measurement, env, scratch):
    """One run, kept under args.results; the run as loaded back, its wall and others' CPU s."""
    config, n, side = planned
    steps = steps_of(args, config)
    out = os.path.join(scratch, name)
    cmd = command(side, trainer_flags(config, steps, args.data_path, out, args.precision))
    started_utc = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    wall, others_s = run_one(cmd, os.path.join(scratch, name + ".log"))
    shared = list(args.shared)
    if others_s > MAX_OTHERS_CORES * wall:
        shared.append(f"other processes used {others_s:.0f} CPU-s during round {n}'s "
                      f"{SIDE_WORDS[side]} run of {label(config)} ({wall:.0f} s)")
    keep(name, "bounded", shlex.join(cmd), out, env, runs_dir=args.results, shared=shared,
         timing={"id": measurement, "config": config, "round": n, "rounds": args.rounds,
                 "side": SIDE_WORDS[side], "first": side == first_side(n), "steps": steps,
                 "started_utc": started_utc, "wall_s": round(wall, 1),
                 "others_cpu_s": round(others_s, 1), "machine_state": args.state})
    return load(name, args.results), wall, others_s


def measure(args, configs):
    measurement, order, names = run_names(args, configs)
    env = environment()  # one record for the whole measurement: its date, commit and machine
    scratch = tempfile.mkdtemp(prefix="ptb-timing-")  # the runs' folders; a failed run's stays
    walls, started = [], time.monotonic()
    try:
        for i, ((config, n, side), name) in enumerate(zip(order, names)):
            print(f"timing: {label(config)}, round {n} of {args.rounds}, {SIDE_WORDS[side]} "
                  f"(run {i + 1} of {len(order)}): {steps_of(args, config)} steps...", flush=True)
            run, wall, others_s = time_and_keep(args, order[i], name, measurement, env, scratch)
            walls.append(wall)
            print(f"timing: {label(config)}, round {n}, {SIDE_WORDS[side]}: "
                  f"{words_per_sec(run):,.0f} words/sec, {epoch_time(run):.0f} s per epoch "
                  f"({wall:.0f} s; others used {others_s:.0f} CPU-s); ETA "
                  f"{eta_s(order, walls, i + 1) / 60:.0f} min", flush=True)
    except KeyboardInterrupt:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    shutil.rmtree(scratch, ignore_errors=True)
    print(f"timing: {len(order)} runs in {(time.monotonic() - started) / 60:.1f} min, kept "
          f"in {args.results} as *-timing-{measurement}-*; `make results` puts them in "
          "README's table")


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", default=list(SIZES), metavar="CONFIG",
                   help="sizes, or configs' names or paths (default: small medium large)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of each config (3)")
    p.add_argument("--steps", type=int,
                   help="steps of every run (400, 80 and 48 for small, medium and large)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"),
                   help="the runs' matmul precision instead of the configs' (fp32): the "
                        "table's row of a bf16 run takes the times of bf16 (and of its Keras: "
                        "PTB_KERAS=2 for tf-keras)")
    p.add_argument("--data_path", default=DEFAULT_DATA_PATH)
    p.add_argument("--results", default=RUNS, help="the folder of the kept runs (results/runs)")
    p.add_argument("--force", metavar="NOTE",
                   help="start on a machine that is not idle, NOTE saying what else runs; the "
                        "figures are then marked as shared")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.steps is not None and args.steps < 2 * WINDOWS:
        p.error(f"--rounds must be 1 or more, --steps {2 * WINDOWS} or more (10 log windows "
                "of 2 steps at least)")
    if args.force is not None and not args.force.strip():
        p.error('--force needs a note of what else runs: --force "the test suite"')
    return args


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    configs = [config_name(c) for c in args.configs]
    for config in configs:  # a name that is no config: one line now, not a failed run later
        try:
            load_config(config)
        except ConfigError as e:
            sys.exit(f"error: {e}")
    state = machine_state()
    reasons = why_not_idle(state)
    if reasons and args.force is None:
        sys.exit("error: the machine is not idle, so the times would not be the configs' own: "
                 + "; ".join(reasons) + ". Wait until it is, or pass --force \"what runs\" to "
                 "time anyway with the figures marked as shared")
    args.state = state
    args.shared = [f"--force: {args.force}"] if args.force is not None else []
    if reasons:
        print(f"timing: not idle ({'; '.join(reasons)}); --force: the figures are marked as "
              "shared", flush=True)
    try:
        measure(args, configs)
    except KeyboardInterrupt:  # the runs got the Ctrl-C too; the rounds kept so far stay
        sys.exit(f"timing: stopped; the runs kept so far are in {args.results} (`make results` "
                 "takes only the rounds where both sides ran)")


if __name__ == "__main__":
    main()
