"""Train the PTB word-level LSTM language model data-parallel with tf.distribute.

This is lm_ptb.py plus TensorFlow's MultiWorkerMirroredStrategy, beside lm_ptb_distributed.py
(Horovod): `diff lm_ptb.py lm_ptb_tf_distribute.py` shows the distribution: the lines of main()
tagged `# tf.distribute N:` after the numbered steps in docs/tf-distribute.md, and the
functions they call, each opening with its step. `batch_size` is
the global batch: N workers train on batch_size / N rows each. Nothing beyond TensorFlow is
needed: the workers find each other through TF_CONFIG and talk gRPC.

One process (same as lm_ptb.py): no TF_CONFIG
    python lm_ptb_tf_distribute.py --config config_small
N workers on one host (launch/tf_config.py writes each one's TF_CONFIG and starts them):
    python launch/tf_config.py -n 2 -- python lm_ptb_tf_distribute.py --config config_small
Two hosts, one worker each: on host i (0, 1), the same command with
    TF_CONFIG='{"cluster": {"worker": ["a:23456", "b:23456"]}, "task": {"type": "worker", "index": i}}'
"""
import json
import os
import sys

import utils  # first: tf.keras becomes the Keras that PTB_KERAS names
# TensorFlow as the scripts here start it, before the imports below load it: oneDNN on (x86),
# its start-up notes and Keras' matplotlib left out; a Python without it stops in one line
utils.import_tensorflow()
from data import ptb
from utils import cli, config, hardware, logs, loop, schedule
from utils.checkpoints import Checkpoints, Position
from utils.errors import TrainingError
from utils.pointers import kept_text
from utils.model import build
from utils.optimizers import KERAS3, create_slots, make_optimizer, optimizer_variables
from utils.train_steps import make_eval_step, make_train_step, seed_everything
from utils.watchdog import Watchdog, chief_wait_s, guard_blocking_call
import tensorflow as tf

# What a collective raises when a peer is gone (a killed or a frozen peer: UnavailableError in
# 10 of 10 tries, results/studies/tf-distribute-peer-errors/). Not InternalError: that one keeps its
# traceback, since it is more likely a fault here than a lost peer.
COLLECTIVE_ERRORS = (tf.errors.UnavailableError, tf.errors.CancelledError,
                     tf.errors.DeadlineExceededError, tf.errors.AbortedError)


def cluster_from_tf_config():
    """tf.distribute 1: (this worker's index, the workers' addresses) from TF_CONFIG; one worker
    without it."""
    text = os.environ.get("TF_CONFIG", "")
    if not text:
        return 0, ["localhost"]
    try:
        tf_config = json.loads(text)
        workers, task = tf_config["cluster"]["worker"], tf_config["task"]
        index = int(task["index"])
        if task.get("type") != "worker" or not 0 <= index < len(workers):
            raise ValueError
    except (ValueError, KeyError, TypeError):
        raise config.ConfigError(
            'TF_CONFIG must be {"cluster": {"worker": ["host:port", ...]}, "task": {"type": '
            f'"worker", "index": i}} with i < the number of workers; got {text[:200]}') from None
    return index, workers


def make_strategy(index, workers, threads):
    """tf.distribute 1 and 2: pin this worker to its GPU (one per local worker) or its share of
    the cores, then the strategy: all-reduce by NCCL between GPUs, by ring over gRPC on CPUs.
    Devices and threads must be set before the strategy starts the runtime."""
    host = workers[index].rsplit(":", 1)[0]
    local = [i for i, w in enumerate(workers) if w.rsplit(":", 1)[0] == host]
    gpus = hardware.local_gpus(len(local), "worker", "launch/tf_config.py -n {gpus}, or at "
                               "most {gpus} of TF_CONFIG's workers on this host")
    if gpus:
        tf.config.set_visible_devices(gpus[local.index(index)], "GPU")
    hardware.set_threads(threads or hardware.cores_per_process(len(local)))
    if len(workers) == 1:
        return tf.distribute.get_strategy()  # the default: no collectives at all
    implementation = tf.distribute.experimental.CommunicationImplementation
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=implementation.NCCL if gpus else implementation.RING))


