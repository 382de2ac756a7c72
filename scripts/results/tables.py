"""The tables, built only from committed logs under results/: README's results table (between
its results markers) and results/README.md (every row, the bounded times, epoch by epoch, the
bf16 and Keras 3 runs against their references, every run's provenance)."""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.results.common import (REPO, RESULTS, CONFIGS, epoch_count, epoch_ends,  # noqa: E402
                                    epoch_time, fp32_only, is_seed_run, keras, keras3_only, last,
                                    longest_runs, longest_trained, machine, precision,
                                    rewrite_block, seed_of, seed_runs, tf_keras_only)
from utils import config  # noqa: E402


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


# Test perplexity published for each config (README links them): Texar's Horovod example (2 GPUs),
# TensorFlow's tutorial (ptb_word_lm.py), Zaremba et al. 2014, Table 1 (small: non-regularized)
PUBLISHED = {"config_small": (114.72, 115.91, 114.5), "config_medium": (84.42, 82.07, 82.7),
             "config_large": (78.72, 78.29, 78.4)}


def fmt(x, spec=".1f", unit=""):
    return "—" if x is None else format(x, spec) + unit


# A time cell from a training run's own epochs: those runs shared their machine with other work
# (tests, builds, other runs) for some epochs, so their times are not a comparison of 1 process
# with 2 workers; `make timing` (scripts/results/timing.py) is.
SHARED = "†"


def is_timing(run):
    return "timing" in run


def trained(runs):
    """The runs that trained (full, partial, running, the old bounded ones), not make timing's."""
    return [r for r in runs if not is_timing(r)]


def timings(runs):
    """Each config of each `make timing` measurement, oldest first: a dict of its id, config
    name, rounds [(round, 1-process s/epoch, 2-worker s/epoch, their ratio)] (the rounds where
    both sides ran), the medians over them (t1, t2), the median of the ratios (speedup), its
    runs, and whether it shared the machine (--force, or other processes busy during a run)."""
    by = {}
    for r in runs:
        if is_timing(r):
            key = (r["timing"]["id"], r["config"]["name"], precision(r), keras(r))
            by.setdefault(key, {}).setdefault(r["timing"]["round"], {})[r["workers"]] = r
    found = []
    for (mid, name, prec, keras_used), rounds in sorted(by.items()):
        pairs = [(n, sides[1], sides[2]) for n, sides in sorted(rounds.items())
                 if 1 in sides and 2 in sides]
        if not pairs:
            continue
        rows = [(n, epoch_time(one), epoch_time(two)) for n, one, two in pairs]
        rows = [(n, t1, t2, t1 / t2) for n, t1, t2 in rows]
        kept = [r for _, one, two in pairs for r in (one, two)]
        found.append({"id": mid, "name": name, "precision": prec, "keras": keras_used,
                      "rounds": rows, "runs": kept,
                      "t1": statistics.median(t1 for _, t1, _, _ in rows),
                      "t2": statistics.median(t2 for _, _, t2, _ in rows),
                      "speedup": statistics.median(x for _, _, _, x in rows),
                      "shared": sorted({s for r in kept for s in r.get("shared", [])})})
    return found


def newest_idle_timings(runs):
    """Per config, precision and Keras, the newest `make timing` measurement on an idle machine:
    the ones README's time cells and results/runs/wps.png give."""
    newest = {}
    for t in timings(runs):
        if not t["shared"]:
            newest[(t["name"], t["precision"], t["keras"])] = t
    return list(newest.values())


def idle_timing(runs, row_run):
    """The newest `make timing` measurement on an idle machine of the config, precision and
    Keras of `row_run` (a row's run), or None: a bf16 row's times are bf16's."""
    key = (row_run["config"]["name"], precision(row_run), keras(row_run))
    return next((t for t in newest_idle_timings(runs)
                 if (t["name"], t["precision"], t["keras"]) == key), None)


def time_cells(t2, t1, timing):
    """The cells time/epoch 2 workers, 1 process and speed-up: a `make timing` measurement's
    medians where there is one, else the training runs' own times marked SHARED (no speed-up:
    those times are no comparison)."""
    if timing:
        return [fmt(timing["t2"], ".0f", " s"), fmt(timing["t1"], ".0f", " s"),
                f"{timing['speedup']:.2f}×"]
    return [marked(t2), marked(t1), "—"]


