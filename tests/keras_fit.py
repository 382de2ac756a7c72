"""The Horovod steps in Keras' model.fit form (docs/keras-fit.md), run by tests/test_keras_fit.py
under mpirun: `mpirun -np 2 python tests/keras_fit.py OUT_DIR`. A small regression model on
data each rank shards by itself, with Horovod's four callbacks; each rank writes what it saw to
OUT_DIR/rankN.json, and rank 0 alone saves the weights each epoch."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: it selects the Keras (Keras 3 unless PTB_KERAS=2)
utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from utils.optimizers import KERAS3  # noqa: E402

BATCH, STEPS_PER_EPOCH, EPOCHS, WARMUP_EPOCHS, LR = 8, 4, 6, 2, 0.05


class RecordLearningRate(tf.keras.callbacks.Callback):
    """The learning rate each batch trains with (after the warm-up callback has set it)."""

    def __init__(self):
        super().__init__()
        self.rates = []

    def on_train_batch_begin(self, batch, logs=None):
        self.rates.append(float(np.array(self.model.optimizer.learning_rate)))


def main(out_dir):
    hvd.init()  # 1
    tf.keras.utils.set_random_seed(100 + hvd.rank())  # each rank its own first weights: 4 aligns
    rng = np.random.RandomState(0)  # the same data everywhere; each rank takes its rows (5)
    x = rng.normal(size=(hvd.size() * BATCH * STEPS_PER_EPOCH, 4)).astype("float32")
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], "float32") + 0.1).astype("float32")
    x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]
    model = tf.keras.Sequential([tf.keras.Input(shape=(4,)),
                                 tf.keras.layers.Dense(8, activation="tanh"),
                                 tf.keras.layers.Dense(1)])
    sgd = tf.keras.optimizers.SGD if KERAS3 else tf.keras.optimizers.legacy.SGD
    optimizer = hvd.DistributedOptimizer(  # 3: the gradients averaged over the ranks
        sgd(learning_rate=LR, momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse")
    record = RecordLearningRate()
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # 4: rank 0's weights to all
        hvd.callbacks.MetricAverageCallback(),  # 8: the epoch's loss averaged over the ranks
        hvd.callbacks.LearningRateWarmupCallback(  # LR / size up to LR over WARMUP_EPOCHS
            initial_lr=LR, warmup_epochs=WARMUP_EPOCHS, steps_per_epoch=STEPS_PER_EPOCH),
        record,
    ]
    if hvd.rank() == 0:  # 8: rank 0 alone writes
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(
            os.path.join(out_dir, "weights-{epoch}.weights.h5"), save_weights_only=True))
    history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, callbacks=callbacks,
                        shuffle=False, verbose=0)
    with open(os.path.join(out_dir, f"rank{hvd.rank()}.json"), "w") as f:
        json.dump({"size": hvd.size(), "rates": record.rates, "loss": [float(v) for v in history.history["loss"]],
                   "weights": [w.tolist() for w in model.get_weights()]}, f)


if __name__ == "__main__":
    main(sys.argv[1])
