"""Horovod or tf.distribute: the same trainer with 2 workers, measured side by side in turns.

    make compare        # as root: .venv/bin/python scripts/compare.py [--quick]

For the small and medium configs, lm_ptb_distributed.py (Horovod, under mpirun) and
lm_ptb_tf_distribute.py (MultiWorkerMirroredStrategy, ring all-reduce over gRPC) train with 2
workers of one thread each: on this host, and on two "hosts" (network namespaces joined by a
veth pair, shaped to 10 Gbit/s, 1 Gbit/s and 100 Mbit/s by a token bucket; and joined by the
network study's TUN relay that holds each packet 10 ms each way). Within each
round the two run one right after the other, on the same link; ratios are medians of the
within-round ratios. Per run: the mean step time after the first logged window, the time from
launch to the end of that window (start-up, tracing and the first steps), the bytes host a
sends per training step (read on the link's counters) and worker 0's peak RSS. Also the lines
each script adds to lm_ptb.py. Writes results/studies/compare.json and .png, and prints the table.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import utils  # noqa: E402
utils.require_setup()  # a Python without .venv's TensorFlow stops here in one line
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from scripts import twohosts  # noqa: E402
from scripts.netstudy import run_workers, trainer_args  # noqa: E402
from scripts.record_env import cpu_model  # noqa: E402
from utils import child_env  # noqa: E402
from utils.config import DEFAULT_DATA_PATH  # noqa: E402

SCRIPTS = {"Horovod": "lm_ptb_distributed.py", "tf.distribute": "lm_ptb_tf_distribute.py"}
LINKS = {"10 Gbit/s": 10000, "1 Gbit/s": 1000, "100 Mbit/s": 100}  # besides "this host"
DELAYS_MS = {"+10 ms each way": 10}  # the network study's relay: latency, not bandwidth
PORT = 23456


def one_host(kind, args):
    """The job's processes on this host: [(command, env)]."""
    py = sys.executable
    if kind == "Horovod":
        return [(["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "-np", "2",
                  "-bind-to", "none", "-map-by", "slot", py, SCRIPTS[kind], *args], child_env())]
    return [([py, "launch/tf_config.py", "-n", "2", "--", py, SCRIPTS[kind], *args], child_env())]


def two_hosts(kind, hosts, args):
    """The job's processes on the two namespace hosts: Horovod's mpirun starts both ranks from
    host a; each tf.distribute worker is started in its own namespace with its TF_CONFIG."""
    if kind == "Horovod":
        return [(twohosts.mpirun_command(hosts, args), child_env())]
    addresses = [f"{address}:{PORT}" for _, address, _ in hosts]
    return [(["ip", "netns", "exec", ns, sys.executable, SCRIPTS[kind], *args],
             child_env(TF_CONFIG=json.dumps({"cluster": {"worker": addresses},
                                             "task": {"type": "worker", "index": i}})))
            for i, (ns, _, _) in enumerate(hosts)]


def measure(kind, config_name, steps, data_path, hosts=None):
    with tempfile.TemporaryDirectory() as out:
        args = trainer_args(config_name, steps, data_path, out, [])
        commands = two_hosts(kind, hosts, args) if hosts else one_host(kind, args)
        started = time.time()
        step_s, sent, events = run_workers(commands, out, hosts[0] if hosts else None)
    progress = [e for e in events if e["event"] == "progress"]
    return {"step_ms": 1000 * step_s, "words_per_s": progress[0]["config"]["batch_size"]
            * progress[0]["config"]["num_steps"] / step_s,
            "first_window_s": progress[0]["time"] - started,
            "first_window_steps": progress[0]["step"],
            "bytes_per_step": sent,
            "peak_rss_mb": max(e["peak_rss_mb"] for e in events if e["event"] == "epoch")}


def lines_added(script):
    diff = subprocess.run(["diff", "lm_ptb.py", script], cwd=REPO, capture_output=True,
                          text=True).stdout.splitlines()
    return {"added": sum(line.startswith("> ") for line in diff),
            "removed": sum(line.startswith("< ") for line in diff)}


