r"""Train the PTB word-level LSTM language model with Horovod elastic: workers may be lost or
added while it trains, and it goes on with those that are left.

This is lm_ptb_distributed.py plus Horovod elastic: `diff lm_ptb_distributed.py
lm_ptb_elastic.py` shows the elastic lines, tagged `# Elastic N:` (docs/elastic.md), and the
training loop moved into the function that hvd.elastic.run restarts. `batch_size` stays the
global batch, split anew among the workers after each change.

    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script launch/discover_hosts.sh \
        python lm_ptb_elastic.py --config config_small
"""
import functools
import os
import socket
import sys

import utils  # first: tf.keras becomes the Keras that PTB_KERAS names
# TensorFlow as the scripts here start it, before the imports below load it: oneDNN on (x86),
# its start-up notes and Keras' matplotlib left out; a Python without it stops in one line
utils.import_tensorflow()
from data import ptb
from utils import cli, config, hardware, logs, loop, schedule
from utils.checkpoints import Checkpoints, Position
from utils.model import build
from utils.optimizers import create_slots, make_optimizer
from utils.train_steps import make_eval_step, make_train_step, seed_everything
import horovod.tensorflow as hvd  # Horovod 1-10, after utils (which selects the Keras: Horovod 3)
import tensorflow as tf  # Horovod 2
import horovod_steps as steps  # Horovod 2-10: the hardening, shared with lm_ptb_distributed.py
from elastic_membership import Membership  # Elastic 8: what a reset changed


COMMIT_EVERY = 100  # Elastic 5: steps between commits when checkpoint_every is not set
# Elastic 9: what a reset may take (waiting for the driver, a new worker's start, the
# rendezvous): horovodrun's --elastic-timeout default, its limit on waiting for workers
RESET_ALLOWANCE_S = 600


def refuse_indivisible(cfg, workers):
    """Elastic 4: after a reset the global batch must still split evenly among the workers."""
    try:
        ptb.check_shardable(cfg["batch_size"], workers, cfg["backward_passes_per_step"])
    except ptb.DataError as e:
        raise config.ConfigError(f"the job now has {workers} workers: {e}; for elastic runs give "
                                 "horovodrun --min-np/--max-np and host slots whose every count "
                                 "in between divides batch_size") from None


def commit_in_epoch(state, checkpoints):
    """Elastic 5: a commit inside an epoch keeps the position and every row's LSTM state in
    memory (a lost worker sends the others back to it) and on disk."""
    save = steps.gather_rows_and_save(checkpoints)

    def commit(epoch, done, loss_sum, lstm_state):
        state.position = Position(epoch, done, loss_sum, save(epoch, done, loss_sum, lstm_state))
        state.commit()  # raises HostsUpdatedInterrupt on every worker when hosts changed
    return commit


def watchdog_through_resets(watchdog):
    """Elastic 9: when a collective fails or the hosts change, the workers leave the step for a
    reset, whose waits the step's timeout must not cut short (it ended both workers of a cut
    link, or the survivor of a frozen peer, while they waited for the driver)."""
    def wrap(train):
        @functools.wraps(train)
        def train_or_reset(state):
            try:
                return train(state)
            except Exception:  # a failed collective comes as TensorFlow's error, made Horovod's
                watchdog.expect("an elastic reset", extra_s=RESET_ALLOWANCE_S, warm_up=False)
                raise  # outside; other errors end the process, with their own line
        return train_or_reset
    return wrap


