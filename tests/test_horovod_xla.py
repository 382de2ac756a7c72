"""Horovod's optimizer wrapper where only a GPU host goes: Keras 3's compile() chooses XLA
wherever a GPU is listed (patches 30, 31). The probe is one 2-rank launch per Keras
(tests/xla_probe.py); expected values are one process's (computed by each rank alone, without
Horovod)."""
import numpy as np
import pytest

from tests.helpers import run_script
from tests.test_horovod_wrapper import KERAS, once_per_keras

MODELS = ("functional", "subclassed")
# the one line a function XLA compiles gets where this Horovod has no XLA kernel (a CPU build)
NO_XLA_KERNEL = (
    "ValueError: Horovod: {op} in a function XLA compiles (jit_compile=True), and this Horovod "
    "has no XLA kernel for it ({where}); compile the Keras model with jit_compile=False, or "
    "take jit_compile=True off the tf.function")
ALLREDUCE_ONLY_ON_GPU = "only a GPU build run with HOROVOD_ENABLE_XLA_OPS=1 has one"
# horovod.tensorflow's call in tests/xla_probe.py: the op it names
NO_KERNEL_ANYWHERE = {
    "grouped_allreduce": "HorovodGroupedAllreduce", "allgather": "HorovodAllgather",
    "grouped_allgather": "HorovodGroupedAllgather", "broadcast": "HorovodBroadcast",
    "broadcast_": "HorovodBroadcastInplace", "alltoall": "HorovodAlltoall",
    "reducescatter": "HorovodReducescatter",
    "grouped_reducescatter": "HorovodGroupedReducescatter", "join": "HorovodJoin",
    "size_op": "HorovodSize", "local_size_op": "HorovodLocalSize", "rank_op": "HorovodRank",
    "local_rank_op": "HorovodLocalRank", "process_set_included_op": "HorovodProcessSetIncluded"}


@pytest.fixture(scope="module")
def xla(tmp_path_factory):
    """tests/xla_probe.py with a stand-in GPU listed."""
    saved = str(tmp_path_factory.mktemp("xla") / "model.keras")
    return once_per_keras("tests/xla_probe.py", SAVE_TO=saved)


def last_line(error):
    """An error's own line: TensorFlow puts the frames of a function it traced before it."""
    return error.strip().splitlines()[-1].strip()


def assert_on_a_gpu_host(ranks, keras):
    """Both ranks ran, under `keras`, with a (stand-in) GPU listed, which Keras 3's compile()
    takes for a GPU (test_the_stand_in_gpu_makes_keras_choose_xla_where_horovod_is_not)."""
    assert sorted(ranks) == [0, 1]
    for out in ranks.values():
        assert out["keras"].startswith("keras" if keras == "3" else "tf_keras"), out["keras"]
        assert "GPU" in out["gpus"], out["gpus"]


# A process of its own with one stand-in GPU: whether Keras 3's "auto" chooses XLA for a model
# compiled as written, without Horovod imported and with it; then, Horovod started on one
# rank, a train_step of one's own averaging with hvd.DistributedGradientTape (whose allreduce
# runs on one rank too) fitted an epoch.
ONE_PROCESS = """import sys
sys.path.insert(0, "tests")
import utils
tf = utils.import_tensorflow()
from stand_in_gpus import stand_in
stand_in(1)
keras = tf.keras
def compiled():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model
without = bool(compiled().jit_compile)
import horovod.tensorflow as hvd
imported = bool(compiled().jit_compile)
hvd.init()
from xla_probe import OwnStep, rows
model = OwnStep("tape")
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
model.fit(*rows(), batch_size=16, epochs=1, verbose=0)
print(without, imported, bool(model.jit_compile), hvd.size())
"""


