"""The optimizer of the paper (SGD, clipped by the global norm), its state made up front, and the
update, the same on Keras 3 and on Keras 2 (utils.KERAS says which tf.keras is)."""
import tensorflow as tf

import utils
from utils.errors import ConfigError, TrainingError

KERAS3 = tf.keras.__name__.startswith("keras._tf_keras")  # tf_keras (2.15: keras.api._v2)


def check_keras():
    """One line when tf.keras is not the Keras utils selected: TensorFlow was imported first."""
    wanted3 = utils.KERAS == "3" and tuple(map(int, tf.__version__.split(".")[:2])) >= (2, 16)
    if KERAS3 != wanted3:
        got, wanted = ("Keras 3", "tf-keras") if KERAS3 else ("tf-keras", "Keras 3")
        raise TrainingError(f"tf.keras is {got}, not the {wanted} that PTB_KERAS={utils.KERAS} "
                            "selects: TensorFlow was imported before utils; import utils "
                            "first (and for tf-keras, install requirements-no-deps.txt)")


if KERAS3:
    from tensorflow.python.ops import gen_training_ops  # the fused update tf-keras's SGD used

    class SGD(tf.keras.optimizers.SGD):
        """Keras 3's SGD with tf-keras's kernels. Its global-norm clip multiplies the
        embedding's sparse gradient into a dense [vocab, hidden] one each step, and its update
        multiplies, then subtracts: medium trained at 0.95x tf-keras's words/sec with it, 1.00x
        with this (make bench-against, docs/keras3.md).
        Keras's TF backend already clips by norm with tf.clip_by_norm for sparse gradients; this
        clips by global norm with tf.clip_by_global_norm, and steps a dense weight in one fused
        kernel and a sparse one by its rows, as tf-keras did."""

        def _clip_gradients(self, grads):
            if self.global_clipnorm and not self.clipnorm and not self.clipvalue:
                return tf.clip_by_global_norm(grads, self.global_clipnorm)[0]
            return super()._clip_gradients(grads)

        def update_step(self, gradient, variable, learning_rate):
            if self.momentum:
                return super().update_step(gradient, variable, learning_rate)
            if isinstance(variable, tf.keras.Variable):
                variable = variable.value
            lr = tf.cast(learning_rate, variable.dtype)
            if isinstance(gradient, tf.IndexedSlices):
                return variable.scatter_sub(tf.IndexedSlices(
                    tf.cast(gradient.values, variable.dtype) * lr, gradient.indices,
                    gradient.dense_shape))
            return gen_training_ops.ResourceApplyGradientDescent(
                var=variable.handle, alpha=lr, delta=tf.cast(gradient, variable.dtype))


def make_optimizer(cfg):
    """SGD that clips the gradient by its global norm, then steps. Horovod's DistributedOptimizer
    averages the ranks' gradients before that clip (Keras 2: in minimize(), Keras 3: in apply(),
    scripts/patches/ 11), so the clipped norm is the global batch's gradient's and a distributed
    update equals the single-process one. precision "fp16": inside Keras 3's LossScaleOptimizer,
    which scales the loss (scale_loss) and unscales the gradients, skips a step whose gradients
    overflow and halves its scale; Horovod's optimizer wraps it and averages the scaled
    gradients first, so every rank skips the same steps (patch 15)."""
    check_keras()
    fp16 = cfg.get("precision") == "fp16"  # runs logged before the key trained in fp32
    if fp16 and not KERAS3:
        raise ConfigError("precision='fp16' scales the loss with Keras 3's LossScaleOptimizer; "
                          "train it on Keras 3 (unset PTB_KERAS), or choose precision='bf16' "
                          "or 'fp32' on tf-keras")
    if KERAS3:
        sgd = SGD(learning_rate=cfg["learning_rate"], global_clipnorm=cfg["max_grad_norm"])
        return tf.keras.optimizers.LossScaleOptimizer(sgd) if fp16 else sgd
    return tf.keras.optimizers.legacy.SGD(learning_rate=cfg["learning_rate"],
                                          global_clipnorm=cfg["max_grad_norm"])


def create_slots(optimizer, variables):
    """The optimizer's state (its step counter; momentum, Adam's moments: a slot per weight)
    made now. Keras makes it at the first update, after the ranks' broadcast from rank 0: that
    would leave it out, only the rank that restored a checkpoint would hold the saved state, and
    the ranks would train apart (optimizer_variables refuses to list it before this call). A
    restore fills state made before or after it alike."""
    if KERAS3:
        with optimizer._distribution_strategy.scope():  # tf.distribute: beside their weights
            optimizer.build(variables)
        return
    with optimizer._distribution_strategy_scope():
        optimizer._create_all_weights(variables)


def slots_made(optimizer):
    """Whether the optimizer's state is made (by create_slots, or by an update). Keras 3 says
    so (built); tf-keras keeps no flag, and makes its step counter and hyperparameters with the
    slots (_create_all_weights), which an optimizer that made neither lacks."""
    if KERAS3:
        return optimizer.built
    return optimizer._hypers_created and optimizer._iterations is not None


def optimizer_variables(optimizer):
    """The optimizer's own variables: its step counter and slots (a list on Keras 3, a method's
    result on Keras 2), for the ranks' broadcast of Horovod 4 (tf.distribute 4). Refused in one
    line before create_slots: the list would lack the slots, and the broadcast would skip them
    without a word."""
    if not slots_made(optimizer):
        raise TrainingError("the optimizer's state (its step counter and slots) is not made yet, "
                            "so the broadcast from rank 0 would leave it out and the ranks "
                            "would train apart; call create_slots(optimizer, "
                            "model.trainable_variables) before it, as lm_ptb.py's main does")
    return list(optimizer.variables) if KERAS3 else optimizer.variables()


def scale_loss(optimizer, loss):
    """The loss to differentiate, inside the tape: scaled by a LossScaleOptimizer (fp16),
    the loss itself otherwise (tf-keras: always)."""
    return optimizer.scale_loss(loss) if KERAS3 else loss


def minimize(optimizer, loss, variables, tape):
    """One update from the loss's gradient. On Keras 2 through minimize(tape=): Horovod's
    wrapper averages inside it (its _compute_gradients), which apply_gradients alone skips. On
    Keras 3 through apply_gradients: the patched wrapper averages in apply()."""
    if not KERAS3:
        return optimizer.minimize(loss, variables, tape=tape)
    return optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