def marked(seconds, spec=".0f"):
    """A training run's time cell: marked SHARED, "—" where there is none."""
    return fmt(seconds, spec, " s") + (SHARED if seconds else "")


def machine_cell(runs, timing):
    """The machine of the row's runs, and that of its times where `make timing` ran elsewhere."""
    where = machine(runs)
    times = timing and machine(timing["runs"])
    return where if not times or times == where else f"{where}; times: {times}"


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
        speedup = f"{t1 / t2:.2f}×{SHARED}" if t1 and t2 else "—"
        label = {"full": "full",
                 "running": f"running ({epochs} of {paper_epochs(name)} epochs so far)",
                 "partial": f"partial ({epochs} of {paper_epochs(name)} epochs"
                 + (f"; {borrowed_from(dist)}" if borrowed_from(dist) else "")
                 + lost_note(runs, single, dist) + ")",
                 "bounded": "bounded"}[kind]
        if kind == "bounded":  # the old single rounds, of TensorFlow 2.15 so far
            tf = (dist or single)["env"]["tensorflow"]
            label = f"bounded (TF {tf}; time from the first steps)"
        if kind == "bounded":
            cells = ["—"] * 4
        else:
            cells = [str(epochs), perplexities(single, dist, "epoch", "train_ppl"),
                     perplexities(single, dist, "epoch", "valid_ppl"),
                     perplexities(single, dist, "test", "test_ppl")]
        rows.append(f"| {name.replace('config_', '')} | {label} | {' | '.join(cells)} | "
                    f"{marked(t2, '.1f')} | {marked(t1, '.1f')} | {speedup} |")
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
        if is_timing(r):
            t = r["timing"]
            note = (f"`make timing` measurement {t['id']}, round {t['round']}, started "
                    f"{t['started_utc']} UTC; beside it: "
                    + ("; ".join(r.get("shared", [])) or "nothing"))
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


TIME_HEADER = "time/epoch, 2 workers | time/epoch, 1 process | speed-up, 2 workers"


def paper_table(runs, label="", timing=None):
    """README's table, in the shape of the published ones: a row per config, the run of the
    card's command, both times per epoch (from timing(run), a `make timing` measurement, where
    it gives one; else the runs' own, marked), and the published test perplexities beside;
    `label` after each row's config name."""
    rows = ["| config | epochs | train | valid | test | " + TIME_HEADER + " | published test: "
            "Texar / TF tutorial / paper | machine |", "|" + " --- |" * 10]
    for name in CONFIGS:
        run = card_run(runs, name)
        if run is None:
            continue
        alike = [r for r in runs if precision(r) == precision(run)]  # times in its precision
        run2, run1 = (r if r and epoch_count(r) else None  # timed: with an epoch done
                      for r in (longest_trained(alike, name, 2), longest_trained(alike, name, 1)))
        t2, t1 = (r and epoch_time(r) for r in (run2, run1))
        timed = timing and timing(run)
        cells = [epochs_cell(run, name, runs), *(fmt(last(run, event, key), ".2f")
                                                  for event, key in (("epoch", "train_ppl"),
                                                                     ("epoch", "valid_ppl"),
                                                                     ("test", "test_ppl"))),
                 *time_cells(t2, t1, timed), " / ".join(map(str, PUBLISHED[name])),
                 machine_cell([run] if timed else [run, run1, run2], timed)]
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


def keras3_table(runs):
    """Each Keras 3 run's valid perplexity per epoch against the tf-keras run of the same
    config, workers and precision (the same seed draws other first weights under each Keras)."""
    legacy = tf_keras_only(runs)
    return paired_table(
        keras3_only(runs),
        lambda r: longest_trained([x for x in legacy if precision(x) == precision(r)],
                                  r["config"]["name"], r["workers"]),
        "| config | workers | epoch | valid ppl, Keras 3 | valid ppl, tf-keras | difference |")


