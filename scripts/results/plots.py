"""results/runs/perplexity.png (each config's perplexity per epoch, its longest fp32 runs and
its longest bf16 run) and results/runs/wps.png (words/sec of 1 process and 2 workers, from
the `make timing` measurements README's time cells give)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.results.common import (CONFIGS, RUNS, epoch_count, fp32_only,  # noqa: E402
                                    full_epoch_steps, longest_runs, machine, precision)


def curves(runs):
    """Per config with 2 or more epochs to draw: its longest fp32 runs (2 workers, then 1
    process), then its longest bf16 run, so a bf16 row's curve sits beside the fp32 epochs."""
    found = {}
    for name, pair in longest_runs(fp32_only(runs)).items():
        bf16 = [r for r in runs if precision(r) == "bf16" and r["config"]["name"] == name
                and r["kind"] != "bounded"]
        drawn = pair + ([max(bf16, key=epoch_count)] if bf16 else [])
        if any(epoch_count(r) > 1 for r in drawn):
            found[name] = drawn
    return found


def throughput_points(measurements):
    """label: [(1, words/sec), (2, words/sec)] of each `make timing` measurement given: a
    config's training words an epoch over the median seconds an epoch of 1 process and of 2
    workers (README's time cells, as words/sec)."""
    points = {}
    for t in sorted(measurements, key=lambda t: list(CONFIGS).index(t["name"])
                    if t["name"] in CONFIGS else len(CONFIGS)):
        cfg = t["runs"][0]["config"]
        words = full_epoch_steps(cfg) * cfg["batch_size"] * cfg["num_steps"]
        label = t["name"].replace("config_", "") + (
            f", {t['precision']}" if t["precision"] != "fp32" else "") + (
            f", {t['keras']}" if t["keras"] != "Keras 3" else "")
        points[label] = [(1, words / t["t1"]), (2, words / t["t2"])]
    return points


def plain_log_ticks(ax, ticks=(40, 50, 60, 80, 100, 150, 200, 300, 400, 600)):
    """Perplexities as plain numbers on the log axis (80, 100, 150), not as 8 x 10^1."""
    import matplotlib
    low, high = ax.get_ylim()
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(
        [t for t in ticks if low <= t <= high]))
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def plots(runs, measurements):
    """perplexity.png from the trained runs, wps.png from the make timing measurements."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    drawn = curves(runs)
    fig, axes = plt.subplots(1, len(drawn), figsize=(6 * len(drawn), 4), squeeze=False)
    for ax, (name, chosen) in zip(axes[0], drawn.items()):
        for r in chosen:
            epochs = [e for e in r["events"] if e["event"] == "epoch"]
            label = (f"{r['workers']} workers" if r["workers"] > 1 else "1 process") + (
                ", bf16" if precision(r) == "bf16" else "")
            ax.plot([e["epoch"] for e in epochs], [e["train_ppl"] for e in epochs], "--",
                    label=f"train, {label}")
            ax.plot([e["epoch"] for e in epochs], [e["valid_ppl"] for e in epochs], "-o",
                    label=f"valid, {label}")
        ax.set(xlabel="epoch", ylabel="perplexity", yscale="log",
               title=f"PTB {name.replace('config_', '')}: perplexity per epoch")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        plain_log_ticks(ax)
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RUNS, "perplexity.png"), dpi=100)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in throughput_points(measurements).items():
        ax.plot(*zip(*points), "-o", label=label)
    timed = [r for t in measurements for r in t["runs"]]
    ax.set_xlabel(f"workers on one host\n{machine(timed)}", fontsize=8)
    ax.set(ylabel="words/sec", xticks=[1, 2],
           title="Words/sec against workers (make timing, medians of its rounds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RUNS, "wps.png"), dpi=100)
