r"""Train the PTB word-level LSTM language model data-parallel with Horovod.

This is lm_ptb.py plus Horovod: past this docstring, every line `diff lm_ptb.py
lm_ptb_distributed.py` shows is tagged `# Horovod N:` after the numbered steps in README.md,
whose bodies are in horovod_steps.py. Steps 1-5 and 8 are required; 6, 7, 9 and 10 harden the
run (docs/template.md: the required steps alone). `batch_size` is the global batch: N workers
train on batch_size / N rows each.

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

from data import ptb
from utils import cli, config, logs
from utils.checkpoints import Checkpoints
from utils.model import build
from utils import training
import horovod.tensorflow as hvd  # Horovod 1-10, after utils (which selects Keras 2: Horovod 3)
import horovod_steps as steps  # Horovod 1-10: the steps' bodies, shared with lm_ptb_elastic.py


def main(argv=None):
    args = config.parse_args(argv, __doc__)
    cfg = config.load_config(args.config, args.set)
    steps.set_horovod_env(cfg)  # Horovod 2, 9: read once, by hvd.init()
    hvd.init()  # Horovod 1: start the ranks' background communication
    steps.pin_to_local_rank(args.threads)  # Horovod 2: a GPU, or a share of the cores, per rank
    watchdog = steps.start_watchdog(cfg, args.output_dir)  # Horovod 10: from here on
    is_chief = hvd.rank() == 0  # Horovod 8: rank 0 alone logs, evaluates and saves
    cli.report_stops(is_chief)  # Horovod 8
    workers = hvd.size()  # Horovod 5: batch_size is split among them
    ptb.check_shardable(cfg["batch_size"], workers, cfg["backward_passes_per_step"])
    log = logs.RunLog(args.output_dir, args.config, cfg, world_size=workers, enabled=is_chief,
                      baseline=args.baseline)
    training.seed_everything(args.seed)

    steps.download_on_chief(args.data_path)  # Horovod 6: rank 0 downloads, the others wait
    corpus = ptb.load_corpus(args.data_path)
    steps.check_ranks_agree(cfg, corpus, args.log_every)  # Horovod 7
    train_x, train_y = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    train_x, train_y = steps.shard(train_x, train_y)  # Horovod 5: rows of the global batch
    valid, test = training.eval_windows(corpus, cfg)
    log.info(f"vocab {len(corpus.vocab)} | train {len(corpus.train)} tokens | "
             f"{len(train_x)} steps of {cfg['batch_size']}x{cfg['num_steps']} per epoch | "
             f"precision {cfg['precision']}")
    log.info(training.precision_note(cfg))  # None (no line) unless bf16 is emulated here

    model = build(cfg, len(corpus.vocab))
    optimizer = training.make_optimizer(cfg)
    optimizer = steps.distributed_optimizer(optimizer, cfg)  # Horovod 3: average, then clip
    train_step = training.make_train_step(model, optimizer, cfg["backward_passes_per_step"],
                                          args.seed, hvd.rank())  # Horovod 4: own dropout masks
    eval_step = training.make_eval_step(model)
    checkpoints = Checkpoints(args.output_dir, model, optimizer, corpus,
                              model.zero_state(cfg["batch_size"]))
    position = checkpoints.start(args.resume) if is_chief else None
    position = steps.resume_together(position, model, optimizer)  # Horovod 4: rank 0's all
    if cfg["timeline"]:  # Horovod 9
        steps.start_timeline(args.output_dir)  # Horovod 9
    after_step = steps.parameter_averaging(model, cfg)  # Horovod 3: None unless "param"

    def train(position):
        """The epochs from `position` (a checkpoints.Position) to the last, then the test."""
        start_epoch = position.epochs_done
        stats, step = None, start_epoch * training.epoch_steps(cfg, len(train_x))
        for epoch in range(start_epoch, cfg["num_epochs"]):
            lr = training.learning_rate(cfg, epoch, workers)
            optimizer.learning_rate.assign(lr)
            resume_at = steps.own_rows(position) if epoch == start_epoch else None  # Horovod 5
            stats = training.train_epoch(train_step, model, train_x, train_y, epoch, cfg, log,
                                         log_every=args.log_every, workers=workers,
                                         average=steps.average_over_ranks,  # Horovod 8
                                         after_step=after_step,  # Horovod 3
                                         watchdog=watchdog,  # Horovod 10
                                         resume_at=resume_at,  # Horovod 5
                                         save=steps.gather_rows_and_save(checkpoints))  # Horovod 5
            step += stats["steps"]
            if is_chief:
                checkpoints.save(epoch + 1)  # before validation: a stop there keeps the epoch
                valid_ppl = training.evaluate(eval_step, model, *valid, cfg, watchdog)  # Horovod 10
                log.epoch(epoch, step, lr, stats, valid_ppl)
            steps.wait_for_chief(watchdog, stats, train_x, valid[0])  # Horovod 10
        if is_chief:
            test_ppl = training.evaluate(eval_step, model, *test, cfg, watchdog)  # Horovod 10
            last = cfg["num_epochs"] - 1
            log.test(last, step, training.learning_rate(cfg, last, workers), stats, test_ppl)
        steps.wait_for_chief(watchdog, stats, train_x, test[0])  # Horovod 10

    unlogged = log.resume(position) if args.resume else None
    unlogged = steps.rank0s(unlogged)  # Horovod 8, 10: every rank validates; none waits idle
    if unlogged:  # stopped during that epoch's validation, after its checkpoint: log it now
        valid_ppl = training.evaluate(eval_step, model, *valid, cfg, watchdog)  # Horovod 10
        done = position.epochs_done
        log.epoch(done - 1, done * training.epoch_steps(cfg, len(train_x)), unlogged["lr"],
                  unlogged, valid_ppl)
    train(position)
    watchdog.stop()  # Horovod 10


if __name__ == "__main__":
    sys.exit(cli.run_main(main))
