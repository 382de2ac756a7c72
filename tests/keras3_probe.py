"""Run by test_keras3.py under mpirun with 2 ranks: Horovod's TensorFlow API on the Keras that
PTB_KERAS selects (Keras 3, whose keras.Variable is no tf.Variable; PTB_KERAS=2 tf-keras, with
both its optimizers, the legacy ones and the new), with values each rank can compute by hand.
Writes one JSON file per rank ($PROBE_OUT), or prints it.

Where Horovod averages differs between the two: the patched wrapper of a Keras 3 optimizer in
apply() (apply_gradients, model.fit), Horovod's own wrapper of a Keras 2 one in
compute_gradients (minimize(tape=), model.fit); apply_gradients alone does not average there,
as upstream. So step() takes each rank's gradients to the optimizer the way its Keras does."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects, before TensorFlow loads
tf = utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import numpy as np  # noqa: E402
import horovod.tensorflow as hvd  # noqa: E402
from utils.optimizers import KERAS3  # noqa: E402

keras = tf.keras


@keras.utils.register_keras_serializable("keras3_probe")
class Linear(keras.Model):
    """A subclassed Dense(1), every weight 0: no weights until its first call. Registered, as a
    .keras file names its class (fp16_probe.py and keras3_calls_probe.py save and load it)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(1, kernel_initializer="zeros")

    def call(self, x):
        return self.dense(x)


def broadcast_with_local_variables(hvd_keras):
    """model.fit with `hvd_keras`'s broadcast callback (horovod.tensorflow.keras's or
    horovod.keras's) and one layer's (Keras 3) variables local: every weight frozen, each
    starting at its rank's number; root rank 1's values reach rank 0 but for the local layer's,
    which keep each rank's own."""
    start = keras.initializers.Constant(float(hvd.rank()))
    model = keras.Sequential([keras.layers.Input((2,)),
                              keras.layers.Dense(2, kernel_initializer=start,
                                                 bias_initializer=start, trainable=False),
                              keras.layers.Dense(1, kernel_initializer=start,
                                                 bias_initializer=start, trainable=False)])
    model.compile(optimizer=hvd_keras.DistributedOptimizer(keras.optimizers.SGD(0.1)),
                  loss="mse")
    callback = hvd_keras.callbacks.BroadcastGlobalVariablesCallback(
        root_rank=1, local_variables=list(model.layers[0].variables))
    model.fit(np.ones((2, 2), "float32"), np.ones((2, 1), "float32"), verbose=0,
              callbacks=[callback])
    return [sorted({float(v) for w in layer.get_weights() for v in np.ravel(w)})
            for layer in model.layers]


def keras_name():
    return "Keras " + keras.__version__ if KERAS3 else "tf-keras"


def optimizer_modules():
    """{kind: the module of its optimizer classes}: Keras 3's; tf-keras's new optimizers and its
    legacy ones (Horovod's Keras 2 paths differ: the legacy ones are OptimizerV2s)."""
    if KERAS3:
        return {"keras3": keras.optimizers}
    return {"new": keras.optimizers, "legacy": keras.optimizers.legacy}


def step(optimizer, grads, variables):
    """One update of `variables` by this rank's `grads`, averaged by Horovod where its wrapper
    does on this Keras: Keras 3 in apply_gradients, tf-keras in minimize (the gradients of a
    loss linear in the variables, sum(g * v), are the g given)."""
    variables = list(variables)
    if KERAS3:
        return optimizer.apply_gradients(zip(grads, variables))
    with tf.GradientTape() as tape:
        loss = tf.add_n([tf.reduce_sum(tf.cast(g, v.dtype) * v) for g, v in zip(grads, variables)])
    return optimizer.minimize(loss, variables, tape=tape)  # tf-keras: averaged in here


def dense(value):
    """A 1-in 1-out layer without bias whose one weight is `value`."""
    layer = keras.layers.Dense(1, use_bias=False,
                               kernel_initializer=keras.initializers.Constant(value))
    layer.build((None, 1))
    return layer


class Regression(keras.Model):
    """A subclassed model: its weights are made by its first call or build(), not by the
    constructor, and Keras 3 names them by the model alone ('regression/kernel')."""

    def __init__(self, value=None, **kwargs):
        super().__init__(**kwargs)
        start = keras.initializers.Constant(value) if value is not None else "glorot_uniform"
        self.value = value
        self.hidden = keras.layers.Dense(2, kernel_initializer=start, bias_initializer="zeros")
        self.out = keras.layers.Dense(1, kernel_initializer=start, bias_initializer="zeros")

    def call(self, x):
        return self.out(self.hidden(x))

    def get_config(self):
        return dict(super().get_config(), value=self.value)


