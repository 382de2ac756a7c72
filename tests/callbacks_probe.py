"""Run by tests/test_horovod_callbacks.py under mpirun with 2 ranks, on the Keras PTB_KERAS selects
(Keras 3; PTB_KERAS=2 tf-keras, its legacy optimizers as Horovod's Keras 2 path takes them):
Horovod's four Keras callbacks in model.fit, on a functional and a subclassed model whose ranks
start from other weights, each a linear regression the test replays by hand (numpy) from the
rows and starting weights defined here. Global batches of 16 rows, rank r taking the r-th half.
Writes one JSON file per rank ($PROBE_OUT); SAVE_TO: a folder for rank 0's saved files.

Importing this file loads no TensorFlow (the test imports its rows and starting weights): main()
imports utils first, which selects the Keras, then TensorFlow and Horovod."""
import os
import sys
import warnings

import numpy as np

ROWS, BATCH, EPOCHS, LR, MOMENTUM = 64, 16, 3, 0.1, 0.5
STEPS = ROWS // BATCH  # batches an epoch
# How each model of the matrix is made on each rank before fit(): "functional" has its
# variables from the start; a subclassed model has them once called on a batch ("subclassed"
# on every rank, "subclassed_on_rank_0" on rank 0 alone, as after a restore there), never
# ("subclassed_unbuilt"), or after model.build(input_shape) ("subclassed_build_shape", which
# on Keras 3 marks the model built and leaves its Dense layer without variables); called on
# every rank, with a second Dense layer its call never uses ("subclassed_unused_layer") or uses
# in training alone, times 0 ("subclassed_training_layer": built in the first step, its
# weights 1 on rank 0 and 2 on rank 1, and its gradient 0, so they stay where they start).
MODELS = ("functional", "subclassed", "subclassed_on_rank_0", "subclassed_unbuilt",
          "subclassed_build_shape", "subclassed_unused_layer", "subclassed_training_layer")


def rows():
    """The whole data: 64 rows of 3 features, y = x . (1, -2, 0.5) + 0.3."""
    rng = np.random.RandomState(0)
    x = rng.randn(ROWS, 3).astype("float32")
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.3).astype("float32")


