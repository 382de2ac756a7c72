"""The epoch: the loop over its training steps (progress lines, the NaN check, saves inside it),
evaluation to a perplexity, and the line of an epoch whose validation a stop cut short."""
import math
import time

import tensorflow as tf

from data import ptb
from utils.errors import ConfigError, TrainingError
from utils.schedule import epoch_steps, learning_rate
from utils.signals import signals_deferred


def perplexity(loss_sum, num_steps_total):
    """exp of the mean per-token loss; loss_sum adds per-window losses summed over time."""
    return math.exp(min(loss_sum / num_steps_total, 700.0))


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


def log_unlogged_epoch(log, unlogged, position, steps_per_epoch, validate):
    """At a resume from the checkpoint of an epoch whose validation a stop cut short (the
    checkpoint comes first), the chief validates that epoch now and writes the line it lacks.
    unlogged: that epoch's stats from RunLog.resume, None when there is no such epoch."""
    if unlogged:
        done = position.epochs_done
        log.epoch(done - 1, done * steps_per_epoch, unlogged["lr"], unlogged, validate())
