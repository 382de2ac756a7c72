"""Run by tests/test_horovod_xla.py under mpirun (2 ranks) on the Keras PTB_KERAS selects, as on
a GPU host: TensorFlow lists a stand-in GPU (tests/stand_in_gpus.py), where Keras 3's
compile(jit_compile="auto") chooses XLA; the training itself runs on the CPU, whose Horovod has
no XLA kernel (patch 26: a CPU build compiles none). Writes one JSON file per rank ($PROBE_OUT):

- fit: model.fit with Horovod's optimizer as a user writes it (compile without jit_compile), a
  functional and a subclassed model (Keras 3: and one under mixed_float16, whose
  LossScaleOptimizer wraps Horovod's); each rank fits its half of each global batch. Beside it
  the same model fitted by this process alone, with the plain optimizer, on every row: one
  process's weights and losses, and the jit_compile Keras chose for it.
- jit: the same with compile(jit_compile=True): what its fit raised, then an allreduce after it
  (the ranks go on together).
- tape, allreduce: a subclassed model whose own train_step averages the gradients with
  hvd.DistributedGradientTape or hvd.allreduce, beside a plain SGD, compiled as written; beside
  it one process's fit with neither. before_init: the jit_compile "auto" gave a model compiled
  as written before hvd.init().
- ops: what each of horovod.tensorflow's collectives raises in a
  tf.function(jit_compile=True).
- load (Keras 3; SAVE_TO, a path): rank 0 saves a model compiled with a plain SGD and XLA (as
  Keras chooses in a process without Horovod); both ranks load it with hvd.load_model and fit
  on their halves; beside it one process's fit of the same file with Keras' own load_model.
"""
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects, before TensorFlow loads
tf = utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import numpy as np  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402  (which loads the Keras utils selected)
from keras3_probe import report  # noqa: E402 -- tests/; after: its import selects Keras 3
from stand_in_gpus import stand_in  # noqa: E402
from utils.optimizers import KERAS3  # noqa: E402

keras = tf.keras
EPOCHS, BATCH, ROWS = 2, 8, 32  # global batch; rank r fits its half of each


def rows(rank=None, size=1, scale=1.0):
    """The regression's rows: all of them, or rank's half of each global batch."""
    rng = np.random.RandomState(0)
    x = scale * rng.randn(ROWS, 3).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.3 * scale
    if rank is None:
        return x, y
    return (a.reshape(ROWS // BATCH, size, BATCH // size, -1)[:, rank].reshape(-1, a.shape[1])
            for a in (x, y))


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)


class OwnStep(Subclassed):
    """A train_step of the user's own that averages the gradients itself, beside a plain
    optimizer: with hvd.DistributedGradientTape ("tape"), hvd.allreduce of each gradient
    ("allreduce"), or neither (None: one process)."""

    def __init__(self, averaged_by):
        super().__init__()
        self.averaged_by = averaged_by

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
        if self.averaged_by == "tape":
            tape = hvd_tf.DistributedGradientTape(tape)
        grads = tape.gradient(loss, self.trainable_variables)
        if self.averaged_by == "allreduce":
            grads = [hvd_tf.allreduce(g) for g in grads]
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


def model_of(kind):
    keras.utils.set_random_seed(0)  # the same starting weights for every model of a kind
    if kind == "subclassed":
        return Subclassed()
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(1)(inputs))


def sgd(kind="functional"):
    """SGD at 0.1; on tf-keras the legacy one (Horovod's Keras 2 path was made for it) for a
    functional model, and the newer one for a subclassed model, which compiles its own update
    step with XLA wherever a GPU is listed."""
    if KERAS3 or kind == "subclassed":
        return keras.optimizers.SGD(0.1)
    return keras.optimizers.legacy.SGD(0.1)


def fitted(model, optimizer, x, y, batch_size):
    """Compiled as a user writes it: the jit_compile Keras chose, the optimizer compile() kept
    (a LossScaleOptimizer around it under mixed_float16: its scale), the weights and the
    losses after the epochs."""
    model.compile(optimizer=optimizer, loss="mse")
    jit = bool(model.jit_compile)
    history = model.fit(x, y, batch_size=batch_size, epochs=EPOCHS, shuffle=False, verbose=0)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    scale = getattr(model.optimizer, "dynamic_scale", None)
    return {"jit": jit, "optimizer": type(model.optimizer).__name__,
            "optimizer_jit": getattr(model.optimizer, "jit_compile", None),  # tf-keras' own
            "scale": None if scale is None else float(scale.numpy()),
            "weights": [float(w) for w in weights],
            "loss": [float(v) for v in history.history["loss"]]}


