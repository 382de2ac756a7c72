"""The results table and plots, built only from committed logs under results/.

    python scripts/results.py record NAME full|partial|bounded -- <trainer command ...>
        runs the command with --output_dir runs/results/NAME, then keeps its metrics.jsonl, the
        command and an environment record in results/runs/NAME/ (never the checkpoints). full: all
        the config's epochs; partial: fewer whole epochs (--set num_epochs=N); bounded: a number
        of steps, timed only. `make reproduce` keeps its run as "running" until it is "full"
    python scripts/results.py build      # = make results
        rewrites the table between the results markers in README.md, results/README.md (the
        full table and every run's provenance), results/runs/*.png (fp32 and bf16 curves) and
        docs/network.md's table
    python scripts/results.py side-by-side RUN_A RUN_B LABEL_A LABEL_B [FIRST_EPOCH]
        a study's table (results/studies/tutorial-schedule-*): the learning rate, train and
        valid perplexity of two runs' metrics.jsonl (folders or files) at each epoch from
        FIRST_EPOCH (default 1) that both finished
"""
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import utils  # noqa: E402
utils.require_setup()  # a Python without .venv's TensorFlow stops here in one line
from utils import config  # noqa: E402
from utils.logs import whole_epoch_s  # noqa: E402
RESULTS = os.path.join(REPO, "results")
RUNS = os.path.join(RESULTS, "runs")  # the training runs: a folder each, with run.json
# results/README.md opens with where each kind of result lives
LAYOUT = [("runs/", "the training runs: the table's rows, the one-process and bounded runs "
                    "beside them, the bf16 runs; each folder its metrics.jsonl and run.json "
                    "(command, date, commit, machine), some the console's train.log, and the "
                    "plots of them"),
          ("bench/", "`make bench`, `make bench-tune` and their probes: words/sec, matmul "
                     "ceilings and floors, what bounds 2 ranks on one host"),
          ("studies/", "comparisons and studies: Horovod against tf.distribute (`make "
                       "compare`), the network study (`make netstudy`), elastic resets, the "
                       "validation layout, the precision check"),
          ("stack/", "the stack: TensorFlow 2.21 against 2.15, 2.22.0rc0 tried, the GPU build "
                     "checked up to the device, the GPU kernels TensorFlow registers for "
                     "bf16, Python 3.10 and 3.12, Open MPI 5's pairing message, and CI: its "
                     "times on each CPU, what cut them, the suite's cost test by test "
                     "(ci/README.md)")]
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
NET_BEGIN, NET_END = "<!-- netstudy:begin -->", "<!-- netstudy:end -->"
CONFIGS = ("config_small", "config_medium", "config_large")
TRAIN_TOKENS = 929589  # ptb.train.txt with <eos>; checked by tests/test_reader.py


def record(name, kind, command):
    out = os.path.join(REPO, "runs", "results", name)
    if os.path.exists(out):
        sys.exit(f"error: {out} exists; remove it or pick another NAME")
    full = [*command, "--output_dir", out]
    env = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "record_env.py")],
                         capture_output=True, text=True, check=True).stdout
    if subprocess.run(full, cwd=REPO).returncode:
        sys.exit(f"error: the run failed: {shlex.join(full)}")
    keep(name, kind, shlex.join(full), out, json.loads(env))


def keep(name, kind, command, run_dir, env):
    folder = os.path.join(RUNS, name)
    os.makedirs(folder, exist_ok=True)
    shutil.copy(os.path.join(run_dir, "metrics.jsonl"), folder)
    with open(os.path.join(folder, "run.json"), "w") as f:
        json.dump({"kind": kind, "command": command, "env": env}, f, indent=1)


def load(name):
    folder = os.path.join(RUNS, name)
    with open(os.path.join(folder, "run.json")) as f:
        run = json.load(f)
    events = read_events(folder)
    run.update(name=name, events=events, config=newest_config(events),
               workers=events[0]["world_size"])
    return run


