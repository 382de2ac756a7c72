"""Train the PTB word-level LSTM language model data-parallel with Horovod.

This is lm_ptb.py plus Horovod: `diff lm_ptb.py lm_ptb_distributed.py` shows only the
distribution, each line tagged `# Horovod N:` after the numbered steps in README.md.
`batch_size` is the global batch: N workers train on batch_size / N rows each.

One process (same as lm_ptb.py):
    python lm_ptb_distributed.py --config config_small
N workers on one host (GPUs, or CPU cores shared among the ranks):
    mpirun -np 2 python lm_ptb_distributed.py --config config_small
    horovodrun -np 2 -H localhost:2 python lm_ptb_distributed.py --config config_small
Two hosts, one worker each (see README for every flag; add --allow-run-as-root as root):
    mpirun -np 2 -H a:1,b:1 -bind-to none -map-by slot -x PATH -x LD_LIBRARY_PATH \
        -mca pml ob1 -mca btl tcp,self -mca btl_tcp_if_include eth0 \
        python lm_ptb_distributed.py --config config_small
"""
import os
import sys

from data import ptb
from utils import cli, config, logs
from utils.checkpoints import Checkpoints
from utils.model import build
from utils import training
from utils.watchdog import Watchdog, chief_work_allowance
# Horovod 3: imported after utils, which selects Keras 2, whose optimizer Horovod averages in
import horovod.tensorflow as hvd
import tensorflow as tf


def set_horovod_env(cfg):
    """Horovod 2 and 9: settings read once, by hvd.init().

    On CPU hosts the ranks share the cores, so a rank waiting in MPI must yield its core rather
    than spin on it (spinning cost a third of the 2-rank throughput here); mpirun sets this
    variable itself (0 unless oversubscribed), so it is overwritten. A timeline started at run
    time needs HOROVOD_TIMELINE=DYNAMIC."""
    if not tf.config.list_physical_devices("GPU"):
        os.environ["OMPI_MCA_mpi_yield_when_idle"] = "1"
    if cfg["timeline"]:
        os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"


def pin_to_local_rank(threads):
    """Horovod 2: one GPU per local rank; on CPU hosts, the cores split among local ranks."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
    training.set_threads(threads or max(1, training.available_cores() // hvd.local_size()))


def check_ranks_agree(cfg, corpus, log_every):
    """Horovod 7: a --set given on one host only, or another copy of the data on one host, would
    silently train different models (or hang where the step counts differ)."""
    mine = {"config": config.config_hash(cfg), "data": ptb.digest(corpus), "log_every": log_every}
    ranks = hvd.allgather_object(mine)
    fixes = {"config": "give every rank the same --config and --set",
             "data": "give every rank the same PTB files (python -m data.ptb --data_path DIR "
                     "md5-checks them)",
             "log_every": "give every rank the same --log_every"}
    for key, fix in fixes.items():
        if len({r[key] for r in ranks}) > 1:
            raise config.ConfigError(f"ranks started with different {key} (per rank: "
                                     f"{', '.join(str(r[key]) for r in ranks)}); {fix}")


def download_on_chief(data_path):
    """Horovod 6: rank 0 downloads; the others wait, then all share its outcome."""
    error = None
    if hvd.rank() == 0:
        try:
            ptb.ensure_data(data_path)
        except ptb.DataError as e:
            error = str(e)
    error = hvd.broadcast_object(error, root_rank=0)
    if error is None and ptb.missing_files(data_path):
        error = (f"rank {hvd.rank()} finds no PTB files in {data_path} (rank 0 has them): without a "
                 "shared filesystem, copy them to every host or point --data_path at a shared folder")
    if error:
        raise ptb.DataError(error)


def start_timeline(output_dir):
    """Horovod 9: record what each collective waited for; rank 0 writes the file."""
    if hvd.rank() == 0:
        os.makedirs(output_dir, exist_ok=True)
    hvd.start_timeline(os.path.join(output_dir, "timeline.json"))


def parameter_averaging(model, cfg):
    """Horovod 3, reduce_type "param": each rank steps on its own shard, and the weights are
    averaged every param_sync_steps steps and at each epoch end (less communication, somewhat
    different convergence). None in the default "grad" mode."""
    if cfg["reduce_type"] != "param":
        return None
    weights = model.trainable_variables

    @tf.function
    def average_weights():
        for w, mean in zip(weights, hvd.grouped_allreduce(weights, op=hvd.Average)):
            w.assign(mean)

    def after_step(done, steps):
        if done % cfg["param_sync_steps"] == 0 or done == steps:
            average_weights()
    return after_step


def own_rows(position):
    """Horovod 5: a checkpoint inside an epoch holds the LSTM state of the whole global batch;
    this rank continues its rows of it, whatever the number of ranks that saved it."""
    return position.rows_of(hvd.rank(), hvd.size())


def gather_rows_and_save(checkpoints, is_chief):
    """Horovod 5: for a checkpoint inside an epoch, every rank's rows of the LSTM state are
    gathered (in rank order, which is row order) and rank 0 saves the global batch's.
    Returns the gathered rows (the elastic script keeps them in memory too)."""
    def save(epoch, done, loss_sum, state):
        rows = [hvd.allgather(t).numpy() for t in tf.nest.flatten(state)]
        if is_chief:
            checkpoints.save_in_epoch(epoch, done, loss_sum, rows)
        return rows
    return save


def average_over_ranks(value):
    """Horovod 8: train perplexity of the global batch, not of rank 0's shard."""
    return hvd.allreduce(value, op=hvd.Average)


