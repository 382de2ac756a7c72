"""A Keras 3 model.fit on 2 ranks with Horovod's wheel alone, as another project would write it:
scripts/horovod_wheel_check.py copies this file into an empty folder and runs it there under
mpirun, by a fresh venv holding TensorFlow and the wheel; it imports nothing of this repository.

Each rank builds the model from weights of its own (seeded by its rank: the ranks start apart)
and fits its half of every global batch of 8 rows, with hvd.DistributedOptimizer and
hvd.callbacks.BroadcastGlobalVariablesCallback(0). Then the ranks' final weights must be equal,
and equal (within 1e-5) to one process's plain-Keras fit of the whole batches from rank 0's
first weights, computed here first, without Horovod. Rank 0 prints one JSON line."""
import json
import sys

try:
    import numpy as np
except ImportError:  # not in the venv scripts/horovod_wheel_check.py makes
    sys.exit("error: this Python has no numpy: scripts/horovod_wheel_check.py runs this file in "
             "the venv it makes (make horovod-wheel-check)")

ROWS = 32
GLOBAL_BATCH = 8  # per step: rank 0's 4 rows and rank 1's 4
EPOCHS = 3
TOLERANCE = 1e-5  # float32: the ranks' averaged half-batch gradients against one whole batch


def toy_data():
    """32 rows of 3 features and a target that a small tanh layer fits only in part."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(ROWS, 3)).astype(np.float32)
    y = np.tanh(x @ np.array([[0.5], [-1.0], [2.0]], np.float32)) + 0.3
    return x, y.astype(np.float32)


def rank_half(array, rank, ranks):
    """The rows this rank takes of each global batch: rank r's are its r-th quarter of 8."""
    per_rank = GLOBAL_BATCH // ranks
    batches = array.reshape(ROWS // GLOBAL_BATCH, ranks, per_rank, *array.shape[1:])
    return batches[:, rank].reshape(-1, *array.shape[1:])


def build_model(keras, seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"),
                             keras.layers.Dense(1)])


def flat(weights):
    return np.concatenate([w.ravel() for w in weights])


def one_process_fit(keras, x, y):
    """The expected weights: plain Keras, one process, the whole global batches, from the
    first weights rank 0 draws (seed 0)."""
    model = build_model(keras, seed=0)
    first = flat(model.get_weights())
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
    return first, flat(model.get_weights())


def main():
    import tensorflow as tf
    import keras
    import horovod
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rank, ranks = hvd.rank(), hvd.size()
    assert ranks == 2, f"run this under mpirun -np 2, not {ranks} rank(s)"
    assert keras.__version__.startswith("3."), f"Keras {keras.__version__}, not Keras 3"
    x, y = toy_data()
    expected_first, expected = one_process_fit(keras, x, y)

    model = build_model(keras, seed=rank)
    first = flat(model.get_weights())
    # rank 0 draws what one process drew; rank 1 starts elsewhere, so the broadcast must act
    assert np.array_equal(first, expected_first) == (rank == 0), f"rank {rank}'s first weights"
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(rank_half(x, rank, ranks), rank_half(y, rank, ranks),
              batch_size=GLOBAL_BATCH // ranks, epochs=EPOCHS, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])

    final = flat(model.get_weights())
    every_rank = hvd_tf.allgather(tf.constant(final[None])).numpy()
    assert np.array_equal(every_rank[0], every_rank[1]), \
        f"the ranks' final weights differ by {np.abs(every_rank[0] - every_rank[1]).max():.3g}"
    off = float(np.abs(final - expected).max())
    moved = float(np.abs(expected - expected_first).max())
    assert off <= TOLERANCE, f"the ranks' weights are {off:.3g} off one process's fit"
    if rank == 0:
        print(json.dumps({"ranks": ranks, "python": sys.version.split()[0],
                          "tensorflow": tf.__version__, "keras": keras.__version__,
                          "horovod": horovod.__version__, "horovod_from": horovod.__file__,
                          "steps": EPOCHS * ROWS // GLOBAL_BATCH, "weights_moved": moved,
                          "off_one_process": off, "sys_path": sys.path}))


if __name__ == "__main__":
    main()
