"""How every script starts: a Python that is not .venv's stops in one line naming .venv/bin/python
and `make setup`; importing utils changes nothing but the Keras, and the rest of how TensorFlow
starts (oneDNN, its notes, matplotlib) comes from the call the scripts make by name."""
import ast
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, TINY, script_env

# Scripts that are not started by a user with .venv's Python: their own venv (torch, no
# TensorFlow), or a relay the other scripts start with the Python they run under.
NOT_VENV_SCRIPTS = {"scripts/peer_pytorch.py": "runs in .venv-peer (make peer)",
                    "scripts/twohosts.py": "started by the scripts that use it, as a relay",
                    "scripts/horovod_wheel_check.py": "the standard library alone: it makes "
                                                      "the venv it checks",
                    "scripts/horovod_wheel_fit.py": "runs in the venv horovod_wheel_check.py "
                                                    "makes (its numpy missing: one line)"}


def entry_points():
    """Every script with a __main__ block at the top, under scripts/ and its folders (not its
    probes)."""
    found = []
    for path in sorted(glob.glob("*.py", root_dir=REPO) + glob.glob("scripts/*.py", root_dir=REPO)
                       + [name for name in glob.glob("scripts/*/*.py", root_dir=REPO)
                          if not name.startswith("scripts/probes/")]):
        with open(os.path.join(REPO, path)) as f:
            tree = ast.parse(f.read())
        if path not in NOT_VENV_SCRIPTS and any(
                isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
                for node in tree.body):
            found.append(path)
    return found


def python_without_tensorflow():
    """The system's Python (what `python3` is before `. .venv/bin/activate`), else the one .venv
    was made from: neither has TensorFlow unless someone installed it there."""
    for python in ("/usr/bin/python3", sys._base_executable):
        if os.path.exists(python):
            has = subprocess.run([python, "-c", "import importlib.util as u; "
                                  "print(u.find_spec('tensorflow') is not None)"],
                                 capture_output=True, text=True, timeout=30).stdout.strip()
            if has == "False":
                return python
    pytest.skip("every Python here has TensorFlow")


def test_a_python_without_tensorflow_or_horovod_stops_every_script_in_one_line():
    python = python_without_tensorflow()
    scripts = entry_points()
    assert {"lm_ptb.py", "lm_ptb_distributed.py", "lm_ptb_elastic.py", "lm_ptb_tf_distribute.py",
            "evaluate.py", "scripts/bench/full.py", "scripts/results/build.py"} <= set(scripts), \
        scripts
    wrong = []
    for script in scripts:
        r = subprocess.run([python, script, "--help"], cwd=REPO, capture_output=True, text=True,
                           timeout=60, env=script_env())
        expected = (f"error: {python} has no tensorflow: start the scripts with .venv/bin/python "
                    "(or after `. .venv/bin/activate`), which `make setup` makes\n")
        if (r.returncode, r.stdout, r.stderr) != (2, "", expected):
            wrong.append(f"{script}: exit {r.returncode}, stderr {r.stderr[-600:]!r}")
    assert not wrong, "\n".join(wrong)
    # and Horovod missing from a Python that has TensorFlow (.venv's, Horovod's import made to
    # fail by Python's own rule for a None in sys.modules): the same line, where the trainer
    # imports it, not a traceback
    hide = ("import runpy, sys; sys.modules['horovod'] = None; sys.argv[0] = "
            "'lm_ptb_distributed.py'; runpy.run_path(sys.argv[0], run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", hide, "--help"], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=script_env())
    assert (r.returncode, r.stdout) == (1, ""), r.stdout + r.stderr
    assert r.stderr == "error: .venv has no horovod: run `make setup` again, which installs it " \
                       "there\n", r.stderr


@pytest.mark.parametrize("launcher", ["mpirun", "launch/tf_config.py"])
def test_readmes_mpirun_line_under_a_python_without_tensorflow_is_one_line_for_the_job(launcher):
    """README's `mpirun -np 2 python lm_ptb_distributed.py ...` typed with the system's Python:
    each rank printed the line (two, the same); rank 0 now says it for the job, exit 2. The same
    for launch/tf_config.py's 2 workers on one host (lm_ptb_tf_distribute.py)."""
    python = python_without_tensorflow()
    command = (["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
                "--oversubscribe", "-np", "2", python, "lm_ptb_distributed.py"]
               if launcher == "mpirun" else
               [python, "launch/tf_config.py", "-n", "2", "--", python, "lm_ptb_tf_distribute.py"])
    r = subprocess.run([*command, "--config", "config_small"], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=script_env())
    assert r.returncode != 0, r
    said = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert said == [f"error: {python} has no tensorflow: start the scripts with .venv/bin/python "
                    "(or after `. .venv/bin/activate`), which `make setup` makes"], r.stderr


