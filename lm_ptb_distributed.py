r"""Train the PTB word-level LSTM language model data-parallel with Horovod.

This is lm_ptb.py plus Horovod: past this docstring, every line `diff lm_ptb.py
lm_ptb_distributed.py` shows is tagged `# Horovod N:` after the numbered steps in README.md.
Steps 1-5 and 8 are required and written out as Horovod's own calls; 6, 7, 9 and 10 harden the
run, their bodies in horovod_steps.py (docs/template.md: the required steps alone).
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
import sys

import utils  # first: tf.keras becomes the Keras that PTB_KERAS names
# TensorFlow as the scripts here start it, before the imports below load it: oneDNN on (x86),
# its start-up notes and Keras' matplotlib left out; a Python without it stops in one line
utils.import_tensorflow()
from data import ptb
from utils import cli, config, hardware, logs, loop, schedule
from utils.checkpoints import Checkpoints
from utils.model import build
from utils.optimizers import create_slots, make_optimizer, optimizer_variables  # Horovod 4
from utils.train_steps import make_eval_step, make_train_step, seed_everything
import horovod.tensorflow as hvd  # Horovod 1-10, after utils (which selects the Keras: Horovod 3)
import tensorflow as tf  # Horovod 2
import horovod_steps as steps  # Horovod 2-10: the hardening, shared with lm_ptb_elastic.py


def main(argv=None):
    args = cli.parse_args(argv, __doc__)
    cli.report_stops(output_dir=args.output_dir)  # a stop's line names its newest checkpoint
    cfg = config.load_config(args.config, args.set)
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
    ptb.check_shardable(cfg["batch_size"], workers, cfg["backward_passes_per_step"])
    log = logs.RunLog(args.output_dir, args.config, cfg, world_size=workers, enabled=is_chief,
                      baseline=args.baseline)
    seed_everything(args.seed)

    steps.download_on_chief(args.data_path)  # Horovod 6: rank 0 downloads, the others wait
    corpus = ptb.load_corpus(args.data_path)
    steps.check_ranks_agree(cfg, corpus, args.log_every)  # Horovod 7
    train_x, train_y = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    train_x = ptb.shard(train_x, hvd.rank(), workers)  # Horovod 5: this rank's rows of the batch
    train_y = ptb.shard(train_y, hvd.rank(), workers)  # Horovod 5
    valid, test = loop.eval_windows(corpus, cfg)
    log.info(f"vocab {len(corpus.vocab)} | train {len(corpus.train)} tokens | "
             f"{len(train_x)} steps of {cfg['batch_size']}x{cfg['num_steps']} per epoch | "
             f"precision {cfg['precision']}")
    log.info(hardware.precision_note(cfg))  # None (no line) unless bf16 is emulated here

    model = build(cfg, len(corpus.vocab))
    optimizer = make_optimizer(cfg)
    if cfg["reduce_type"] == "grad":  # Horovod 3: average the gradients, then clip
        optimizer = hvd.DistributedOptimizer(optimizer, **steps.allreduce_options(cfg))  # Horovod 3
    train_step = make_train_step(model, optimizer, cfg["backward_passes_per_step"],
                                 args.seed, hvd.rank())  # Horovod 4: each rank its own masks
    eval_step = make_eval_step(model)
    # The optimizer's state (step counter, slots) made now, not at its first step: a distributed
    # run's broadcast from rank 0 (Horovod 4) sends only the state that exists
    create_slots(optimizer, model.trainable_variables)
    checkpoints = Checkpoints(args.output_dir, model, optimizer, corpus, cfg, args.seed)
    position = checkpoints.start(args.resume, args.change_config) if is_chief else None
    position = hvd.broadcast_object(position, root_rank=0)  # Horovod 4: rank 0's position,
    hvd.broadcast_variables(model.variables + optimizer_variables(optimizer),  # Horovod 4
                            root_rank=0)  # Horovod 4
    if position.finished:  # --resume of a run that has trained and tested every epoch
        watchdog.stop()  # Horovod 10: nothing more to watch
        return
    epoch_steps = schedule.epoch_steps(cfg, len(train_x))
    if cfg["timeline"]:  # Horovod 9
        steps.start_timeline(args.output_dir)  # Horovod 9
    after_step = steps.parameter_averaging(model, cfg)  # Horovod 3: None unless "param"

    def validate():
        return loop.evaluate(eval_step, model, *valid, cfg, watchdog)  # Horovod 10

    unlogged = log.resume(position) if args.resume else None
    unlogged = hvd.broadcast_object(unlogged, root_rank=0)  # Horovod 8, 10: what rank 0 does
    if is_chief:  # the epoch whose validation a stop cut short, if any, gets its line now
        loop.log_unlogged_epoch(log, unlogged, position, epoch_steps, validate)
    steps.wait_for_chief(watchdog, unlogged, train_x, valid[0])  # Horovod 10
    start_epoch = position.epochs_done
    stats, step = None, start_epoch * epoch_steps
    for epoch in range(start_epoch, cfg["num_epochs"]):
        lr = schedule.learning_rate(cfg, epoch, workers)
        optimizer.learning_rate.assign(lr)
        resume_at = position if epoch == start_epoch else None
        resume_at = resume_at and resume_at.rows_of(hvd.rank(), workers)  # Horovod 5: its rows
        stats = loop.train_epoch(train_step, model, train_x, train_y, epoch, cfg, log,
                                 log_every=args.log_every, workers=workers,
                                 average=steps.average_over_ranks,  # Horovod 8
                                 after_step=after_step,  # Horovod 3
                                 watchdog=watchdog,  # Horovod 10
                                 resume_at=resume_at,
                                 save=steps.gather_rows_and_save(checkpoints))  # Horovod 5
        step += stats["steps"]
        if is_chief:
            checkpoints.save(epoch + 1)  # before validation: a stop there keeps the epoch
            log.epoch(epoch, step, lr, stats, validate())
        steps.wait_for_chief(watchdog, stats, train_x, valid[0])  # Horovod 10
    if is_chief:
        log.test(step, stats, loop.evaluate(eval_step, model, *test, cfg, watchdog))  # Horovod 10
    steps.wait_for_chief(watchdog, stats, train_x, test[0])  # Horovod 10
    watchdog.stop()  # Horovod 10


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
