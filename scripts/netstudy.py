"""Network study: what the link between two hosts costs, and what each option saves.

    make netstudy        # as root: .venv/bin/python scripts/netstudy.py [--quick]

Runs lm_ptb_distributed.py as two "hosts" (network namespaces joined by a veth pair), the link
shaped with tc's token bucket to each bandwidth, for the small and medium configs and each
communication variant. Then the same over a link with added latency: two TUN devices joined by
a relay that holds each packet for a fixed time (this kernel has no netem), with a +0 ms run of
the same relay as its control. `--part latency` reruns only those rows and keeps the others.
For every run it reports the mean step time after the first progress window, the scaling
efficiency against one process on one core with the whole global batch, and the bytes rank 0
sends per step: computed from the model, and measured on the link's counters while training.
Writes results/studies/netstudy.json (each row with the command that measured it) and
results/studies/netstudy.png.
"""
import argparse
import json
import os
import signal
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
from utils import config  # noqa: E402
from utils.config import DEFAULT_DATA_PATH  # noqa: E402

VOCAB = 10000
RATES_MBIT = {"10 Gbit/s": 10000, "1 Gbit/s": 1000, "100 Mbit/s": 100}
DELAYS_MS = {"relay +0 ms": 0, "relay +1 ms": 1, "relay +10 ms": 10}  # one way; RTT grows 2x
VARIANTS = {  # name -> --set items
    "grad": [],
    "grad + fp16": ["fp16_allreduce=True"],
    "grad + sparse_as_dense": ["sparse_as_dense=True"],
    "param k=10": ["reduce_type='param'", "param_sync_steps=10"],
    "param k=100": ["reduce_type='param'", "param_sync_steps=100"],
}


def sizes(cfg, vocab=VOCAB):
    """Parameter counts: the embedding, and the dense rest (LSTMs and softmax)."""
    h, layers = cfg["hidden_size"], cfg["num_layers"]
    dense = layers * (2 * h * 4 * h + 4 * h) + h * vocab + vocab
    return vocab * h, dense


def predicted_bytes(cfg, variant, workers=2):
    """Bytes one rank sends per step: ring allreduce sends 2(N-1)/N of the buffer, an
    allgather the rank's own rows (float32 values plus int64 indices) to each other rank."""
    embedding, dense = sizes(cfg)
    ring = 2 * (workers - 1) / workers
    rows = cfg["batch_size"] // workers * cfg["num_steps"]
    gather = (workers - 1) * rows * (cfg["hidden_size"] * 4 + 8)
    sets = VARIANTS[variant]
    if "reduce_type='param'" in sets:
        k = int(sets[1].split("=")[1])
        return ring * 4 * (embedding + dense) / k
    if "sparse_as_dense=True" in sets:
        return ring * 4 * (embedding + dense)
    return ring * (2 if "fp16_allreduce=True" in sets else 4) * dense + gather


def poll(proc, metrics, host):
    """(step, bytes sent) pairs read while the trainer runs."""
    samples = []
    while proc.poll() is None:
        if host and os.path.exists(metrics):
            with open(metrics) as f:
                lines = f.readlines()
            try:
                samples.append((json.loads(lines[-1])["step"], twohosts.tx_bytes(host)))
            except (IndexError, ValueError):  # nothing yet, or a line being written
                pass
        time.sleep(0.05)
    return samples


def run(command, out, host=None):
    """Run a trainer; returns (mean step seconds, measured bytes per step or None)."""
    return run_workers([(command, None)], out, host)[:2]


