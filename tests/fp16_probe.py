"""Run by test_keras3.py, alone or under mpirun: model.fit of a linear regression under Keras 3's
mixed_float16 policy with Horovod's optimizer, where one row of one batch overflows float16 (its
rank alone sees it when 2 ranks split the batch). One process on the whole batch skips that step
and halves its loss scale; N ranks must do the same, together. WRAP=inner (default): compile()
wraps Horovod's optimizer in a LossScaleOptimizer; WRAP=outer: Horovod's wraps one given to
compile(). RELOAD=path: rank 0 saves the model after epoch 1, and every rank goes on from
hvd.load_model of it, its loss scale and steps included. Writes one JSON file per rank
($PROBE_OUT): the weights, the loss scale, the steps taken and skipped; after fit, one more
allreduce, which pairs with another rank's only if every rank ran the same collectives in fit."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects (this probe: Keras 3)
tf = utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import numpy as np  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from keras3_probe import report  # noqa: E402 -- tests/, the script's own folder

keras = tf.keras
BATCH, ROWS, OVERFLOW_BATCH = 8, 32, 2


def main():
    hvd.init()
    n, rank = hvd.size(), hvd.rank()
    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.RandomState(0)
    x = rng.randn(ROWS, 3).astype("float32")
    # small targets, a model started at 0: no gradient of an ordinary row comes near float16's
    # limit at the default scale (32768), so the planted row's step is the only one skipped
    y = 0.01 * (x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.3)
    # the last row of batch 2 overflows float16 (max 65504) in the forward pass; with 2 ranks
    # it is rank 1's alone
    x[OVERFLOW_BATCH * BATCH + BATCH - 1] = 1e6
    xs = x.reshape(ROWS // BATCH, n, BATCH // n, 3)[:, rank].reshape(-1, 3)
    ys = y.reshape(ROWS // BATCH, n, BATCH // n, 1)[:, rank].reshape(-1, 1)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((3,)),
                              keras.layers.Dense(1, kernel_initializer="zeros")])
    sgd = keras.optimizers.SGD(learning_rate=0.05)
    if os.environ.get("WRAP") == "outer":
        optimizer = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(sgd))
    else:
        optimizer = hvd.DistributedOptimizer(sgd)
    model.compile(optimizer=optimizer, loss="mse")
    fit = dict(batch_size=BATCH // n, shuffle=False, verbose=0,
               callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    if os.environ.get("RELOAD"):  # epoch 1, saved by rank 0, loaded by all, then epoch 2
        model.fit(xs, ys, epochs=1, **fit)
        if rank == 0:
            model.save(os.environ["RELOAD"])
        hvd.allreduce(tf.constant(0.0), name="saved")  # no rank loads before the save
        model = hvd.load_model(os.environ["RELOAD"])
        model.fit(xs, ys, epochs=1, **fit)
    else:
        model.fit(xs, ys, epochs=2, **fit)
    scaling = model.optimizer
    after = hvd.allreduce(tf.constant(float(rank)), op=hvd.Sum, name="after_fit")
    report({"rank": rank, "wrapped": type(scaling).__name__,
            # Horovod's class: the LossScaleOptimizer itself, or the optimizer inside it
            "horovods": ("outer" if hasattr(scaling, "_hvd_allreduce") else
                         "inner" if hasattr(scaling.inner_optimizer, "_hvd_allreduce") else None),
            "weights": [float(w) for w in np.concatenate([w.ravel()
                                                          for w in model.get_weights()])],
            "scale": float(scaling.dynamic_scale.numpy()),
            "iterations": int(scaling.iterations.numpy()),
            "after": float(after)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