class Collectives:
    """tf.distribute 4-9: collectives over the workers of lists of this worker's tensors,
    compiled: run eagerly, the strategy warns of their overhead."""

    def __init__(self, strategy):
        self.strategy = strategy
        self.sum = self._compiled(lambda ctx, t: ctx.all_reduce("SUM", t))
        self.mean = self._compiled(lambda ctx, t: ctx.all_reduce("MEAN", t))
        self.gather = self._compiled(lambda ctx, t: ctx.all_gather(t, axis=0))  # worker order

    def _compiled(self, collective):
        strategy = self.strategy

        @tf.function
        def run(tensors):
            # One collective per tensor (a list of several dtypes cannot be packed into one);
            # tf.identity inside the replica function places each on its device (a graph
            # tensor without a device gives the collective nowhere to go).
            out = strategy.run(lambda *t: [collective(tf.distribute.get_replica_context(),
                                                      tf.identity(x)) for x in t],
                               args=tuple(tensors))
            return [strategy.experimental_local_results(t)[0] for t in out]
        # Traced once per call site's tensor list (a handful: the download flag, the
        # fingerprints, the weights, the loss...): not the loop TensorFlow's frequent-retracing
        # warning is about, which would otherwise print at every start.
        run._omit_frequent_tracing_warning = True
        if strategy.num_replicas_in_sync == 1:
            return lambda tensors: [tf.convert_to_tensor(t) for t in tensors]
        return lambda tensors: run([tf.convert_to_tensor(t) for t in tensors])

    def from_chief(self, is_chief, tensors):
        """tf.distribute 4: worker 0's values on every worker (a sum with the others' zeros)."""
        tensors = [tf.convert_to_tensor(t) for t in tensors]
        return self.sum([t if is_chief else tf.zeros_like(t) for t in tensors])


def download_on_chief(collectives, is_chief, data_path):
    """tf.distribute 6: worker 0 downloads; the others wait for its outcome."""
    error = None
    if is_chief:
        try:
            ptb.ensure_data(data_path)
        except ptb.DataError as e:
            error = e
    failed, = collectives.from_chief(is_chief, [1.0 if error else 0.0])
    if error:
        raise error
    if float(failed):
        raise ptb.DataError("worker 0 could not get the PTB files (its error says why)")
    if ptb.missing_files(data_path):
        raise ptb.DataError(f"this worker finds no PTB files in {data_path} (worker 0 has them): "
                            "without a shared filesystem, copy them to every host or point "
                            "--data_path at a shared folder")


def check_workers_agree(collectives, cfg, corpus, log_every):
    """tf.distribute 7: a --set or a copy of the data on one host only would silently train
    different models; every worker's fingerprints are gathered and compared."""
    mine = {"config": int(config.config_hash(cfg)[:15], 16),
            "data": int(ptb.digest(corpus)[:15], 16), "log_every": log_every}
    workers = collectives.gather([tf.constant([list(mine.values())], tf.int64)])[0].numpy()
    fixes = {"config": "give every worker the same --config and --set",
             "data": "give every worker the same PTB files (python -m data.ptb --data_path DIR "
                     "md5-checks them)",
             "log_every": "give every worker the same --log_every"}
    for column, (key, fix) in enumerate(fixes.items()):
        if len(set(workers[:, column])) > 1:
            raise config.ConfigError(f"workers started with different {key} (per worker: "
                                     f"{', '.join(str(v) for v in workers[:, column])}); {fix}")


def refuse_fp16(cfg):
    """tf.distribute 3: sum_before_clipping sums the workers' gradients in the optimizer's
    apply(), which a LossScaleOptimizer (fp16) passes to an inner optimizer that would sum them
    again; fp16 trains with the Horovod trainers."""
    if cfg["precision"] == "fp16":
        raise config.ConfigError("precision='fp16' is not trained by lm_ptb_tf_distribute.py "
                                 "(its loss scaling and the workers' sum before the clip do "
                                 "not combine yet); train it with lm_ptb_distributed.py, or "
                                 "choose precision='bf16' or 'fp32'")


def sum_before_clipping(optimizer):
    """tf.distribute 3: Keras 3's optimizer clips each replica's gradient and sums them after
    (Keras 2's summed first): a sum of clipped gradients is not the global batch's clipped
    gradient, and the update would not be one process's. The same optimizer, made to sum in
    apply(), before its clip, and to skip its own sum after."""
    if not KERAS3:
        return optimizer
    base = type(optimizer)

    def apply(self, grads, trainable_variables=None):
        replica = tf.distribute.get_replica_context()
        if replica is not None and replica.num_replicas_in_sync > 1:
            grads = replica.all_reduce(tf.distribute.ReduceOp.SUM, list(grads))
        return base.apply(self, grads, trainable_variables)
    summing = type(base.__name__, (base,), {
        "apply": apply, "_all_reduce_sum_gradients": lambda self, pairs: list(pairs)})
    return summing.from_config(optimizer.get_config())


def distributed(strategy, step):
    """tf.distribute 3: the same train step run by every worker on its rows; the optimizer,
    made in the strategy's scope, sums the replicas' gradients before clipping."""
    local = lambda t: strategy.experimental_local_results(t)[0]  # noqa: E731

    @tf.function
    def run(x, y, state):
        loss, state = strategy.run(step, args=(x, y, state))
        return local(loss), tf.nest.map_structure(local, state)
    return run