def main(argv=None):
    args = cli.parse_args(argv, __doc__)
    cli.report_stops(output_dir=args.output_dir)  # a stop's line names its newest checkpoint
    cfg = config.load_config(args.config, args.set)
    cfg["checkpoint_every"] = cfg["checkpoint_every"] or COMMIT_EVERY  # Elastic 5: as logged
    config.check_together(cfg)  # Elastic 5: commits inside epochs, so no reduce_type 'param'
    steps.set_horovod_env(cfg)  # Horovod 2, 9: read once, by hvd.init()
    hvd.init()  # Horovod 1: start the ranks' background communication
    gpus = steps.local_gpus()  # Horovod 2: this host's; too few for its ranks is one line
    if gpus:  # Horovod 2: one GPU per local rank
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")  # Horovod 2
    hardware.set_threads(args.threads or hardware.cores_per_process(hvd.local_size()))  # Horovod 2
    watchdog = steps.start_watchdog(cfg, args.output_dir)  # Horovod 10: from here on
    is_chief = hvd.rank() == 0  # Horovod 8: rank 0 alone logs, evaluates and saves
    cli.report_stops(is_chief)  # Horovod 8
    workers = hvd.size()  # Horovod 5: batch_size is split among them
    # Horovod 5: every rank checks the split before any collective, so none waits for one that quit
    ptb.check_shardable(cfg["batch_size"], workers, cfg["backward_passes_per_step"])
    log = logs.RunLog(args.output_dir, args.config, cfg, world_size=workers, enabled=is_chief,
                      baseline=args.baseline)
    seed_everything(args.seed)

    # Elastic 2: no collective before hvd.elastic.run, where a worker that joins later would
    # wait for ever: each worker checks its own data (a shared folder, or a copy on each host)
    ptb.ensure_data(args.data_path)
    corpus = ptb.load_corpus(args.data_path)
    global_x, global_y = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    train_x = global_x  # Elastic 4: split in train(), for the workers of the moment
    valid, test = loop.eval_windows(corpus, cfg)
    log.info(f"vocab {len(corpus.vocab)} | train {len(corpus.train)} tokens | "
             f"{len(train_x)} steps of {cfg['batch_size']}x{cfg['num_steps']} per epoch | "
             f"precision {cfg['precision']}")
    log.info(hardware.precision_note(cfg))  # None (no line) unless bf16 is emulated here

    model = build(cfg, len(corpus.vocab))
    optimizer = make_optimizer(cfg)
    if cfg["reduce_type"] == "grad":  # Horovod 3: average the gradients, then clip
        optimizer = hvd.DistributedOptimizer(optimizer, **steps.allreduce_options(cfg))  # Horovod 3
    eval_step = make_eval_step(model)
    # The optimizer's state (step counter, slots) made now, not at its first step: a distributed
    # run's broadcast from rank 0 (Horovod 4) sends only the state that exists
    create_slots(optimizer, model.trainable_variables)
    checkpoints = Checkpoints(args.output_dir, model, optimizer, corpus, cfg, args.seed)
    # Elastic 2: only rank 0 reads the checkpoint; the state's first sync hands it to the others
    position = checkpoints.start(args.resume, args.change_config) if is_chief else Position(0)
    # Elastic 1: what a reset restores (the last commit) and hands to new workers (rank 0's):
    # the weights and the optimizer's variables (its step and slots), as Horovod 4 broadcasts
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, position=position, sizes=())
    if cfg["timeline"]:  # Horovod 9
        steps.start_timeline(args.output_dir)  # Horovod 9
    # Elastic 8: who trained since the last start and how far, so a reset can say what changed
    membership = Membership(os.environ.get("HOROVOD_HOSTNAME") or socket.gethostname())

    def validate():
        return loop.evaluate(eval_step, model, *valid, cfg, watchdog)  # Horovod 10

    @hvd.elastic.run  # Elastic 3: after a lost or an added worker, again from the last commit
    @watchdog_through_resets(watchdog)  # Elastic 9
    def train(state):
        """The epochs from the last commit to the last, then the test."""
        position, workers, is_chief = state.position, hvd.size(), hvd.rank() == 0  # Elastic 4
        if position.finished:  # --resume of a run that has trained and tested every epoch
            return
        refuse_indivisible(cfg, workers)  # Elastic 4
        steps.check_ranks_agree(cfg, corpus, args.log_every)  # Elastic 2: Horovod 7 each time
        train_x = ptb.shard(global_x, hvd.rank(), workers)  # Elastic 4: this worker's rows
        train_y = ptb.shard(global_y, hvd.rank(), workers)  # Elastic 4
        epoch_steps = schedule.epoch_steps(cfg, len(train_x))
        train_step = make_train_step(model, optimizer, cfg["backward_passes_per_step"],
                                     args.seed, hvd.rank())  # Elastic 4: own dropout masks
        after_step = steps.parameter_averaging(model, cfg)  # Elastic 4
        log.enabled, log.world_size = is_chief, workers  # Elastic 4
        if is_chief:
            checkpoints.reread()  # Elastic 4: this rank 0 may be new; the others saved till now
        cli.report_stops(is_chief)  # Elastic 4
        watchdog.where = f"rank {hvd.rank()} of {workers}"  # Elastic 4
        change = membership.start(hvd.allgather_object(membership.mine()), position)  # Elastic 8
        if change:
            log.reset(change)  # Elastic 8: one line and a reset event, from rank 0
        # Elastic 7: after a reset as after --resume, the log goes on from the commit (the
        # events past it dropped) with one line per epoch: if rank 0 was lost in a validation,
        # the new rank 0 validates that epoch now and writes its line
        unlogged = log.resume(position, world_sizes=True)  # Elastic 7
        unlogged = hvd.broadcast_object(unlogged, root_rank=0)  # Horovod 8, 10: what rank 0 does
        if is_chief:
            loop.log_unlogged_epoch(log, unlogged, position, epoch_steps, validate)
        steps.wait_for_chief(watchdog, unlogged, train_x, valid[0])  # Horovod 10
        start_epoch = position.epochs_done
        stats, step = None, start_epoch * epoch_steps
        for epoch in range(start_epoch, cfg["num_epochs"]):
            lr = schedule.learning_rate(cfg, epoch, workers)
            optimizer.learning_rate.assign(lr)
            state.sizes += (workers,) if state.sizes[-1:] != (workers,) else ()  # Elastic 6
            resume_at = position if epoch == start_epoch else None
            resume_at = resume_at and resume_at.rows_of(hvd.rank(), workers)  # Horovod 5: its rows
            stats = loop.train_epoch(train_step, model, train_x, train_y, epoch, cfg, log,
                                     log_every=args.log_every, workers=workers,
                                     average=steps.average_over_ranks,  # Horovod 8
                                     after_step=membership.counting(
                                         epoch, after_step),  # Horovod 3, Elastic 8
                                     watchdog=watchdog,  # Horovod 10
                                     resume_at=resume_at,
                                     save=commit_in_epoch(state, checkpoints))  # Elastic 5
            step += stats["steps"]
            stats["world_sizes"], state.sizes = state.sizes, ()  # Elastic 6
            stats["rolled_back"] = membership.epoch_done()  # Elastic 8
            state.position = Position(epoch + 1)  # Elastic 5: what a reset from now restores
            state.save()  # Elastic 5
            if is_chief:
                checkpoints.save(epoch + 1)  # before validation: a stop there keeps the epoch
                log.epoch(epoch, step, lr, stats, validate())
            steps.wait_for_chief(watchdog, stats, train_x, valid[0])  # Horovod 10
            state.check_host_updates()  # Elastic 5: the commit's other half, a collective
        if is_chief:
            test_ppl = loop.evaluate(eval_step, model, *test, cfg, watchdog)  # Horovod 10
            log.test(step, stats, test_ppl)
        steps.wait_for_chief(watchdog, stats, train_x, test[0])  # Horovod 10

    train(state)  # Elastic 3
    watchdog.stop()  # Horovod 10


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
