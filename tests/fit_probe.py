"""Run by test_keras3.py, alone or under mpirun: model.fit with Horovod's optimizer wrapper and
callbacks on a linear regression, on the Keras PTB_KERAS selects (Keras 3; PTB_KERAS=2
tf-keras, its legacy optimizers). Each global batch of 16 rows is split among the ranks (rank r
its r-th share), so N ranks take the steps of one process on the whole batch. Prints one JSON
line per rank: the weights, the learning rate of each epoch, the losses, the optimizer's steps.
SEED_BY_RANK=1 starts each rank from other weights (the broadcast callback must even them).
SAVE=PATH (one process): one epoch with Adam, then a checkpoint of the model and the optimizer
at PATH. RESUME=PATH: Adam, rank 0 alone restores PATH (weights, Adam's moments, its step
count), then the epochs; the broadcast callback must bring that state to every rank before the
first update."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects, before TensorFlow loads
tf = utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import numpy as np  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from keras3_probe import report  # noqa: E402 -- tests/, the script's own folder
from utils.optimizers import KERAS3  # noqa: E402

keras = tf.keras
optimizers = keras.optimizers if KERAS3 else keras.optimizers.legacy  # Horovod's Keras 2 path

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
    save, resume = os.environ.get("SAVE"), os.environ.get("RESUME")
    adam = save or resume
    inner = optimizers.Adam(0.1) if adam else optimizers.SGD(learning_rate=0.1)
    model.compile(optimizer=hvd.DistributedOptimizer(inner), loss="mse")
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    if resume and rank == 0:  # restored on rank 0 alone: the optimizer's state when it is built
        checkpoint.restore(resume)
    rates = LearningRates()
    schedule = [] if adam else [hvd.callbacks.LearningRateScheduleCallback(
        initial_lr=0.1, multiplier=lambda epoch: 0.5 ** epoch)]
    history = model.fit(xs, ys, batch_size=BATCH // n, epochs=1 if save else EPOCHS,
                        shuffle=False, verbose=0,
                        callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvd.callbacks.MetricAverageCallback(), *schedule, rates])
    if save:
        checkpoint.write(save)
    weights = np.concatenate([w.ravel() for w in model.get_weights()])
    report({"rank": rank, "weights": [float(w) for w in weights], "lr": rates.seen,
            "loss": [float(v) for v in history.history["loss"]],
            "iterations": int(model.optimizer.iterations.numpy())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
