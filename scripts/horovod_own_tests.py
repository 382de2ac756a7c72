"""Run Horovod's own v0.28.1 TensorFlow/Keras tests on 2 ranks under Keras 3, their Keras 2-only
calls adapted at run time.

    python scripts/horovod_own_tests.py HOROVOD_TEST_DIR [FILE ...] [--deps DIR] [--elastic]

HOROVOD_TEST_DIR is the `test` folder of horovod/horovod at its tag v0.28.1 (not in the sdist):
`git -C horovod archive v0.28.1 test | tar x -C /tmp/hvdtests` gives /tmp/hvdtests/test. The
tests are copied into a temporary folder, each Keras 2 call of their own that Keras 3 refuses is
rewritten there (ADAPTATIONS: line for line, so a failure's line number is the original's; the
rewritten lines are printed first), and pytest runs them under mpirun with TF_USE_LEGACY_KERAS
unset; --elastic runs the elastic tests (integration/, horovodrun, up to 4 ranks on this host)
instead. Nothing of Horovod is changed: only the tests' own uses of the Keras 2 API. Horovod's
tests need `mock` and `parameterized`: `pip install --target DIR mock parameterized`, --deps DIR.
"""
import argparse
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
PARALLEL_FILES = ("test_tensorflow.py", "test_tensorflow2_keras.py", "test_tensorflow_keras.py")
ELASTIC_FILE = "integration/test_elastic_tensorflow2.py"
HELPERS = "\nfrom horovod_own_tests import keras3_ref, keras3_compute_gradients  # adapted\n"

# (file under the test folder, pattern, replacement, the test call it serves); each must match
# at least once, so tests of another Horovod version stop in one line instead of running unadapted
ADAPTATIONS = [
    ("parallel/test_tensorflow.py", r"BatchNormalization\(axis=1, fused=False\)",
     "BatchNormalization(axis=1)",
     # test_horovod_syncbn_*'s reference layer: Keras 3's BatchNormalization has no `fused`
     "syncbn reference layer"),
    ("parallel/test_tensorflow.py", r"\b(\w+)\.ref\(\)", r"keras3_ref(\1)",
     # test_partial_distributed_gradient_tape's dict keys: a Keras 3 variable has no ref()
     "Variable.ref()"),
    ("parallel/test_tensorflow2_keras.py", r"keras\.losses\.mean_squared_error", "keras.losses.MSE",
     # test_train_model_lr_schedule, test_sparse_as_dense*: tf.keras.losses' old alias, gone
     "losses.mean_squared_error"),
    ("parallel/test_tensorflow2_keras.py", r"experimental_run_tf_function=False", "",
     # the same tests' compile(): a Keras 2 argument Keras 3 refuses (a trailing comma stays)
     "compile(experimental_run_tf_function=False)"),
    ("parallel/test_tensorflow2_keras.py", r"\b(RMSprop|Adam)\(lr=", r"\1(learning_rate=",
     # test_sparse_as_dense*, test_legacy_optimizer: Keras 2's `lr` alias
     "optimizer(lr=)"),
    ("parallel/test_tensorflow2_keras.py", r"\.optimizer\.lr\b", ".optimizer.learning_rate",
     # test_train_model_lr_schedule's StoreLearningRateCallback: Keras 2's `lr` attribute
     "optimizer.lr"),
    ("parallel/test_tensorflow2_keras.py", r"hasattr\(keras\.optimizers, 'legacy'\)", "False",
     # test_legacy_optimizer's own skip: hasattr finds Keras 3's stub, which raises on use
     "hasattr(keras.optimizers, 'legacy')"),
    ("parallel/test_tensorflow2_keras.py", r"super\(\)\.__init__\(name=name, \*\*kwargs\)",
     'super().__init__(name=name, **{"learning_rate": 0.1, **kwargs})',
     # TestingOptimizer(): Keras 3 needs the learning_rate Keras 2.11 got in _build_learning_rate
     "Optimizer.__init__ without learning_rate"),
    ("parallel/test_tensorflow2_keras.py", r"def update_step\(self, gradient, variable\):",
     "def update_step(self, gradient, variable, learning_rate=None):",
     # TestingOptimizer.update_step: Keras 3 passes the learning rate too
     "update_step(gradient, variable)"),
    ("parallel/test_tensorflow2_keras.py", r"\b(\w+)\._compute_gradients\(",
     r"keras3_compute_gradients(\1, ",
     # test_gradient_aggregation*, *_with_inf_grad, test_partial_*: a Keras 2 optimizer's hook
     "optimizer._compute_gradients()"),
    ("parallel/test_tensorflow2_keras.py", r"experimental_aggregate_gradients=False", "",
     # test_gradient_aggregation*'s apply_gradients(): a Keras 2 argument
     "apply_gradients(experimental_aggregate_gradients=False)"),
    ("parallel/test_tensorflow2_keras.py", r"\b(\w+)\.ref\(\)", r"keras3_ref(\1)",
     # test_partial_distributed_optimizer's and test_broadcast_*_with_local_vars' dict keys
     "Variable.ref()"),
    ("integration/data/elastic_tensorflow2_main.py", r"\boptimizer\.lr\.assign\(",
     "optimizer.learning_rate.assign(",
     # the elastic training script's on_state_reset: Keras 2's `lr` attribute
     "optimizer.lr.assign()"),
]