def wait_for_chief(watchdog, stats, train_x, eval_x):
    """Horovod 10: the other ranks wait here while rank 0 saves and evaluates alone, allowing
    for that work beyond step_timeout_s (rank 0's watchdog times each of its own steps); then a
    rank that never arrives ends the job instead of hanging it."""
    extra_s = 0.0
    if hvd.rank() != 0 and stats:
        step_s = stats["epoch_time_s"] / stats["steps_run"]
        extra_s = chief_work_allowance(step_s, train_x.shape[1:], eval_x.shape)
    watchdog.expect("the wait for rank 0's checkpoint and evaluation" if hvd.rank() else
                    "the wait for the other ranks after its checkpoint and evaluation",
                    extra_s=extra_s)
    hvd.broadcast_object(None, root_rank=0, name="chief_done")


def main(argv=None):
    args = config.parse_args(argv, __doc__)
    cfg = config.load_config(args.config, args.set)
    set_horovod_env(cfg)  # Horovod 2, 9
    hvd.init()  # Horovod 1: start the ranks' background communication
    pin_to_local_rank(args.threads)  # Horovod 2
    is_chief = hvd.rank() == 0  # Horovod 8: rank 0 alone logs, evaluates and saves
    cli.report_stops(is_chief)  # Horovod 8
    workers = hvd.size()  # Horovod 5: batch_size is split among them
    # Horovod 5: every rank checks the split before any collective, so none waits for one that quit
    ptb.check_shardable(cfg["batch_size"], workers, cfg["backward_passes_per_step"])
    log = logs.RunLog(args.output_dir, args.config, cfg, world_size=workers, enabled=is_chief,
                      baseline=args.baseline)
    training.seed_everything(args.seed)

    download_on_chief(args.data_path)  # Horovod 6
    corpus = ptb.load_corpus(args.data_path)
    check_ranks_agree(cfg, corpus, args.log_every)  # Horovod 7
    train_x, train_y = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    train_x = ptb.shard(train_x, hvd.rank(), hvd.size())  # Horovod 5: rows of the global batch
    train_y = ptb.shard(train_y, hvd.rank(), hvd.size())  # Horovod 5
    valid, test = training.eval_windows(corpus, cfg)
    log.info(f"vocab {len(corpus.vocab)} | train {len(corpus.train)} tokens | "
             f"{len(train_x)} steps of {cfg['batch_size']}x{cfg['num_steps']} per epoch | "
             f"precision {cfg['precision']}")
    log.info(training.precision_note(cfg))  # None (no line) unless bf16 is emulated here

    model = build(cfg, len(corpus.vocab))
    optimizer = training.make_optimizer(cfg)
    if cfg["reduce_type"] == "grad":  # Horovod 3: average gradients, then clip
        optimizer = hvd.DistributedOptimizer(
            optimizer, sparse_as_dense=cfg["sparse_as_dense"],
            compression=hvd.Compression.fp16 if cfg["fp16_allreduce"] else hvd.Compression.none)
    train_step = training.make_train_step(model, optimizer, cfg["backward_passes_per_step"],
                                          args.seed, hvd.rank())  # Horovod 4: own dropout masks
    eval_step = training.make_eval_step(model)
    checkpoints = Checkpoints(args.output_dir, model, optimizer, corpus,
                              model.zero_state(cfg["batch_size"]))
    position = checkpoints.start(args.resume) if is_chief else None
    position = hvd.broadcast_object(position, root_rank=0)  # Horovod 4: resume together
    # Horovod 4: the weights and the optimizer's state (its step, and slots such as momentum)
    hvd.broadcast_variables(model.variables + optimizer.variables(), root_rank=0)
    if cfg["timeline"]:
        start_timeline(args.output_dir)  # Horovod 9
    after_step = parameter_averaging(model, cfg)  # Horovod 3: None unless reduce_type "param"
    watchdog = Watchdog(cfg["step_timeout_s"], hvd.rank(), workers, args.output_dir)  # Horovod 10

    def train(position):
        """The epochs from `position` (a checkpoints.Position) to the last, then the test."""
        start_epoch = position.epochs_done
        stats, step = None, start_epoch * training.epoch_steps(cfg, len(train_x))
        for epoch in range(start_epoch, cfg["num_epochs"]):
            lr = training.learning_rate(cfg, epoch, workers)
            optimizer.learning_rate.assign(lr)
            stats = training.train_epoch(train_step, model, train_x, train_y, epoch, cfg, log,
                                         log_every=args.log_every, workers=workers,
                                         average=average_over_ranks,  # Horovod 8
                                         after_step=after_step,  # Horovod 3
                                         watchdog=watchdog,  # Horovod 10
                                         resume_at=own_rows(position) if epoch == start_epoch
                                         else None,  # Horovod 5
                                         save=gather_rows_and_save(checkpoints,
                                                                   is_chief))  # Horovod 5
            step += stats["steps"]
            if is_chief:
                checkpoints.save(epoch + 1)  # before validation: a stop there keeps the epoch
                valid_ppl = training.evaluate(eval_step, model, *valid, cfg,
                                              watchdog)  # Horovod 10
                log.epoch(epoch, step, lr, stats, valid_ppl)
            wait_for_chief(watchdog, stats, train_x, valid[0])  # Horovod 10
        if is_chief:
            test_ppl = training.evaluate(eval_step, model, *test, cfg, watchdog)  # Horovod 10
            last = cfg["num_epochs"] - 1
            log.test(last, step, training.learning_rate(cfg, last, workers), stats, test_ppl)
        wait_for_chief(watchdog, stats, train_x, test[0])  # Horovod 10

    unlogged = log.resume(position) if args.resume else None
    if unlogged:  # stopped during that epoch's validation, after its checkpoint: log it now
        done = position.epochs_done
        log.epoch(done - 1, done * training.epoch_steps(cfg, len(train_x)), unlogged["lr"],
                  unlogged, training.evaluate(eval_step, model, *valid, cfg))
    train(position)
    watchdog.stop()  # Horovod 10


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