def test_the_stand_in_gpu_makes_keras_choose_xla_where_horovod_is_not():
    """Patch 37, in one process (no launcher): Keras 3 chooses XLA for a model compiled as
    written where the stand-in GPU is listed, so the 2-rank tests here see what a GPU host
    does; once horovod.tensorflow is imported "auto" leaves XLA off, before hvd.init() too
    (Keras resolves it at compile()); and a one-rank job's train_step with the tape trains,
    where it stopped at its first batch in patch 30's line."""
    r = run_script(["-c", ONE_PROCESS], env={"PTB_KERAS": "3"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-4:] == ["True", "False", "False", "1"], r.stdout


# tf-keras selected (tf.keras is tf-keras) and Keras 3 imported by itself beside it, after
# horovod.tensorflow: Keras 3's "auto" before hvd.init(), after it, and a train_step of one's
# own with the tape, fitted an epoch on one rank.
KERAS3_BESIDE_TF_KERAS = """import sys
sys.path.insert(0, "tests")
import utils
tf = utils.import_tensorflow()
from stand_in_gpus import stand_in
stand_in(1)
import horovod.tensorflow as hvd
import keras
def compiled():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model
before_init = bool(compiled().jit_compile)
hvd.init()
after_init = bool(compiled().jit_compile)
class Tape(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)
    def call(self, x):
        return self.dense(x)
    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}
model = Tape()
model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
x = tf.ones((16, 3))
model.fit(x, tf.ones((16, 1)), batch_size=8, epochs=1, verbose=0)
print(tf.keras.__name__.partition(".")[0], keras.__version__[0], before_init, after_init,
      bool(model.jit_compile))
"""


def test_keras3_imported_beside_tf_keras_after_horovod_gets_no_auto_xla_from_hvd_init():
    """Patch 37's rule on Keras 3's own Model where it is not tf.keras: tf-keras selected, a
    user's `import keras` after horovod.tensorflow's. Before hvd.init() Keras 3 still chooses
    XLA where the stand-in GPU is listed (the rule reaches a Keras imported later at hvd.init()
    or at Horovod's optimizer, not before); after it "auto" is False, and a train_step of one's
    own with hvd.DistributedGradientTape trains, where it went to XLA and stopped at its first
    batch in patch 30's line (a review's probe, before the rule reached Keras 3's Model)."""
    r = run_script(["-c", KERAS3_BESIDE_TF_KERAS], env={"PTB_KERAS": "2"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split()[-5:] == ["tf_keras", "3", "True", "False", "False"], r.stdout


@KERAS
def test_model_fit_compiled_as_written_on_a_gpu_host_is_one_process(xla, keras):
    """Patches 31 and 37. With a GPU listed (a stand-in; the steps run on the CPU), Keras 3's
    compile() without jit_compile chose XLA for the train step, and a 2-rank model.fit with
    Horovod's optimizer failed at its first batch: "Detected unsupported operations ...
    HorovodAllreduce (No registered 'HorovodAllreduce' OpKernel for XLA_CPU_JIT devices ...)".
    Keras chooses XLA in a process without Horovod (test_the_stand_in_gpu_...); where Horovod
    is imported "auto" now leaves it off for every model, compiled before hvd.init() or after,
    as Keras does under a tf.distribute strategy, and 2 ranks on half of each batch end with
    one process's weights and losses (each rank's loss is its half's: their mean is the whole
    batch's), a functional and a subclassed model alike. tf-keras never chooses XLA for the step (its default is False); its newer SGD
    compiles its own update with XLA where a GPU is listed, as it does here."""
    ranks = xla(keras)
    assert_on_a_gpu_host(ranks, keras)
    assert [out["before_init"] for out in ranks.values()] == [False, False]
    for kind in MODELS:
        one = ranks[0][kind]["one"]
        assert one["jit"] is False, one  # in the job, beside the ranks' model
        assert one["loss"][-1] < one["loss"][0] / 4  # it trained
        for out in ranks.values():
            ours = out[kind]["ours"]
            assert ours["jit"] is False, (kind, ours)
            np.testing.assert_allclose(ours["weights"], one["weights"], rtol=1e-5)
        np.testing.assert_allclose(np.mean([out[kind]["ours"]["loss"] for out in ranks.values()],
                                           axis=0), one["loss"], rtol=1e-5)
    if keras == "2":  # tf-keras' newer SGD, the subclassed model's
        subclassed = ranks[0]["subclassed"]
        assert subclassed["ours"]["optimizer_jit"] is subclassed["one"]["optimizer_jit"] is True


def test_mixed_float16_looks_through_the_loss_scale_optimizer(xla):
    """Patches 31 and 37 under mixed_float16: compile() wraps Horovod's optimizer in a
    LossScaleOptimizer; "auto" leaves XLA off in the 2-rank job (patch 31 alone looked through
    the LossScaleOptimizer for Horovod's). Rows a tenth as large overflow no step (the scale
    stays 32768), so the ranks end at one process's weights but for float16's rounding of a
    half batch."""
    ranks = xla("3")
    one = ranks[0]["mixed_float16"]["one"]
    assert (one["jit"], one["optimizer"], one["scale"]) == (False, "LossScaleOptimizer", 32768)
    for out in ranks.values():
        ours = out["mixed_float16"]["ours"]
        assert (ours["jit"], ours["optimizer"], ours["scale"]) == (False, "LossScaleOptimizer",
                                                                   32768), ours
        np.testing.assert_allclose(ours["weights"], one["weights"], rtol=1e-3, atol=1e-5)
    assert ranks[0]["mixed_float16"]["ours"]["weights"] == ranks[1]["mixed_float16"]["ours"][
        "weights"]


@KERAS
@pytest.mark.parametrize("averaged_by", ["tape", "allreduce"])
def test_a_train_step_of_ones_own_on_a_gpu_host_is_one_process(xla, keras, averaged_by):
    """Patch 37. A subclassed model whose own train_step averages the gradients, with
    hvd.DistributedGradientTape or hvd.allreduce of each, beside a plain SGD, compiled as
    written where a GPU is listed: Keras 3 chose XLA (patch 31 looked only at the model's
    optimizer), and the 2-rank fit stopped at its first batch in patch 30's line. "auto" now
    leaves XLA off where Horovod is imported, and the ranks end at one process's
    weights (its own train_step with neither, on the whole batches), which are those of Keras'
    own train step on the same model and batches."""
    ranks = xla(keras)
    assert_on_a_gpu_host(ranks, keras)
    one = ranks[0][averaged_by]["one"]
    np.testing.assert_allclose(one["weights"], ranks[0]["subclassed"]["one"]["weights"],
                               rtol=1e-5)
    for out in ranks.values():
        ours = out[averaged_by]["ours"]
        assert ours["jit"] is False, ours
        np.testing.assert_allclose(ours["weights"], one["weights"], rtol=1e-5)


@KERAS
def test_jit_compile_true_stops_at_the_first_batch_in_one_line(xla, keras):
    """Patch 30. compile(jit_compile=True) with Horovod's optimizer, in a CPU build: TensorFlow's
    "Detected unsupported operations" at the first batch, with the graph's nodes; now one line
    at its trace naming the fix, on both ranks before any allreduce of the step (both go on to
    the allreduce after it: 0.5, the mean of their numbers)."""
    for out in xla(keras).values():
        assert last_line(out["jit"]["error"]) == NO_XLA_KERNEL.format(
            op="HorovodAllreduce", where=ALLREDUCE_ONLY_ON_GPU), out["jit"]
        assert out["jit"]["after"] == 0.5


@KERAS
def test_horovods_collectives_in_an_xla_function_stop_in_one_line(xla, keras):
    """Patches 30 and 38: each of horovod.tensorflow's collectives in a
    tf.function(jit_compile=True) failed at its first run in TensorFlow's "Detected unsupported
    operations" (patch 30 gave the line to the first three; the others kept TensorFlow's error
    until patch 38); only the allreduce has an XLA kernel, and in GPU builds only."""
    for out in xla(keras).values():
        ops = out["ops"]
        assert sorted(ops) == sorted([*NO_KERNEL_ANYWHERE, "allreduce"]), ops
        assert last_line(ops["allreduce"]) == NO_XLA_KERNEL.format(
            op="HorovodAllreduce", where=ALLREDUCE_ONLY_ON_GPU), ops
        for name, op in NO_KERNEL_ANYWHERE.items():
            assert last_line(ops[name]) == NO_XLA_KERNEL.format(
                op=op, where="no Horovod build has one"), (name, ops[name])


def test_hvd_load_model_of_a_model_compiled_with_xla_trains_without_it(xla):
    """Patch 31 through hvd.load_model (patch 25): a model compiled as written with a plain SGD
    on a GPU host, in a process without Horovod, is saved with jit_compile=True (here given, as
    "auto" leaves XLA off in the job); loaded with Horovod's optimizer around its SGD, it failed
    at its first batch. It now says so in one warning and trains without XLA: 2 ranks end at
    the weights of one process that loads the file with Keras alone (and keeps XLA)."""
    ranks = xla("3")
    assert ranks[0]["load"]["saved_jit"] is True
    for out in ranks.values():
        load = out["load"]
        assert (load["jit"], load["one_jit"]) == (False, True), load
        assert load["warned"] == [
            "hvd.load_model: the model was saved compiled with jit_compile=True; it trains with "
            "jit_compile=False, as Horovod's allreduce has no XLA kernel in this build (only a "
            "GPU build run with HOROVOD_ENABLE_XLA_OPS=1 has one)"], load
        np.testing.assert_allclose(load["weights"], load["one"], rtol=1e-5)