def share(array, rank, size):
    """Rank `rank`'s rows of each global batch of BATCH rows."""
    return array.reshape(STEPS, size, BATCH // size, -1)[:, rank].reshape(-1, array.shape[-1])


def start_weights(rank):
    """Rank `rank`'s starting kernel (3, 1) and bias (1,): other ranks, other weights."""
    rng = np.random.RandomState(10 + rank)
    return rng.randn(3, 1).astype("float32"), rng.randn(1).astype("float32")


def main():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import utils  # first: the Keras PTB_KERAS selects, before TensorFlow loads
    global tf, keras, hvd, KERAS3, optimizers  # for the functions below
    tf = utils.import_tensorflow()
    keras = tf.keras
    import horovod.tensorflow.keras as hvd
    from utils.optimizers import KERAS3
    from keras3_probe import broadcast_with_local_variables, report  # tests/, beside it
    optimizers = keras.optimizers if KERAS3 else keras.optimizers.legacy
    hvd.init()
    saved = os.environ["SAVE_TO"]
    out = {"rank": hvd.rank(), "keras3": KERAS3}
    for kind in MODELS:
        out[kind] = fit_with_the_four_callbacks(kind, optimizers.SGD)
    if not KERAS3:  # tf-keras's own optimizers (not legacy): momentum a Python number
        out["functional_non_legacy_sgd"] = fit_with_the_four_callbacks("functional",
                                                                       keras.optimizers.SGD)
    out["resume_adam"] = resumed_by_rank_0_alone(os.path.join(saved, "adam"))
    out["loaded"] = fits_of_a_loaded_model(os.path.join(saved, "model"))
    # Horovod's tf-keras wrapper cannot wrap tf-keras's LossScaleOptimizer (upstream's
    # from_config passes it the inner optimizer, which its __init__ does not take)
    out["mixed_float16"] = {wrap: warmup_warnings_under_mixed_float16(wrap)
                            for wrap in (("inner", "outer") if KERAS3 else ("inner",))}
    if KERAS3:  # horovod.keras is the keras package's: Keras 3 whatever PTB_KERAS says
        import horovod.keras as hvd_keras
        out["horovod_keras_local"] = broadcast_with_local_variables(hvd_keras)
    report(out)
    return 0


def constant(value):
    """An initializer of exactly `value` (both Keras take a callable)."""
    return lambda shape, dtype=None: tf.constant(value, dtype=dtype or "float32")


def dense(rank):
    kernel, bias = start_weights(rank)
    return keras.layers.Dense(1, kernel_initializer=constant(kernel),
                              bias_initializer=constant(bias))


def model_of(kind, rank, x):
    if kind == "functional":
        inputs = keras.Input((3,))
        return keras.Model(inputs, dense(rank)(inputs))

    class Regressor(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = dense(rank)
            if kind in ("subclassed_unused_layer", "subclassed_training_layer"):
                self.extra = keras.layers.Dense(
                    1, kernel_initializer=constant(np.full((3, 1), rank + 1.0, "float32")),
                    bias_initializer=constant(np.full((1,), rank + 1.0, "float32")))

        def call(self, inputs, training=None):
            out = self.dense(inputs)
            if training and kind == "subclassed_training_layer":
                out = out + 0.0 * self.extra(inputs)
            return out
    model = Regressor()
    if kind in ("subclassed", "subclassed_unused_layer", "subclassed_training_layer") or (
            kind == "subclassed_on_rank_0" and rank == 0):
        model(x[:1])
    elif kind == "subclassed_build_shape":
        model.build((None, 3))
    return model


def seen_callback():
    """A callback after Horovod's: the learning rate each batch trains with."""
    class Seen(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.lrs = []

        def on_train_batch_begin(self, batch, logs=None):
            self.lrs.append(float(tf.convert_to_tensor(self.model.optimizer.learning_rate)))
    return Seen()


def horovod_warnings(caught):
    return [str(w.message) for w in caught if str(w.message).startswith((
        "BroadcastGlobalVariablesCallback", "LearningRateWarmupCallback",
        "LearningRateScheduleCallback"))]


def fit(model, x, y, callbacks, epochs=EPOCHS):
    """model.fit on this rank's rows in order; the Horovod callbacks' warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, batch_size=BATCH // hvd.size(), epochs=epochs, shuffle=False,
                            verbose=0, callbacks=callbacks)
    return history, horovod_warnings(caught)


def fit_with_the_four_callbacks(kind, sgd):
    """Every rank from its own weights, SGD with momentum 0.5 under all four callbacks: the
    broadcast, the metric average, a warm-up over epoch 0 (the learning rate per batch) and a
    schedule that halves it each epoch from epoch 1."""
    rank, size = hvd.rank(), hvd.size()
    x, y = (share(a, rank, size) for a in rows())
    model = model_of(kind, rank, x)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd(learning_rate=LR, momentum=MOMENTUM)),
                  loss="mse")
    seen = seen_callback()
    history, said = fit(model, x, y, [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=1),
        hvd.callbacks.LearningRateScheduleCallback(initial_lr=LR, multiplier=0.5,
                                                   start_epoch=1),
        seen])
    return {"weights": flat(model), "loss": [float(v) for v in history.history["loss"]],
            "lrs": seen.lrs, "warnings": said}


def flat(model):
    return [float(w) for w in np.concatenate([w.ravel() for w in model.get_weights()])]


def resumed_by_rank_0_alone(path):
    """Adam (tf-keras: its own, not legacy: the callback builds it through optimizer.build),
    a subclassed model built on every rank. One process without Horovod trains one epoch on
    the whole batches and saves it; restored there, two more epochs are the values the ranks
    must end with. Then rank 0 alone restores it while rank 1 starts from its own weights and a
    fresh Adam, and two epochs under the broadcast callback. (Every rank takes the one-process
    part, so that every rank makes the same objects, whose names the broadcast pairs.)"""
    rank, size = hvd.rank(), hvd.size()
    x, y = rows()
    path = os.path.join(path, str(rank))

    def adam_model(weights_of):
        return model_of("subclassed", weights_of, x), keras.optimizers.Adam(LR)
    model, adam = adam_model(0)
    model.compile(optimizer=adam, loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    tf.train.Checkpoint(model=model, optimizer=adam).write(path)
    model, adam = adam_model(1)
    model.compile(optimizer=adam, loss="mse")
    tf.train.Checkpoint(model=model, optimizer=adam).restore(path)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    one = [flat(model), int(adam.iterations.numpy())]
    model, adam = adam_model(rank)
    model.compile(optimizer=hvd.DistributedOptimizer(adam), loss="mse")
    if rank == 0:
        tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(path)
    _, said = fit(model, share(x, rank, size), share(y, rank, size),
                  [hvd.callbacks.BroadcastGlobalVariablesCallback(0)], epochs=2)
    return {"one": one, "weights": flat(model),
            "iterations": int(model.optimizer.iterations.numpy()), "warnings": said}


def fits_of_a_loaded_model(path):
    """Rank 0 saves a model compiled with Horovod's optimizer; every rank loads it with
    keras.models.load_model (the optimizer it wrapped, no Horovod's: each rank would train
    alone) and with hvd.load_model, and fits each under the broadcast callback: the warnings of
    each fit, and whether its ranks end equal."""
    rank, size = hvd.rank(), hvd.size()
    x, y = (share(a, rank, size) for a in rows())
    # tf-keras: .h5, whose optimizer hvd.load_model wraps (its own .keras format, whose
    # optimizer it does not, is saved for the test to load without Horovod)
    path += ".keras" if KERAS3 else ".h5"
    # made on every rank, so that the ranks' later objects have the same names (the broadcast
    # pairs the ranks' variables by name)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(optimizers.SGD(LR)), loss="mse")
    if rank == 0:
        model.save(path)
        if not KERAS3:
            model.save(os.path.join(os.path.dirname(path), "tf_keras_model.keras"))
    hvd.allreduce(tf.constant(0.0), name="saved")  # rank 0 has written it
    out = {}
    # tf-keras: the saved legacy SGD is hvd.load_model's legacy_opts
    hvd_load_model = lambda path: hvd.load_model(path, legacy_opts=not KERAS3)  # noqa: E731
    for name, load in (("keras", keras.models.load_model), ("hvd", hvd_load_model)):
        model = load(path)
        _, said = fit(model, x, y, [hvd.callbacks.BroadcastGlobalVariablesCallback(0)], 1)
        out[name] = {"warnings": said, "weights": flat(model)}
    return out


def warmup_warnings_under_mixed_float16(wrap):
    """The warm-up callback over SGD with momentum under mixed_float16: compile() wraps the
    optimizer in a LossScaleOptimizer ("inner": Horovod's inside it), or Horovod's wraps one
    ("outer"). The callback's warnings."""
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x, y = (share(a, hvd.rank(), hvd.size()) for a in rows())
        model = model_of("functional", 0, x)
        sgd = keras.optimizers.SGD(LR, momentum=MOMENTUM)
        if wrap == "inner":
            optimizer = hvd.DistributedOptimizer(sgd)
        else:
            optimizer = hvd.DistributedOptimizer(keras.mixed_precision.LossScaleOptimizer(sgd))
        model.compile(optimizer=optimizer, loss="mse")
        _, said = fit(model, x, y, [hvd.callbacks.LearningRateWarmupCallback(
            initial_lr=LR, warmup_epochs=1)], epochs=1)
        return {"optimizer": type(model.optimizer).__name__, "warnings": said}
    finally:
        keras.mixed_precision.set_global_policy(policy)


if __name__ == "__main__":
    sys.exit(main())