def keras3_ref(variable):
    """Variable.ref()'s use in the tests, a hashable key for a variable: a Keras 3 variable is
    unhashable and has no ref(); its identity serves, as the tests compare the same objects."""
    return variable.ref() if hasattr(variable, "ref") else id(variable)


def keras3_compute_gradients(optimizer, loss, var_list, grad_loss=None, tape=None):
    """Keras 2's optimizer._compute_gradients(loss, var_list, tape=None): (gradient, variable)
    pairs of a loss callable, or of a loss tensor recorded on `tape`. Horovod's Keras 3 optimizer
    averages in apply_gradients(), so the gradients returned here are this rank's own."""
    import tensorflow as tf
    if tape is None:
        with tf.GradientTape() as tape:
            loss = loss()
    return list(zip(tape.gradient(loss, var_list, output_gradients=grad_loss), var_list))


def stop(message):
    """Bad input: one line, exit status 2."""
    print("error: " + message, file=sys.stderr)
    sys.exit(2)


def adapt(test_dir, files):
    """Rewrite `files` (paths under test_dir) in place; return each file's unified diff."""
    diffs = []
    for name in files:
        path = os.path.join(test_dir, name)
        with open(path) as f:
            original = f.read()
        text = original
        for file, pattern, replacement, call in ADAPTATIONS:
            if file != name:
                continue
            text, count = re.subn(pattern, replacement, text)
            if count == 0:
                stop(f"{name} has no {call} to adapt: these are not Horovod v0.28.1's "
                     "tests; give its test folder (git archive v0.28.1 test)")
        if "keras3_" in text:
            text += HELPERS
        with open(path, "w") as f:
            f.write(text)
        diffs += difflib.unified_diff(original.splitlines(True), text.splitlines(True),
                                      name, name + " (adapted)", n=0)
    return "".join(diffs)


def check_test_dir(test_dir):
    missing = [f for f in ("parallel/" + p for p in PARALLEL_FILES)
               if not os.path.isfile(os.path.join(test_dir, f))]
    if missing:
        stop(f"{test_dir} has no Horovod tests ({missing[0]} missing); give the test "
             "folder of horovod/horovod at v0.28.1: git -C HOROVOD_REPO archive v0.28.1 test "
             "| tar x -C DIR, then DIR/test")


