"""Run by test_keras3.py under mpirun with 2 ranks: Horovod's public TensorFlow and Keras calls a
copier of the template reaches past its own path, on the Keras PTB_KERAS selects (Keras 3;
PTB_KERAS=2 tf-keras and its legacy optimizers, the trainers' there, unless a call says), with
values each rank can compute by hand. Rank r's gradient of every weight is r + 1 (averaged over
2 ranks: 1.5), and every weight starts at 1, so after one SGD step at learning rate 0.1 an
averaged weight is 0.85. Writes one JSON file per rank ($PROBE_OUT); SAVE_TO: a folder where
rank 0 saves the models it compiled with Horovod's optimizer. The calls of patches 19-24 are
tried on Keras 3 alone here."""
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects
tf = utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import numpy as np  # noqa: E402
import horovod.keras as hvd_keras  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from keras3_probe import (KERAS3, Linear, broadcast_with_local_variables,  # noqa: E402 -- tests/
                          dense, keras_name, models, optimizer_modules, report, step)

keras = tf.keras
# the optimizers of the calls tried with one kind: Keras 3's; tf-keras's legacy ones, which
# the trainers use there (elastic_adam and load_model try both of tf-keras's)
OPTIMIZERS = keras.optimizers if KERAS3 else keras.optimizers.legacy


def grads_of(*layers):
    """Rank r's gradient, r + 1, for each layer's one weight."""
    return [tf.ones([1, 1]) * (hvd.rank() + 1) for _ in layers]


def weights(*layers):
    return [round(float(layer.kernel.numpy()[0, 0]), 6) for layer in layers]


def values(variables):
    """Every value of `variables`, flattened, rounded to 6 decimals."""
    return [round(float(v), 6) for var in variables for v in np.ravel(var.numpy())]


def is_horovods(optimizer):
    """Horovod's wrapper: the Keras 3 one (patch 11) or Keras 2's own."""
    return hasattr(optimizer, "_hvd_allreduce") or hasattr(optimizer, "_allreduce_grads")


def optimizer_variables(optimizer):
    return list(optimizer.variables) if KERAS3 else optimizer.variables()


# a process set of each rank alone, made at hvd.init(): own_process_set()'s
OWN_SETS = [hvd_tf.ProcessSet([0]), hvd_tf.ProcessSet([1])]


def own_process_set():
    """process_set through both wrappers: each rank in a set of its own averages its gradient
    r + 1 with nobody's, so its weight is 1 - 0.1 * (r + 1) (0.9, 0.8), not the global 0.85."""
    out = []
    for wrapper in (hvd.DistributedOptimizer, hvd_tf.DistributedOptimizer):
        layer = dense(1.0)
        optimizer = wrapper(OPTIMIZERS.SGD(0.1), process_set=OWN_SETS[hvd.rank()])
        step(optimizer, grads_of(layer), [layer.kernel])
        out += weights(layer)
    return out


def apply_with_an_iterator():
    """apply() given a generator of the variables, as zip() or a comprehension gives them
    (Keras 3's apply(); Keras 2's optimizers have none)."""
    layer = dense(1.0)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1))
    optimizer.apply(grads_of(layer), (v for v in [layer.kernel]))
    return weights(layer)


def horovod_ops(function):
    """How many of Horovod's allreduce ops of each kind the traced `function` holds, in its
    graph and in the functions it calls (Horovod's own subgraphs, tf.cond's branches)."""
    graph = function.get_concrete_function().graph.as_graph_def()
    ops = [node.op for node in graph.node] + [
        node.op for f in graph.library.function for node in f.node_def]
    return {kind: ops.count(kind) for kind in ("HorovodAllreduce", "HorovodGroupedAllreduce")}


def op_and_groups_through_the_tensorflow_wrapper():
    """horovod.tensorflow's DistributedOptimizer of a Keras optimizer with op=Sum and groups, a
    subclassed model's (every kernel weight 1, biases 0), in a tf.function. op kept: each weight
    steps by the sum of the ranks' gradients, 3, not their mean (kernels to 0.7, biases to
    -0.3). groups kept: Horovod allreduces a group in one grouped op and makes a group of each
    variable in none: the two kernels in one HorovodGroupedAllreduce, each bias in one of its
    own, 3 in all and no plain HorovodAllreduce (dropped, groups would leave 4 of those). The
    model's variables share names on Keras 3 ('regression/kernel:0' twice): groups matched by
    name gave the first layer's gradients to nobody (patch 29)."""
    model = models(1, value=1.0)["subclassed"]
    optimizer = hvd_tf.DistributedOptimizer(
        OPTIMIZERS.SGD(0.1), op=hvd_tf.Sum,
        groups=[[model.hidden.kernel, model.out.kernel]])

    @tf.function
    def update():
        step(optimizer, [tf.fill(v.shape, hvd.rank() + 1.0) for v in model.trainable_variables],
             model.trainable_variables)
    update()
    return [values(model.trainable_variables), horovod_ops(update)]


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
    optimizer = hvd_keras.PartialDistributedOptimizer(OPTIMIZERS.SGD(0.1), local_layers=[local])
    step(optimizer, grads_of(shared, local), [shared.kernel, local.kernel])
    return weights(shared, local)


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
    optimizer = hvd.DistributedOptimizer(OPTIMIZERS.SGD(0.1), sparse_as_dense=sparse_as_dense)
    with tf.GradientTape(persistent=True) as tape:
        loss = (hvd.rank() + 1) * tf.reduce_sum(layer(tf.constant([hvd.rank()])))
    grads = tape.gradient(loss, layer.trainable_variables)
    if KERAS3:
        optimizer.apply(grads, layer.trainable_variables)
    else:  # Keras 2: averaged in minimize(), from the tape
        optimizer.minimize(loss, layer.trainable_variables, tape=tape)
    return [type(grads[0]).__name__, [round(float(v), 6) for v in np.ravel(layer.embeddings)]]