def compare_link(link, config_name, steps, data_path, rounds, hosts=None):
    """Both kinds in turns (the order swapped each round) on one link, as it is now."""
    per_round = []
    for r in range(rounds):
        kinds = list(SCRIPTS) if r % 2 == 0 else list(reversed(SCRIPTS))
        per_round.append({kind: measure(kind, config_name, steps, data_path, hosts)
                          for kind in kinds})
    row = {"config": config_name, "link": link, "rounds": per_round}
    for kind in SCRIPTS:
        for key in ("words_per_s", "first_window_s", "peak_rss_mb"):
            row[f"{kind} {key}"] = statistics.median(r[kind][key] for r in per_round)
        sent = [r[kind]["bytes_per_step"] for r in per_round if r[kind]["bytes_per_step"]]
        row[f"{kind} bytes_per_step"] = statistics.median(sent) if sent else None
    row["tf.distribute / Horovod words/s"] = statistics.median(
        r["tf.distribute"]["words_per_s"] / r["Horovod"]["words_per_s"] for r in per_round)
    print(f"  {config_name:<14} {link:<11} Horovod {row['Horovod words_per_s']:7,.0f} wps  "
          f"tf.distribute {row['tf.distribute words_per_s']:7,.0f} wps  "
          f"ratio {row['tf.distribute / Horovod words/s']:.2f}  first window "
          f"{row['Horovod first_window_s']:.0f} / {row['tf.distribute first_window_s']:.0f} s  "
          + (f"MB/step {row['Horovod bytes_per_step'] / 1e6:.2f} / "
             f"{row['tf.distribute bytes_per_step'] / 1e6:.2f}  " if hosts else "")
          + f"RSS {row['Horovod peak_rss_mb']:.0f} / {row['tf.distribute peak_rss_mb']:.0f} MB",
          flush=True)
    return row


def plot(rows, path):
    """Words/sec of both trainers per link, one panel per config: results/studies/compare.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(dict.fromkeys(r["config"] for r in rows))
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        panel = [r for r in rows if r["config"] == name]
        for k, kind in enumerate(SCRIPTS):
            ax.bar([i + 0.4 * k for i in range(len(panel))],
                   [r[f"{kind} words_per_s"] for r in panel], 0.4, label=kind)
        ax.set_xticks([i + 0.2 for i in range(len(panel))], [r["link"] for r in panel],
                      fontsize=8)
        ax.set(ylabel="words/sec, 2 workers x 1 thread",
               title=f"{os.path.basename(name).removesuffix('.py').replace('config_', '')}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small only, 1 round, 2 links")
    p.add_argument("--config", default="", help="only this config (a name or a path)")
    p.add_argument("--steps", type=int, default=0, help="steps a run (default: per config)")
    p.add_argument("--data_path", default=DEFAULT_DATA_PATH)
    p.add_argument("--out", default=os.path.join(REPO, "results", "studies", "compare.json"))
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("error: the comparison needs root (ip netns, tc); run it as root")
    # SIGTERM must unwind too, so the namespaces are deleted and no worker is left behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit("error: stopped by SIGTERM"))
    configs = {"config_small": 60, "config_medium": 24}
    links, delays, rounds = LINKS, DELAYS_MS, 3
    if args.quick:
        configs, links, delays, rounds = {"config_small": 30}, {"1 Gbit/s": 1000}, {}, 1
    if args.config:
        configs = {args.config: configs.get(args.config, 30)}
    if args.steps:
        configs = {name: args.steps for name in configs}
    print(f"Horovod / tf.distribute, 2 workers x 1 thread, {cpu_model()}, {rounds} round(s) in "
          "turns (first window: launch to its end; MB/step: host a's link counter)", flush=True)
    rows = []
    for name, steps in configs.items():
        rows.append(compare_link("this host", name, steps, args.data_path, rounds))
        with twohosts.two_hosts() as hosts:
            for link, rate in links.items():
                twohosts.shape(hosts, rate)
                rows.append(compare_link(link, name, steps, args.data_path, rounds, hosts))
        for link, delay in delays.items():
            with twohosts.two_hosts_delayed(delay) as hosts:
                rows.append(compare_link(link, name, steps, args.data_path, rounds, hosts))
    result = {"command": " ".join(["python scripts/compare.py", *(argv or sys.argv[1:])]),
              "cpu": cpu_model(), "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
              "rows": rows, "lines_added_to_lm_ptb": {k: lines_added(s) for k, s in SCRIPTS.items()}}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    plot(rows, os.path.splitext(args.out)[0] + ".png")
    for kind, n in result["lines_added_to_lm_ptb"].items():
        print(f"  {kind}: {SCRIPTS[kind]} adds {n['added']} lines to lm_ptb.py, changes "
              f"{n['removed']}")
    print(f"  written to {args.out} and its .png")


if __name__ == "__main__":
    main()
