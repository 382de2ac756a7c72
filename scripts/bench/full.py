"""Throughput benchmark: the real trainers on real PTB, one table and one JSON file.

    make bench          # or: .venv/bin/python scripts/bench/full.py [--quick] [--against X]

The full mode runs every row (small, medium and large: one process on all cores, 2 ranks of
one thread, the PyTorch peer) in 3 rounds (scripts/bench/common.py says how a row is timed and
a ratio taken). Each config's single process is also given as its share of the words/sec the
fp32 matmul ceiling would allow (FLOPs per word below); the ceiling is the fastest of the
models' own matmul shapes and two square ones, measured in the same run. Each config also runs
in precision bf16 right after its fp32 run, beside PyTorch's autocast bf16, with the bf16
ceiling and floor, and the CPU's bf16 units named. The other modes, each a file beside this
one: against.py (make bench-against), tune.py (make bench-tune), ceiling.py, floor.py and
profiles.py (the ceiling, the floor and a layer's profile alone).
"""
import json
from collections import namedtuple
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.bench import common  # noqa: E402
from scripts.bench.against import (against_ratios, against_rows, against_rows_of,  # noqa: E402
                                   other_stack, with_runs_against)
from scripts.bench.ceiling import ceiling_rows, matmul_gflops, matmul_shapes  # noqa: E402
from scripts.bench.common import PEER_SCRIPT, fwd_bwd, median_ratio, timed_alternately  # noqa: E402
from scripts.bench.floor import floor_row, flops_per_word, matmul_floor  # noqa: E402
from scripts.bench.profiles import ablations, layers_of, profile_small  # noqa: E402
from scripts.record_env import cpu_model  # noqa: E402
from utils import config, import_tensorflow  # noqa: E402

# quick: enough steps for the bound's 2 copies to run together for seconds on the fastest CPU
QUICK_STEPS = {"small": 300, "medium": 60}


def layer_vs_peer(peer, layers, n_rounds, reps):
    """One LSTM layer's fwd+bwd, ours (bptt) and PyTorch's nn.LSTM, in turns for n_rounds:
    per size, the medians of each side and the median of the within-round ratios."""
    tf = import_tensorflow()
    from utils.model import bptt_lstm
    out = {}
    for size, (units, steps) in layers.items():
        lstm = tf.keras.layers.LSTM(units, return_sequences=True, return_state=True)
        x = tf.random.normal([20, steps, units])
        h, c = tf.random.normal([20, units]), tf.random.normal([20, units])
        lstm(x)
        ours = fwd_bwd(lambda: tf.reduce_sum(bptt_lstm(lstm.cell, x, h, c)[0]),
                       lstm.trainable_variables)
        rounds = []
        for _ in range(n_rounds):
            ours_ms = timed_alternately([ours], reps)[0]
            peer_ms = json.loads(subprocess.run(
                [peer, PEER_SCRIPT, "--layer", str(units), str(steps), str(reps)], check=True,
                capture_output=True, text=True).stdout)["ms"]
            rounds.append((ours_ms, peer_ms))
        out[size] = {"ours_ms": statistics.median(r[0] for r in rounds),
                     "pytorch_ms": statistics.median(r[1] for r in rounds),
                     "ours_vs_pytorch": statistics.median(p / o for o, p in rounds),
                     "per_round_ms": rounds}
    return out