def seeds_row(group, label, timing=lambda run: None):
    """README's row of one config trained with several seeds (`group`: its runs, finished or
    not): train and valid as the mean of the finished seeds, test as their mean and its spread
    (min-max); the unfinished ones named in the epochs cell; the time the median of the seeds'
    median epochs, marked, unless timing(run) (a `make timing` measurement) gives the times."""
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
    t = statistics.median(epoch_time(r) for r in done)
    timed = timing(done[0])
    two = done[0]["workers"] == 2
    seeds = ", ".join(str(seed_of(r)) for r in done)
    cells = [epochs, f"{mean['train_ppl']:.2f}", f"{mean['valid_ppl']:.2f}",
             f"{mean['test_ppl']:.2f}{spread}", *time_cells(t if two else None,
                                                            None if two else t, timed),
             " / ".join(map(str, PUBLISHED[name])), machine_cell(done, timed)]
    row = (name.replace("config_", "") + (", bf16" if precision(done[0]) == "bf16" else "")
           + f"{label}, seed{'s' * (len(done) > 1)} {seeds}")
    return f"| {row} | {' | '.join(cells)} |"


def shipped_precision(group):
    """Of a config's seed runs, those of one precision, never averaged across two: fp32 (the
    configs' own) where one of them finished, else the first precision where one did."""
    finished = [precision(r) for r in group if r["kind"] == "full"]
    chosen = "fp32" if "fp32" in finished else (finished or ["fp32"])[0]
    return [r for r in group if precision(r) == chosen]


def results_block(all_runs):
    """The lines between the results markers of README.md: a row per config from the code as
    shipped (Keras 3: the mean of its seeds where it ran several), else from tf-keras, labelled
    so; the other rows are in results/README.md. The times of a config come from its newest
    `make timing` on an idle machine where there is one; the notes under the table say where
    each time comes from."""
    runs = trained(all_runs)
    used = []

    def timing(run):
        found = idle_timing(all_runs, run)
        used.extend([found] if found and found not in used else [])
        return found
    rows = paper_table([])
    keras3, seeded = keras3_only(runs), seed_runs(runs)
    for name in CONFIGS:
        group = shipped_precision([r for r in keras3
                                   if r in seeded and r["config"]["name"] == name])
        row = seeds_row(group, ", Keras 3", timing) if group else None
        if row is None:
            one = [r for r in keras3 if r not in seeded and r["config"]["name"] == name]
            row = (paper_table(one, ", Keras 3", timing)[2:] or
                   paper_table([r for r in tf_keras_only(runs) if r["config"]["name"] == name],
                               ", tf-keras", timing)[2:] or [None])[0]
        if row:
            rows.append(row)
    return rows + time_notes(rows, used)


def time_notes(rows, measured):
    """The lines under README's table that say what its time cells are."""
    notes = []
    for t in filter(None, measured):
        env = t["runs"][0]["env"]
        notes.append(f"- {t['name'].replace('config_', '')}: times without {SHARED} from `make "
                     f"timing` ({env['date_utc']} UTC, commit {env['commit']}, {env['cpu']}, "
                     f"{t['precision']}, {t['keras']}), {len(t['rounds'])} rounds.")
    if notes:  # how every such time was taken, said once
        notes.append(f"- A time without {SHARED}: rounds of a bounded run of each side in turns "
                     "on an idle machine, the median over the rounds of the run's time per epoch "
                     "(its median step after the first log window, times a full epoch's steps); "
                     "the speed-up is the median of the rounds' own ratios.")
    if any(SHARED in row for row in rows[2:]):
        notes.append(f"- {SHARED}: the training run's own time per epoch, the median of its "
                     "epochs (a row of seeds: the median of the seeds' medians); those runs "
                     "shared the machine with other work for some of their epochs "
                     "([results/README.md](results/README.md) names what), so these times "
                     "are no comparison of one process with 2 workers, and give no speed-up.")
    return ["", *notes] if notes else []


def every_row(runs):
    """results/README.md's table of every config's rows: tf-keras's, then Keras 3's, each seed's
    run a row of its own."""
    keras3, seeded = keras3_only(runs), seed_runs(runs)
    rows = paper_table(tf_keras_only(runs), ", tf-keras")
    for r in sorted(keras3, key=lambda r: (r["config"]["name"], r in seeded, seed_of(r))):
        seed = f", seed {seed_of(r)}" if r in seeded else ""
        rows += paper_table([r], f", Keras 3{seed}, commit {r['env']['commit']}")[2:]
    return rows