def resume_together(collectives, is_chief, model, optimizer, position, global_state):
    """tf.distribute 4: worker 0 restored the checkpoint; every worker takes its weights,
    optimizer state and position (with the LSTM state of the whole global batch)."""
    variables = model.variables + optimizer_variables(optimizer)
    for variable, value in zip(variables, collectives.from_chief(is_chief, variables)):
        variable.assign(value)
    position = position or Position(0)
    state = position.state or [tf.zeros_like(t) for t in tf.nest.flatten(global_state)]
    counts, loss_sum, *state = collectives.from_chief(is_chief, [
        tf.constant([position.epochs_done, position.step, position.finished], tf.int64),
        tf.constant(position.loss_sum, tf.float64), *state])
    epochs_done, step, finished = (int(v) for v in counts.numpy())
    state = [s.numpy() for s in state] if step else None
    return Position(epochs_done, step, float(loss_sum), state, bool(finished))


def unlogged_from_chief(collectives, is_chief, unlogged):
    """tf.distribute 9: whether worker 0 validates an epoch at the resume, and that epoch's time
    and steps, on every worker (RunLog.resume's stats; None: no such epoch), for the others'
    allowance while they wait for it."""
    mine = [unlogged["epoch_time_s"], unlogged["steps"]] if unlogged else [0.0, 0.0]
    time_s, steps = (float(v) for v in collectives.from_chief(is_chief, [
        tf.constant(mine, tf.float64)])[0].numpy())
    if is_chief or not steps:
        return unlogged
    return {"epoch_time_s": time_s, "steps": int(steps)}


def gather_rows_and_save(collectives, checkpoints, is_chief):
    """tf.distribute 5: every worker's rows of the LSTM state, in worker order (row order);
    worker 0 saves the global batch's."""
    def save(epoch, done, loss_sum, state):
        rows = collectives.gather(tf.nest.flatten(state))
        if is_chief:
            checkpoints.save_in_epoch(epoch, done, loss_sum, [t.numpy() for t in rows])
    return save


def average_over_workers(collectives):
    """tf.distribute 8: train perplexity of the global batch, not of worker 0's rows."""
    return lambda value: collectives.mean([value])[0]


def wait_for_chief(collectives, watchdog, is_chief, stats, train_x, eval_x):
    """tf.distribute 9: the others wait in a collective while worker 0 saves and evaluates,
    allowing for that work beyond step_timeout_s; a worker that never arrives ends the job."""
    extra_s = chief_wait_s(stats, train_x.shape[1:], eval_x.shape) if not is_chief else 0.0
    watchdog.expect("the wait for the other workers after its checkpoint and evaluation"
                    if is_chief else "the wait for worker 0's checkpoint and evaluation",
                    extra_s=extra_s)
    collectives.sum([0.0])


