"""Training and evaluation: LR schedule, optimizer, compiled steps, epoch loop, perplexity."""
import math
import os
import time

from data import ptb
from utils import import_tensorflow
from utils.cli import signals_deferred
from utils.config import ConfigError
from utils.model import sequence_loss

tf = import_tensorflow()


class TrainingError(Exception):
    """Training cannot go on (NaN loss, say); the message names where and what to do."""


def learning_rate(cfg, epoch, workers=1):
    """The paper's schedule: constant for max_epoch epochs, then decayed each epoch (epoch from 0).
    With scale_lr, times the number of workers."""
    scale = workers if cfg["scale_lr"] else 1
    return scale * cfg["learning_rate"] * cfg["lr_decay"] ** max(epoch + 1 - cfg["max_epoch"], 0)


def make_optimizer(cfg):
    # Legacy Keras SGD clips by global norm in apply_gradients. Horovod's DistributedOptimizer
    # averages the gradients before that, in _compute_gradients, which minimize() calls (see
    # make_train_step), so the clipped norm is that of the global batch's gradient and a
    # distributed update equals the single-process update.
    if tf.keras.__name__.startswith("keras._tf_keras"):  # Keras 3 (2.15: keras.api._v2)
        raise TrainingError("tf.keras is Keras 3: TensorFlow was imported before utils, which "
                            "selects Keras 2 (TF_USE_LEGACY_KERAS=1), or tf-keras is not "
                            "installed; import utils first, and install requirements-no-deps.txt")
    return tf.keras.optimizers.legacy.SGD(learning_rate=cfg["learning_rate"],
                                          global_clipnorm=cfg["max_grad_norm"])


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # the CPU flags of bf16 matmul units (Linux names)


def bf16_units(cpuinfo=None):
    """Which of BF16_FLAGS the CPU has, from /proc/cpuinfo's text (read if not given); [] where
    it cannot be read."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return []
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return [flag for flag in BF16_FLAGS if flag in flags]


def precision_note(cfg, cpuinfo=None, gpus=None):
    """One line for a bf16 run on a CPU without bf16 units, where oneDNN falls back to slow
    kernels; None otherwise (GPUs: docs/gpu.md)."""
    if cfg["precision"] != "bf16":
        return None
    if gpus is None:
        gpus = tf.config.list_logical_devices("GPU")
    if gpus or bf16_units(cpuinfo):
        return None
    return ("note: precision='bf16' on a CPU without bf16 units (neither avx512_bf16 nor "
            "amx_bf16 in /proc/cpuinfo): TensorFlow emulates bfloat16 here, so "
            "precision='fp32' trains faster")


def create_slots(optimizer, variables):
    """The optimizer's state (momentum, Adam's moments: a slot per weight) made now. Legacy Keras
    makes it at the first update, after a checkpoint's restore and the ranks' broadcast: then
    only the restoring rank would hold the saved state, and the ranks would train apart."""
    with optimizer._distribution_strategy_scope():  # tf.distribute: slots beside their weights
        optimizer._create_all_weights(variables)


def available_cores():
    return len(os.sched_getaffinity(0))


def set_threads(intra_op):
    """Cap TensorFlow's thread pools. They are fixed once TensorFlow has run an op, so when
    main() is called from a process that already ran TensorFlow (a test), they stay as they are."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(intra_op)
    except RuntimeError:
        pass


def seed_everything(seed):
    tf.keras.utils.set_random_seed(seed)


def noise_seed(seed, rank, step):
    """The dropout seed of one training step: a function of (--seed, rank, optimizer step) only.
    The step counter is saved in every checkpoint, so a resumed run draws the same masks as
    the uninterrupted one; each rank draws its own masks for its own rows."""
    return tf.random.experimental.stateless_fold_in(
        tf.stack([tf.constant(seed, tf.int64), tf.constant(rank, tf.int64)]),
        tf.cast(step, tf.int64))


# The steps are traced without AutoGraph: their loops and branches (over time steps, layers,
# passes, `training`) run on Python values, so AutoGraph has nothing to convert, and converting
# the model's code cost each process about 1.7 of its ~19 CPU seconds (a tiny 2-epoch run, AMD
# EPYC with AVX2 only: results/stack/ci/autograph-and-threads-ab-avx2.log). A model of your own
# that branches or loops on a tensor's value needs tf.cond / tf.while_loop, or autograph=True
# in these three.


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
            scaled = loss / replicas
        # minimize(tape=...) rather than tape.gradient + apply_gradients: Horovod's Keras
        # DistributedOptimizer allreduces inside _compute_gradients, which minimize calls and
        # apply_gradients alone never does (it would silently train each rank on its own).
        optimizer.minimize(scaled, model.trainable_variables, tape=tape)
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
            g = tape.gradient(loss, variables)
            grads = g if grads is None else [_add(a, b) for a, b in zip(grads, g)]
            total += loss
        # Hand the summed gradient to minimize() as the gradient of a linear surrogate, so that
        # a wrapped optimizer (Horovod's) averages it over the ranks exactly as it would a
        # loss's gradient, then clips and applies it once.
        with tf.GradientTape() as tape:
            surrogate = tf.add_n([_dot(g, v) for g, v in zip(grads, variables)]) / replicas
        optimizer.minimize(surrogate, variables, tape=tape)
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


def perplexity(loss_sum, num_steps_total):
    """exp of the mean per-token loss; loss_sum adds per-window losses summed over time."""
    return math.exp(min(loss_sum / num_steps_total, 700.0))


