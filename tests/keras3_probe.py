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


def main():
    hvd.init()
    assert not isinstance(dense(1.0).kernel, tf.Variable), "not Keras 3's variable"
    out = {"rank": hvd.rank(), "keras": keras.__version__,
           "tape": tape_gradients(), "tape_unscaled": tape_gradients(False),
           "broadcast": broadcast(False), "broadcast_inplace": broadcast(True)}
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
