"""Horovod's settings for 2 ranks sharing one CPU host, for one config: each variant against
the defaults, in turns over 3 rounds, with the single process and the no-allreduce bound of
make bench beside them (small: about 15 minutes; large: 12 to 35, by CPU):

    make bench-tune CONFIG=config_large
    .venv/bin/python scripts/bench/tune.py --config config_large
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.bench import common  # noqa: E402
from scripts.bench.common import VOCAB, median_ratio  # noqa: E402
from scripts.record_env import cpu_model  # noqa: E402
from utils import config  # noqa: E402

# steps a tune run (2 ranks; the single process runs twice as many, at twice the speed); another
# config runs small's
TUNE_STEPS = {"small": 300, "medium": 60, "large": 30}
FUSE_ALL = 512 * 1024 * 1024  # above large's 264 MB of gradients: one allreduce a step
FUSION_BUFFER = 64 * 1024 * 1024  # Horovod's default HOROVOD_FUSION_THRESHOLD


def gradient_bytes(cfg, vocab=VOCAB):
    """fp32 bytes of a step's gradients: the embedding, each LSTM layer's kernels and bias, the
    softmax's weights and bias (small 18.6 MB, medium 79 MB, large 264 MB)."""
    h = cfg["hidden_size"]
    lstm = cfg["num_layers"] * (2 * h * 4 * h + 4 * h)
    return 4 * (vocab * h + lstm + h * vocab + vocab)


def tune_variants(cfg):
    """name: (mpirun flags, trainer flags) of 2 ranks x 1 thread. A config whose gradients fit
    in one fusion buffer (small) keeps the variants of small's earlier runs; one whose gradients
    pass it several times a step (medium, large) tries one buffer for all of them, none, a
    shorter cycle, and the embedding's gradient allreduced dense instead of gathered. Every
    config also tries 2 threads a rank: 4 threads on 2 cores, so that one rank's matmuls may
    use a core the other leaves idle."""
    fast = ["-x", "HOROVOD_CYCLE_TIME=0.2", "-x", "HOROVOD_FUSION_THRESHOLD=0"]
    variants = {"default": ([], ()), "2 threads a rank (--threads 2)": ([], ("--threads", "2"))}
    if gradient_bytes(cfg) <= FUSION_BUFFER:
        variants.update({
            "HOROVOD_CYCLE_TIME=0.2": (fast[:2], ()),
            "HOROVOD_FUSION_THRESHOLD=0": (fast[2:], ()),
            "both of these": (fast, ()),
            "fp16_allreduce=True": ([], ("--set", "fp16_allreduce=True")),
            "reduce_type='param' (every 10 steps)": ([], ("--set", "reduce_type='param'")),
        })
    else:
        variants.update({
            "HOROVOD_FUSION_THRESHOLD=512 MB": (["-x", f"HOROVOD_FUSION_THRESHOLD={FUSE_ALL}"], ()),
            "HOROVOD_FUSION_THRESHOLD=0": (fast[2:], ()),
            "HOROVOD_CYCLE_TIME=0.2": (fast[:2], ()),
            "sparse_as_dense=True": ([], ("--set", "sparse_as_dense=True")),
        })
    return variants


def report_lines(rounds, summary, default, single):
    """The table's lines, a run each in the order run: words/sec and the two ratios."""
    return common.table_lines(
        (name, f"{summary[name]['wps']:6,.0f} wps  "
               f"{median_ratio(rounds, name, default):.2f}x the default  "
               f"{median_ratio(rounds, name, single):.2f}x the single process")
        for name in summary)


def tune(args, launchers, n_rounds=3):
    """Horovod's settings for 2 ranks sharing one CPU host, each against the defaults, in
    turns, with the single process and the no-allreduce bound of the full mode beside them."""
    py, mpirun, dist = launchers
    (size, cfg_name), = common.checked_configs([args.config]).items()
    steps = common.steps_of([size], args.steps, TUNE_STEPS)[size]
    runs = {f"{size}, 2 ranks, {name}": (mpirun + ["-np", "2"] + x + dist, cfg_name, steps,
                                        ("--threads", "1") + flags, 1)
            for name, (x, flags) in tune_variants(config.load_config(cfg_name)).items()}
    bound = f"{size}, 2 processes x 1 thread, half batch each, no allreduce (the bound)"
    runs[bound] = common.no_allreduce_bound(py, cfg_name, steps)
    single = f"{size}, single process (reference)"
    runs[single] = (py + ["lm_ptb.py"], cfg_name, 2 * steps, (), 1)
    rounds, summary = common.run_rounds(runs, n_rounds, args.data_path)
    default = f"{size}, 2 ranks, default"
    print(f"\n2 ranks x 1 thread on one host, {common.cores()} cores, {cpu_model()} "
          f"({n_rounds} rounds in turns; ratios are medians of within-round ratios)")
    print("\n".join(report_lines(rounds, summary, default, single)))
    return {"config": size, "cpu": cpu_model(), "rounds": rounds, **summary}


def main(argv=None):
    p = common.parser(__doc__.splitlines()[0], data=True, configs=False)
    p.add_argument("--config", default="small",
                   help="small, medium, large, or a config's name or path (small)")
    common.add_runs_flags(p, steps="300, 60 and 30 for small, medium and large")
    args = p.parse_args(argv)
    common.write_result(tune(args, common.launchers(), args.rounds or 3), args.out)


if __name__ == "__main__":
    main()