def timing_section(runs):
    """results/README.md's lines of every `make timing` measurement: each round's times per
    epoch and ratio, the medians, the machine, commit and date, and what else ran."""
    found = timings(runs)
    if not found:
        return ["None yet: `make timing` on an idle machine ([docs/performance.md]"
                "(../docs/performance.md#time-per-epoch-one-process-against-2-workers)).", ""]
    lines = []
    for t in found:
        env, first = t["runs"][0]["env"], t["runs"][0]["timing"]
        beside = "; ".join(t["shared"]) if t["shared"] else "nothing (an idle machine)"
        state = first.get("machine_state", {})
        lines += [f"{t['name'].replace('config_', '')}, measurement {t['id']} ({env['date_utc']} "
                  f"UTC, {env['cpu']}, {env['cores']} cores, TF {env['tensorflow']}, Keras "
                  f"{env.get('keras', '—')}, {t['precision']}, commit {env['commit']}; "
                  f"{first['steps']} steps a "
                  f"run; load {state.get('load_per_core', '—')} per core at its start; beside "
                  f"it: {beside}" + (f"; {SHARED} shared: not in README's table" if t["shared"]
                                      else "") + "):", "",
                  "| round | first | time/epoch, 1 process | time/epoch, 2 workers | 1 process / "
                  "2 workers |", "|" + " --- |" * 5]
        for n, t1, t2, ratio in t["rounds"]:
            side = next(r["timing"]["side"] for r in t["runs"]
                        if r["timing"]["round"] == n and r["timing"]["first"])
            lines.append(f"| {n} | {side} | {t1:.1f} s | {t2:.1f} s | {ratio:.3f} |")
        lines += [f"| median | | {t['t1']:.1f} s | {t['t2']:.1f} s | {t['speedup']:.3f} |", ""]
    return lines


def results_readme(all_runs):
    """results/README.md: the full table and every run's provenance."""
    timed, all_runs = all_runs, trained(all_runs)
    runs = tf_keras_only(all_runs)  # the tables' runs; the Keras 3 ones in a table of their own
    return "\n".join([
        "# Results: every run behind the table, with its command, date and machine", "",
        "Where each kind lives:", "",
        *(f"- [`{folder}`]({folder}): {what}" for folder, what in LAYOUT), "",
        "Only what runs wrote is here; each log names the command that made it, and the probes "
        "among those commands are in [`scripts/probes/`](../scripts/probes/) (a probe removed "
        "since is named with the commit that had it). The benchmark's logs from before its "
        "split name scripts/benchmark.py and a flag for each mode, a file each in "
        "[`scripts/bench/`](../scripts/bench/) since ([performance.md](../docs/performance.md#"
        "performance)).", "",
        "README's table shows a row per config from the code as shipped; every row of every "
        "config, each with the Keras it trained on (tf-keras until Keras 3 became the default, "
        "docs/keras3.md) and each seed's run apart:", "", *every_row(all_runs), "",
        "Generated by `make results` from the logs in this folder; do not edit by hand. Each "
        "perplexity cell gives the 2-worker run, then the one-process run, for the last epoch "
        "(train, valid) and the test set after training; \"bounded\" rows time only the first "
        "steps of an epoch and scale them to a full epoch. Every time here is a training "
        f"run's own, marked {SHARED}: the trained runs shared the machine with other work at "
        "times (their provenance below says what), the bounded ones are single runs of "
        "TensorFlow 2.15 not checked for it, so the speed-ups between them are no measurement; "
        "`make timing`'s, on an idle machine, are at the end.", "",
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
        "Time per epoch, one process against 2 workers, on an idle machine unless said (`make "
        "timing`: bounded runs of each side in turns; a run's time per epoch is its median "
        "step after the first log window times the steps of the config's full epoch; the "
        "median row takes each column's median over the rounds, and the median of the rounds' "
        "ratios):", "", *timing_section(timed),
        "Runs (command, date, machine):", "",
        *provenance(timed), ""])


def write(runs):
    """README's table and results/README.md, from `runs` (all of results/runs/)."""
    rewrite_block(os.path.join(REPO, "README.md"), BEGIN, END, results_block(runs))
    with open(os.path.join(RESULTS, "README.md"), "w") as f:
        f.write(results_readme(runs))