# In a process of its own, without the variables the tests' conftest sets: utils and its modules
# imported as a copier would, without the call; then what they changed.
IMPORT_ONLY = """import json, os, sys
hook = sys.excepthook
import utils
import utils.checkpoints, utils.hardware, utils.loop, utils.model, utils.train_steps
print(json.dumps({"set": sorted(k for k in os.environ if k.startswith("TF_")),
                  "hook_kept": sys.excepthook is hook,
                  "keras": __import__("tensorflow").keras.__name__,
                  "matplotlib_found": "matplotlib" in sys.modules}))
"""


@pytest.mark.parametrize("keras, tf_keras", [("3", "keras._tf_keras.keras"), ("2", "tf_keras")])
def test_importing_utils_selects_the_keras_and_nothing_else(keras, tf_keras):
    env = {k: v for k, v in script_env({"PTB_KERAS": keras}).items() if not k.startswith("TF_")}
    r = subprocess.run([sys.executable, "-c", IMPORT_ONLY], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["keras"].startswith(tf_keras), seen
    # no oneDNN nor log level set (TF_USE_LEGACY_KERAS alone, for tf-keras), the excepthook
    # Python's, and Keras 3's import of matplotlib (installed here, for make results) not held back
    assert seen["set"] == (["TF_USE_LEGACY_KERAS"] if keras == "2" else []), seen
    assert seen["hook_kept"], seen
    assert seen["matplotlib_found"] == (keras == "3" and bool(importlib.util.find_spec(
        "matplotlib"))), seen


def test_a_ctrl_c_while_tensorflow_loads_is_one_line(ptb_path, tmp_path):
    """A SIGINT in the seconds a trainer imports TensorFlow, before its signal handlers: two
    KeyboardInterrupt tracebacks (the trainer's and its stderr filter's), a review found. Sent
    once TensorFlow's framework library is mapped into the process (its import goes on for
    seconds after): one line, exit 130, no run folder made."""
    out = tmp_path / "run"
    job = subprocess.Popen([sys.executable, "lm_ptb.py", "--config", TINY, "--data_path", ptb_path,
                            "--output_dir", str(out)], cwd=REPO, env=script_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(f"/proc/{job.pid}/maps") as f:
            if "libtensorflow_framework" in f.read():
                break
        time.sleep(0.01)
    job.send_signal(signal.SIGINT)
    stdout, stderr = job.communicate(timeout=120)
    assert (job.returncode, stdout, stderr) == (
        130, "", "error: stopped by SIGINT while TensorFlow was loading, before anything was "
                 "read or written: rerun the same command\n"), stderr[-2000:]
    assert not out.exists()


STOPPED_WHILE_KERAS_TRACES = """import os, signal, sys
import utils
tf = utils.import_tensorflow()
from utils import cli


class Interrupting(tf.keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(2)  # unbuilt state: Keras builds it by tracing call()
        self.sent = False

    def call(self, x):
        if not self.sent:  # one Ctrl-C, while Keras traces this call to build the layer
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)
        return self.dense(x)


def main(argv):
    Interrupting()(tf.keras.Input((3,)))
    print("trained on")


sys.exit(cli.run_main(main, []))
"""


def test_a_ctrl_c_while_keras_builds_a_layer_stops_the_run():
    """Keras 3 builds a layer with unbuilt state by tracing its call() and, where that raises
    any Exception, warns and goes on: a SIGINT there (our Interrupted, then an Exception) was
    a warning, and the run trained on to its end with exit 0 (a review's run, 2026-12-02).
    The stop line and exit 130."""
    r = subprocess.run([sys.executable, "-c", STOPPED_WHILE_KERAS_TRACES], cwd=REPO,
                       env=script_env(), capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout) == (130, ""), r.stdout + r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "error: stopped by SIGINT; nothing was written: rerun the same command"), r.stderr[-2000:]
