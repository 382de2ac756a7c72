"""The probes behind results/'s logs (scripts/probes/) run on today's code: each imports, with
its main(), in one process; first_trace.py, which wraps the trainer's own make_train_step, runs
on the tiny config; and every probe that results/ or docs/ name is there (one removed is named
by the commit that had it, `git show COMMIT:scripts/probes/NAME`)."""
import glob
import os
import re
import subprocess
import sys

from tests.helpers import IS_ROOT, REPO, TINY, script_env

PROBES = sorted(glob.glob("scripts/probes/*.py", root_dir=REPO))
# Each probe imported, a line for each that fails; each that runs as a script (all but
# precision_probe.py, which two of them import) with a main() its __main__ block calls.
IMPORT_ALL = """
import importlib, sys
for path in sys.argv[1:]:
    try:
        module = importlib.import_module(path[:-3].replace("/", "."))
    except Exception as e:
        print(f"{path}: {type(e).__name__}: {e}")
        continue
    if not (path.endswith("precision_probe.py") or callable(getattr(module, "main", None))):
        print(f"{path}: no main()")
"""


def test_every_probe_imports_with_its_main():
    assert len(PROBES) > 10, PROBES
    r = subprocess.run([sys.executable, "-c", IMPORT_ALL, *PROBES], cwd=REPO, env=script_env(),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr[-3000:]
    for script in glob.glob("scripts/probes/*.sh", root_dir=REPO):
        r = subprocess.run(["bash", "-n", script], cwd=REPO, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


def test_first_trace_times_the_trainers_first_trace(ptb_path, tmp_path):
    """Its command (docstring) on one rank: the line of the first trace, then the run trains."""
    r = subprocess.run(
        ["mpirun", *(["--allow-run-as-root"] if IS_ROOT else []), "--oversubscribe", "-bind-to",
         "none", "-np", "1", sys.executable, "scripts/probes/first_trace.py", "--config", TINY,
         "--data_path", ptb_path, "--output_dir", str(tmp_path / "ft"), "--set", "num_epochs=1",
         "--set", "steps_per_epoch=5", "--set", "eval_steps=2"],
        cwd=REPO, env=script_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(r"rank 0: first trace [\d.]+ s wall, [\d.]+ s CPU", r.stdout), r.stdout
    assert "[ptb] test ppl" in r.stdout, r.stdout


def test_every_probe_results_and_docs_name_is_there():
    named, missing = set(), []
    for path in glob.glob("results/**/*", root_dir=REPO, recursive=True) + \
            glob.glob("docs/*.md", root_dir=REPO):
        if path.endswith((".gz", ".png")) or os.path.isdir(os.path.join(REPO, path)):
            continue
        with open(os.path.join(REPO, path)) as f:
            # not the ones named as `git show COMMIT:scripts/probes/...`
            for probe in re.findall(r"(?<![:\w/])scripts/probes/[\w.]+\w", f.read()):
                named.add(probe)
                if not os.path.exists(os.path.join(REPO, probe)):
                    missing.append(f"{path}: {probe}")
    assert len(named) > 8, named
    assert not missing, "\n".join(missing)


def test_a_probe_without_its_arguments_or_its_tensorflow_says_so_in_one_line():
    """The two probes that take arguments, started without them (an IndexError, once) or with a
    timeline that is not one, or no steps (tracebacks, a review found), and bf16_gpu_kernels.py
    by a Python without TensorFlow (it wants the GPU wheel in a venv of its own): one line
    naming what is wrong, a non-zero exit, no traceback."""
    runs = [([sys.executable, "scripts/probes/tf_distribute_peer_errors.py"],
             "the following arguments are required: tries, kinds"),
            ([sys.executable, "scripts/probes/timeline_summary.py", "timeline.json"],
             "the following arguments are required: steps"),
            (["/usr/bin/python3", "scripts/probes/bf16_gpu_kernels.py"],
             "/usr/bin/python3 has no TensorFlow; run this probe with the GPU wheel"),
            ([sys.executable, "scripts/probes/timeline_summary.py", "/nonexistent.json", "10"],
             "/nonexistent.json is not a readable Horovod timeline ("),
            ([sys.executable, "scripts/probes/timeline_summary.py", "README.md", "10"],
             "README.md is not a readable Horovod timeline ("),
            ([sys.executable, "scripts/probes/timeline_summary.py", "timeline.json", "0"],
             "steps must be 1 or more and skip_s 0 or more (got 0 and 0)")]
    for command, says in runs:
        r = subprocess.run(command, cwd=REPO, env=script_env(), capture_output=True, text=True,
                           timeout=120)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert says in r.stderr.strip().splitlines()[-1], r.stderr
