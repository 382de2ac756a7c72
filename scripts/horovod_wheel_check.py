"""The patched Horovod wheel as another project would use it, checked.

    make horovod-wheel-check      # .venv/bin/python scripts/horovod_wheel_check.py dist

WHEEL is the wheel `make horovod-wheel` wrote, or the folder it wrote it into (dist). In a new
temporary folder: a venv made by this Python, with the TensorFlow the wheel was built against
(tensorflow-cpu, its version read from the wheel's horovod/metadata.json) and the wheel, by pip
as a user installs them; then scripts/horovod_wheel_fit.py, copied there and run from there
under `mpirun -np 2` without PYTHONPATH, so that nothing of this repository is on its path: a
Keras 3 model.fit with hvd.DistributedOptimizer and the broadcast callback, ranks starting
apart, whose final weights must be equal on both ranks and to one process's fit. The folder
(about 1.6 GB, TensorFlow's) is removed at the end. Prints a line per step with its seconds.
"""
import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIT = os.path.join(REPO, "scripts", "horovod_wheel_fit.py")
PYTHON_TAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
INSTALL_S = 1200  # TensorFlow's 600 MB from a cold pip cache over a slow link
FIT_S = 300


def stop(message):
    sys.exit(f"error: {message}")


def find_wheel(path):
    """The wheel at `path`, or the one in the folder `path` for this Python's tag."""
    if os.path.isdir(path):
        found = glob.glob(os.path.join(path, f"horovod-*-{PYTHON_TAG}-*.whl"))
        if len(found) != 1:
            stop(f"{len(found) or 'no'} Horovod wheels for Python {sys.version_info[0]}."
                 f"{sys.version_info[1]} ({PYTHON_TAG}) in {path}; `make horovod-wheel "
                 f"WHEEL_DIR={path}` writes one")
        return found[0]
    if not os.path.isfile(path):
        stop(f"no such wheel or folder: {path}; `make horovod-wheel` writes the wheel into dist")
    name = os.path.basename(path)
    if not (name.startswith("horovod-") and name.endswith(".whl")):
        stop(f"{path} is not a Horovod wheel (horovod-*.whl); `make horovod-wheel` writes one")
    if f"-{PYTHON_TAG}-" not in name:
        stop(f"{name} is not for this Python ({PYTHON_TAG}); run the check with the Python of "
             "the wheel's tag (its .venv/bin/python)")
    return path


def built_against(wheel):
    """The TensorFlow version Horovod's build recorded in the wheel (horovod/metadata.json)."""
    try:
        return json.loads(zipfile.ZipFile(wheel).read("horovod/metadata.json"))["tensorflow"]
    except (zipfile.BadZipFile, KeyError, ValueError) as e:
        stop(f"{wheel} is no Horovod wheel built with TensorFlow ({e}); `make horovod-wheel` "
             "writes one")


def run(cmd, timeout, **kwargs):
    """cmd in a session of its own, killed whole (mpirun and its ranks) at the timeout."""
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True, **kwargs)
    try:
        out, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, _ = job.communicate()
        return 124, out + f"\n(killed after {timeout} s)"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    return job.returncode, out


def failed(step, code, out):
    """The step's error lines (a rank's exception, pip's error), then one line, and exit."""
    lines = [line for line in out.splitlines()
             if "Error" in line or line.startswith(("ERROR", "error", "(killed"))]
    for line in dict.fromkeys(lines[-6:]):
        print(f"  {line}", file=sys.stderr)
    stop(f"{step} failed (exit {code}); the lines above are its errors")


def install(folder, wheel, tensorflow):
    started = time.monotonic()
    venv = os.path.join(folder, "venv")
    code, out = run([sys.executable, "-m", "venv", venv], 120)
    if code:
        failed("making the venv", code, out)
    python = os.path.join(venv, "bin", "python")
    code, out = run([python, "-m", "pip", "install", "-q", tensorflow, wheel], INSTALL_S)
    if code:
        failed(f"pip install {tensorflow} {os.path.basename(wheel)}", code, out)
    print(f"check: a new venv with {tensorflow} and {os.path.basename(wheel)} "
          f"({time.monotonic() - started:.0f} s)", flush=True)
    return python


def fit_on_two_ranks(folder, python):
    """scripts/horovod_wheel_fit.py from `folder`, by the new venv, under mpirun -np 2: rank 0's
    JSON line."""
    started = time.monotonic()
    script = os.path.join(folder, "fit.py")
    shutil.copy(FIT, script)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "TF_USE_LEGACY_KERAS")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    code, out = run(["mpirun", *root, "--oversubscribe", "-bind-to", "none", "-np", "2",
                     python, script], FIT_S, cwd=folder, env=env)
    if code:
        failed("the 2-rank model.fit", code, out)
    result = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    result["seconds"] = time.monotonic() - started
    return result


def check_isolated(result, folder):
    """Horovod came from the new venv, and nothing of this repository was on the ranks' path."""
    if not result["horovod_from"].startswith(folder + os.sep):
        stop(f"the ranks imported Horovod from {result['horovod_from']}, not the new venv")
    inside = [p for p in result["sys_path"]
              if (os.path.realpath(p or folder) + os.sep).startswith(REPO + os.sep)]
    if inside:
        stop(f"the ranks' sys.path held this repository's {inside}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheel", metavar="WHEEL",
                        help="the wheel make horovod-wheel wrote, or its folder (dist)")
    args = parser.parse_args()
    wheel = os.path.abspath(find_wheel(args.wheel))
    tensorflow = f"tensorflow-cpu=={built_against(wheel)}"
    folder = os.path.realpath(tempfile.mkdtemp(prefix="ptb-horovod-wheel-check-"))
    try:
        python = install(folder, wheel, tensorflow)
        result = fit_on_two_ranks(folder, python)
        check_isolated(result, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"check: ok: Python {result['python']}, TensorFlow {result['tensorflow']}, Keras "
          f"{result['keras']}, Horovod {result['horovod']} from the new venv alone; "
          f"{result['ranks']} ranks, {result['steps']} steps of model.fit, their weights "
          f"equal and {result['off_one_process']:.1e} off one process's (moved "
          f"{result['weights_moved']:.2f}) ({result['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