def fp16_compression():
    """Gradients that float16 cannot hold: 1 + 2^-12 on rank 0, 3 on rank 1 (mean 2 + 2^-13).
    Compressed, the mean is float16's (the 2^-12 is lost): a weight of 0 steps to -2 exactly at
    learning rate 1; uncompressed, to -(2 + 2^-13)."""
    steps = []
    for compression in (hvd.Compression.fp16, hvd.Compression.none):
        layer = dense(0.0)
        optimizer = hvd.DistributedOptimizer(OPTIMIZERS.SGD(1.0), compression=compression)
        grad = tf.constant([[1.0 + 2.0 ** -12 if hvd.rank() == 0 else 3.0]])
        step(optimizer, [grad], [layer.kernel])
        steps.append(float(layer.kernel.numpy()[0, 0]))
    return steps


def elastic_reset_keeps_adam(module):
    """hvd.elastic's state of a model and Adam: one step (gradient r + 1, averaged 1.5) and a
    commit; one more step, then a reset: the optimizer's variables (its step count and non-zero
    moments) are the committed ones, and the weight is where the first step put it (its value
    to float64's precision: the test derives it by hand from Adam's update)."""
    layer = dense(1.0)
    model = keras.Sequential([keras.layers.Input((1,)), layer])
    optimizer = hvd.DistributedOptimizer(module.Adam(0.1))
    state = hvd.elastic.KerasState(model, optimizer)
    step(optimizer, grads_of(layer), [layer.kernel])
    state.commit()
    committed = [v.numpy().ravel().tolist() for v in optimizer_variables(optimizer)]
    step(optimizer, grads_of(layer), [layer.kernel])
    state.restore()
    restored = [v.numpy().ravel().tolist() for v in optimizer_variables(optimizer)]
    moments = [v for v in committed if v and any(x != 0 for x in v)]
    return [restored == committed, float(layer.kernel.numpy()[0, 0]), len(moments) >= 2]


def regression(kind):
    """A model of one Dense(1) on 2 features, every weight 0 (by hand below): the functional
    one, or a subclassed one registered for saving (a .keras file names its class)."""
    if kind == "subclassed":
        return Linear()
    x = keras.Input((2,))
    return keras.Model(x, keras.layers.Dense(1, kernel_initializer="zeros")(x))


def save(folder):
    """Rank 0 saves models compiled with Horovod's SGD (momentum 0.5) after a model.fit of 2
    steps on rows of ones, target 1, every weight from 0: each weight steps by 0.2 (its gradient
    is 2 * (prediction - 1) = -2, the velocity 0.2), then by 0.18 (prediction 0.6, gradient
    -0.8, velocity 0.5 * 0.2 + 0.08): each weight 0.38, its velocity 0.18, 2 steps. Which
    models: on Keras 3 a Sequential one (loaded without Horovod by the test) and each kind in
    .keras files; on tf-keras each kind in .keras files with its new optimizers (those files
    keep no legacy optimizer's state) and the functional one in HDF5 with either optimizer
    (tf-keras writes no subclassed model to HDF5). {name: [path, Horovod's SGD's module]}."""
    if KERAS3:
        files = [("sequential", "keras3", "keras"), ("functional", "keras3", "keras"),
                 ("subclassed", "keras3", "keras")]
    else:
        files = [("functional", "new", "keras"), ("subclassed", "new", "keras"),
                 ("functional", "new", "h5"), ("functional", "legacy", "h5")]
    saved = {}
    for kind, optimizers, suffix in files:
        module = optimizer_modules()[optimizers]
        model = (keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(
            1, kernel_initializer="zeros")]) if kind == "sequential" else regression(kind))
        model.compile(optimizer=hvd.DistributedOptimizer(module.SGD(0.1, momentum=0.5)),
                      loss="mse")
        model.fit(np.ones((4, 2), "float32"), np.ones((4, 1), "float32"), batch_size=2,
                  verbose=0)
        path = os.path.join(folder, f"{kind}-{optimizers}.{suffix}")
        if hvd.rank() == 0:
            model.save(path)
        saved[f"{kind}-{optimizers}-{suffix}"] = [path, type(model.optimizer).__module__]
    hvd_tf.broadcast(tf.constant(0), 0, name="saved")  # no rank loads before rank 0 has saved
    return saved