def main(argv=None):
    args = cli.parse_args(argv, __doc__)
    cli.report_stops(output_dir=args.output_dir)  # a stop's line names its newest checkpoint
    cfg = config.load_config(args.config, args.set)
    config.refuse_horovod_only(cfg, "tf.distribute")  # tf.distribute 7: none would act
    refuse_fp16(cfg)  # tf.distribute 3: its optimizer sums before the clip, not yet in fp16
    index, addresses = cluster_from_tf_config()  # tf.distribute 1
    # tf.distribute 9: the strategy waits for every worker of TF_CONFIG, for ever and holding
    # Python's lock, so a process beside this one ends the wait
    started = guard_blocking_call(cfg["step_timeout_s"], (
        f"error: worker {index}: not every worker of TF_CONFIG started within "
        f"{cfg['step_timeout_s']} s ({', '.join(addresses)}); start each of them (launch/"
        "tf_config.py does, on one host), or give a longer --set step_timeout_s=N"))
    strategy = make_strategy(index, addresses, args.threads)  # tf.distribute 1, 2
    started()
    collectives = Collectives(strategy)  # tf.distribute 4-9
    is_chief = index == 0  # tf.distribute 8: worker 0 alone logs, evaluates and saves
    cli.report_stops(is_chief)  # tf.distribute 8
    workers = len(addresses)  # tf.distribute 5: batch_size is split among them
    ptb.check_shardable(cfg["batch_size"], workers, cfg["backward_passes_per_step"])
    log = logs.RunLog(args.output_dir, args.config, cfg, world_size=workers, enabled=is_chief,
                      baseline=args.baseline)
    seed_everything(args.seed)
    watchdog = Watchdog(cfg["step_timeout_s"], index, workers, args.output_dir,  # tf.distribute 9
                        role="worker")  # tf.distribute 9

    download_on_chief(collectives, is_chief, args.data_path)  # tf.distribute 6
    corpus = ptb.load_corpus(args.data_path)
    check_workers_agree(collectives, cfg, corpus, args.log_every)  # tf.distribute 7
    train_x, train_y = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    train_x = ptb.shard(train_x, index, workers)  # tf.distribute 5: rows of the global batch
    train_y = ptb.shard(train_y, index, workers)  # tf.distribute 5
    valid, test = loop.eval_windows(corpus, cfg)
    log.info(f"vocab {len(corpus.vocab)} | train {len(corpus.train)} tokens | "
             f"{len(train_x)} steps of {cfg['batch_size']}x{cfg['num_steps']} per epoch | "
             f"precision {cfg['precision']}")
    log.info(hardware.precision_note(cfg))  # None (no line) unless bf16 is emulated here

    with strategy.scope():  # tf.distribute 3: variables mirrored, initial values from worker 0
        model = build(cfg, len(corpus.vocab))
        optimizer = sum_before_clipping(make_optimizer(cfg))  # tf.distribute 3
    train_step = make_train_step(model, optimizer, cfg["backward_passes_per_step"],
                                 args.seed, index,  # tf.distribute 4: own dropout masks
                                 replicas=workers)  # tf.distribute 3: summed, so / N
    train_step = distributed(strategy, train_step)  # tf.distribute 3
    eval_step = make_eval_step(model)
    # The optimizer's state (step counter, slots) made now, not at its first step: a distributed
    # run's broadcast from rank 0 (Horovod 4) sends only the state that exists
    create_slots(optimizer, model.trainable_variables)
    checkpoints = Checkpoints(args.output_dir, model, optimizer, corpus, cfg, args.seed)
    position = checkpoints.start(args.resume, args.change_config) if is_chief else None
    if workers > 1:  # tf.distribute 4: resume together
        position = resume_together(collectives, is_chief, model, optimizer, position,
                                   model.zero_state(cfg["batch_size"]))
    if position.finished:  # --resume of a run that has trained and tested every epoch
        return
    epoch_steps = schedule.epoch_steps(cfg, len(train_x))

    def validate():
        return loop.evaluate(eval_step, model, *valid, cfg, watchdog)  # tf.distribute 9

    def train(position):
        """The epoch a stop cut short in its validation, if any; the epochs from `position` (a
        checkpoints.Position) to the last; then the test."""
        unlogged = log.resume(position) if args.resume else None
        unlogged = unlogged_from_chief(collectives, is_chief, unlogged)  # tf.distribute 9
        if is_chief:  # the epoch whose validation a stop cut short, if any, gets its line now
            loop.log_unlogged_epoch(log, unlogged, position, epoch_steps, validate)
        wait_for_chief(collectives, watchdog, is_chief, unlogged, train_x,
                       valid[0])  # tf.distribute 9
        start_epoch = position.epochs_done
        stats, step = None, start_epoch * epoch_steps
        for epoch in range(start_epoch, cfg["num_epochs"]):
            lr = schedule.learning_rate(cfg, epoch, workers)
            optimizer.learning_rate.assign(lr)
            resume_at = position if epoch == start_epoch else None
            resume_at = resume_at and resume_at.rows_of(index, workers)  # tf.distribute 5
            stats = loop.train_epoch(train_step, model, train_x, train_y, epoch, cfg, log,
                                     log_every=args.log_every, workers=workers,
                                     average=average_over_workers(collectives),  # tf.distribute 8
                                     watchdog=watchdog,  # tf.distribute 9
                                     resume_at=resume_at,
                                     save=gather_rows_and_save(collectives, checkpoints,
                                                               is_chief))  # tf.distribute 5
            step += stats["steps"]
            if is_chief:
                checkpoints.save(epoch + 1)  # before validation: a stop there keeps the epoch
                log.epoch(epoch, step, lr, stats, validate())
            wait_for_chief(collectives, watchdog, is_chief, stats, train_x,
                           valid[0])  # tf.distribute 9
        if is_chief:
            log.test(step, stats, loop.evaluate(eval_step, model, *test, cfg, watchdog))
        wait_for_chief(collectives, watchdog, is_chief, stats, train_x, test[0])  # tf.distribute 9

    try:
        train(position)
    except COLLECTIVE_ERRORS as e:  # tf.distribute 9: a peer is gone
        raise TrainingError(
            f"worker {index}: a collective with the other workers failed ({type(e).__name__}), "
            "so another worker stopped or cannot be reached (its own output says why); "
            f"{kept_text(args.output_dir)}") from None
    watchdog.stop()  # tf.distribute 9

if __name__ == "__main__":
    sys.exit(cli.run_main(main))