def check_deps(test_dir, files, deps):
    """The modules the tests to run import that this Python cannot (Horovod's: mock and
    parameterized), in one line."""
    text = "".join(open(os.path.join(test_dir, f)).read() for f in files)
    wanted = [m for m in ("mock", "parameterized")
              if re.search(rf"^(import|from) {m}\b", text, re.M)]
    env = dict(os.environ, PYTHONPATH=deps)
    missing = [m for m in wanted if subprocess.run(
        [sys.executable, "-c", f"import {m}"], env=env, capture_output=True).returncode]
    if missing:
        stop(f"Horovod's tests need {' and '.join(missing)}: pip install --target DIR "
             f"{' '.join(missing)}, then --deps DIR")


def job_pids(root):
    """The processes of the session `root` leads and their descendants: mpirun's ranks, each in
    a process group of its own, and horovodrun's workers, each in a session of its own."""
    procs = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, session, ...
        except OSError:
            continue
        procs[int(name)] = (int(fields[1]), int(fields[3]))
    pids = {pid for pid, (_, session) in procs.items() if session == root} | {root}
    while True:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in pids} - pids
        if not more:
            return pids
        pids |= more


def run(cmd, cwd, env, timeout):
    """Run `cmd` in a session of its own; at the timeout every process of it is killed (a hung
    rank included), not the command alone."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in job_pids(proc.pid):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        proc.wait()
        print(f"error: {' '.join(cmd[:3])} ... outgrew {timeout} s: killed", flush=True)
        return 124


def main(argv=None):
    # .venv's Python runs Horovod's tests (sys.executable): another stops here in one line
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import utils
    utils.require_setup()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("test_dir", help="horovod/horovod's test folder at v0.28.1")
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help=f"which of {', '.join(PARALLEL_FILES)} to run (default: all)")
    parser.add_argument("--deps", default="", help="a folder with mock and parameterized")
    parser.add_argument("--elastic", action="store_true",
                        help="integration/test_elastic_tensorflow2.py instead (horovodrun, "
                        "up to 4 ranks on this host)")
    parser.add_argument("-k", default=None, help="pytest's -k: the tests to run")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds for each pytest run")
    parser.add_argument("--adapt-to", metavar="DIR",
                        help="write the adapted tests to DIR (a new folder) and stop")
    args = parser.parse_args(argv)
    check_test_dir(args.test_dir)
    for name in set(args.files) - set(PARALLEL_FILES):
        stop(f"{name} is not one of the files run here: {', '.join(PARALLEL_FILES)}")
    deps = os.path.abspath(args.deps) if args.deps else ""
    files = ["parallel/" + p for p in PARALLEL_FILES]
    files += ["integration/data/elastic_tensorflow2_main.py"] if args.elastic else []
    if args.adapt_to:
        shutil.copytree(args.test_dir, args.adapt_to)
        print(adapt(args.adapt_to, files), flush=True)
        return 0
    with tempfile.TemporaryDirectory(prefix="hvdtests-keras3-") as tmp:
        test_dir = os.path.join(tmp, "test")
        shutil.copytree(args.test_dir, test_dir)
        print(adapt(test_dir, files), flush=True)
        check_deps(test_dir, [ELASTIC_FILE] if args.elastic else files, deps)
        env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
        # the elastic tests' horovodrun starts `python` from PATH: this one
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        env.update(TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=os.pathsep.join(filter(None, [
            test_dir, os.path.join(test_dir, "utils"), deps, SCRIPTS])))
        pytest = [sys.executable, "-m", "pytest", "-q", "-rfEs", "--color=no",
                  "-p", "no:cacheprovider"]
        mpirun = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
                  "--oversubscribe", "-bind-to", "none", "-np", "2",
                  "-x", "TF_CPP_MIN_LOG_LEVEL", "-x", "PYTHONPATH"]
        k = ["-k", args.k] if args.k else []
        if args.elastic:  # horovodrun starts its own ranks: pytest alone, not under mpirun
            return run(pytest + k + [ELASTIC_FILE], test_dir, env, args.timeout)
        return run(mpirun + pytest + k + (args.files or list(PARALLEL_FILES)),
                   os.path.join(test_dir, "parallel"), env, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
