"""Everything the trainers share that is not about distribution.

Importing it does one thing, which must come before TensorFlow's first import: tf.keras becomes
the Keras PTB_KERAS names. All else about how TensorFlow starts is a call the scripts make by
name, first thing: import_tensorflow() (oneDNN on, its start-up notes and Keras' matplotlib left
out; a Python without it stops in one line). The modules here import TensorFlow as it is, so a
copy of them gets none of that unless it makes the call."""
import contextlib
import importlib.abc
import importlib.util
import os
import platform
import sys

# Which Keras is tf.keras: PTB_KERAS=3 is TensorFlow's own (Keras 3, what TensorFlow >= 2.16
# installs), PTB_KERAS=2 legacy tf-keras, installed beside it (TF_USE_LEGACY_KERAS=1). Horovod
# 0.28.1 hooks Keras 2's optimizer only; the patches in scripts/patches/ (10-24) make it average
# a Keras 3 optimizer's gradients too (docs/keras3.md). TensorFlow <= 2.15's tf.keras is Keras 2
# whatever this says. Read once, before TensorFlow's first import.
KERAS_CHOICES = ("2", "3")  # tf-keras, Keras 3
KERAS = os.environ.get("PTB_KERAS") or "3"
if KERAS not in KERAS_CHOICES:
    print(f"error: PTB_KERAS={KERAS!r} is not a Keras this repository runs; set PTB_KERAS=3 "
          "(Keras 3) or PTB_KERAS=2 (tf-keras), or unset it", file=sys.stderr)
    sys.exit(2)
if KERAS == "2" and importlib.util.find_spec("tf_keras"):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
elif KERAS == "3":
    os.environ.pop("TF_USE_LEGACY_KERAS", None)

# What `make setup` installs into .venv and the scripts import: a Python without one of them is
# not .venv's (the system's `python`, say), and stops in one line (require_setup).
SETUP_PACKAGES = ("tensorflow", "horovod", "numpy", "keras", "tf_keras", "matplotlib",
                  "tensorboard")


# Where launchers put a process's rank, for the lines said before the trainer knows it from
# Horovod (or its strategy), or knows the packages are there: Open MPI's mpirun, Slurm's srun
# with PMIx (or PMI-2, MPICH's and Intel MPI's mpiexec), horovodrun without MPI, and
# launch/tf_config.py -n N's workers, all on its host (a TF_CONFIG alone may be a worker's on a
# host of its own, whose lines no other worker says).
LAUNCHER_RANKS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "HOROVOD_RANK",
                  "PTB_LOCAL_WORKER")


def launcher_rank():
    """This process's rank as its launcher gave it (LAUNCHER_RANKS); None without a launcher."""
    for name in LAUNCHER_RANKS:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def _setup_line(package):
    venv = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv")
    if os.path.realpath(sys.prefix) == os.path.realpath(venv):  # .venv's own, set up wrong
        return f"error: .venv has no {package}: run `make setup` again, which installs it there"
    return (f"error: {sys.executable} has no {package}: start the scripts with .venv/bin/python "
            "(or after `. .venv/bin/activate`), which `make setup` makes")


def _missing_package_hook(previous):
    """An excepthook that ends on _setup_line for a SETUP_PACKAGES module not found, and hands
    every other error to `previous`."""
    def hook(kind, error, trace):
        package = (getattr(error, "name", None) or "").partition(".")[0]
        if issubclass(kind, ModuleNotFoundError) and package in SETUP_PACKAGES:
            if launcher_rank() in (None, 0):  # each rank has it: rank 0 says it for the job
                sys.stderr.write(_setup_line(package) + "\n")
                sys.stderr.flush()
        else:
            previous(kind, error, trace)
    hook.names_setup = True
    return hook


def require_setup():
    """Where this Python has no TensorFlow, one line naming .venv/bin/python and `make setup`,
    and exit 2; and the same line, not a traceback, for another of SETUP_PACKAGES whose import
    fails later (Horovod, in a Python that has TensorFlow alone)."""
    if not getattr(sys.excepthook, "names_setup", False):
        sys.excepthook = _missing_package_hook(sys.excepthook)
    if importlib.util.find_spec("tensorflow") is None:
        if launcher_rank() in (None, 0):  # each rank has it: rank 0 says it for the job
            sys.stderr.write(_setup_line("tensorflow") + "\n")
        sys.exit(2)


# TensorFlow's x86 builds run oneDNN's kernels by default only on CPUs with AVX-512 VNNI or
# newer units; on the others (the AVX2-only EPYCs here) Eigen's run, and with oneDNN's the fp32
# train steps took 0.81x-0.97x their time, bf16's 0.63x, slower in no config or thread count
# measured (results/bench/onednn-avx2/). So oneDNN on every x86 CPU; TF_ENABLE_ONEDNN_OPTS=0
# turns it off.
KERNEL_DEFAULTS = {"TF_ENABLE_ONEDNN_OPTS": "1"} if platform.machine() == "x86_64" else {}


