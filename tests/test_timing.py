"""make timing (scripts/results/timing.py): the tables' arithmetic on hand-made measurements; the
refusal of a machine that is not idle; and `make timing` itself on the tiny config, 2 rounds,
whose kept runs the tables read as the test reads them by hand."""
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time

from scripts.results import common, plots, tables, timing
from tests.helpers import REPO, TINY, kill_job, run_job, script_env

ENV = {"cpu": "AMD EPYC", "cores": 2, "date_utc": "2026-12-02 01:00", "commit": "abc1234",
       "tensorflow": "2.21.0", "keras": "3.15.1"}


def bounded(name, workers, step_s, mid, n, first, shared=(), env=ENV):
    """A make timing run of config_small (2,323 steps an epoch): 11 progress events of
    constant step time, and the timing block as timing.py writes it."""
    events = [{"event": "progress", "step": 10 * i, "time": 10 * i * step_s, "wps": 0,
               "world_size": workers} for i in range(1, 12)]
    return {"name": name, "kind": "bounded", "workers": workers, "events": events, "env": env,
            "config": {"name": name, "batch_size": 20, "num_steps": 20},
            "shared": list(shared), "command": "c",
            "timing": {"id": mid, "round": n, "side": "2 workers" if workers == 2 else
                       "1 process", "first": first, "steps": 110, "started_utc": "s",
                       "machine_state": {"load_per_core": 0.1}}}


def measurement(mid, step_times, shared=(), env=ENV, name="config_small"):
    """Rounds of (1-process step s, 2-worker step s), the first side alternating."""
    runs = []
    for n, (one, two) in enumerate(step_times, 1):
        runs += [bounded(name, 1, one, mid, n, n % 2 == 1, shared, env),
                 bounded(name, 2, two, mid, n, n % 2 == 0, shared, env)]
    return runs


def full_small_run():
    """The row's trained run: 2 workers, 2 epochs of 300 s on a shared machine."""
    events = [{"event": "epoch", "epoch": n, "train_ppl": 50.0, "valid_ppl": 60.0,
               "epoch_time_s": 300.0} for n in (1, 2)] + [{"event": "test", "test_ppl": 58.0}]
    return {"name": "small-2workers", "kind": "full", "workers": 2, "events": events,
            "env": ENV, "command": "c", "config": {"name": "config_small", "batch_size": 20,
                                                   "num_steps": 20}}


def test_the_table_takes_each_sides_median_over_the_rounds_and_the_median_of_their_ratios():
    # step s (1 process, 2 workers) per round: ratios 2.0, 2.5, 1.2 (median 2.0); the sides'
    # medians 1.2 and 0.8 s a step, whose own ratio (1.5) is not what the table shows
    idle = measurement("2026-12-02-0100", [(1.0, 0.5), (2.0, 0.8), (1.2, 1.0)])
    # a newer measurement on a shared machine (--force), and a round with one side only
    shared = measurement("2026-12-03-0100", [(1.0, 1.0)], shared=["--force: the suite"])
    broken = measurement("2026-12-02-0100", [(9.0, 9.0)])[:1]
    broken[0]["timing"]["round"] = 4
    runs = [full_small_run(), *idle, *shared, *broken]
    found = tables.timings(runs)
    assert [(t["id"], len(t["rounds"])) for t in found] == [("2026-12-02-0100", 3),
                                                           ("2026-12-03-0100", 1)]
    t = tables.idle_timing(runs, full_small_run())
    assert t["id"] == "2026-12-02-0100"
    assert abs(t["t1"] - 1.2 * 2323) < 1e-6 and abs(t["t2"] - 0.8 * 2323) < 1e-6
    assert abs(t["speedup"] - 2.0) < 1e-9
    block = tables.results_block(runs)
    assert block[2].startswith("| small, Keras 3 | 2 | 50.00 | 60.00 | 58.00 | 1858 s | "
                               "2788 s | 2.00× | 114.72 / 115.91 / 114.5 | AMD EPYC, 2 cores |")
    assert block[4].startswith("- small: times without † from `make timing` (2026-12-02 01:00 "
                               "UTC, commit abc1234, AMD EPYC, fp32, Keras 3), 3 rounds")
    assert not any(line.startswith("- †") for line in block)  # no marked cell left
    section = tables.timing_section(runs)
    assert "| 2 | 2 workers | 4646.0 s | 1858.4 s | 2.500 |" in section
    assert "| median | | 2787.6 s | 1858.4 s | 2.000 |" in section
    assert any("beside it: --force: the suite; † shared: not in README's table" in line
               for line in section)
    # the times measured on another machine than the row's perplexities: both named
    elsewhere = measurement("2026-12-04-0100", [(1.0, 0.5)], env=dict(ENV, cpu="Intel Xeon"))
    assert tables.results_block([full_small_run(), *elsewhere])[2].endswith(
        "| AMD EPYC, 2 cores; times: Intel Xeon, 2 cores |")
    # a row of tf-keras, or of bf16, takes no times of Keras 3 in fp32 (its own where they ran)
    legacy = dict(full_small_run(), env={k: v for k, v in ENV.items() if k != "keras"})
    assert " | 300 s† | — | — | " in tables.results_block([legacy, *idle])[2]
    half = dict(full_small_run(), config={"name": "config_small", "batch_size": 20,
                                          "num_steps": 20, "precision": "bf16"})
    bf16 = [dict(r, config=dict(r["config"], precision="bf16"))
            for r in measurement("2026-12-05-0100", [(0.5, 0.4)])]
    assert " | 300 s† | — | — | " in tables.results_block([half, *idle])[2]
    assert " | 929 s | 1162 s | 1.25× | " in tables.results_block([half, *idle, *bf16])[2]
    # without an idle measurement, the training run's time is marked and has no speed-up
    assert tables.results_block([full_small_run(), *shared])[2].startswith(
        "| small, Keras 3 | 2 | 50.00 | 60.00 | 58.00 | 300 s† | — | — |")


