"""Run by test_keras3.py under mpirun with 2 ranks: Horovod's public TensorFlow and Keras calls a
copier of the template reaches past its own path, on Keras 3, with values each rank can
compute by hand. Rank r's gradient of every weight is r + 1 (averaged over 2 ranks: 1.5), and
every weight starts at 1, so after one SGD step at learning rate 0.1 an averaged weight is
0.85. Writes one JSON file per rank ($PROBE_OUT); SAVE_TO: where rank 0 saves a model compiled
with Horovod's optimizer."""
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects (this probe: Keras 3)
import numpy as np  # noqa: E402
import horovod.keras as hvd_keras  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from keras3_probe import dense, report  # noqa: E402 -- tests/, the script's own folder

tf = utils.import_tensorflow()
keras = tf.keras


def grads_of(*layers):
    """Rank r's gradient, r + 1, for each layer's one weight."""
    return [tf.ones([1, 1]) * (hvd.rank() + 1) for _ in layers]


def weights(*layers):
    return [round(float(layer.kernel.numpy()[0, 0]), 6) for layer in layers]


# a process set of each rank alone, made at hvd.init(): own_process_set()'s
OWN_SETS = [hvd_tf.ProcessSet([0]), hvd_tf.ProcessSet([1])]


def own_process_set():
    """process_set through both wrappers: each rank in a set of its own averages its gradient
    r + 1 with nobody's, so its weight is 1 - 0.1 * (r + 1) (0.9, 0.8), not the global 0.85."""
    out = []
    for wrapper in (hvd.DistributedOptimizer, hvd_tf.DistributedOptimizer):
        layer = dense(1.0)
        optimizer = wrapper(keras.optimizers.SGD(0.1), process_set=OWN_SETS[hvd.rank()])
        optimizer.apply_gradients(zip(grads_of(layer), [layer.kernel]))
        out += weights(layer)
    return out


def apply_with_an_iterator():
    """apply() given a generator of the variables, as zip() or a comprehension gives them."""
    layer = dense(1.0)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    optimizer.apply(grads_of(layer), (v for v in [layer.kernel]))
    return weights(layer)


def op_and_groups_through_the_tensorflow_wrapper():
    """horovod.tensorflow's DistributedOptimizer of a Keras optimizer, op=Sum and groups kept:
    the sum, 3, not the mean."""
    layer = dense(1.0)
    optimizer = hvd_tf.DistributedOptimizer(keras.optimizers.SGD(0.1), op=hvd_tf.Sum,
                                            groups=[[layer.kernel]])
    optimizer.apply_gradients(zip(grads_of(layer), [layer.kernel]))
    return weights(layer)


def passes_and_keras_accumulation():
    try:
        hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                                 backward_passes_per_step=2)
    except ValueError as e:
        return str(e)
    return None


def local_variable_in_an_elastic_job():
    """register_local_var where HOROVOD_ELASTIC is set (the size is then a tensor): the local
    weight keeps its own gradient over the ranks' number, (r + 1) / 2."""
    shared, local = dense(1.0), dense(1.0)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    optimizer.register_local_var(local.kernel)
    os.environ["HOROVOD_ELASTIC"] = "1"
    try:
        optimizer.apply(grads_of(shared, local), [shared.kernel, local.kernel])
    finally:
        del os.environ["HOROVOD_ELASTIC"]
    return weights(shared, local)


def partial_distributed_optimizer():
    """horovod.keras's PartialDistributedOptimizer, one layer local."""
    shared, local = dense(1.0), dense(1.0)
    optimizer = hvd_keras.PartialDistributedOptimizer(keras.optimizers.SGD(0.1),
                                                      local_layers=[local])
    optimizer.apply_gradients(zip(grads_of(shared, local), [shared.kernel, local.kernel]))
    return weights(shared, local)


