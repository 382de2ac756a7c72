"""Run by test_keras3.py under mpirun: model.fit with Horovod's optimizer wrapper and callbacks on
a linear regression, on the Keras PTB_KERAS selects (Keras 3; PTB_KERAS=2 tf-keras, its legacy
optimizers and its new ones), each case beside what one process makes of it. Each global batch
of 16 rows is split among the ranks (rank r its r-th share), so N ranks take the steps of one
process on the whole batch; the one process is plain Keras (no Horovod), run on every rank
before the ranks train, on all 16 rows, its learning rate set by Keras's own scheduler.

Cases, each a model.fit with the broadcast, metric-average and (SGD) learning-rate callbacks:
  a Sequential model, every rank from the same weights; a functional and a subclassed one, each
  rank from weights of its own (seeded by its rank: the broadcast must even them before the
  first batch); Adam resumed from a checkpoint that rank 0 alone restores (weights, moments,
  step count), the other rank fresh from weights of its own, as Horovod's examples resume.
Writes one JSON file per rank ($PROBE_OUT): for each case, the ranks' run and the one process's
(weights, losses, the learning rate of each epoch, the optimizer's steps)."""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects, before TensorFlow loads
tf = utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import numpy as np  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from keras3_probe import KERAS3, keras_name, report  # noqa: E402 -- tests/, beside

keras = tf.keras

EPOCHS, BATCH, ROWS = 3, 16, 64
# tf-keras: the legacy optimizers (the trainers' there) and the new ones, whose Horovod paths
# differ (the new ones are built, the legacy ones make slots)
LEGACY = None if KERAS3 else keras.optimizers.legacy


class LearningRates(keras.callbacks.Callback):
    """The learning rate each epoch trained with (read at its end)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(float(tf.convert_to_tensor(self.model.optimizer.learning_rate)))


class Linear(keras.Model):
    """A subclassed model: no weights until its first call."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)


def model_of(kind, seed):
    """A linear regression of 3 features, its weights drawn from `seed`, built."""
    keras.utils.set_random_seed(seed)
    if kind == "sequential":
        return keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(1)])
    if kind == "functional":
        x = keras.Input((3,))
        return keras.Model(x, keras.layers.Dense(1)(x))
    model = Linear()
    model(tf.zeros((1, 3)))  # built by a call, on every rank, before fit
    return model


def data():
    rng = np.random.RandomState(0)
    x = rng.randn(ROWS, 3).astype("float32")
    return x, x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.3


def share(rows, n, rank):
    """Rank r's rows of each global batch."""
    width = rows.shape[1]
    return rows.reshape(ROWS // BATCH, n, BATCH // n, width)[:, rank].reshape(-1, width)


def fit(model, optimizer, x, y, batch_size, callbacks, epochs=EPOCHS):
    rates = LearningRates()
    model.compile(optimizer=optimizer, loss="mse")
    history = model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
                        callbacks=[*callbacks, rates])
    return {"weights": [float(w) for w in np.concatenate([w.ravel()
                                                          for w in model.get_weights()])],
            "loss": [float(v) for v in history.history["loss"]], "lr": rates.seen,
            "iterations": int(model.optimizer.iterations.numpy())}


def sgd_case(kind, module, apart):
    """The ranks' fit with SGD at 0.1 halved each epoch (Horovod's schedule callback), and one
    process's (Keras's own scheduler) from rank 0's weights on the whole batch."""
    x, y = data()
    one = fit(model_of(kind, 0), module.SGD(learning_rate=0.1), x, y, BATCH,
              [keras.callbacks.LearningRateScheduler(lambda epoch: 0.1 * 0.5 ** epoch)])
    n, rank = hvd.size(), hvd.rank()
    ranks = fit(model_of(kind, rank if apart else 0),
                hvd.DistributedOptimizer(module.SGD(learning_rate=0.1)),
                share(x, n, rank), share(y, n, rank), BATCH // n,
                [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(),
                 hvd.callbacks.LearningRateScheduleCallback(
                     initial_lr=0.1, multiplier=lambda epoch: 0.5 ** epoch)])
    return {"ranks": ranks, "one": one}


def adam_resumed_case(kind, module, folder):
    """Adam, one epoch by one process (rank 0's, plain Keras) saved to a checkpoint; then 3
    epochs on from it: by one process, and by the ranks, rank 0 alone restoring it (weights,
    moments, step count), the others fresh from weights of their own. The broadcast callback
    must bring rank 0's state to every rank before the first update."""
    x, y = data()
    saved = os.path.join(folder, f"{kind}-adam")
    # every rank makes this epoch, rank 0 saves it: Horovod names its broadcasts by the
    # variables' names (adam_1/iteration), which Keras numbers by the objects made before, so
    # a model and an optimizer made on rank 0 alone would leave the ranks' broadcasts apart
    model = model_of(kind, 0)
    fit(model, module.Adam(0.1), x, y, BATCH, [], epochs=1)
    if hvd.rank() == 0:
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(saved)
    hvd.broadcast(tf.constant(0), 0, name=f"saved_{kind}")  # none restores before the save

    def resumed(seed, optimizer, restore):
        model = model_of(kind, seed)
        model.compile(optimizer=optimizer, loss="mse")
        if restore:  # the optimizer's state when it is built
            tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(saved)
        return model
    one_model = resumed(0, module.Adam(0.1), True)
    one = fit(one_model, one_model.optimizer, x, y, BATCH, [])
    n, rank = hvd.size(), hvd.rank()
    model = resumed(rank, hvd.DistributedOptimizer(module.Adam(0.1)), rank == 0)
    ranks = fit(model, model.optimizer, share(x, n, rank), share(y, n, rank), BATCH // n,
                [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback()])
    return {"ranks": ranks, "one": one}


def cases():
    """{name: (function, arguments)}: on tf-keras each model with the legacy optimizers (the
    trainers'), the functional and subclassed ones apart with its new optimizers too."""
    main = keras.optimizers if KERAS3 else LEGACY
    out = {"sequential": (sgd_case, ("sequential", main, False)),
           "functional-apart": (sgd_case, ("functional", main, True)),
           "subclassed-apart": (sgd_case, ("subclassed", main, True))}
    if not KERAS3:
        out.update({f"{kind}-apart-new": (sgd_case, (kind, keras.optimizers, True))
                    for kind in ("functional", "subclassed")})
    return out, main


def main():
    hvd.init()
    out = {"rank": hvd.rank(), "keras": keras_name()}
    sgd_cases, main_optimizers = cases()
    for name, (case, args) in sgd_cases.items():
        out[name] = case(*args)
    # rank 0's folder for the checkpoints, known to every rank (they run on this host)
    folder = hvd_tf.broadcast_object(tempfile.mkdtemp() if hvd.rank() == 0 else None, 0)
    for kind in ("sequential", "subclassed"):
        out[f"adam-resumed-{kind}"] = adam_resumed_case(kind, main_optimizers, folder)
    hvd.broadcast(tf.constant(0), 0, name="restored")  # every rank has read the checkpoints
    if hvd.rank() == 0:
        shutil.rmtree(folder)
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