def timing_command(*args):
    return [sys.executable, "scripts/results/timing.py", *args]


def test_the_words_per_second_plot_draws_each_configs_newest_idle_measurement():
    """results/runs/wps.png: 1 process and 2 workers of each config's newest idle make timing,
    as words/sec. By hand: small's epoch is 2,323 steps of 20 x 20 words, so a step of s
    seconds is 400 / s words/sec; the sides' medians, 1.2 and 0.8 s, give 333.3 and 500."""
    older = measurement("2026-12-01-0100", [(4.0, 4.0)])
    idle = measurement("2026-12-02-0100", [(1.0, 0.5), (2.0, 0.8), (1.2, 1.0)])
    shared = measurement("2026-12-03-0100", [(1.0, 1.0)], shared=["--force: the suite"])
    bf16 = [dict(r, config=dict(r["config"], precision="bf16"))
            for r in measurement("2026-12-02-0200", [(0.5, 0.4)])]
    points = plots.throughput_points(tables.newest_idle_timings([*older, *idle, *shared, *bf16]))
    assert list(points) == ["small", "small, bf16"]
    (one, wps1), (two, wps2) = points["small"]
    assert (one, two) == (1, 2) and abs(wps1 - 400 / 1.2) < 1e-9 and abs(wps2 - 500) < 1e-9
    assert [round(w, 6) for _, w in points["small, bf16"]] == [800, 1000]