def broadcast_with_local_variables():
    """The broadcast callback with one layer's (Keras 3) variables local: model.fit with every
    weight frozen, each starting at its rank's number; root rank 1's values reach rank 0 but for
    the local layer's, which keep each rank's own."""
    start = keras.initializers.Constant(float(hvd.rank()))
    model = keras.Sequential([keras.layers.Input((2,)),
                              keras.layers.Dense(2, kernel_initializer=start,
                                                 bias_initializer=start, trainable=False),
                              keras.layers.Dense(1, kernel_initializer=start,
                                                 bias_initializer=start, trainable=False)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    callback = hvd.callbacks.BroadcastGlobalVariablesCallback(
        root_rank=1, local_variables=list(model.layers[0].variables))
    model.fit(np.ones((2, 2), "float32"), np.ones((2, 1), "float32"), verbose=0,
              callbacks=[callback])
    return [sorted({float(v) for w in layer.get_weights() for v in np.ravel(w)})
            for layer in model.layers]


def warmup_momentum(correction):
    """The warm-up callback over an SGD with momentum: the warnings it gives."""
    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
                  loss="mse")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(np.ones((4, 2), "float32"), np.ones((4, 1), "float32"), batch_size=2,
                  epochs=2, verbose=0, callbacks=[hvd.callbacks.LearningRateWarmupCallback(
                      initial_lr=0.1, warmup_epochs=1, momentum_correction=correction)])
    return [str(w.message) for w in caught if "momentum_correction" in str(w.message)]


def sync_batch_normalization():
    """Rank 0's rows 1 and 3, rank 1's 5 and 7: normalized by the mean (4) and variance (5) of
    all four."""
    layer = hvd_tf.SyncBatchNormalization()
    rows = tf.constant([[1.0], [3.0]]) + 4.0 * hvd.rank()
    return [round(float(v), 5) for v in np.ravel(layer(rows, training=True))]


def sparse_gradients(sparse_as_dense):
    """An Embedding's gradient is IndexedSlices: rank r looks up row r, whose gradient is r + 1
    (loss = (r + 1) * the sum of the row). Averaged over 2 ranks as rows of their own: row 0
    steps by 0.1 * 1 / 2, row 1 by 0.1 * 2 / 2, as one process on both lookups; the same dense."""
    layer = keras.layers.Embedding(2, 1, embeddings_initializer="ones")
    layer.build((None,))
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1),
                                         sparse_as_dense=sparse_as_dense)
    with tf.GradientTape() as tape:
        loss = (hvd.rank() + 1) * tf.reduce_sum(layer(tf.constant([hvd.rank()])))
    grads = tape.gradient(loss, layer.trainable_variables)
    optimizer.apply(grads, layer.trainable_variables)
    return [type(grads[0]).__name__, [round(float(v), 6) for v in np.ravel(layer.embeddings)]]


def fp16_compression():
    """Gradients that float16 cannot hold: 1 + 2^-12 on rank 0, 3 on rank 1 (mean 2 + 2^-13).
    Compressed, the mean is float16's (the 2^-12 is lost): a weight of 0 steps to -2 exactly at
    learning rate 1; uncompressed, to -(2 + 2^-13)."""
    steps = []
    for compression in (hvd.Compression.fp16, hvd.Compression.none):
        layer = dense(0.0)
        optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(1.0), compression=compression)
        grad = tf.constant([[1.0 + 2.0 ** -12 if hvd.rank() == 0 else 3.0]])
        optimizer.apply([grad], [layer.kernel])
        steps.append(float(layer.kernel.numpy()[0, 0]))
    return steps


def elastic_reset_keeps_adam():
    """hvd.elastic's state of a model and Adam: after a commit and one more step, a reset
    brings back the committed weights, Adam's moments and its step count, not zeros."""
    layer = dense(1.0)
    model = keras.Sequential([keras.layers.Input((1,)), layer])
    optimizer = hvd.DistributedOptimizer(keras.optimizers.Adam(0.1))
    state = hvd.elastic.KerasState(model, optimizer)

    def step():
        optimizer.apply(grads_of(layer), [layer.kernel])
    step()
    state.commit()
    committed = [v.numpy().ravel().tolist() for v in optimizer.variables]
    step()
    state.restore()
    restored = [v.numpy().ravel().tolist() for v in optimizer.variables]
    moments = [v for v in committed if v and any(x != 0 for x in v)]
    return [restored == committed, weights(layer), len(moments) >= 2]


