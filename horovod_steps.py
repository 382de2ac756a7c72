"""The bodies of README.md's Horovod steps that are more than a call, each opening with its
step's number: what lm_ptb_distributed.py's `# Horovod N:` lines call, shared with
lm_ptb_elastic.py. utils/ and data/ stay free of Horovod; this is the one module besides the
trainers that imports it.

Required (every data-parallel run needs them): 1 init, 2 pin, 3 DistributedOptimizer,
4 broadcast, 5 shard, 8 rank 0 alone writes; the trainers call Horovod for them directly, and
this module holds only their checks and options. The rest harden a run: 6 rank 0 downloads,
7 the ranks must agree, 9 timeline, 10 step watchdog. docs/template.md shows the required steps
alone, as a diff of lm_ptb.py.
"""
import os

from data import ptb
from utils import config, hardware
from utils.watchdog import START_UP_S, Watchdog, chief_wait_s
# Horovod 3: imported after utils, which selects the Keras (PTB_KERAS) before TensorFlow loads
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


def local_gpus():
    """Horovod 2: this host's GPUs, one for each of its ranks; one line naming the fix when the
    host runs more ranks than it has GPUs."""
    return hardware.local_gpus(hvd.local_size(), "rank",
                               "mpirun -H host:{gpus}, horovodrun -H host:{gpus}")


def start_watchdog(cfg, output_dir):
    """Horovod 10: a rank whose step (or start-up) cannot finish, because a peer stopped or hung,
    ends the job instead of hanging it. Started right after hvd.init(), so that a rank frozen
    in the start-up's collectives (download, agreement check, broadcast) is caught too, after
    step_timeout_s and START_UP_S more for the start-up's own work."""
    watchdog = Watchdog(cfg["step_timeout_s"], hvd.rank(), hvd.size(), output_dir)
    watchdog.expect("the start-up (data, agreement check, checkpoint, broadcast)",
                    extra_s=START_UP_S, warm_up=False)
    return watchdog


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
        error = (f"rank {hvd.rank()} finds no PTB files in {data_path} (rank 0 has them): "
                 "without a shared filesystem, copy them to every host or point --data_path at "
                 "a shared folder")
    if error:
        raise ptb.DataError(error)


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


def allreduce_options(cfg):
    """Horovod 3: hvd.DistributedOptimizer's options from the config (docs/network.md's
    "Communication options")."""
    compression = hvd.Compression.fp16 if cfg["fp16_allreduce"] else hvd.Compression.none
    return {"sparse_as_dense": cfg["sparse_as_dense"], "compression": compression}


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


def gather_rows_and_save(checkpoints):
    """Horovod 5: for a checkpoint inside an epoch, every rank's rows of the LSTM state are
    gathered (in rank order, which is row order) and rank 0 (of the moment: elastic ranks
    change) saves the global batch's. Returns the gathered rows (the elastic script keeps them
    in memory too)."""
    def save(epoch, done, loss_sum, state):
        rows = [hvd.allgather(t).numpy() for t in tf.nest.flatten(state)]
        if hvd.rank() == 0:
            checkpoints.save_in_epoch(epoch, done, loss_sum, rows)
        return rows
    return save


def average_over_ranks(value):
    """Horovod 8: train perplexity of the global batch, not of rank 0's shard."""
    return hvd.allreduce(value, op=hvd.Average)


def wait_for_chief(watchdog, stats, train_x, eval_x):
    """Horovod 10: the other ranks wait here while rank 0 saves and evaluates alone, allowing
    for that work beyond step_timeout_s (rank 0's watchdog times each of its own steps); then a
    rank that never arrives ends the job instead of hanging it. stats: the epoch's (None: no
    evaluation to wait for)."""
    extra_s = chief_wait_s(stats, train_x.shape[1:], eval_x.shape) if hvd.rank() != 0 else 0.0
    watchdog.expect("the wait for rank 0's checkpoint and evaluation" if hvd.rank() else
                    "the wait for the other ranks after its checkpoint and evaluation",
                    extra_s=extra_s)
    hvd.broadcast_object(None, root_rank=0, name="chief_done")