def test_a_machine_that_is_not_idle_is_refused_in_one_line_naming_what_runs(corpus, tmp_path):
    """Busy loops on half the cores, and a process whose command line is a trainer's: timing.py
    stops in one line that names both, exit 1, before any run; a --force without its note and
    a config that is none are one line too."""
    env = script_env()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(max(os.cpu_count() // 2, 1))]
    trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                "lm_ptb_distributed.py"], start_new_session=True)
    try:
        time.sleep(0.5)
        state = timing.machine_state(look_s=1.0)
        r = subprocess.run(timing_command("--configs", TINY, "--rounds", "1", "--steps", "20",
                                          "--data_path", corpus, "--results", str(tmp_path)),
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    finally:
        for p in (*busy, trainer):
            kill_job(p)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stdout + r.stderr
    assert lines[0].startswith("error: the machine is not idle"), lines
    assert "another training runs (pid " in lines[0], lines
    assert "of the cores were busy over 2 s" in lines[0] and "--force" in lines[0], lines
    # what it saw: the trainer by its command line, the busy loops' cores (half of them)
    assert any(t.startswith(f"pid {trainer.pid}: ") for t in state["trainings"]), state
    assert not any(t.startswith(f"pid {busy[0].pid}: ") for t in state["trainings"]), state
    assert state["busy_share"] >= 0.45 and timing.why_not_idle(state), state
    assert not timing.is_training(["vim", "lm_ptb.py"])  # an editor of a trainer is none
    assert os.listdir(tmp_path) == []
    for args, says in ((["--force", " "], "--force needs a note"),
                       (["--configs", "config_none"], "error: unknown config 'config_none'")):
        r = subprocess.run(timing_command(*args), cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0 and says in r.stderr.strip().splitlines()[-1], r.stderr
        assert "Traceback" not in r.stderr


def epoch_s_by_hand(folder):
    """The run's time per epoch, from its metrics.jsonl: the median seconds a step of its log
    windows after the first, times the tiny config's steps of a PTB epoch (929,589 training
    tokens in 20 rows of 10-step windows)."""
    with open(os.path.join(folder, "metrics.jsonl")) as f:
        progress = [e for e in map(json.loads, f) if e["event"] == "progress"]
    steps = [(b["time"] - a["time"]) / (b["step"] - a["step"])
             for a, b in zip(progress, progress[1:])]
    assert len(steps) == 9  # 20 steps, a window every 2, the first (its tracing) not timed
    return statistics.median(steps) * ((929589 // 20 - 1) // 10)


def test_make_timing_keeps_each_rounds_runs_and_the_tables_give_their_medians(corpus, tmp_path):
    """`make timing` on the tiny config, 2 rounds of 20 steps, --force (the suite loads the
    machine): 4 runs kept in turns, one process first in round 1 and 2 workers in round 2,
    sharing one environment record, marked shared. results/README.md's section gives each
    round and the medians computed here from the metrics; the same logs written as an idle
    machine's (no shared mark) and named config_small give README's small row its times."""
    results = tmp_path / "runs"
    args = f'--configs {TINY} --rounds 2 --steps 20 --force "the test suite"'
    r = run_job(["make", "timing", f"RESULTS={results}", f"TIMING_ARGS={args}"], 600, cwd=REPO,
                env=dict(script_env(), PTB_DATA_PATH=corpus))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    progress = [line for line in r.stdout.splitlines() if line.startswith("timing: tiny")]
    assert [line.split(": ")[1] for line in progress[::2]] == [
        "tiny, round 1 of 2, 1 process (run 1 of 4)", "tiny, round 1 of 2, 2 workers (run 2 of 4)",
        "tiny, round 2 of 2, 2 workers (run 3 of 4)", "tiny, round 2 of 2, 1 process (run 4 of 4)"]
    assert all(" words/sec, " in line and " s per epoch " in line and "; ETA " in line
               for line in progress[1::2]), progress
    names = sorted(os.listdir(results))
    assert [n.split("-timing-")[0] + n[-12:] for n in names] == [
        "tiny-r1-1process", "tiny-r1-2workers", "tiny-r2-1process", "tiny-r2-2workers"]
    kept = {}
    for name in names:
        with open(results / name / "run.json") as f:
            kept[name] = json.load(f)
    envs = {json.dumps(k["env"], sort_keys=True) for k in kept.values()}
    assert len(envs) == 1 and len({k["timing"]["id"] for k in kept.values()}) == 1
    one, two = (shlex.split(kept[names[i]]["command"]) for i in (0, 1))
    assert one[1] == "lm_ptb.py" and "--log_every" in one and "steps_per_epoch=20" in one
    assert two[0] == "mpirun" and shlex.join(two).count(" -np 2 -bind-to none -map-by slot ") == 1
    assert two[two.index("lm_ptb_distributed.py") + 1:] == one[2:-1] + [two[-1]]
    starts = sorted((k["timing"]["started_utc"], k["timing"]["round"], k["timing"]["side"])
                    for k in kept.values())
    assert [(n, side) for _, n, side in starts] == [(1, "1 process"), (1, "2 workers"),
                                                    (2, "2 workers"), (2, "1 process")]
    assert all(k["shared"][0] == "--force: the test suite" and k["kind"] == "bounded"
               for k in kept.values())
    # by hand, from the metrics
    seconds = {name: epoch_s_by_hand(results / name) for name in names}
    t1 = [seconds[names[0]], seconds[names[2]]]
    t2 = [seconds[names[1]], seconds[names[3]]]
    ratios = [a / b for a, b in zip(t1, t2)]
    runs = common.load_all(str(results))
    section = tables.timing_section(runs)
    assert "| 1 | 1 process | %.1f s | %.1f s | %.3f |" % (t1[0], t2[0], ratios[0]) in section
    assert "| 2 | 2 workers | %.1f s | %.1f s | %.3f |" % (t1[1], t2[1], ratios[1]) in section
    assert "| median | | %.1f s | %.1f s | %.3f |" % (statistics.median(t1), statistics.median(t2),
                                                     statistics.median(ratios)) in section
    tiny = runs[0]["config"]["name"]  # the config as given: its path
    assert [t["name"] for t in tables.timings(runs)] == [tiny]
    assert "--force: the test suite" in tables.timings(runs)[0]["shared"]  # not README's
    # the same logs as an idle machine writes them, of config_small: README's small row
    for name in names:
        folder = results / name
        with open(folder / "run.json") as f:
            record = json.load(f)
        with open(folder / "run.json", "w") as f:
            json.dump(dict(record, shared=[]), f)
        text = (folder / "metrics.jsonl").read_text()
        (folder / "metrics.jsonl").write_text(text.replace(json.dumps(tiny), '"config_small"'))
    idle = common.load_all(str(results))
    row = tables.results_block([full_small_run(), *idle])[2]
    assert " | %.0f s | %.0f s | %.2f× | " % (statistics.median(t2), statistics.median(t1),
                                              statistics.median(ratios)) in row, row
    shutil.rmtree(results)