def save(path):
    """Rank 0 saves a model compiled with Horovod's optimizer (the test loads it without
    Horovod)."""
    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.1, momentum=0.5)),
                  loss="mse")
    model.fit(np.ones((4, 2), "float32"), np.ones((4, 1), "float32"), batch_size=2, verbose=0)
    if hvd.rank() == 0:
        model.save(path)
    return type(model.optimizer).__module__


def load_model(path):
    """hvd.load_model of the model save() wrote (SGD, momentum 0.5, 2 steps taken): its
    optimizer is Horovod's, with the loaded step count and velocity, and one step of rank r's
    gradient r + 1 moves every rank's weights alike, by the mean: w + 0.5 * v - 0.1 * 1.5; a
    model.fit after it on each rank's own rows leaves the ranks' weights equal."""
    hvd_tf.broadcast(tf.constant(0), 0, name="saved")  # rank 0 has written the file
    model = hvd.load_model(path)
    optimizer = model.optimizer
    kernel = model.layers[0].kernel
    velocity = [v for v in optimizer.variables if v.shape == kernel.shape][0]
    expected = kernel.numpy() + 0.5 * velocity.numpy() - 0.1 * 1.5
    steps = int(optimizer.iterations.numpy())
    optimizer.apply([tf.ones_like(kernel) * (hvd.rank() + 1)], [kernel])
    averaged = bool(np.allclose(kernel.numpy(), expected, rtol=1e-6))
    # and model.fit of the loaded model, each rank on rows of its own: the ranks stay equal
    model.fit(np.full((2, 2), hvd.rank() + 1, "float32"), np.ones((2, 1), "float32"), verbose=0)
    return [hasattr(optimizer, "_hvd_allreduce"), steps, averaged,
            [round(float(w), 6) for w in kernel.numpy().ravel()]]


def passes_in_model_fit():
    """backward_passes_per_step=2 in model.fit, the passes averaged: 2 ranks on 2 rows a batch
    are one process on both ranks' 4 rows with Keras's own gradient_accumulation_steps=2, 4
    batches (2 updates) from the same weight."""
    def rows(rank):
        x = (np.arange(8, dtype="float32").reshape(8, 1) + 1) * (rank + 1) / 10
        return x, np.ones((8, 1), "float32")

    def fitted(optimizer, x, y, batch_size):
        model = keras.Sequential([keras.layers.Input((1,)), dense(1.0)])
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0)
        return float(model.layers[0].kernel.numpy()[0, 0]), int(model.optimizer.iterations)

    def interleaved(rank0, rank1):
        """One process's rows: its batch k is rank 0's batch k of 2 rows, then rank 1's."""
        return np.stack([rank0.reshape(4, 2, 1), rank1.reshape(4, 2, 1)], axis=1).reshape(16, 1)

    ours = fitted(hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=2,
                                           average_aggregated_gradients=True),
                  *rows(hvd.rank()), batch_size=2)
    one = fitted(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                 *map(interleaved, rows(0), rows(1)), batch_size=4)
    return [ours[0] != 1.0, abs(ours[0] - one[0]) <= 1e-6 * abs(one[0]), ours[1], one[1]]


def main():
    hvd.init(process_sets=OWN_SETS)
    report({"rank": hvd.rank(), "keras": keras.__version__,
            "own_process_set": own_process_set(),
            "apply_iterator": apply_with_an_iterator(),
            "op_sum": op_and_groups_through_the_tensorflow_wrapper(),
            "accumulation": passes_and_keras_accumulation(),
            "elastic_local": local_variable_in_an_elastic_job(),
            "partial": partial_distributed_optimizer(),
            "broadcast_local": broadcast_with_local_variables(),
            "warmup": warmup_momentum(True), "warmup_off": warmup_momentum(False),
            "sync_bn": sync_batch_normalization(),
            "sparse": sparse_gradients(False), "sparse_as_dense": sparse_gradients(True),
            "fp16_compression": fp16_compression(),
            "elastic_adam": elastic_reset_keeps_adam(),
            "saved_module": save(os.environ["SAVE_TO"]),
            "load_model": load_model(os.environ["SAVE_TO"]),
            "passes_in_fit": passes_in_model_fit()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
