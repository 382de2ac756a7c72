"""A training run kept in results/runs/NAME/: its metrics.jsonl, its command and an environment
record (never the checkpoints).

    python scripts/results/record.py NAME full|partial|bounded -- <trainer command ...>
        runs the command with --output_dir runs/results/NAME, then keeps it. full: all the
        config's epochs; partial: fewer whole epochs (--set num_epochs=N); bounded: a number of
        steps, timed only. `make reproduce` keeps its run as "running" until it is "full"
    python scripts/results/record.py keep NAME KIND DIR "COMMAND"
        keeps a run made by hand in DIR
"""
import json
import os
import shlex
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.results.common import REPO, RUNS  # noqa: E402


KINDS = ("full", "partial", "bounded")


def environment():
    """This machine's record (scripts/record_env.py: CPU, cores, versions, commit, date)."""
    return json.loads(subprocess.run([sys.executable, os.path.join(REPO, "scripts",
                                                                   "record_env.py")],
                                     capture_output=True, text=True, check=True).stdout)


def record(name, kind, command):
    out = os.path.join(REPO, "runs", "results", name)
    if os.path.exists(out):
        sys.exit(f"error: {out} exists; remove it or pick another NAME")
    full = [*command, "--output_dir", out]
    env = environment()
    if subprocess.run(full, cwd=REPO).returncode:
        sys.exit(f"error: the run failed: {shlex.join(full)}")
    keep(name, kind, shlex.join(full), out, env)


def keep(name, kind, command, run_dir, env, runs_dir=None, **more):
    """The run in run_dir kept as runs_dir/NAME (results/runs/NAME): its metrics.jsonl, and a
    run.json of its kind, command, environment record and `more` (scripts/results/timing.py's
    "timing" and "shared")."""
    folder = os.path.join(runs_dir or RUNS, name)
    os.makedirs(folder, exist_ok=True)
    shutil.copy(os.path.join(run_dir, "metrics.jsonl"), folder)
    with open(os.path.join(folder, "run.json"), "w") as f:
        json.dump({"kind": kind, "command": command, "env": env, **more}, f, indent=1)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) > 3 and argv[1] in KINDS and argv[2] == "--":
        record(argv[0], argv[1], argv[3:])
    elif argv[:1] == ["keep"] and len(argv) == 5:  # a run made by hand: NAME KIND DIR COMMAND
        keep(argv[1], argv[2], argv[4], argv[3], environment())
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
