"""Run by tests/test_horovod_wrapper.py under mpirun (2 ranks) on the Keras PTB_KERAS selects:
what Horovod's optimizer and tape wrappers do with the gradients they do not simply average.

- Local (worker-local) gradients where the job is elastic (HOROVOD_ELASTIC=1, set here after
  hvd.init: the ranks are mpirun's): the size is then an int32 tensor by which every float
  gradient of a local variable was divided:
    TypeError: `x` and `y` must have the same dtype, got tf.float32 != tf.int32.
  Every weight starts at 1 and rank r's gradient of each is r + 1, so by hand: a shared weight's
  gradient is the ranks' mean, 1.5; a local one's is its own over the ranks' number,
  (r + 1) / 2; one SGD step at learning rate 0.1 leaves 0.85 and 1 - 0.1 * (r + 1) / 2 (0.95,
  0.9). backward_passes_per_step=2 sums two passes first: 3 shared, r + 1 local, so 0.7 and
  0.9, 0.8.
- (Keras 3) backward_passes_per_step=2 around a LossScaleOptimizer whose inner optimizer has
  gradient_accumulation_steps=2.
Writes one JSON file per rank ($PROBE_OUT)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects, before TensorFlow loads
tf = utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402  (which loads the Keras utils selected)
from keras3_probe import report  # noqa: E402 -- tests/; after: its import selects Keras 3
from utils.optimizers import KERAS3  # noqa: E402

keras = tf.keras
LR = 0.1


def weights():
    """A shared and a local weight, both 1 (tf.Variables: both Keras' optimizers take them)."""
    return tf.Variable([[1.0]]), tf.Variable([[1.0]])


def loss_of(shared, local):
    return (hvd.rank() + 1.0) * tf.reduce_sum(shared + local)


def values(*tensors):
    return [round(float(tf.reshape(tf.convert_to_tensor(t), [-1])[0]), 6) for t in tensors]


def tape_gradients(compiled):
    """hvd.DistributedGradientTape with the local weight registered a local source, eagerly or
    in a tf.function: its gradients, (1.5, (r + 1) / 2)."""
    shared, local = weights()

    def gradients():
        with tf.GradientTape() as tape:
            loss = loss_of(shared, local)
        tape = hvd_tf.DistributedGradientTape(tape)
        tape.register_local_source(local)
        return tape.gradient(loss, [shared, local])
    return values(*(tf.function(gradients)() if compiled else gradients()))


def tape_sparse_gradient():
    """A local embedding's gradient (IndexedSlices): its rows, r + 1 each, over the ranks'
    number: (r + 1) / 2."""
    table = tf.Variable(tf.ones([4, 1]))
    with tf.GradientTape() as tape:
        loss = (hvd.rank() + 1.0) * tf.reduce_sum(tf.gather(table, [1, 2]))
    tape = hvd_tf.DistributedGradientTape(tape)
    tape.register_local_source(table)
    grad = tape.gradient(loss, [table])[0]
    return [type(grad).__name__, *values(grad.values)]


def sgd():
    """tf-keras: the legacy SGD, whose Keras 2 path Horovod was made for."""
    return keras.optimizers.SGD(LR) if KERAS3 else keras.optimizers.legacy.SGD(LR)


def step(optimizer, shared, local):
    """One pass: Keras 3's optimizers take the gradients (apply); Keras 2's averages them in
    minimize (its _compute_gradients; apply_gradients takes them as given)."""
    if KERAS3:
        grad = tf.ones([1, 1]) * (hvd.rank() + 1.0)
        optimizer.apply([grad, grad], [shared, local])
    else:
        optimizer.minimize(lambda: loss_of(shared, local), [shared, local])


def optimizer_local(passes=1, optimizer=None):
    """hvd.DistributedOptimizer with the local weight registered: the weights after `passes`
    passes of backward_passes_per_step=passes (with 2, also after the first pass: 1, 1)."""
    shared, local = weights()
    optimizer = hvd.DistributedOptimizer(optimizer or sgd(), backward_passes_per_step=passes)
    optimizer.register_local_var(local)
    seen = []
    for _ in range(passes):
        step(optimizer, shared, local)
        seen += values(shared, local)
    return seen


def accumulation_inside_a_loss_scale_optimizer():
    """Keras 3: backward_passes_per_step=2 around a LossScaleOptimizer whose SGD has
    gradient_accumulation_steps=2: what making it raised; else (unrefused) what two passes
    raised."""
    inner = keras.optimizers.SGD(LR, gradient_accumulation_steps=2)
    try:
        optimizer = hvd.DistributedOptimizer(keras.optimizers.LossScaleOptimizer(inner),
                                             backward_passes_per_step=2)
    except ValueError as e:
        return {"refused": str(e)}
    shared, local = weights()
    try:
        for _ in range(2):
            optimizer.apply([tf.ones([1, 1])] * 2, [shared, local])
    except Exception as e:  # what the step raised
        return {"step": "%s: %s" % (type(e).__name__, str(e).splitlines()[0])}
    return {"step": None}


def main():
    hvd.init()
    os.environ["HOROVOD_ELASTIC"] = "1"  # the size is now size_op's tensor
    out = {"rank": hvd.rank(), "keras": keras.__name__,
           "tape": tape_gradients(False), "tape_function": tape_gradients(True),
           "tape_sparse": tape_sparse_gradient(),
           "optimizer_local": optimizer_local(),
           "passes_local": optimizer_local(passes=2)}
    if KERAS3:
        out["accumulation"] = accumulation_inside_a_loss_scale_optimizer()
    else:  # tf-keras' newer optimizer, through the same Keras 2 path
        out["optimizer_local_new"] = optimizer_local(optimizer=keras.optimizers.SGD(LR))
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