def newest_config(events):
    """The config a run trains under now, from its metrics events: a resume may have lengthened
    the schedule, or changed more with --change_config, and logged the config it went on with.
    scripts/reproduce.py's status line reads it here too."""
    return [e["config"] for e in events if "config" in e][-1]


def full_epoch_steps(cfg):
    return (TRAIN_TOKENS // cfg["batch_size"] - 1) // cfg["num_steps"]


def epoch_time(run):
    """Median seconds per epoch: measured epochs, or step time x steps of a full epoch; None
    for a run started again that has not finished its first epoch yet."""
    if run["kind"] != "bounded":
        seconds = [whole_epoch_s(e) for e in run["events"] if e["event"] == "epoch"]
        return statistics.median(seconds) if seconds else None
    progress = [e for e in run["events"] if e["event"] == "progress"]
    step_s = [(b["time"] - a["time"]) / (b["step"] - a["step"])
              for a, b in zip(progress, progress[1:]) if b["step"] > a["step"]]
    return statistics.median(step_s) * full_epoch_steps(run["config"])


def epoch_count(run):
    return sum(e["event"] == "epoch" for e in run["events"])


def last(run, event, key):
    values = [e[key] for e in run["events"] if e["event"] == event]
    return values[-1] if values else None


def fmt(x, spec=".1f", unit=""):
    return "—" if x is None else format(x, spec) + unit


def paper_epochs(config_name):
    return config.load_config(config_name)["num_epochs"]


def perplexities(single, dist, event, key):
    """'2 workers / 1 process' for one perplexity column, or the one that exists."""
    values = [fmt(last(r, event, key), ".2f") if r else "—" for r in (dist, single)]
    return " / ".join(values)


def first_epochs(run, n):
    """A longer run as it stood after epoch n: its first n epoch lines, no test."""
    events = [e for e in run["events"] if e["event"] == "epoch" and e["epoch"] <= n]
    return dict(run, events=events, borrowed=True)


def borrowed_from(dist):
    """Where a row's 2-worker cells come from, if not from a run of the row's own kind."""
    if dist and dist.get("borrowed"):
        return f"2 workers: the {dist['kind']} run's first {epoch_count(dist)}"
    return ""


def longer_2worker_run(runs, name, epochs):
    """The config's 2-worker run of the whole schedule (done or running), if it reached `epochs`:
    a one-process partial run is then compared with its first epochs, not run twice."""
    longer = [r for r in runs if r["config"]["name"] == name and r["workers"] == 2
              and r["kind"] in ("full", "running") and epoch_count(r) >= epochs]
    return first_epochs(max(longer, key=epoch_count), epochs) if longer else None


def row_runs(runs):
    """Per table row, in order: (config name, kind, 1-process run, 2-worker run, epochs, time
    per epoch of each), the runs absent as None. A 2-worker cell borrowed from a longer run's
    first epochs has no time: those epochs ran in another sitting."""
    by = {}
    for r in runs:
        key = (r["config"]["name"], r["kind"], r["workers"])
        if key in by and (r.get("lost") or by[key].get("lost")):
            by[key] = max(by[key], r, key=epoch_count)  # attempts lost with their machine
            continue
        if key in by:
            sys.exit(f"error: results/runs/{by[key]['name']} and results/runs/{r['name']} are "
                     f"both a {r['kind']} run of {key[0]} with {key[2]} worker(s); remove the "
                     "older one")
        by[key] = r
    for name in CONFIGS:
        for kind in ("full", "running", "partial", "bounded"):
            single, dist = by.get((name, kind, 1)), by.get((name, kind, 2))
            if single or dist:
                epochs = epoch_count(dist or single)
                if kind == "partial" and not dist:
                    dist = longer_2worker_run(runs, name, epochs)
                yield (name, kind, single, dist, epochs, single and epoch_time(single),
                       dist and not dist.get("borrowed") and epoch_time(dist) or None)


def longest_trained(runs, name, workers):
    """The config's trained (not bounded) run with most epochs with that many workers, or None."""
    trained = [r for r in runs if r["config"]["name"] == name and r["workers"] == workers
               and r["kind"] != "bounded"]
    return max(trained, key=epoch_count) if trained else None


def longest_runs(runs):
    """Per config, its trained (not bounded) runs with most epochs: 2 workers, then 1 process."""
    return {name: [r for r in (longest_trained(runs, name, w) for w in (2, 1)) if r]
            for name in CONFIGS}


def epoch_ends(events):
    """Epoch -> its last "epoch" event (an epoch trained twice: the later one)."""
    return {e["epoch"]: e for e in events if e["event"] == "epoch"}


def epoch_by_epoch(runs):
    """The valid perplexity of 2 workers and of one process at each epoch both ran."""
    rows = ["| config | epoch | valid ppl, 2 workers | valid ppl, 1 process | difference |",
            "|" + " --- |" * 5]
    for name, pair in longest_runs(runs).items():
        if len(pair) < 2:
            continue
        valid = [{n: e["valid_ppl"] for n, e in epoch_ends(r["events"]).items()} for r in pair]
        for epoch in sorted(set(valid[0]) & set(valid[1])):
            two, one = valid[0][epoch], valid[1][epoch]
            rows.append(f"| {name.replace('config_', '')} | {epoch} | {two:.2f} | {one:.2f} | "
                        f"{100 * (two - one) / one:+.1f} % |")
    return rows


def lost_note(runs, *row):
    """What a row showing an attempt lost with its machine adds: that it was, and how far the
    run started again has come (the row shows the lost one until the new one passes it)."""
    lost = next((r for r in row if r and r.get("lost")), None)
    if lost is None:
        return ""
    again = started_again(runs, lost["config"]["name"])
    return "; its machine ended" + (f"; started again: {epoch_count(again)} so far"
                                     if again else "")


def table(runs):
    rows = ["| config | run | epochs | train ppl, 2 workers / 1 process | valid ppl, 2 / 1 | "
            "test ppl, 2 / 1 | time/epoch, 2 workers | time/epoch, 1 process | speedup |",
            "|" + " --- |" * 9]
    for name, kind, single, dist, epochs, t1, t2 in row_runs(runs):
        speedup = f"{t1 / t2:.2f}×" if t1 and t2 else "—"
        label = {"full": "full",
                 "running": f"running ({epochs} of {paper_epochs(name)} epochs so far)",
                 "partial": f"partial ({epochs} of {paper_epochs(name)} epochs"
                 + (f"; {borrowed_from(dist)}" if borrowed_from(dist) else "")
                 + lost_note(runs, single, dist) + ")",
                 "bounded": "bounded (time from the first steps)"}[kind]
        if kind == "bounded":
            cells = ["—"] * 4
        else:
            cells = [str(epochs), perplexities(single, dist, "epoch", "train_ppl"),
                     perplexities(single, dist, "epoch", "valid_ppl"),
                     perplexities(single, dist, "test", "test_ppl")]
        rows.append(f"| {name.replace('config_', '')} | {label} | {' | '.join(cells)} | "
                    f"{fmt(t2, unit=' s')} | {fmt(t1, unit=' s')} | {speedup} |")
    return rows


def sittings(run):
    """A run continued over several sittings (`make reproduce`): which epochs each trained, from
    when, on which machine and commit, and what else ran there meanwhile."""
    segments, parts = run["segments"], []
    ends = [s["epochs_done_at_start"] for s in segments[1:]] + [epoch_count(run)]
    for s, end in zip(segments, ends):
        first = s["epochs_done_at_start"] + 1
        if first > end:
            continue  # a sitting stopped before it finished an epoch
        beside = "; ".join(s.get("shared", [])) or "nothing else noted"
        epochs = f"epochs {first}-{end}" if end > first else f"epoch {first}"
        settings = "".join(f", {name}={value}" for name, value in s.get("settings", {}).items())
        parts.append(f"{epochs} from {s['started_utc']} UTC on {s['cpu']}, "
                     f"{s['cores']} cores, commit {s['commit']}{settings} (beside it: {beside})")
    if not parts:
        return "No epoch finished yet"
    return f"In {len(parts)} sitting{'s' if len(parts) > 1 else ''}: " + " | ".join(parts)


def provenance(runs):
    lines = []
    for r in sorted(runs, key=lambda r: r["name"]):
        env = r["env"]
        note = sittings(r) if r.get("segments") else r.get("note")
        if r.get("lost"):
            note += f". Lost {r['lost']}"
        lines.append(f"- `results/runs/{r['name']}` ({r['kind']}, {r['workers']} worker"
                     f"{'s' if r['workers'] > 1 else ''}; {env['date_utc']} UTC, {env['cpu']}, "
                     f"{env['cores']} cores, TF {env['tensorflow']}, "
                     + (f"Keras {env['keras']}, " if "keras" in env else "")
                     + f"Horovod {env['horovod']}, "
                     f"commit {env['commit']}): `{r['command']}`"
                     + (f". {note}" if note else ""))
    return lines


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


def plain_log_ticks(ax, ticks=(40, 50, 60, 80, 100, 150, 200, 300, 400, 600)):
    """Perplexities as plain numbers on the log axis (80, 100, 150), not as 8 x 10^1."""
    import matplotlib
    low, high = ax.get_ylim()
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(
        [t for t in ticks if low <= t <= high]))
    ax.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def plots(runs):
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
    fig, ax = plt.subplots(figsize=(6, 4))
    bounded = [r for r in fp32_only(runs) if r["kind"] == "bounded"]
    for name in CONFIGS:
        points = sorted((r["workers"], statistics.median(
            [e["wps"] for e in r["events"] if e["event"] == "progress"][1:] or [0]))
            for r in bounded if r["config"]["name"] == name)
        if points:
            ax.plot(*zip(*points), "-o", label=name.replace("config_", ""))
    ax.set(xlabel=f"workers on one host: {machine(bounded)}", ylabel="words/sec", xticks=[1, 2],
           title="Throughput against the number of workers (bounded runs)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(RUNS, "wps.png"), dpi=100)


def netstudy_block():
    path = os.path.join(RESULTS, "studies", "netstudy.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        study = json.load(f)
    commands = dict.fromkeys(r["command"] for r in study["rows"])
    lines = [f"Measured by {' and '.join(f'`{c}`' for c in commands)} (2 ranks, one per namespace, one core each; "
             "efficiency = one process's step time / (2 × the 2-worker step time)):", "",
             "| config | link | variant | ms/step | efficiency | MB sent/step, model | "
             "MB sent/step, measured |", "|" + " --- |" * 7]
    for r in study["rows"]:
        measured = r["bytes_per_step_measured"]
        lines.append(f"| {r['config'].replace('config_', '')} | {r['link']} | {r['variant']} | "
                     f"{r['step_ms']:.0f} | {r['efficiency']:.2f} | "
                     f"{r['bytes_per_step_predicted'] / 1e6:.2f} | "
                     f"{'—' if measured is None else format(measured / 1e6, '.2f')} |")
    lines += ["", "**Projection** (ring-allreduce cost model fitted to the measured steps, not a "
              "measurement; rows per worker as measured, 50 µs assumed per message): compute "
              "share of the step at 8 and 64 workers.", "",
              "| config | variant | workers | 10 Gbit/s | 1 Gbit/s | 100 Mbit/s |",
              "|" + " --- |" * 6]
    keyed = {}
    for r in study["projection"]:
        keyed.setdefault((r["config"], r["variant"], r["workers"]), {})[r["link"]] = r
    for (name, variant, workers), by_link in keyed.items():
        cells = " | ".join(f"{by_link[l]['efficiency']:.2f}" if l in by_link else "—"
                           for l in ("10 Gbit/s", "1 Gbit/s", "100 Mbit/s"))
        lines.append(f"| {name.replace('config_', '')} | {variant} | {workers} | {cells} |")
    return lines


def replace_block(text, begin, end, lines):
    if begin not in text:
        sys.exit(f"error: no {begin} marker where the table goes")
    head, rest = text.split(begin, 1)
    return head + "\n".join([begin, *lines, end]) + rest.split(end, 1)[1]


def load_all():
    return [load(n) for n in sorted(os.listdir(RUNS))
            if os.path.isfile(os.path.join(RUNS, n, "run.json"))]


def machine(runs):
    cpus = sorted({f"{r['env']['cpu']}, {r['env']['cores']} cores" for r in runs if r})
    return "; ".join(cpus) or "—"


# Test perplexity published for each config (README links them): Texar's Horovod example (2 GPUs),
# TensorFlow's tutorial (ptb_word_lm.py), Zaremba et al. 2014, Table 1 (small: non-regularized)
PUBLISHED = {"config_small": (114.72, 115.91, 114.5), "config_medium": (84.42, 82.07, 82.7),
             "config_large": (78.72, 78.29, 78.4)}


def precision(run):
    return run["config"].get("precision", "fp32")  # runs logged before the key: fp32


def card_run(runs, name):
    """The run a config's README row shows: a finished run of the card's command (2 workers),
    else of one process; else the run that got furthest, running or stopped (one started again
    after its first attempt was lost with a machine shows once it passes that attempt). Of two
    as far: 2 workers, then the running one, then fp32 (the paper's precision)."""
    trained = [r for r in runs if r["config"]["name"] == name and r["kind"] != "bounded"]
    for workers in (2, 1):
        full = [r for r in trained if r["kind"] == "full" and r["workers"] == workers]
        if full:
            return max(full, key=lambda r: precision(r) == "fp32")
    return max(trained, default=None, key=lambda r: (
        epoch_count(r), r["workers"] == 2, r["kind"] == "running", precision(r) == "fp32"))


def started_again(runs, name):
    """The config's run of `make reproduce` not lost, running or stopped between sittings."""
    return next((r for r in runs if r["config"]["name"] == name and r.get("segments")
                 and r["kind"] in ("running", "partial") and not r.get("lost")), None)


def epochs_cell(run, name, runs):
    total, done = paper_epochs(name), epoch_count(run)
    workers = f"{run['workers']} workers" if run["workers"] > 1 else "1 process"
    if run["kind"] == "full":
        return str(done)
    if run["kind"] == "running":
        hours = (total - done) * epoch_time(run) / 3600 if done else None
        return (f"{done} of {total}, running" + (f" ({workers})" if run["workers"] == 1 else "")
                + (f", ETA ≈ {hours:.0f} h" if hours else ""))
    cell = f"{done} of {total} ({workers}, partial)"
    if not run.get("lost"):
        return cell
    cell += "; its machine ended"
    again = started_again(runs, name)  # the row shows a lost attempt until the new run passes it
    if again:
        cell += f"; started again in {precision(again)}: {epoch_count(again)} of {total}"
    return cell


def paper_table(runs, label=""):
    """README's table, in the shape of the published ones: a row per config, the run of the
    card's command, both times per epoch, and the published test perplexities beside; `label`
    after each row's config name."""
    rows = ["| config | epochs | train | valid | test | time/epoch, 2 workers | time/epoch, "
            "1 process | published test: Texar / TF tutorial / paper | machine |",
            "|" + " --- |" * 9]
    for name in CONFIGS:
        run = card_run(runs, name)
        if run is None:
            continue
        alike = [r for r in runs if precision(r) == precision(run)]  # times in its precision
        run2, run1 = (r if r and epoch_count(r) else None  # timed: with an epoch done
                      for r in (longest_trained(alike, name, 2), longest_trained(alike, name, 1)))
        t2, t1 = (r and epoch_time(r) for r in (run2, run1))
        cells = [epochs_cell(run, name, runs), *(fmt(last(run, event, key), ".2f")
                                                  for event, key in (("epoch", "train_ppl"),
                                                                     ("epoch", "valid_ppl"),
                                                                     ("test", "test_ppl"))),
            fmt(t2, ".0f", " s"), fmt(t1, ".0f", " s"),
            " / ".join(map(str, PUBLISHED[name])), machine([run, run1, run2])]
        row = name.replace("config_", "") + (", bf16" if precision(run) == "bf16" else "") + label
        rows.append(f"| {row} | {' | '.join(cells)} |")
    return rows


def paired_table(subjects, reference_of, header, label=lambda r: ""):
    """Each run of `subjects`: its valid perplexity per epoch against its reference_of(run) at
    the same epoch (the test perplexity too, where both ran as many epochs and have one); the
    first cell is its config and `label(run)`."""
    rows = [header, "|" + " --- |" * 6]
    for r in sorted(subjects, key=lambda r: r["name"]):
        ref_run = reference_of(r)
        reference = {n: e["valid_ppl"]
                     for n, e in epoch_ends(ref_run["events"] if ref_run else []).items()}
        pairs = [(n, e["valid_ppl"], reference.get(n))
                 for n, e in sorted(epoch_ends(r["events"]).items())]
        tests = [last(x, "test", "test_ppl") if x else None for x in (r, ref_run)]
        if all(tests) and epoch_count(r) == epoch_count(ref_run):
            pairs.append(("test", *tests))
        for epoch, value, ref in pairs:
            diff = f"{100 * (value - ref) / ref:+.2f} %" if ref else "—"
            config = r["config"]["name"].replace("config_", "")
            rows.append(f"| {config}{label(r)} | {r['workers']} | "
                        f"{epoch} | {value:.2f} | {fmt(ref, '.2f')} | {diff} |")
    return rows


def bf16_table(runs):
    """Each bf16 run's valid perplexity per epoch against the fp32 run of the same config,
    workers, Keras and seed at the same epoch (the test perplexity too, where both have one):
    then the precision is all that differs."""
    fp32 = fp32_only(runs)
    return paired_table(
        [r for r in runs if precision(r) == "bf16"],
        lambda r: longest_trained([x for x in fp32 if keras(x) == keras(r)
                                   and seed_of(x) == seed_of(r)], r["config"]["name"],
                                  r["workers"]),
        "| config | workers | epoch | valid ppl, bf16 | valid ppl, fp32 | difference |",
        lambda r: (", Keras 3" if keras(r) == "Keras 3" else "")
        + (f", seed {seed_of(r)}" if is_seed_run(r) else ""))


def keras(run):
    """"Keras 3" for a run on TensorFlow's own Keras 3 (its environment records Keras 3.x), else
    "tf-keras": the runs from before Keras 3 was the default recorded no Keras."""
    return "Keras 3" if str(run.get("env", {}).get("keras", "")).startswith("3") else "tf-keras"


def keras3_only(runs):
    return [r for r in runs if keras(r) == "Keras 3"]


def tf_keras_only(runs):
    return [r for r in runs if keras(r) == "tf-keras"]


def keras3_table(runs):
    """Each Keras 3 run's valid perplexity per epoch against the tf-keras run of the same
    config, workers and precision (the same seed draws other first weights under each Keras)."""
    legacy = tf_keras_only(runs)
    return paired_table(
        keras3_only(runs),
        lambda r: longest_trained([x for x in legacy if precision(x) == precision(r)],
                                  r["config"]["name"], r["workers"]),
        "| config | workers | epoch | valid ppl, Keras 3 | valid ppl, tf-keras | difference |")


DEFAULT_SEED = 1234  # the trainers' --seed


def seed_of(run):
    """The --seed its command gave the trainer (the trainers' default where none)."""
    words = shlex.split(run.get("command", ""))
    return int(words[words.index("--seed") + 1]) if "--seed" in words else DEFAULT_SEED


def is_seed_run(run):
    """A run of `make reproduce SEED=N`, one of a row's several seeds (folder ...-seedN)."""
    return re.search(r"-seed\d+$", run["name"]) is not None


def seed_runs(runs):
    return [r for r in runs if is_seed_run(r)]


def seeds_row(group, label):
    """README's row of one config trained with several seeds (`group`: its runs, finished or
    not): train and valid as the mean of the finished seeds, test as their mean and its spread
    (min-max); the unfinished ones named in the epochs cell."""
    done = sorted((r for r in group if r["kind"] == "full"), key=seed_of)
    left = sorted((r for r in group if r["kind"] != "full"), key=seed_of)
    name = group[0]["config"]["name"]
    if not done:
        return None
    mean = {key: statistics.mean(last(r, event, key) for r in done)
            for event, key in (("epoch", "train_ppl"), ("epoch", "valid_ppl"),
                               ("test", "test_ppl"))}
    tests = [last(r, "test", "test_ppl") for r in done]
    spread = f" ({min(tests):.2f}-{max(tests):.2f})" if len(tests) > 1 else ""
    epochs = f"{epoch_count(done[0])}" + "".join(
        f"; seed {seed_of(r)}: {epoch_count(r)} of {paper_epochs(name)} so far" for r in left)
    times = [epoch_time(r) for r in done]
    t = statistics.median(times)
    where = "2 workers" if done[0]["workers"] == 2 else "1 process"
    seeds = ", ".join(str(seed_of(r)) for r in done)
    cells = [epochs, f"{mean['train_ppl']:.2f}", f"{mean['valid_ppl']:.2f}",
             f"{mean['test_ppl']:.2f}{spread}", *(
                 (fmt(t, ".0f", " s"), "—") if where == "2 workers" else ("—", fmt(t, ".0f", " s"))),
             " / ".join(map(str, PUBLISHED[name])), machine(done)]
    row = (name.replace("config_", "") + (", bf16" if precision(done[0]) == "bf16" else "")
           + f"{label}, seed{'s' * (len(done) > 1)} {seeds}")
    return f"| {row} | {' | '.join(cells)} |"


def shipped_precision(group):
    """Of a config's seed runs, those of one precision, never averaged across two: fp32 (the
    configs' own) where one of them finished, else the first precision where one did."""
    finished = [precision(r) for r in group if r["kind"] == "full"]
    chosen = "fp32" if "fp32" in finished else (finished or ["fp32"])[0]
    return [r for r in group if precision(r) == chosen]


def results_block(runs):
    """The lines between the results markers of README.md: a row per config from the code as
    shipped (Keras 3: the mean of its seeds where it ran several), else from tf-keras, labelled
    so; the other rows are in results/README.md."""
    rows = paper_table([])
    keras3, seeded = keras3_only(runs), seed_runs(runs)
    for name in CONFIGS:
        group = shipped_precision([r for r in keras3
                                   if r in seeded and r["config"]["name"] == name])
        row = seeds_row(group, ", Keras 3") if group else None
        if row is None:
            one = [r for r in keras3 if r not in seeded and r["config"]["name"] == name]
            row = (paper_table(one, ", Keras 3")[2:] or
                   paper_table([r for r in tf_keras_only(runs) if r["config"]["name"] == name],
                               ", tf-keras")[2:] or [None])[0]
        if row:
            rows.append(row)
    return rows


def every_row(runs):
    """results/README.md's table of every config's rows: tf-keras's, then Keras 3's, each seed's
    run a row of its own."""
    keras3, seeded = keras3_only(runs), seed_runs(runs)
    rows = paper_table(tf_keras_only(runs), ", tf-keras")
    for r in sorted(keras3, key=lambda r: (r["config"]["name"], r in seeded, seed_of(r))):
        seed = f", seed {seed_of(r)}" if r in seeded else ""
        rows += paper_table([r], f", Keras 3{seed}, commit {r['env']['commit']}")[2:]
    return rows


def fp32_only(runs):
    return [r for r in runs if precision(r) == "fp32"]


def results_readme(all_runs):
    """results/README.md: the full table and every run's provenance."""
    runs = tf_keras_only(all_runs)  # the tables' runs; the Keras 3 ones in a table of their own
    return "\n".join([
        "# Results: every run behind the table, with its command, date and machine", "",
        "Where each kind lives:", "",
        *(f"- [`{folder}`]({folder}): {what}" for folder, what in LAYOUT), "",
        "Only what runs wrote is here; each log names the command that made it, and the probes "
        "among those commands are in [`scripts/probes/`](../scripts/probes/).", "",
        "README's table shows a row per config from the code as shipped; every row of every "
        "config, each with the Keras it trained on (tf-keras until Keras 3 became the default, "
        "docs/keras3.md) and each seed's run apart:", "", *every_row(all_runs), "",
        "Generated by `make results` from the logs in this folder; do not edit by hand. Each "
        "perplexity cell gives the 2-worker run, then the one-process run, for the last epoch "
        "(train, valid) and the test set after training; \"bounded\" rows time only the first "
        "steps of an epoch and scale them to a full epoch.", "",
        *table(fp32_only(runs)), "", "![perplexity per epoch](runs/perplexity.png) "
        "![words/sec against workers](runs/wps.png)", "",
        "Per epoch: the longest fp32 runs of each config, and its longest bf16 run beside them.",
        "",
        "Epoch by epoch, the longest 2-worker run of each config against its longest one-process "
        "run (difference: 2 workers relative to one process):", "",
        *epoch_by_epoch(fp32_only(runs)), "",
        "bf16 runs (precision='bf16', docs/precision.md), apart from the table above, against "
        "the fp32 run of the same config, workers, Keras and seed:", "", *bf16_table(all_runs),
        "",
        "The tables above but the bf16 one are of runs on tf-keras (Keras 2), the default "
        "before Keras 3 (docs/keras3.md). Runs on Keras 3, against the tf-keras run of the "
        "same config, workers and precision:", "", *keras3_table(all_runs), "",
        "Runs (command, date, machine):", "",
        *provenance(all_runs), ""])


def build():
    runs = load_all()
    if not runs:
        sys.exit("error: no runs under results/runs/; record some first")
    plots(tf_keras_only(runs))
    path = os.path.join(REPO, "README.md")
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(replace_block(text, BEGIN, END, results_block(runs)))
    with open(os.path.join(RESULTS, "README.md"), "w") as f:
        f.write(results_readme(runs))
    study = netstudy_block()
    if study:
        path = os.path.join(REPO, "docs", "network.md")
        with open(path) as f:
            text = f.read()
        with open(path, "w") as f:
            f.write(replace_block(text, NET_BEGIN, NET_END, study))
    print(f"README.md table, results/README.md and results/runs/*.png rebuilt from {len(runs)} "
          "runs")


def read_events(path):
    """The events of a metrics.jsonl, or of the one in folder `path`."""
    path = os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path
    with open(path) as f:
        return [json.loads(line) for line in f]


def side_by_side(run_a, run_b, label_a, label_b, first=1):
    """Markdown rows: each epoch from `first` that both runs finished, "a / b" in each cell."""
    a, b = (epoch_ends(read_events(path)) for path in (run_a, run_b))
    rows = [f"| epoch | lr, {label_a} / {label_b} | train | valid |", "|" + " --- |" * 4]
    for n in sorted(set(a) & set(b)):
        if n >= first:
            rows.append(f"| {n} | {a[n]['lr']:.4g} / {b[n]['lr']:.4g} | "
                        f"{a[n]['train_ppl']:.2f} / {b[n]['train_ppl']:.2f} | "
                        f"{a[n]['valid_ppl']:.2f} / {b[n]['valid_ppl']:.2f} |")
    return rows


def main(argv):
    if argv[:1] == ["build"]:
        build()
    elif argv[:1] == ["record"] and len(argv) > 4 and argv[2] in ("full", "partial", "bounded") \
            and argv[3] == "--":
        record(argv[1], argv[2], argv[4:])
    elif argv[:1] == ["side-by-side"] and len(argv) in (5, 6):
        print("\n".join(side_by_side(*argv[1:5], *map(int, argv[5:]))))
    elif argv[:1] == ["keep"] and len(argv) == 5:  # adopt a run made by hand: NAME KIND DIR CMD
        env = json.loads(subprocess.run([sys.executable, os.path.join(REPO, "scripts",
                                                                      "record_env.py")],
                                        capture_output=True, text=True, check=True).stdout)
        keep(argv[1], argv[2], argv[4], argv[3], env)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