def set_tensorflow_defaults():
    """TensorFlow's variables as the scripts run it, where the environment does not set them:
    KERNEL_DEFAULTS, and its C++ notes below warnings left out of the log. They are read once,
    at TensorFlow's first import, and pass to the processes this one starts."""
    for name, value in {**KERNEL_DEFAULTS, "TF_CPP_MIN_LOG_LEVEL": "2"}.items():
        os.environ.setdefault(name, value)


# Since TensorFlow 2.19 a few notes are logged before TF_CPP_MIN_LOG_LEVEL is read (tensorflow
# issue 100442): wherever oneDNN is on, every start prints them, and a bad input's one-line
# error would come after four lines of them.
STARTUP_NOTES = ("WARNING: All log messages before absl::InitializeLog() is called are written "
                 "to STDERR", "oneDNN custom operations are on")


# The filter TensorFlow's notes are written through while it is known to print them: a process
# of its own, so that what came before a native abort (or a hang) still reaches the terminal,
# line by line, at once; it ends when its input does (the call returned, or the process died).
_STDERR_FILTER = """import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the trainer's to say; this ends after it
notes = [note.encode() for note in sys.argv[1:]]
for line in sys.stdin.buffer:
    if not any(note in line for note in notes):
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
"""
# With CUDA_VISIBLE_DEVICES empty (or -1) on a GPU build, TensorFlow's first look at its devices
# logs its failed cuInit as an error, though hiding the GPUs was what was asked (the trainers'
# fix for more ranks than GPUs, and `make test`, which runs on the CPU cores).
HIDDEN_GPUS_NOTE = "CUDA_ERROR_NO_DEVICE"


def gpus_hidden(env=None):
    """Whether CUDA_VISIBLE_DEVICES hides every GPU."""
    return (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES") in ("", "-1")


@contextlib.contextmanager
def stderr_without(*notes):
    """Within it, the process's stderr (fd 2, where TensorFlow's C++ logs go) passes through a
    filter process that drops the lines holding any of `notes`, and passes on every other line
    as it comes, also when the call inside aborts or hangs; unfiltered where
    TF_CPP_MIN_LOG_LEVEL asks for every note."""
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "") in ("", "0"):
        yield
        return
    import subprocess
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        drop = subprocess.Popen([sys.executable, "-S", "-c", _STDERR_FILTER, *notes],
                                stdin=subprocess.PIPE, stdout=saved, stderr=saved)
    except OSError:  # no process to spare: the notes go through as they are
        os.close(saved)
        yield
        return
    os.dup2(drop.stdin.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        drop.stdin.close()
        drop.wait()


class _WithoutMatplotlib(importlib.abc.MetaPathFinder):
    """While on sys.meta_path, matplotlib is not found. Keras 3 imports matplotlib.pyplot with
    TensorFlow where it is installed (make results plots with it), for two image-gallery helpers
    nothing here calls, and goes on without it. Left out, TensorFlow's import took 4.4 CPU s, not
    5.4, in every trainer, rank and probe (results/stack/ci/startup-without-matplotlib-zen3.log).
    Later imports of matplotlib find it as usual."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def import_tensorflow():
    """TensorFlow as every script here starts it, called first thing (before any module that
    imports TensorFlow): in a Python that has it (require_setup), with set_tensorflow_defaults(),
    without STARTUP_NOTES, its devices listed then too (without HIDDEN_GPUS_NOTE where
    CUDA_VISIBLE_DEVICES hides them all), and without Keras' import of matplotlib
    (_WithoutMatplotlib). Once TensorFlow is imported, it only returns it."""
    if "tensorflow" in sys.modules:
        import tensorflow
        return tensorflow
    require_setup()
    set_tensorflow_defaults()
    hide = _WithoutMatplotlib() if "matplotlib" not in sys.modules else None
    if hide:
        sys.meta_path.insert(0, hide)
    try:
        with stderr_without(*STARTUP_NOTES, *([HIDDEN_GPUS_NOTE] if gpus_hidden() else [])):
            import tensorflow
            tensorflow.config.list_physical_devices()  # sets nothing up: devices stay configurable
    except KeyboardInterrupt:  # a Ctrl-C in the seconds TensorFlow loads, before the handlers
        if launcher_rank() in (None, 0):  # each rank has it: rank 0 says it for the job
            sys.stderr.write("error: stopped by SIGINT while TensorFlow was loading, before "
                             "anything was read or written: rerun the same command\n")
        sys.exit(128 + 2)
    finally:
        if hide:
            sys.meta_path.remove(hide)
    return tensorflow


def child_env(**extra):
    """This process's environment for a child Python, without TF_USE_LEGACY_KERAS: the child may
    be another venv (TensorFlow 2.15 fails with it), and its own utils sets it where it belongs."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    return dict(env, **extra)