def fit(kind, scale=1.0):
    """Horovod's optimizer on this rank's half of each batch, and one process on all rows."""
    ours = fitted(model_of(kind), hvd.DistributedOptimizer(sgd(kind)),
                  *rows(hvd.rank(), hvd.size(), scale), BATCH // hvd.size())
    one = fitted(model_of(kind), sgd(kind), *rows(scale=scale), BATCH)
    return {"ours": ours, "one": one}


def own_step(averaged_by):
    """OwnStep on this rank's half of each batch, with a plain SGD as a user compiles it (no
    jit_compile), and one process's on all rows."""
    def model():
        keras.utils.set_random_seed(0)
        return OwnStep(averaged_by)
    ours = fitted(model(), sgd("subclassed"), *rows(hvd.rank(), hvd.size()), BATCH // hvd.size())
    keras.utils.set_random_seed(0)
    one = fitted(OwnStep(None), sgd("subclassed"), *rows(), BATCH)
    return {"ours": ours, "one": one}


def compiled_before_init():
    """The jit_compile "auto" gives a model compiled as written with a plain SGD before
    hvd.init(), Horovod imported (Keras alone chooses XLA here: tests/test_horovod_xla.py)."""
    model = model_of("functional")
    model.compile(optimizer=sgd(), loss="mse")
    return bool(model.jit_compile)


def mixed_float16():
    """Rows a tenth as large: no gradient times the loss scale (32768) overflows float16, so
    that no step is skipped, on a half batch or on the whole."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        return fit("functional", scale=0.1)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def error_of(call):
    try:
        call()
    except Exception as e:  # what a user's script would end with
        return "%s: %s" % (type(e).__name__, e)
    return None


def jit_compile_true():
    """compile(jit_compile=True): what the first batch raises, then an allreduce of the ranks'
    numbers (0.5: both reached it)."""
    model = model_of("functional")
    model.compile(optimizer=hvd.DistributedOptimizer(sgd()), loss="mse", jit_compile=True)
    x, y = rows(hvd.rank(), hvd.size())
    error = error_of(lambda: model.fit(x, y, batch_size=BATCH // hvd.size(), verbose=0))
    after = float(hvd.allreduce(tf.constant(float(hvd.rank()))))
    return {"error": error, "after": after}


def ops_under_xla():
    """horovod.tensorflow's (horovod.tensorflow.keras' evaluate their result, eagerly), of the
    function's argument, as a step's gradients are."""
    x = tf.ones([2, 2])
    variable = tf.Variable(tf.ones([2, 2]))
    calls = {"allreduce": hvd_tf.allreduce,
             "grouped_allreduce": lambda x: hvd_tf.grouped_allreduce([x, x]),
             "allgather": hvd_tf.allgather,
             "grouped_allgather": lambda x: hvd_tf.grouped_allgather([x, x]),
             "broadcast": lambda x: hvd_tf.broadcast(x, 0),
             "broadcast_": lambda x: hvd_tf.broadcast_([variable], 0),
             "alltoall": hvd_tf.alltoall,
             "reducescatter": hvd_tf.reducescatter,
             "grouped_reducescatter": lambda x: hvd_tf.grouped_reducescatter([x, x]),
             "join": lambda x: hvd_tf.join(),
             **{name: (lambda op: lambda x: op())(getattr(hvd_tf, name))
                for name in ("size_op", "local_size_op", "rank_op", "local_rank_op",
                             "process_set_included_op")}}
    return {name: error_of(lambda: tf.function(call, jit_compile=True)(x))
            for name, call in calls.items()}


def load(path):
    """hvd.load_model of a model saved compiled with XLA: Keras' choice for a plain SGD on a GPU
    host in a process without Horovod, given here, where Horovod is imported and "auto" leaves
    it off."""
    if hvd.rank() == 0:
        model = model_of("functional")
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=True)
        saved_jit = bool(model.jit_compile)
        model.save(path)
    hvd.allreduce(tf.constant(0.0), name="saved")  # rank 1 waits for the file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = hvd.load_model(path)
    said = [str(w.message) for w in caught if "hvd.load_model" in str(w.message)]
    jit = bool(model.jit_compile)
    x, y = rows(hvd.rank(), hvd.size())
    model.fit(x, y, batch_size=BATCH // hvd.size(), epochs=EPOCHS, shuffle=False, verbose=0)
    one = keras.models.load_model(path)
    one_jit = bool(one.jit_compile)
    one.fit(*rows(), batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    flat = [np.concatenate([w.ravel() for w in m.get_weights()]).tolist() for m in (model, one)]
    out = {"jit": jit, "warned": said, "weights": flat[0], "one_jit": one_jit, "one": flat[1]}
    if hvd.rank() == 0:
        out["saved_jit"] = saved_jit
    return out


def main():
    stand_in(1)
    before_init = compiled_before_init()
    hvd.init()
    out = {"rank": hvd.rank(), "keras": keras.__name__, "before_init": before_init,
           "gpus": [d.device_type for d in tf.config.list_physical_devices()],
           "functional": fit("functional"), "subclassed": fit("subclassed"),
           "tape": own_step("tape"), "allreduce": own_step("allreduce"),
           "jit": jit_compile_true(), "ops": ops_under_xla()}
    if KERAS3:
        out["mixed_float16"] = mixed_float16()
        out["load"] = load(os.environ["SAVE_TO"])
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