def find_peer(path):
    """The PyTorch peer's interpreter, or None with one line saying why (the rest still runs)."""
    if not path:
        return None
    try:
        probe = subprocess.run([path, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True, timeout=120)
        why = (probe.stderr.strip().splitlines() or ["no output"])[-1]
    except OSError as e:
        probe, why = None, str(e)
    if probe is not None and probe.returncode == 0:
        print(f"  peer: PyTorch {probe.stdout.strip()} ({path})", flush=True)
        return path
    print(f"  peer: no PyTorch at {path} ({why}); the PyTorch rows are left out "
          "(`make bench` installs it into .venv-peer from requirements-peer.txt)", flush=True)
    return None


EVAL_CONFIGS = ("config_medium", "config_large")  # whose validation eval_cost times


def eval_cost(data_path, timed_steps, eval_windows, names=EVAL_CONFIGS):
    """What the per-epoch validation costs against a training epoch, for each config of `names`
    (medium and large by default), in one process: the training epoch as the median step time
    x the steps of an epoch, the validation at batch 1 x 35 (timed over `eval_windows` windows,
    scaled to the whole set) and in the training layout (whole set)."""
    tf = import_tensorflow()
    from data import ptb
    from utils import loop, optimizers, train_steps
    from utils.model import build_model
    corpus = ptb.load_corpus(data_path)
    out = {}
    for name in names:
        cfg = config.load_config(name)
        model = build_model(cfg, len(corpus.vocab))
        step = train_steps.make_train_step(model, optimizers.make_optimizer(cfg))
        xs, ys = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"])
        state, times = model.zero_state(cfg["batch_size"]), []
        for k in range(timed_steps + 1):  # the first one traces
            t0 = time.perf_counter()
            loss, state = step(tf.constant(xs[k]), tf.constant(ys[k]), state)
            float(loss)
            times.append(time.perf_counter() - t0)
        row = {"train_epoch_s": statistics.median(times[1:]) * len(xs)}
        eval_step = train_steps.make_eval_step(model)
        for layout, (batch, steps) in (("batch 1 x 35", (1, 35)),
                                       ("training layout", (cfg["batch_size"], cfg["num_steps"]))):
            vx, vy = ptb.windows(corpus.valid, batch, steps)
            n = min(len(vx), eval_windows)
            loop.evaluate(eval_step, model, vx[:1], vy[:1], dict(cfg, eval_steps=1))  # trace
            t0 = time.perf_counter()
            loop.evaluate(eval_step, model, vx, vy, dict(cfg, eval_steps=n))
            row[f"valid_s, {layout}"] = (time.perf_counter() - t0) * len(vx) / n
            row[f"valid_share, {layout}"] = row[f"valid_s, {layout}"] / row["train_epoch_s"]
        out[name] = row
    return out


Plan = namedtuple("Plan", "configs steps rounds reps eval_windows shape_configs eval_configs")


def plan(args):
    """What make bench (or --quick) runs, from its flags: the configs of its rows (label:
    config), each one's steps, the rounds, the timing repetitions, eval_cost's timed steps and
    windows, and the configs whose matmul shapes and validation are timed (without --configs,
    the three's and medium's and large's in either mode)."""
    configs = common.checked_configs(args.configs) or \
        (common.configs_of(QUICK_STEPS) if args.quick else common.DEFAULT_CONFIGS)
    return Plan(configs=configs,
                steps=common.steps_of(configs, args.steps,
                                      QUICK_STEPS if args.quick else common.STEPS),
                rounds=args.rounds or (1 if args.quick else 3), reps=9 if args.quick else 15,
                eval_windows=(4, 100) if args.quick else (8, 300),
                shape_configs=list((configs if args.configs else common.DEFAULT_CONFIGS).values()),
                eval_configs=list(configs.values()) if args.configs else list(EVAL_CONFIGS))


def measure_all(args, plan, launchers, cores):
    """The full benchmark (or --quick) as planned: the ceilings, floors, profiles and every
    trainer row in rounds, and the ratios between rows; the result that write_result keeps."""
    import_tensorflow()  # as the trainers start it, before utils.hardware loads it
    from utils.hardware import bf16_units
    configs, steps, reps, n_rounds = plan.configs, plan.steps, plan.reps, plan.rounds
    sizes, first = list(configs), next(iter(configs))
    peer = find_peer(args.peer_python)
    against = other_stack(args.against) if args.against else None
    shapes = matmul_shapes(plan.shape_configs)
    rates = matmul_gflops(shapes)
    gflops = max(rates.values())
    rates_bf16 = matmul_gflops(shapes, dtype="bf16")
    gflops_bf16 = max(rates_bf16.values())
    layers = layers_of(configs)
    profile = profile_small(reps, configs[first])
    ablation = ablations(layers, reps)
    evaluation = eval_cost(args.data_path, *plan.eval_windows, plan.eval_configs)
    result = {"cores": cores, "cpu": cpu_model(), "bf16_units": bf16_units(),
              "configs": configs,
              "matmul_gflops": gflops, "matmul_gflops_by_shape": rates,
              "bf16_matmul_gflops": gflops_bf16, "bf16_matmul_gflops_by_shape": rates_bf16,
              f"{first}_step_profile_ms": profile, "valid_eval_cost": evaluation,
              "ablation_fwd_bwd_ms": ablation}
    for size, name in configs.items():  # the words/sec each config would reach at the ceiling
        cfg = config.load_config(name)
        result[f"{size}_flops_per_word"] = flops_per_word(cfg)
        result[f"{size}_wps_ceiling"] = gflops * 1e9 / result[f"{size}_flops_per_word"]
        result[f"{size}_matmul_floor_ms"] = matmul_floor(cfg, reps, n_rounds + 2)
        result[f"{size}_bf16_matmul_floor_ms"] = matmul_floor(cfg, reps, n_rounds + 2,
                                                              dtype="bf16")
        result[f"{size}_bf16_wps_ceiling"] = gflops_bf16 * 1e9 / result[f"{size}_flops_per_word"]
    runs = common.trainer_runs(configs, steps, launchers, peer)
    rows = against_rows_of(sizes)
    if against:
        runs = with_runs_against(runs, args.against, against, rows)
    rounds, summary = common.run_rounds(runs, n_rounds, args.data_path)
    result.update(summary)
    if against:
        result["against"] = against_ratios(rounds, against, rows)
    if peer:
        result["layer_vs_pytorch"] = layer_vs_peer(peer, layers, n_rounds, reps)
        for size in sizes:
            result[f"{size}_single_vs_pytorch"] = median_ratio(
                rounds, f"{size}_single_all_cores", f"{size}_pytorch")
            result[f"{size}_bf16_vs_pytorch_bf16"] = median_ratio(
                rounds, f"{size}_single_bf16", f"{size}_pytorch_bf16")
            result[f"{size}_pytorch_bf16_vs_fp32"] = median_ratio(
                rounds, f"{size}_pytorch_bf16", f"{size}_pytorch")
    for size in sizes:
        result[f"{size}_bf16_vs_fp32"] = median_ratio(rounds, f"{size}_single_bf16",
                                                      f"{size}_single_all_cores")
        result[f"{size}_bf16_share_of_bf16_ceiling"] = \
            result[f"{size}_single_bf16"]["wps"] / result[f"{size}_bf16_wps_ceiling"]
    for size in sizes:
        result[f"{size}_share_of_ceiling"] = \
            result[f"{size}_single_all_cores"]["wps"] / result[f"{size}_wps_ceiling"]
        two, single = f"{size}_2ranks_1thread", f"{size}_single_all_cores"
        no_allreduce = f"{size}_2procs_half_batch_no_allreduce"
        result[f"{size}_2ranks_vs_single_process"] = median_ratio(rounds, two, single)
        result[f"{size}_no_allreduce_vs_single_process"] = median_ratio(rounds, no_allreduce, single)
        result[f"{size}_2ranks_vs_no_allreduce"] = median_ratio(rounds, two, no_allreduce)
    result[f"{first}_2_vs_1_rank_speedup"] = median_ratio(rounds, f"{first}_2ranks_1thread",
                                                          f"{first}_1rank_1thread")
    result["rounds"] = n_rounds
    return result


def report_rows(result, sizes):
    """(label, value) rows of a full or quick result, as printed: from the result alone, so a
    kept result (results/bench/*.json) gives its rows again. `sizes`: the labels of its
    configs, in order (its results from before --configs: of config_small ...)."""
    names = result.get("configs") or {size: common.config_name(size) for size in sizes}
    first = sizes[0]
    peer = "layer_vs_pytorch" in result
    against = result.get("against", {}).get("stack")
    rates, rates_bf16 = result["matmul_gflops_by_shape"], result["bf16_matmul_gflops_by_shape"]
    gflops, gflops_bf16 = result["matmul_gflops"], result["bf16_matmul_gflops"]
    evaluation, profile = result["valid_eval_cost"], result[f"{first}_step_profile_ms"]
    ablation = result["ablation_fwd_bwd_ms"]
    rows = ceiling_rows(rates) + ceiling_rows(rates_bf16, "bf16") + [
        ("bf16 units of this CPU (/proc/cpuinfo)", ", ".join(result["bf16_units"]) or
         "none: bf16 is emulated")]
    for size in sizes:
        rows += [
            (f"{size}: FLOPs per word (fwd + bwd)", f"{result[f'{size}_flops_per_word'] / 1e6:.1f} MFLOP"),
            (f"{size}: words/sec at that ceiling", f"{result[f'{size}_wps_ceiling']:,.0f} wps"),
            (f"{size}, single process, all cores", f"{result[f'{size}_single_all_cores']['wps']:,.0f} wps "
                                                    f"({100 * result[f'{size}_share_of_ceiling']:.0f} % of ceiling)"),
            floor_row(size, result[f"{size}_matmul_floor_ms"], gflops,
                      config.load_config(names[size])),
            (f"{size}, 2 ranks x 1 thread", f"{result[f'{size}_2ranks_1thread']['wps']:,.0f} wps"),
            (f"{size}, 2 ranks x 1 thread / single process",
             f"{result[f'{size}_2ranks_vs_single_process']:.2f}x"),
            (f"{size}, 2 processes x 1 thread, half batch, no allreduce",
             f"{result[f'{size}_2procs_half_batch_no_allreduce']['wps']:,.0f} wps "
             f"({result[f'{size}_no_allreduce_vs_single_process']:.2f}x the single process): "
             "the bound for 2 ranks"),
            (f"{size}, 2 ranks x 1 thread / that bound", f"{result[f'{size}_2ranks_vs_no_allreduce']:.2f}x"),
        ]
    for size in sizes:
        cfg = config.load_config(names[size])
        rows += [
            (f"{size}, single process, bf16", f"{result[f'{size}_single_bf16']['wps']:,.0f} wps "
                                               f"({100 * result[f'{size}_bf16_share_of_bf16_ceiling']:.0f} % "
                                               "of the bf16 ceiling)"),
            (f"{size}, bf16 / fp32 (single process)", f"{result[f'{size}_bf16_vs_fp32']:.2f}x"),
            (f"{size}, fp32 floor / bf16 floor (the most bf16 could gain on matmuls alone)",
             f"{result[f'{size}_matmul_floor_ms']['step floor'] / result[f'{size}_bf16_matmul_floor_ms']['step floor']:.2f}x"),
            floor_row(f"{size}, bf16", result[f"{size}_bf16_matmul_floor_ms"], gflops_bf16, cfg),
        ]
        if peer:
            rows += [(f"{size}, bf16 / PyTorch's autocast bf16",
                      f"{result[f'{size}_bf16_vs_pytorch_bf16']:.2f}x (PyTorch autocast / its "
                      f"fp32: {result[f'{size}_pytorch_bf16_vs_fp32']:.2f}x)")]
    rows += [
        (f"{first}, 1 rank x 1 thread", f"{result[f'{first}_1rank_1thread']['wps']:,.0f} wps"),
        (f"{first}, 2 ranks x 1 thread / 1 rank x 1 thread",
         f"{result[f'{first}_2_vs_1_rank_speedup']:.2f}x"),
        (f"{first}, 1 rank x 1 thread, half batch",
         f"{result[f'{first}_1rank_1thread_half_batch']['wps']:,.0f} wps (alone on the machine)"),
        (f"peak RSS, {first} single / rank 0 of 2",
         f"{result[f'{first}_single_all_cores']['peak_rss_mb']:,.0f}"
         f" / {result[f'{first}_2ranks_1thread']['peak_rss_mb']:,.0f} MB"),
    ]
    if peer:
        for size in sizes:
            rows.append((f"{size}, PyTorch (same model, all cores)",
                         f"{result[f'{size}_pytorch']['wps']:,.0f} wps"))
            rows.append((f"{size}, single process / PyTorch",
                         f"{result[f'{size}_single_vs_pytorch']:.2f}x"))
        for size, r in result["layer_vs_pytorch"].items():
            rows.append((f"one {size} LSTM layer fwd+bwd, ours / PyTorch's",
                         f"{r['ours_ms']:.1f} / {r['pytorch_ms']:.1f} ms: "
                         f"{r['ours_vs_pytorch']:.2f}x PyTorch's speed"))
    for name, r in evaluation.items():
        rows.append((f"{common.label(name)}: valid evaluation / training epoch",
                     f"batch 1 x 35: {r['valid_s, batch 1 x 35']:.0f} s "
                     f"({100 * r['valid_share, batch 1 x 35']:.1f} %), training layout: "
                     f"{r['valid_s, training layout']:.0f} s "
                     f"({100 * r['valid_share, training layout']:.1f} %) "
                     f"of {r['train_epoch_s']:.0f} s"))
    if against:
        rows += against_rows(result)
    rows += [(f"{first} step profile: {name}", f"{ms:.1f} ms") for name, ms in profile.items()]
    rows += [(f"fwd+bwd {name}", f"{ms:.1f} ms") for name, ms in ablation.items()]
    return rows


def arguments():
    p = common.parser(__doc__.splitlines()[0], data=True)
    p.add_argument("--quick", action="store_true",
                   help="fewer steps, one round, no large rows; under 4 minutes")
    p.add_argument("--peer_python", default=os.path.join(common.REPO, ".venv-peer", "bin",
                                                         "python"),
                   help="interpreter with PyTorch for the peer rows ('' to leave them out)")
    p.add_argument("--against", default="",
                   help="another venv's interpreter (another TensorFlow, say: make venv-tf2.15), "
                        "or another checkout with its own .venv (another commit: its trainers "
                        "run): each config's single process in fp32 and bf16 and small's 2 ranks "
                        "run on it too, in turns with ours, and their ratios")
    common.add_runs_flags(p, rounds="3; --quick: 1", steps="600, 100 and 60 for small, medium "
                                                         "and large; --quick: 300 and 60")
    return p


def main(argv=None):
    args = arguments().parse_args(argv)
    planned = plan(args)
    result = measure_all(args, planned, common.launchers(), common.cores())
    print(f"\nbenchmark ({'quick' if args.quick else 'full'}, {result['cores']} cores, "
          f"{result['cpu']}, {result['rounds']} round{'s' if result['rounds'] > 1 else ''}; "
          "ratios are medians of within-round ratios)")
    print("\n".join(common.table_lines(report_rows(result, list(planned.configs)))))
    common.write_result(result, args.out)


if __name__ == "__main__":
    main()
