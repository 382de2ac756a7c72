"""The compiled steps: a training step (gradient accumulation included, its dropout masks a
function of the seed, the rank and the optimizer's step) and an evaluation step."""
import tensorflow as tf

from utils.model import sequence_loss
from utils.optimizers import minimize, scale_loss

# The steps are traced without AutoGraph: their loops and branches (over time steps, layers,
# passes, `training`) run on Python values, so AutoGraph has nothing to convert, and converting
# the model's code cost each process about 1.7 of its ~19 CPU seconds (a tiny 2-epoch run, AMD
# EPYC with AVX2 only: results/stack/ci/autograph-and-threads-ab-avx2.log). A model of your own
# that branches or loops on a tensor's value needs tf.cond / tf.while_loop, or autograph=True
# in these three.


def seed_everything(seed):
    tf.keras.utils.set_random_seed(seed)


def noise_seed(seed, rank, step):
    """The dropout seed of one training step: a function of (--seed, rank, optimizer step) only.
    The step counter is saved in every checkpoint, so a resumed run draws the same masks as
    the uninterrupted one; each rank draws its own masks for its own rows."""
    return tf.random.experimental.stateless_fold_in(
        tf.stack([tf.constant(seed, tf.int64), tf.constant(rank, tf.int64)]),
        tf.cast(step, tf.int64))


def make_train_step(model, optimizer, passes=1, seed=0, rank=0, replicas=1):
    """The compiled train step; `passes` > 1 accumulates gradients over that many slices of the
    batch rows (backward_passes_per_step): the same update, 1/passes of the activations.
    Dropout masks come from noise_seed(seed, rank, optimizer.iterations). `replicas`: an
    optimizer that sums the gradients of that many replicas (tf.distribute's does) gets each
    one's loss divided by it, so that the sum is the global batch's mean gradient."""
    if passes > 1:
        return _make_accumulating_step(model, optimizer, passes, seed, rank, replicas)

    @tf.function(autograph=False)
    def train_step(x, y, state):
        with tf.GradientTape() as tape:
            logits, state = model(x, state, training=True,
                                  noise_seed=noise_seed(seed, rank, optimizer.iterations))
            loss = sequence_loss(logits, y)
            scaled = scale_loss(optimizer, loss / replicas)  # fp16: by the loss scale
        # optimizers.minimize: where Horovod's DistributedOptimizer averages (docs/keras3.md)
        minimize(optimizer, scaled, model.trainable_variables, tape)
        return loss, state
    return train_step


def _make_accumulating_step(model, optimizer, passes, seed, rank, replicas):
    variables = model.trainable_variables

    @tf.function(autograph=False)
    def train_step(x, y, state):
        xs, ys = tf.split(x, passes), tf.split(y, passes)
        states = [tf.nest.map_structure(lambda t: tf.split(t, passes)[k], state)
                  for k in range(passes)]
        step_seed = noise_seed(seed, rank, optimizer.iterations)
        total, grads = 0.0, None
        for k in range(passes):
            with tf.GradientTape() as tape:
                logits, states[k] = model(xs[k], states[k], training=True,
                                          noise_seed=tf.random.experimental.stateless_fold_in(
                                              step_seed, k))
                loss = sequence_loss(logits, ys[k]) / passes
                scaled = scale_loss(optimizer, loss)  # fp16: the summed gradient stays scaled
            g = tape.gradient(scaled, variables)
            grads = g if grads is None else [_add(a, b) for a, b in zip(grads, g)]
            total += loss
        # Hand the summed gradient to minimize() as the gradient of a linear surrogate, so that
        # a wrapped optimizer (Horovod's) averages it over the ranks exactly as it would a
        # loss's gradient, then clips and applies it once.
        with tf.GradientTape() as tape:
            surrogate = tf.add_n([_dot(g, v) for g, v in zip(grads, variables)]) / replicas
        minimize(optimizer, surrogate, variables, tape)
        state = tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *states)
        return total, state
    return train_step


def _add(a, b):
    if isinstance(a, tf.IndexedSlices):
        return tf.IndexedSlices(tf.concat([a.values, b.values], 0),
                                tf.concat([a.indices, b.indices], 0), a.dense_shape)
    return a + b


def _dot(g, v):
    """A scalar whose gradient with respect to v is g (an IndexedSlices stays one)."""
    if isinstance(g, tf.IndexedSlices):
        return tf.reduce_sum(tf.stop_gradient(g.values) * tf.gather(v, g.indices))
    return tf.reduce_sum(tf.stop_gradient(g) * v)


def make_eval_step(model):
    @tf.function(autograph=False)
    def eval_step(x, y, state):
        logits, state = model(x, state, training=False)
        return sequence_loss(logits, y), state
    return eval_step