def epoch_steps(cfg, num_windows):
    cap = cfg["steps_per_epoch"]
    return num_windows if cap is None else min(num_windows, cap)


def train_epoch(train_step, model, x, y, epoch, cfg, log, average=None, log_every=0, workers=1,
                after_step=None, watchdog=None, resume_at=None, save=None):
    """One pass over the windows x, y ([steps, batch, num_steps]); the LSTM state starts at zero,
    or, with `resume_at` (a checkpoints.Position inside this epoch, its state this process's
    rows), where that checkpoint left it.

    `average` turns a local scalar into the mean over workers (None in one process), so the
    perplexity logged is that of the global batch. It is called at the same steps on every
    worker, since all of them run the same number of steps. `after_step(done, steps)`, if
    given, runs after each step (parameter averaging, for one). A `watchdog` (utils.watchdog)
    is told of each step, so that a step that never finishes ends the process. With
    cfg["checkpoint_every"], `save(epoch, done, loss_sum, state)` is called every that many
    steps (not at the epoch's end, which has its own checkpoint), on every worker.
    """
    steps = epoch_steps(cfg, len(x))
    words_per_step = cfg["batch_size"] * cfg["num_steps"]  # the global batch
    log_every = log_every or max(1, steps // 10)
    save_every = cfg["checkpoint_every"] if save else None
    first, loss_sum, state = 0, 0.0, model.zero_state(x.shape[1])
    if resume_at is not None and resume_at.step >= steps:
        raise ConfigError(f"--resume: the checkpoint is {resume_at.step} steps into epoch "
                          f"{epoch + 1}, which now has {steps} (steps_per_epoch="
                          f"{cfg['steps_per_epoch']}); resume with the steps_per_epoch it was "
                          "saved with, or more")
    if resume_at is not None and resume_at.step:
        first, loss_sum = resume_at.step, resume_at.loss_sum
        state = tf.nest.pack_sequence_as(state, [tf.constant(a) for a in resume_at.state])
    x, y = tf.constant(x), tf.constant(y)
    pending, since, compute_s = tf.constant(0.0), 0, 0.0
    start = time.perf_counter()
    for step in range(first, steps):
        t0 = time.perf_counter()
        if watchdog:
            watchdog.expect("a training step")
        with signals_deferred():  # a signal raised inside TensorFlow's call would be mangled
            loss, state = train_step(x[step], y[step], state)
            if after_step:
                after_step(step + 1, steps)
        pending += loss
        since += 1
        compute_s += time.perf_counter() - t0
        logs_now = (step + 1) % log_every == 0 or step + 1 == steps
        saves_now = save_every and (step + 1) % save_every == 0 and step + 1 < steps
        if not (logs_now or saves_now):
            continue
        # One host read per log line or checkpoint, not per step.
        with signals_deferred():
            window_loss = float(average(pending) if average else pending)
        if not math.isfinite(window_loss):
            raise TrainingError(f"loss became {window_loss} in epoch {epoch + 1} between steps "
                                f"{step + 2 - since} and {step + 1}; the last checkpoint is "
                                "kept; lower learning_rate or max_grad_norm with --set")
        loss_sum += window_loss
        recent = window_loss / (since * cfg["num_steps"])
        pending, since = tf.constant(0.0), 0
        train_ppl = perplexity(loss_sum, (step + 1) * cfg["num_steps"])
        elapsed = time.perf_counter() - start
        wps = (step + 1 - first) * words_per_step / elapsed
        if logs_now:
            steps_left = steps - step - 1 + steps * (cfg["num_epochs"] - epoch - 1)
            log.progress(epoch, step + 1, steps, learning_rate(cfg, epoch, workers), train_ppl,
                         wps, eta_s=steps_left * elapsed / (step + 1 - first), loss=recent)
        if saves_now:
            save(epoch, step + 1, loss_sum, state)
    elapsed = time.perf_counter() - start
    done = steps - first  # fewer than an epoch's steps when it was resumed inside the epoch
    return {"train_ppl": train_ppl, "epoch_time_s": elapsed, "wps": done * words_per_step / elapsed,
            "compute_share": compute_s / elapsed, "steps": steps, "steps_run": done}


def eval_windows(corpus, cfg):
    """Valid and test windows. The final test is read as eval_batch_size streams (1: every
    token scored with its whole left context). The per-epoch validation only steers the run
    (and is logged), so it takes the training layout, batch_size x num_steps, unless
    valid_batch_size / valid_num_steps say otherwise: for medium 20x fewer sequential steps."""
    valid = ptb.windows(corpus.valid, cfg["valid_batch_size"] or cfg["batch_size"],
                        cfg["valid_num_steps"] or cfg["num_steps"], "valid")
    test = ptb.windows(corpus.test, cfg["eval_batch_size"], cfg["eval_num_steps"], "test")
    return valid, test


def evaluate(eval_step, model, x, y, cfg, watchdog=None):
    """Perplexity over windows x, y ([steps, batch, num_steps] from ptb.windows), the state
    carried from one window to the next; at most eval_steps windows."""
    steps = len(x) if cfg["eval_steps"] is None else min(len(x), cfg["eval_steps"])
    state = model.zero_state(x.shape[1])
    x, y = tf.constant(x), tf.constant(y)
    total = tf.constant(0.0)
    for step in range(steps):
        if watchdog:
            watchdog.expect("an evaluation step")
        with signals_deferred():
            loss, state = eval_step(x[step], y[step], state)
        total += loss
    return perplexity(float(total), steps * x.shape[2])
