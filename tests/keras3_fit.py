"""Run by test_keras3.py, alone or under mpirun: Keras 3's model.fit with Horovod's optimizer
wrapper and callbacks on a linear regression. Each global batch of 16 rows is split among the
ranks (rank r its r-th share), so N ranks take the steps of one process on the whole batch.
Prints one JSON line per rank: the weights, the learning rate of each epoch, the losses.
SEED_BY_RANK=1 starts each rank from other weights (the broadcast callback must even them)."""
import os
import sys

os.environ.pop("TF_USE_LEGACY_KERAS", None)  # TensorFlow's own tf.keras: Keras 3
import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from keras3_probe import report  # noqa: E402 -- tests/, the script's own folder

EPOCHS, BATCH, ROWS = 3, 16, 64


class LearningRates(keras.callbacks.Callback):
    """The learning rate each epoch trained with (read at its end)."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def on_epoch_end(self, epoch, logs=None):
        self.seen.append(float(tf.convert_to_tensor(self.model.optimizer.learning_rate)))


def main():
    hvd.init()
    n, rank = hvd.size(), hvd.rank()
    rng = np.random.RandomState(0)
    x = rng.randn(ROWS, 3).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.3
    xs = x.reshape(ROWS // BATCH, n, BATCH // n, 3)[:, rank].reshape(-1, 3)
    ys = y.reshape(ROWS // BATCH, n, BATCH // n, 1)[:, rank].reshape(-1, 1)
    keras.utils.set_random_seed(rank if os.environ.get("SEED_BY_RANK") else 0)
    model = keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1)),
                  loss="mse")
    rates = LearningRates()
    history = model.fit(xs, ys, batch_size=BATCH // n, epochs=EPOCHS, shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback(),
                                   hvd.callbacks.LearningRateScheduleCallback(
                                       initial_lr=0.1, multiplier=lambda epoch: 0.5 ** epoch),
                                   rates])
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    report({"rank": rank, "weights": [float(w) for w in weights], "lr": rates.seen,
            "loss": [float(v) for v in history.history["loss"]]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
