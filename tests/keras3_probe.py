"""Run by test_keras3.py under mpirun with 2 ranks: Horovod's TensorFlow API on Keras 3 variables
(keras.Variable, which is no tf.Variable), with values each rank can compute by hand. Prints
one JSON line per rank. Keras 3 is TensorFlow's own tf.keras: TF_USE_LEGACY_KERAS is unset
before TensorFlow is imported, and utils is not imported (it would select tf-keras)."""
import json
import os
import sys

os.environ.pop("TF_USE_LEGACY_KERAS", None)
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402


def dense(value):
    """A 1-in 1-out layer without bias whose one weight is `value`."""
    layer = keras.layers.Dense(1, use_bias=False, kernel_initializer=keras.initializers.Constant(value))
    layer.build((None, 1))
    return layer


def tape_gradients(scale_local_gradients=True):
    """loss = (rank + 1) * (w_global + w_local) at x = 1: each weight's gradient on rank r is
    r + 1; averaged over 2 ranks, 1.5. The local weight's is left alone (by default scaled by
    1 / size, as Horovod does for local sources)."""
    shared, local = dense(1.0), dense(1.0)
    x = tf.ones([1, 1])
    with tf.GradientTape() as tape:
        loss = (hvd.rank() + 1) * tf.reduce_sum(shared(x) + local(x))
    tape = hvd.DistributedGradientTape(tape, scale_local_gradients=scale_local_gradients)
    tape.register_local_source(local.kernel)
    grads = tape.gradient(loss, [shared.kernel, local.kernel])
    return [float(tf.reshape(g, [])) for g in grads]


def broadcast(inplace):
    """Each rank starts its weight at 10 * rank + 1; after the broadcast every rank holds rank
    0's, 1, in the same keras.Variable object."""
    layer = dense(10.0 * hvd.rank() + 1)
    before = layer.kernel
    hvd.broadcast_variables(layer.variables, root_rank=0, inplace=inplace)
    return float(tf.reshape(layer.kernel, [])), layer.kernel is before


def distributed_optimizer(wrap, **options):
    """Two weights at 1, SGD at lr 0.1 with global_clipnorm 1: rank 0's gradient (3, 0), rank
    1's (0, 4). Averaged, (1.5, 2), norm 2.5, clipped to (0.6, 0.8): weights (0.94, 0.92) on
    both ranks; each rank clipping its own first would give (0.95, 0.95). Returns the weights,
    the wrapper's class name (the optimizer's own) and its step count."""
    weights = [keras.Variable(1.0), keras.Variable(1.0)]
    optimizer = wrap(keras.optimizers.SGD(learning_rate=0.1, global_clipnorm=1.0), **options)
    grads = [tf.constant(3.0 if hvd.rank() == 0 else 0.0),
             tf.constant(0.0 if hvd.rank() == 0 else 4.0)]
    optimizer.apply_gradients(zip(grads, weights))
    return [round(float(w.numpy()), 6) for w in weights] + [type(optimizer).__name__,
                                                           int(optimizer.iterations.numpy())]


def accumulated():
    """backward_passes_per_step=2, gradient r + 1 at each pass: the first call updates nothing,
    the second applies the ranks' mean of the summed passes, 3: 1 - 0.1 * 3 = 0.7."""
    weight = keras.Variable(1.0)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1),
                                         backward_passes_per_step=2)
    grad = tf.constant(float(hvd.rank() + 1))
    optimizer.apply_gradients([(grad, weight)])
    first = float(weight.numpy())
    optimizer.apply_gradients([(grad, weight)])
    return [first, round(float(weight.numpy()), 6), int(optimizer.iterations.numpy())]


def in_a_function():
    """Two compiled steps of loss (r + 1) * w: each update 0.1 * 1.5, so w = 1 - 0.3 = 0.7."""
    weight = keras.Variable(1.0)
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(learning_rate=0.1))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = (hvd.rank() + 1.0) * weight
        optimizer.apply_gradients(zip(tape.gradient(loss, [weight]), [weight]))
    step()
    step()
    return round(float(weight.numpy()), 6)


def elastic_state():
    """hvd.elastic.TensorFlowKerasState of a Keras 3 model and optimizer: sync takes rank 0's
    weights (1), a restore brings back the last save after a change."""
    import horovod.tensorflow.keras as hvd_keras
    layer = dense(10.0 * hvd.rank() + 1)
    model = keras.Sequential([keras.layers.Input((1,)), layer])
    optimizer = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    optimizer.build(model.trainable_variables)
    state = hvd_keras.elastic.KerasState(model, optimizer, epoch=hvd.rank())
    state.sync()
    synced = [float(tf.reshape(layer.kernel, [])), state.epoch]
    layer.kernel.assign([[5.0]])
    state.restore()
    return synced + [float(tf.reshape(layer.kernel, []))]


def main():
    import horovod.tensorflow.keras as hvd_keras
    hvd.init()
    assert not isinstance(dense(1.0).kernel, tf.Variable), "not Keras 3's variable"
    out = {"rank": hvd.rank(), "keras": keras.__version__,
           "tape": tape_gradients(), "tape_unscaled": tape_gradients(False),
           "broadcast": broadcast(False), "broadcast_inplace": broadcast(True),
           "optimizer": distributed_optimizer(hvd.DistributedOptimizer),
           "keras_optimizer": distributed_optimizer(hvd_keras.DistributedOptimizer),
           "fp16": distributed_optimizer(hvd.DistributedOptimizer,
                                         compression=hvd.Compression.fp16),
           "accumulated": accumulated(), "function": in_a_function(),
           "elastic": elastic_state()}
    report(out)
    return 0


def report(out):
    """This rank's results as a file of its own in $PROBE_OUT (two ranks' lines printed at once
    can run into one line of mpirun's output), else on stdout."""
    folder = os.environ.get("PROBE_OUT")
    if not folder:
        print(json.dumps(out), flush=True)
        return
    with open(os.path.join(folder, f"rank{out['rank']}.json"), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    sys.exit(main())
