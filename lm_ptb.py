"""Train the PTB word-level LSTM language model (Zaremba et al. 2014) in one process.

One process, all cores:
    python lm_ptb.py --config config_small --data_path data/ptb
Smoke run (one short epoch):
    python lm_ptb.py --config config_small --set num_epochs=1 --set steps_per_epoch=200

N local workers or two hosts: lm_ptb_distributed.py, which is this file plus Horovod.
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
from utils.optimizers import create_slots, make_optimizer
from utils.train_steps import make_eval_step, make_train_step, seed_everything


def main(argv=None):
    args = cli.parse_args(argv, __doc__)
    cli.report_stops(output_dir=args.output_dir)  # a stop's line names its newest checkpoint
    cfg = config.load_config(args.config, args.set)
    hardware.set_threads(args.threads or hardware.available_cores())
    is_chief = True
    workers = 1
    ptb.check_shardable(cfg["batch_size"], workers, cfg["backward_passes_per_step"])
    log = logs.RunLog(args.output_dir, args.config, cfg, world_size=workers, enabled=is_chief,
                      baseline=args.baseline)
    seed_everything(args.seed)

    ptb.ensure_data(args.data_path)
    corpus = ptb.load_corpus(args.data_path)
    train_x, train_y = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    valid, test = loop.eval_windows(corpus, cfg)
    log.info(f"vocab {len(corpus.vocab)} | train {len(corpus.train)} tokens | "
             f"{len(train_x)} steps of {cfg['batch_size']}x{cfg['num_steps']} per epoch | "
             f"precision {cfg['precision']}")
    log.info(hardware.precision_note(cfg))  # None (no line) unless bf16 is emulated here

    model = build(cfg, len(corpus.vocab))
    optimizer = make_optimizer(cfg)
    train_step = make_train_step(model, optimizer, cfg["backward_passes_per_step"],
                                 args.seed)
    eval_step = make_eval_step(model)
    # The optimizer's state (step counter, slots) made now, not at its first step: a distributed
    # run's broadcast from rank 0 (Horovod 4) sends only the state that exists
    create_slots(optimizer, model.trainable_variables)
    checkpoints = Checkpoints(args.output_dir, model, optimizer, corpus, cfg, args.seed)
    position = checkpoints.start(args.resume, args.change_config) if is_chief else None
    if position.finished:  # --resume of a run that has trained and tested every epoch
        return
    epoch_steps = schedule.epoch_steps(cfg, len(train_x))

    def validate():
        return loop.evaluate(eval_step, model, *valid, cfg)

    unlogged = log.resume(position) if args.resume else None
    if is_chief:  # the epoch whose validation a stop cut short, if any, gets its line now
        loop.log_unlogged_epoch(log, unlogged, position, epoch_steps, validate)
    start_epoch = position.epochs_done
    stats, step = None, start_epoch * epoch_steps
    for epoch in range(start_epoch, cfg["num_epochs"]):
        lr = schedule.learning_rate(cfg, epoch, workers)
        optimizer.learning_rate.assign(lr)
        resume_at = position if epoch == start_epoch else None
        stats = loop.train_epoch(train_step, model, train_x, train_y, epoch, cfg, log,
                                 log_every=args.log_every, workers=workers,
                                 resume_at=resume_at,
                                 save=checkpoints.save_in_epoch)
        step += stats["steps"]
        if is_chief:
            checkpoints.save(epoch + 1)  # before validation: a stop there keeps the epoch
            log.epoch(epoch, step, lr, stats, validate())
    if is_chief:
        log.test(step, stats, loop.evaluate(eval_step, model, *test, cfg))


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