def models(inputs, value=None):
    """{kind: a built model of `inputs` features}: functional and subclassed, both of a hidden
    Dense(2) and an output Dense(1); every kernel weight `value` (else drawn), biases 0."""
    start = keras.initializers.Constant(value) if value is not None else "glorot_uniform"
    x = keras.Input((inputs,))
    hidden = keras.layers.Dense(2, kernel_initializer=start, bias_initializer="zeros")(x)
    functional = keras.Model(x, keras.layers.Dense(1, kernel_initializer=start,
                                                   bias_initializer="zeros")(hidden))
    subclassed = Regression(value)
    subclassed(tf.zeros((1, inputs)))  # built by a call (Keras 3's build(shape) makes no layer)
    return {"functional": functional, "subclassed": subclassed}


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
    0's, 1, in the same variable object."""
    layer = dense(10.0 * hvd.rank() + 1)
    before = layer.kernel
    hvd.broadcast_variables(layer.variables, root_rank=0, inplace=inplace)
    return float(tf.reshape(layer.kernel, [])), layer.kernel is before


def distributed_optimizer(module, wrap, **options):
    """Two weights at 1, SGD at lr 0.1 with global_clipnorm 1: rank 0's gradient (3, 0), rank
    1's (0, 4). Averaged, (1.5, 2), norm 2.5, clipped to (0.6, 0.8): weights (0.94, 0.92) on
    both ranks; each rank clipping its own first would give (0.95, 0.95). Returns the weights,
    the wrapper's class name (the optimizer's own) and its step count."""
    weights = [dense(1.0).kernel, dense(1.0).kernel]
    optimizer = wrap(module.SGD(learning_rate=0.1, global_clipnorm=1.0), **options)
    grads = [tf.constant([[3.0 if hvd.rank() == 0 else 0.0]]),
             tf.constant([[0.0 if hvd.rank() == 0 else 4.0]])]
    step(optimizer, grads, weights)
    return [round(float(w.numpy()[0, 0]), 6) for w in weights] + [
        type(optimizer).__name__, int(optimizer.iterations.numpy())]


def accumulated(module):
    """backward_passes_per_step=2, gradient r + 1 at each pass: the first call updates nothing,
    the second applies the ranks' mean of the summed passes, 3: 1 - 0.1 * 3 = 0.7; both calls
    count as steps."""
    weight = dense(1.0).kernel
    optimizer = hvd.DistributedOptimizer(module.SGD(learning_rate=0.1),
                                         backward_passes_per_step=2)
    grad = tf.constant([[float(hvd.rank() + 1)]])
    step(optimizer, [grad], [weight])
    first = float(weight.numpy()[0, 0])
    step(optimizer, [grad], [weight])
    return [first, round(float(weight.numpy()[0, 0]), 6), int(optimizer.iterations.numpy())]


def in_a_function(module):
    """Two compiled steps of gradient r + 1: each update 0.1 * 1.5, so w = 1 - 0.3 = 0.7."""
    weight = dense(1.0).kernel
    optimizer = hvd.DistributedOptimizer(module.SGD(learning_rate=0.1))

    @tf.function
    def compiled():
        step(optimizer, [tf.fill([1, 1], hvd.rank() + 1.0)], [weight])
    compiled()
    compiled()
    return round(float(weight.numpy()[0, 0]), 6)


def build_optimizer(optimizer, variables):
    """The optimizer's variables made now: Keras 3's and tf-keras's new optimizers build(), the
    legacy ones make their slots."""
    if hasattr(optimizer, "_create_all_weights"):
        optimizer._create_all_weights(variables)
    else:
        optimizer.build(variables)


def elastic_state(kind, module):
    """hvd.elastic.KerasState of a model and an SGD with momentum, each rank's model started
    apart (every kernel weight 10 * rank + 1): sync() takes rank 0's weights (1) and epoch (0),
    and restore() brings back what the sync saved after a change (to 5)."""
    import horovod.tensorflow.keras as hvd_keras
    model = models(1, value=10.0 * hvd.rank() + 1)[kind]
    optimizer = module.SGD(learning_rate=0.1, momentum=0.9)
    build_optimizer(optimizer, model.trainable_variables)
    state = hvd_keras.elastic.KerasState(model, optimizer, epoch=hvd.rank())
    state.sync()
    synced = sorted({float(v) for w in model.get_weights() for v in np.ravel(w) if v})
    for layer_weights in model.trainable_variables:
        layer_weights.assign(tf.fill(layer_weights.shape, 5.0))
    state.restore()
    restored = sorted({float(v) for w in model.get_weights() for v in np.ravel(w) if v})
    return [synced, state.epoch, restored]


def main():
    import horovod.tensorflow.keras as hvd_keras
    hvd.init()
    out = {"rank": hvd.rank(), "keras": keras_name(),
           "keras3_variable": not isinstance(dense(1.0).kernel, tf.Variable),
           "tape": tape_gradients(), "tape_unscaled": tape_gradients(False),
           "broadcast": broadcast(False), "broadcast_inplace": broadcast(True)}
    for kind, module in optimizer_modules().items():
        out[kind] = {
            "optimizer": distributed_optimizer(module, hvd.DistributedOptimizer),
            "keras_optimizer": distributed_optimizer(module, hvd_keras.DistributedOptimizer),
            "fp16": distributed_optimizer(module, hvd.DistributedOptimizer,
                                          compression=hvd.Compression.fp16),
            "accumulated": accumulated(module), "function": in_a_function(module),
            "elastic": {model: elastic_state(model, module)
                        for model in ("functional", "subclassed")}}
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
