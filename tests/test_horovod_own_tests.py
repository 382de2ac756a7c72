"""scripts/horovod_own_tests.py's fast parts: its bad input, and its Keras 3 adaptations of
Horovod's own tests on small test files written here, each Keras 2 call of the list in a test
that runs on 2 ranks. The full run of Horovod's tests takes too long for CI; its log is
results/stack/horovod-own-tests/."""
import importlib.util
import os
import sys

import pytest

from tests.helpers import REPO, run_job, script_env

SCRIPT = os.path.join(REPO, "scripts", "horovod_own_tests.py")

# Small stand-ins for Horovod's test files, with each Keras 2 call the script adapts, run on
# Keras 3 after it: the optimizer's update is known by hand (rank r's gradient is r + 1, so the
# 2 ranks' average is 1.5), so a call adapted wrong, or Horovod's averaging skipped, fails.
TENSORFLOW = """import tensorflow as tf


def test_a_reference_layer_and_a_variables_key():
    bn = tf.keras.layers.BatchNormalization(axis=1, fused=False)
    var = tf.keras.Variable(1.0)
    assert {var.ref(): 1}[var.ref()] == 1 and bn.axis in (1, [1])
"""
TENSORFLOW2_KERAS = """import numpy as np
import tensorflow as tf
from tensorflow import keras

import horovod.tensorflow.keras as hvd

hvd.init()


class TestingOptimizer(keras.optimizers.Optimizer):
    def __init__(self, name, **kwargs):
        super().__init__(name=name, **kwargs)

    def update_step(self, gradient, variable):
        variable.assign_add(gradient)


def test_gradients_computed_and_applied_are_averaged():
    opt = hvd.DistributedOptimizer(TestingOptimizer("test"))
    x = tf.Variable([0.0])
    grads_and_vars = opt._compute_gradients(lambda: (hvd.rank() + 1.0) * x, var_list=[x])
    opt.apply_gradients(grads_and_vars,
                        experimental_aggregate_gradients=False)
    with tf.GradientTape() as tape:
        loss = (hvd.rank() + 1.0) * x
    opt.apply_gradients(opt._compute_gradients(loss, [x], tape=tape))
    assert x.numpy().tolist() == [3.0], x.numpy()  # twice the average, 1.5
    assert {x.ref(): 1}[x.ref()] == 1


def test_compile_and_the_learning_rate():
    model = keras.Sequential([keras.layers.Dense(1)])
    model.compile(loss=keras.losses.mean_squared_error,
                  optimizer=hvd.DistributedOptimizer(keras.optimizers.RMSprop(lr=0.5)),
                  experimental_run_tf_function=False)
    assert np.isclose(model.optimizer.lr.numpy(), 0.5)
    assert not hasattr(keras.optimizers, 'legacy')  # the test's own skip finds none
"""
ELASTIC_MAIN = "def on_state_reset():\n    optimizer.lr.assign(lr * hvd.size())\n"

# each file's adapted lines, written by hand: (line number, line)
ADAPTED = {
    "parallel/test_tensorflow.py": [
        (5, "    bn = tf.keras.layers.BatchNormalization(axis=1)"),
        (7, "    assert {keras3_ref(var): 1}[keras3_ref(var)] == 1 and bn.axis in (1, [1])")],
    "parallel/test_tensorflow2_keras.py": [
        (12, '        super().__init__(name=name, **{"learning_rate": 0.1, **kwargs})'),
        (14, "    def update_step(self, gradient, variable, learning_rate=None):"),
        (21, "    grads_and_vars = keras3_compute_gradients(opt, lambda: (hvd.rank() + 1.0) * x,"
             " var_list=[x])"),
        (23, "                        )"),
        (26, "    opt.apply_gradients(keras3_compute_gradients(opt, loss, [x], tape=tape))"),
        (28, "    assert {keras3_ref(x): 1}[keras3_ref(x)] == 1"),
        (33, "    model.compile(loss=keras.losses.MSE,"),
        (34, "                  optimizer=hvd.DistributedOptimizer(keras.optimizers.RMSprop("
             "learning_rate=0.5)),"),
        (35, "                  )"),
        (36, "    assert np.isclose(model.optimizer.learning_rate.numpy(), 0.5)"),
        (37, "    assert not False  # the test's own skip finds none")],
    "integration/data/elastic_tensorflow2_main.py": [
        (2, "    optimizer.learning_rate.assign(lr * hvd.size())")],
}


def horovods_tests(folder, tensorflow=TENSORFLOW, tensorflow2_keras=TENSORFLOW2_KERAS):
    files = {"parallel/test_tensorflow.py": tensorflow,
             "parallel/test_tensorflow2_keras.py": tensorflow2_keras,
             "parallel/test_tensorflow_keras.py": "",
             "integration/data/elastic_tensorflow2_main.py": ELASTIC_MAIN}
    for name, text in files.items():
        os.makedirs(folder / os.path.dirname(name), exist_ok=True)
        (folder / name).write_text(text)
    return folder


def horovod_own_tests(*args, timeout=60):
    return run_job([sys.executable, SCRIPT, *map(str, args)], timeout, cwd=REPO,
                   env=script_env())


def test_bad_input_is_one_line(tmp_path):
    no_tests = horovod_own_tests(tmp_path)
    other_version = horovod_own_tests(horovods_tests(tmp_path / "other", tensorflow="x = 1\n"))
    other_file = horovod_own_tests(horovods_tests(tmp_path / "torch"), "test_torch.py")
    for r, says in [(no_tests, f"error: {tmp_path} has no Horovod tests "
                                "(parallel/test_tensorflow.py missing)"),
                    (other_file, "error: test_torch.py is not one of the files run here: "
                                 "test_tensorflow.py, test_tensorflow2_keras.py, "
                                 "test_tensorflow_keras.py"),
                    (other_version, "error: parallel/test_tensorflow.py has no syncbn reference "
                                    "layer to adapt: these are not Horovod v0.28.1's tests")]:
        assert r.returncode == 2 and r.stderr.startswith(says), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    if importlib.util.find_spec("parameterized"):
        pytest.skip("parameterized is installed: its absence is not tested")
    no_deps = horovod_own_tests(horovods_tests(  # the import of Horovod's file
        tmp_path / "v0.28.1", tensorflow2_keras="from parameterized import parameterized\n"
        + TENSORFLOW2_KERAS))
    assert no_deps.returncode == 2 and no_deps.stderr.startswith(
        "error: Horovod's tests need parameterized: pip install --target DIR parameterized, "
        "then --deps DIR"), no_deps.stderr
    assert len(no_deps.stderr.strip().splitlines()) == 1, no_deps.stderr


def test_the_keras2_calls_are_adapted_line_for_line_and_run_on_keras3(tmp_path):
    tests = horovods_tests(tmp_path / "test")
    adapted = tmp_path / "adapted"
    r = horovod_own_tests(tests, "--elastic", "--adapt-to", adapted)
    assert r.returncode == 0, r.stdout + r.stderr
    for name, lines in ADAPTED.items():
        expected = (tests / name).read_text().splitlines()
        for number, line in lines:
            expected[number - 1] = line
        # line for line (a traceback's line number is the original file's), the rest unchanged,
        # and the helpers imported after the last
        assert (adapted / name).read_text().splitlines()[:len(expected)] == expected, name
    assert (adapted / "parallel" / "test_tensorflow.py").read_text().endswith(
        "\nfrom horovod_own_tests import keras3_ref, keras3_compute_gradients  # adapted\n")
    r = horovod_own_tests(tests, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("3 passed") == 2, r.stdout[-3000:]  # on each rank