def run_workers(commands, out, host=None):
    """Run the processes of one training job, [(command, env or None)], the first writing the
    run's metrics; returns (mean step seconds, measured bytes per step or None, the progress
    and epoch events)."""
    metrics = os.path.join(out, "metrics.jsonl")
    errors = [tempfile.TemporaryFile() for _ in commands]  # a full pipe would block a worker
    procs = [subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=err) for (command, env), err in zip(commands, errors)]
    try:
        samples = poll(procs[0], metrics, host)
        for proc in procs[1:]:
            proc.wait(timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for (command, _), proc, err in zip(commands, procs, errors):
        if proc.returncode:
            err.seek(0)
            raise SystemExit(f"run failed: {' '.join(command)}\n{err.read().decode()[-2000:]}")
    with open(metrics) as f:
        events = [e for e in map(json.loads, f) if e["event"] in ("progress", "epoch")]
    progress = [e for e in events if e["event"] == "progress"]
    measured = None
    # Counter readings taken after the first window (warm-up, broadcast) up to the last step
    # (before evaluation), so only training steps' traffic counts.
    after = [s for s in samples if progress[1]["step"] <= s[0] <= progress[-1]["step"]]
    if host and len(after) > 1 and after[-1][0] > after[0][0]:
        measured = (after[-1][1] - after[0][1]) / (after[-1][0] - after[0][0])
    # Mean over the steps after the first window: a median of windows would hide the weight
    # averages that "param" mode does only every k steps.
    first = progress[1] if len(progress) > 2 else progress[0]
    step_s = (progress[-1]["time"] - first["time"]) / (progress[-1]["step"] - first["step"])
    return step_s, measured, events


def trainer_args(config_name, steps, data_path, out, sets):
    args = ["--config", config_name, "--data_path", data_path, "--output_dir", out,
            "--set", f"steps_per_epoch={steps}", "--set", "num_epochs=1", "--set", "eval_steps=1",
            "--log_every", str(max(1, steps // 6)), "--threads", "1"]
    for s in sets:
        args += ["--set", s]
    return args


def study_link(hosts, name, steps, data_path, single, link, quick=False, **extra):
    """One row per variant over the link `hosts` as it is now."""
    cfg, rows = config.load_config(name), []
    for variant, sets in VARIANTS.items():
        k = int(sets[1].split("=")[1]) if len(sets) == 2 else 0
        n = steps if not k else max(steps, 3 * k) if k <= 10 else k
        if quick and n > 3 * steps:
            continue
        with tempfile.TemporaryDirectory() as out:
            cmd = twohosts.mpirun_command(hosts, trainer_args(name, n, data_path, out, sets))
            step_s, measured = run(cmd, out, host=hosts[0])
        row = {"config": name, "link": link, **extra, "variant": variant,
               "step_ms": 1000 * step_s, "single_step_ms": 1000 * single,
               "efficiency": single / step_s / 2,
               "bytes_per_step_predicted": predicted_bytes(cfg, variant),
               "bytes_per_step_measured": measured}
        rows.append(row)
        print(f"  {link:>12} {variant:<24} {row['step_ms']:8.0f} ms/step  "
              f"efficiency {row['efficiency']:5.2f}  bytes/step predicted "
              f"{row['bytes_per_step_predicted'] / 1e6:7.2f} MB, measured "
              f"{(measured or 0) / 1e6:7.2f} MB", flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="small config, 1 and 0.1 Gbit/s, +0 and +10 ms only")
    p.add_argument("--part", choices=["all", "bandwidth", "latency"], default="all",
                   help="run only these rows; the others are kept from results/studies/netstudy.json")
    p.add_argument("--data_path", default=DEFAULT_DATA_PATH)
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        raise SystemExit("error: the network study needs root (ip netns, tc); run it as root")
    # SIGTERM must unwind too, so the namespaces are deleted and no mpirun is left behind.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit("error: stopped by SIGTERM"))
    configs = {"config_small": 30, "config_medium": 12}
    rates, delays = RATES_MBIT, DELAYS_MS
    if args.quick:
        configs = {"config_small": 24}
        rates = {k: v for k, v in RATES_MBIT.items() if v <= 1000}
        delays = {k: v for k, v in DELAYS_MS.items() if v in (0, 10)}
    path = os.path.join(REPO, "results", "studies", "netstudy.json")
    command = "make netstudy" if args.part == "all" else \
        f"python scripts/netstudy.py --part {args.part}"
    command += " --quick" if args.quick else ""
    results = []
    if args.part != "all" and os.path.exists(path):
        with open(path) as f:
            kept = json.load(f)
        results = [r for r in kept["rows"] if ("delay_ms" in r) != (args.part == "latency")]
    for name, steps in configs.items():
        with tempfile.TemporaryDirectory() as out:
            single, _ = run([sys.executable, "lm_ptb.py",
                             *trainer_args(name, steps, args.data_path, out, [])], out)
        print(f"{name}: one process, one core: {single * 1000:.0f} ms/step", flush=True)
        if args.part in ("all", "bandwidth"):
            with twohosts.two_hosts() as hosts:
                for link, rate in rates.items():
                    twohosts.shape(hosts, rate)
                    results += study_link(hosts, name, steps, args.data_path, single, link,
                                          args.quick, command=command)
        if args.part in ("all", "latency"):
            for link, delay in delays.items():
                with twohosts.two_hosts_delayed(delay) as hosts:
                    results += study_link(hosts, name, steps, args.data_path, single, link,
                                          args.quick, command=command, delay_ms=delay)
    os.makedirs(os.path.join(REPO, "results", "studies"), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"rows": results, "projection": project(results)}, f, indent=1)
    plot(results)


def project(results, latency_s=50e-6):
    """PROJECTION, not a measurement: step time at N workers from the ring-allreduce cost model,
    t(N) = t_compute + 2(N-1)/N * S / bandwidth + 2(N-1) * latency, with t_compute and the
    effective bandwidth fitted to the measured 2-worker steps at 1 Gbit/s and 100 Mbit/s, the
    rows per worker kept as measured (the global batch grows with N), and an assumed 50 us
    latency per message."""
    out = []
    for name in sorted({r["config"] for r in results}):
        cfg = config.load_config(name)
        for variant in VARIANTS:
            rows = {r["link"]: r for r in results if r["config"] == name and r["variant"] == variant}
            if not {"1 Gbit/s", "100 Mbit/s"} <= set(rows):
                continue
            fast, slow = rows["1 Gbit/s"], rows["100 Mbit/s"]
            sent = fast["bytes_per_step_predicted"]
            # t = compute + per_byte * bytes / (link in Mbit/s), solved from the two links
            per_byte = (slow["step_ms"] - fast["step_ms"]) / 1000 / sent / (1 / 100 - 1 / 1000)
            compute = max(0.0, fast["step_ms"] / 1000 - per_byte * sent / 1000)
            for workers in (8, 64):
                ring = predicted_bytes(dict(cfg, batch_size=cfg["batch_size"] * workers // 2),
                                       variant, workers)
                for link, mbit in RATES_MBIT.items():
                    step = compute + per_byte * ring / mbit + 2 * (workers - 1) * latency_s
                    out.append({"config": name, "variant": variant, "workers": workers,
                                "link": link, "step_ms": 1000 * step,
                                "efficiency": compute / step})
    return out


def plot(results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted({r["config"] for r in results})
    fig, axes = plt.subplots(2, len(names), figsize=(6 * len(names), 8), squeeze=False)
    for col, name in enumerate(names):
        for row, (key, x_of, xlabel, xscale) in enumerate([
                ("link", lambda r: RATES_MBIT[r["link"]], "link (Mbit/s), veth + tbf", "log"),
                ("delay_ms", lambda r: r["delay_ms"], "added delay each way (ms), TUN relay",
                 "symlog")]):
            ax = axes[row][col]
            panel = [r for r in results
                     if r["config"] == name and ("delay_ms" in r) == (key == "delay_ms")]
            for variant in VARIANTS:
                rows = [r for r in panel if r["variant"] == variant]
                if rows:
                    ax.plot([x_of(r) for r in rows], [r["step_ms"] for r in rows], "-o",
                            label=variant)
            if panel:  # each part of the study timed its own one-process baseline
                ax.axhline(panel[0]["single_step_ms"] / 2, ls=":", c="gray",
                           label="ideal 2 workers")
            ax.set(xscale=xscale, yscale="log", xlabel=xlabel, ylabel="ms per step",
                   title=f"{name.replace('config_', '')}: 2 hosts, one rank each")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(REPO, "results", "studies", "netstudy.png"), dpi=100)


if __name__ == "__main__":
    main()