def load_model(path, legacy):
    """hvd.load_model of a model save() wrote: its optimizer is Horovod's, with the saved step
    count (2) and velocity (0.18 for each weight), and one step of rank r's gradient r + 1 moves
    every weight by the mean: 0.38 + 0.5 * 0.18 - 0.1 * 1.5 = 0.32; a model.fit after it on each
    rank's own rows leaves the ranks' weights equal (the test compares them)."""
    model = hvd.load_model(path, **({"legacy_opts": True} if legacy else {}))
    optimizer = model.optimizer
    steps = int(optimizer.iterations.numpy())
    shapes = {tuple(v.shape) for v in model.trainable_variables}
    velocity = [v for v in optimizer_variables(optimizer) if tuple(v.shape) in shapes]
    loaded = [is_horovods(optimizer), steps, values(velocity), values(model.trainable_variables)]
    step(optimizer, [tf.fill(v.shape, hvd.rank() + 1.0) for v in model.trainable_variables],
         model.trainable_variables)
    stepped = values(model.trainable_variables)
    model.fit(np.full((2, 2), hvd.rank() + 1, "float32"), np.ones((2, 1), "float32"), verbose=0)
    return loaded + [stepped, values(model.trainable_variables)]


def passes_in_model_fit():
    """backward_passes_per_step=2 in model.fit, the passes averaged: 2 ranks on 2 rows a batch,
    4 batches (2 updates) from the same weight, are one process taking each update on the 8
    rows of both ranks' two batches: on Keras 3 its own gradient_accumulation_steps=2 on
    batches of 4, on tf-keras (which has none) batches of 8."""
    def rows(rank):
        x = (np.arange(8, dtype="float32").reshape(8, 1) + 1) * (rank + 1) / 10
        return x, np.ones((8, 1), "float32")

    def fitted(optimizer, x, y, batch_size):
        model = keras.Sequential([keras.layers.Input((1,)), dense(1.0)])
        model.compile(optimizer=optimizer, loss="mse")
        model.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0)
        return float(model.layers[0].kernel.numpy()[0, 0]), int(model.optimizer.iterations)

    def interleaved(rank0, rank1, rows_each):
        """One process's rows: its batch k holds rank 0's rows of it, then rank 1's."""
        return np.stack([rank0.reshape(-1, rows_each, 1), rank1.reshape(-1, rows_each, 1)],
                        axis=1).reshape(16, 1)

    ours = fitted(hvd.DistributedOptimizer(OPTIMIZERS.SGD(0.1), backward_passes_per_step=2,
                                           average_aggregated_gradients=True),
                  *rows(hvd.rank()), batch_size=2)
    if KERAS3:
        one = fitted(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2),
                     *(interleaved(a, b, 2) for a, b in zip(rows(0), rows(1))), batch_size=4)
    else:
        one = fitted(OPTIMIZERS.SGD(0.1),
                     *(interleaved(a, b, 4) for a, b in zip(rows(0), rows(1))), batch_size=8)
    return [ours[0] != 1.0, abs(ours[0] - one[0]) <= 1e-6 * abs(one[0]), ours[1], one[1]]


def main():
    hvd.init(process_sets=OWN_SETS)
    out = {"rank": hvd.rank(), "keras": keras_name(),
           "own_process_set": own_process_set(),
           "op_and_groups": op_and_groups_through_the_tensorflow_wrapper(),
           "partial": partial_distributed_optimizer(),
           "sparse": sparse_gradients(False), "sparse_as_dense": sparse_gradients(True),
           "fp16_compression": fp16_compression(),
           "elastic_adam": {kind: elastic_reset_keeps_adam(module)
                            for kind, module in optimizer_modules().items()},
           "passes_in_fit": passes_in_model_fit()}
    saved = save(os.environ["SAVE_TO"])
    out["saved_module"] = {name: module for name, (_, module) in saved.items()}
    out["load_model"] = {name: load_model(path, legacy="-legacy-" in name)
                         for name, (path, _) in saved.items() if not name.startswith("seq")}
    if KERAS3:  # Keras 3's alone here: apply(), gradient_accumulation_steps; patches 20-23
        out.update({"apply_iterator": apply_with_an_iterator(),
                    "accumulation": passes_and_keras_accumulation(),
                    "elastic_local": local_variable_in_an_elastic_job(),
                    "broadcast_local": broadcast_with_local_variables(hvd),
                    "warmup": warmup_momentum(True), "warmup_off": warmup_momentum(False),
                    "sync_bn": sync_batch_normalization()})
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
