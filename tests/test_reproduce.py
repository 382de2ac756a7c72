"""`make reproduce`: a long run started in the background, stopped, and continued by the same
command, with real mpirun ranks and its logs copied for the results table."""
import argparse
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import time

from tests.helpers import REPO, TINY
from utils.pointers import IN_EPOCH


def reproduce(action, tmp_path, corpus, *more, epochs=3):
    args = [sys.executable, "scripts/reproduce.py", action, *more, "--config", TINY,
            "--runs_dir", str(tmp_path / "runs"), "--results_dir", str(tmp_path / "results")]
    if action == "start":
        args += ["--data_path", corpus, "--set", "steps_per_epoch=800", "--set",
                 f"num_epochs={epochs}", "--set", "eval_steps=5"]
    r = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=240)
    return r.returncode, r.stdout.strip()


def wait_for(condition, what, timeout=400):
    """A bound for a hang, not a speed: on a loaded machine a first checkpoint came after 150 s."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.3)


def test_start_stop_and_continue_with_the_same_command(long_corpus, tmp_path):
    """6 epochs of 800 tiny steps (4-6 s each here): the resumed run must still be training
    when the stop comes, after two more starts (3 epochs were once done before it, under load)."""
    corpus = long_corpus
    run_dir = tmp_path / "runs" / "tiny-np2"
    assert reproduce("status", tmp_path, corpus)[0] == 1  # nothing to report yet
    rc, out = reproduce("start", tmp_path, corpus, epochs=6)
    # it returned with the trainer's first progress line, the run going on in the background
    assert rc == 0 and "started" in out and "; its first line: [ptb] epoch 1/6 | step 100/800 " \
        in out, out
    assert alive(int((run_dir / "pid").read_text()))
    wait_for(lambda: (run_dir / "checkpoints" / "ckpt-1.index").exists(), "first checkpoint")
    # checkpoints inside the epoch too (every 100 steps of its 800), so a stop loses little
    assert list((run_dir / "checkpoints" / IN_EPOCH).glob("*.index")), "no in-epoch checkpoint"
    os.killpg(int((run_dir / "pid").read_text()), signal.SIGKILL)  # the machine is taken away
    wait_for(lambda: "stopped" in reproduce("status", tmp_path, corpus)[1], "stopped status", 30)
    # the command that continues it carries the --set values it was started with; the time
    # left follows it where epoch 1's line was logged before the kill (on a loaded machine)
    line = reproduce("status", tmp_path, corpus)[1]
    assert re.search(r" ARGS='--set steps_per_epoch=800 --set num_epochs=6 --set eval_steps=5'` "
                     r"continues it(, about \d+ h of training left at its median epoch "
                     r"\(\d+ min\))?$", line), line
    # stopped before its last epoch, with nothing running it: a partial run, not a running one
    assert json.load(open(tmp_path / "results" / "tiny-2workers" / "run.json"))["kind"] == "partial"
    assert reproduce("shared", tmp_path, corpus, "a test beside it")[0] == 0

    rc, out = reproduce("start", tmp_path, corpus, epochs=6)  # returns at its first line
    assert rc == 0 and "resumed" in out and "; its first line: [ptb] epoch " in out, out
    rc, out = reproduce("start", tmp_path, corpus, epochs=6)  # a second start while it runs
    assert rc == 0 and "already running" in out and "`make reproduce-status CONFIG=" in out, out
    rc, out = reproduce("stop", tmp_path, corpus)  # the ranks end their step, rank 0 says so
    assert rc == 0 and "stopped by SIGTERM; the newest checkpoint" in out, out
    assert "stopped;" in reproduce("status", tmp_path, corpus)[1]
    rc, out = reproduce("start", tmp_path, corpus, epochs=6)
    assert rc == 0 and "resumed" in out, out
    wait_for(lambda: "done" in reproduce("status", tmp_path, corpus)[1], "finished run")
    rc, out = reproduce("status", tmp_path, corpus)
    assert out.startswith("reproduce: ") and "6 of 6 epochs" in out and "test ppl" in out, out

    kept = tmp_path / "results" / "tiny-2workers"
    events = [json.loads(line) for line in open(kept / "metrics.jsonl")]
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == [1, 2, 3, 4, 5, 6]
    assert {e["world_size"] for e in events} == {2}
    run = json.load(open(kept / "run.json"))
    assert run["kind"] == "full" and len(run["segments"]) == 3
    assert run["note"].endswith(" segment: a test beside it"), run["note"]
    assert run["env"]["tensorflow"] and run["env"]["horovod"] and run["env"]["python"]
    assert run["env"]["keras"].startswith("3.")  # Keras 3, the default
    first, second, third = run["segments"]
    assert "--resume" not in first["command"] and second["command"].endswith("--resume")
    assert second["epochs_done_at_start"] >= 1 and second["cpu"] and second["commit"]
    assert third["command"] == second["command"]
    # Both segments' output, appended. The first one's last lines may be missing: SIGKILL ends
    # mpirun before it forwards what rank 0 printed last, though rank 0 had written the event
    # to metrics.jsonl (seen once: epoch 1's line lost, its event kept). Every epoch after the
    # checkpoint the second segment started from is its own, and so is its line.
    log = (run_dir / "train.log").read_text()
    for epoch in range(second["epochs_done_at_start"] + 1, 7):
        assert f"[ptb] epoch {epoch}/6 done" in log, log
    # the console's log goes beside the metrics, to be committed with them
    assert (kept / "train.log").read_text() == log and "stopped by SIGTERM" in log


def test_stop_lets_the_ranks_end_a_step_longer_than_mpiruns_grace(corpus, tmp_path):
    """A SIGTERM to mpirun reaches the ranks a second late and its SIGKILL a second after (Open
    MPI's odls_base_sigkill_timeout): a 3-s step (tests/slow_model.py; large's on a CPU) would be
    cut and the run's line lost. `stop` signals the ranks, which end their step and say so."""
    run_dir = tmp_path / "runs" / "tiny-np2"
    # 3-s steps: no progress line (every 100 steps) within the start's wait of 20 s
    rc, out = reproduce("start", tmp_path, corpus, "--set", "model='tests.slow_model:build'",
                        "--set", "checkpoint_every=2", "--wait_s", "20")
    assert "; its first line: none yet after 20 s" in out, out
    assert rc == 0 and "started" in out, out
    wait_for(lambda: list((run_dir / "checkpoints" / IN_EPOCH).glob("ckpt-2.index")),
             "the checkpoint of step 2")
    started = time.monotonic()
    rc, out = reproduce("stop", tmp_path, corpus)
    assert rc == 0 and "error: stopped by SIGTERM; the newest checkpoint" in out, out
    assert time.monotonic() - started < 30, out
    assert subprocess.run(["pgrep", "-f", str(run_dir)]).returncode == 1  # nothing of it left


def test_a_start_that_cannot_run_says_why_in_one_line(corpus, tmp_path):
    rc, out = reproduce("start", tmp_path, corpus, "--np", "3")  # batch_size 20 over 3 workers
    assert rc == 2 and not (tmp_path / "runs").exists(), out
    rc, out = reproduce("status", tmp_path, corpus, "--np", "0")
    assert rc == 2, out
    # more workers than this host has slots: mpirun itself refuses, within the first seconds
    workers = os.cpu_count() + 1
    started = time.monotonic()
    r = subprocess.run([sys.executable, "scripts/reproduce.py", "start", "--config", TINY,
                        "--np", str(workers), "--set", f"batch_size={workers}",
                        "--data_path", corpus, "--runs_dir", str(tmp_path / "runs")],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and not r.stdout and time.monotonic() - started < 30, r.stdout
    assert r.stderr.startswith("error: the run ended (exit 1): There are not enough "
                               "slots available") and len(r.stderr.splitlines()) == 1, r.stderr


def test_status_line_names_the_epoch_running_and_what_is_left():
    """Hand-made events of a 3-epoch run: the epoch it runs is the one after the last epoch line
    until that epoch's first progress line (after a resume, say)."""
    from scripts.reproduce import DEFAULT_RUNS_DIR, make_command, status_line
    args = argparse.Namespace(config="config_large", np=1, precision="fp32", seed=None,
                              runs_dir=DEFAULT_RUNS_DIR)
    assert make_command(args) == "make reproduce CONFIG=config_large NP=1"
    args.runs_dir, args.precision = "/var/tmp/ptb-runs/reproduce", "bf16"
    assert make_command(args) == \
        "make reproduce CONFIG=config_large NP=1 PRECISION=bf16 RUNS=/var/tmp/ptb-runs"
    assert make_command(args, {"TF_ENABLE_ONEDNN_OPTS": "0"}) == "TF_ENABLE_ONEDNN_OPTS=0 " \
        "make reproduce CONFIG=config_large NP=1 PRECISION=bf16 RUNS=/var/tmp/ptb-runs"
    # a setting the trainers make by default anyway (oneDNN on, on x86) is left out
    assert make_command(args, {"TF_ENABLE_ONEDNN_OPTS": "1"}) == (
        "make reproduce CONFIG=config_large NP=1 PRECISION=bf16 RUNS=/var/tmp/ptb-runs"
        if platform.machine() == "x86_64" else "TF_ENABLE_ONEDNN_OPTS=1 make reproduce "
        "CONFIG=config_large NP=1 PRECISION=bf16 RUNS=/var/tmp/ptb-runs")
    # a run that trains from a clone of its own is continued from there
    assert make_command(args, checkout="/var/tmp/ptb-runs/clone") == (
        "cd /var/tmp/ptb-runs/clone && make reproduce CONFIG=config_large NP=1 PRECISION=bf16 "
        "RUNS=/var/tmp/ptb-runs")
    # its seed, where not the trainer's default, and the --set values it last started with, as
    # ARGS quoted once for the user's shell and once for the Makefile recipe's
    args.seed = 2
    command = make_command(args, sets=["num_epochs=60", "model='my_models:build'"])
    words = shlex.split(command)
    assert words[:-1] == ["make", "reproduce", "CONFIG=config_large", "NP=1", "PRECISION=bf16",
                          "SEED=2", "RUNS=/var/tmp/ptb-runs"], command
    assert words[-1].startswith("ARGS=") and shlex.split(words[-1][5:]) == [
        "--set", "num_epochs=60", "--set", "model='my_models:build'"], command
    assert make_command(args, sets=["num_epochs=60"]).endswith(" ARGS='--set num_epochs=60'")
    # the status of that run: the same run named, without the trainer's values
    assert make_command(args, sets=["num_epochs=60"], target="reproduce-status") == (
        "make reproduce-status CONFIG=config_large NP=1 PRECISION=bf16 SEED=2 "
        "RUNS=/var/tmp/ptb-runs")
    # a sitting recorded before its --set values were kept apart: those past the trainer
    # command's own two; a key given twice, its last value
    from scripts.reproduce import given_sets
    recorded = ("mpirun -np 1 python lm_ptb_distributed.py --set \"precision='bf16'\" --set "
                "checkpoint_every=100 --set num_epochs=60 --set eval_steps=5 --set num_epochs=70")
    assert given_sets({"command": recorded}) == ["num_epochs=70", "eval_steps=5"]
    args.seed = 1234
    assert make_command(args).endswith("PRECISION=bf16 RUNS=/var/tmp/ptb-runs")
    cfg = {"num_epochs": 3, "name": "config_large"}
    epoch1 = {"event": "epoch", "epoch": 1, "valid_ppl": 249.3182, "config": cfg}
    progress = {"event": "progress", "epoch": 2, "step": 1400, "eta_s": 5400, "config": cfg}
    make = "make reproduce CONFIG=config_large NP=1"
    assert status_line(make, [epoch1], alive=True) == \
        "reproduce: config_large, 1 of 3 epochs, last valid ppl 249.32, running epoch 2"
    assert status_line(make, [epoch1, progress], alive=True) == \
        "reproduce: config_large, 1 of 3 epochs, last valid ppl 249.32, running epoch 2 " \
        "(step 1400), ETA 1.5 h"
    # resumed with a longer schedule: the newest config's, as the results table reads it
    longer = dict(progress, config=dict(cfg, num_epochs=5, precision="bf16"))
    assert status_line(make, [epoch1, longer], alive=True) == \
        "reproduce: config_large (bf16), 1 of 5 epochs, last valid ppl 249.32, running epoch 2 " \
        "(step 1400), ETA 1.5 h"
    assert status_line(make, [epoch1], alive=False) == \
        "reproduce: config_large, 1 of 3 epochs, last valid ppl 249.32, stopped; " \
        "`make reproduce CONFIG=config_large NP=1` continues it"
    bf16 = [dict(epoch1, config=dict(cfg, precision="bf16"))]
    assert status_line(make + " PRECISION=bf16", bf16, alive=False) == \
        "reproduce: config_large (bf16), 1 of 3 epochs, last valid ppl 249.32, stopped; " \
        "`make reproduce CONFIG=config_large NP=1 PRECISION=bf16` continues it"
    # with epoch times, the hours left at the median epoch (one slowed by tests beside it aside)
    timed = [dict(epoch1, epoch=n, epoch_time_s=s, steps=1327)
             for n, s in ((1, 2700.0), (2, 4200.0), (3, 2640.0))]
    long_cfg = dict(cfg, num_epochs=55)
    timed = [dict(e, config=long_cfg) for e in timed]
    assert status_line(make, timed, alive=False) == \
        "reproduce: config_large, 3 of 55 epochs, last valid ppl 249.32, stopped; `make " \
        "reproduce CONFIG=config_large NP=1` continues it, about 39 h of training left at its " \
        "median epoch (45 min)"
    assert status_line(make, timed, alive=True).endswith(
        "running epoch 4, about 39 h of training left at its median epoch (45 min)")
    # an epoch resumed inside it counts its time scaled to all its steps
    resumed = dict(timed[0], epoch_time_s=1320.0, steps_run=663)  # 2,642 s for 1,327 steps
    assert status_line(make, [resumed], alive=True).endswith(
        "running epoch 2, about 40 h of training left at its median epoch (44 min)")
    last = [dict(epoch1, epoch=n) for n in (1, 2, 3)]
    assert status_line(make, last, alive=True).endswith(
        "3 of 3 epochs, last valid ppl 249.32, running the test evaluation")
    test = {"event": "test", "epoch": 3, "test_ppl": 78.1234, "config": cfg}
    assert status_line(make, last + [test], alive=False).endswith(
        "3 of 3 epochs, last valid ppl 249.32, test ppl 78.12: done")


def test_make_reproduce_status_and_stop_as_the_readme_gives_them(ptb_path, tmp_path):
    """`RUNS=... make reproduce`, then `make reproduce-status` and `make reproduce-stop` with the
    same CONFIG and SEED: the run folder goes where RUNS says (a disk that outlives the
    checkout), named by its seed, the status looks there and copies the logs to RESULTS (a
    clone's run reports into the work tree's results/ so), and the stop ends it with its newest
    checkpoint kept."""
    keep, elsewhere, results = tmp_path / "keep", tmp_path / "elsewhere", tmp_path / "results"
    env = dict(os.environ, PTB_DATA_PATH=ptb_path)
    run_dir = keep / "reproduce" / "tiny-np1-seed7"

    def make(target, runs=keep):
        return subprocess.run(["make", target, f"RUNS={runs}", f"RESULTS={results}",
                               f"CONFIG={TINY}", "NP=1", "SEED=7"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600)
    try:
        r = make("reproduce")
        assert r.returncode == 0 and f"log {run_dir}/train.log" in r.stdout, r.stdout + r.stderr
        assert "; its first line: [ptb] epoch 1/3 | step 100/" in r.stdout, r.stdout
        assert not os.path.exists(os.path.join(REPO, "runs", "reproduce", "tiny-np1-seed7"))
        assert "--seed 7" in (run_dir / "segments.jsonl").read_text()
        r = make("reproduce-status", runs=elsewhere)
        assert r.returncode != 0 and f"in {elsewhere}/reproduce/tiny-np1-seed7 yet" in r.stdout, \
            r.stdout
        r = make("reproduce-status")
        assert r.returncode == 0 and f"reproduce: {TINY}, 0 of 3 epochs" in r.stdout, \
            r.stdout + r.stderr
        run = json.load(open(results / "tiny-1workers-seed7" / "run.json"))
        assert run["kind"] == "running" and " SEED=7 " in run["resume"], run["resume"]
        r = make("reproduce-stop")
        assert r.returncode == 0 and "stopped by SIGTERM; the newest checkpoint" in r.stdout, \
            r.stdout + r.stderr
    finally:  # SIGTERM: mpirun passes it on to its rank and ends after it
        if (run_dir / "pid").exists():
            pid = int((run_dir / "pid").read_text())
            if alive(pid):
                os.killpg(pid, signal.SIGTERM)
            wait_for(lambda: not alive(pid), "end of the run's mpirun", 60)


def alive(pid):
    """False once the process is gone or a zombie: mpirun outlives reproduce.py, its parent, so
    whoever adopts it may reap it late, and /proc/PID stays until then."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def lost_attempt(results_dir, earlier_run_dir, kind="partial"):
    """results_dir as `make reproduce-status` left it for a run started in earlier_run_dir and
    stopped after 2 epochs (hand-made)."""
    results_dir.mkdir(parents=True)
    command = f"mpirun -np 1 python lm_ptb_distributed.py --output_dir {earlier_run_dir}"
    segment = {"started_utc": "2026-11-25 10:17", "cpu": "AMD EPYC", "cores": 2,
               "commit": "abc1234", "epochs_done_at_start": 0, "command": command}
    (results_dir / "run.json").write_text(json.dumps(
        {"kind": kind, "command": command, "segments": [segment], "env": {}}))
    (results_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"event": "epoch", "epoch": n, "valid_ppl": 100.0}) + "\n" for n in (1, 2)))


def test_a_start_that_finds_no_checkpoint_keeps_the_lost_attempts_logs_apart(tmp_path):
    from scripts.reproduce import set_aside_lost_attempt
    results_dir, run_dir = tmp_path / "results" / "tiny-1workers", tmp_path / "runs" / "tiny-np1"
    lost_attempt(results_dir, tmp_path / "gone" / "tiny-np1")  # its machine, and folder, ended
    assert set_aside_lost_attempt(str(run_dir), str(results_dir)) is None
    kept = tmp_path / "results" / "tiny-1workers-lost-2026-11-25-1017"
    assert not results_dir.exists() and len((kept / "metrics.jsonl").read_text().splitlines()) == 2
    run = json.load(open(kept / "run.json"))
    assert run["kind"] == "partial" and run["lost"].startswith("after 2 epochs: no checkpoint of "
                                                               "it at a start on "), run["lost"]
    # a finished run is the one a new start reproduces: its logs are not a lost attempt
    lost_attempt(results_dir, tmp_path / "gone" / "tiny-np1", kind="full")
    assert set_aside_lost_attempt(str(run_dir), str(results_dir)) is None
    assert json.load(open(results_dir / "run.json"))["kind"] == "full"


def test_a_start_beside_the_runs_folder_of_the_run_it_means_refuses_and_moves_nothing(
        corpus, tmp_path):
    """RUNS forgotten at a later sitting: the run's folder still exists elsewhere, so starting a
    new run over its logs would be the mistake; the start says where the run is."""
    earlier = tmp_path / "keep" / "tiny-np2"
    earlier.mkdir(parents=True)
    (earlier / "metrics.jsonl").write_text("{}\n")
    results_dir = tmp_path / "results" / "tiny-2workers"
    lost_attempt(results_dir, earlier)
    r = subprocess.run([sys.executable, "scripts/reproduce.py", "start", "--config", TINY,
                        "--data_path", corpus, "--runs_dir", str(tmp_path / "runs"),
                        "--results_dir", str(tmp_path / "results")],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: {results_dir} is the run in {earlier}, not in "), r.stderr
    assert json.load(open(results_dir / "run.json"))["kind"] == "partial"
    assert not (tmp_path / "runs").exists()


def test_a_start_reports_the_trainers_own_line_its_refusal_or_a_finished_run(long_corpus,
                                                                            tmp_path):
    """The start returns with the trainer's first progress line; a start the trainer refuses
    (here a resume under another dropout) ends with the trainer's own error and exit code, not
    with "resumed"; a start of a finished run says it is finished."""
    def start(*more):
        r = subprocess.run([sys.executable, "scripts/reproduce.py", "start", "--config", TINY,
                            "--np", "1", "--data_path", long_corpus,
                            "--runs_dir", str(tmp_path / "runs"),
                            "--results_dir", str(tmp_path / "results"), "--set", "num_epochs=1",
                            "--set", "steps_per_epoch=150", "--set", "eval_steps=2", *more],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        return r.returncode, r.stdout.strip(), r.stderr.strip()
    run_dir = tmp_path / "runs" / "tiny-np1"
    rc, out, err = start()
    assert rc == 0 and "; its first line: [ptb] epoch 1/1 | step 100/150 |" in out, out + err
    wait_for(lambda: not alive(int((run_dir / "pid").read_text())), "the end of the run")
    rc, out, err = start("--set", "keep_prob=0.5")
    assert rc == 1 and not out and len(err.splitlines()) == 1, out + err
    assert err.startswith("error: the run ended (exit 2): --resume: the run was trained with other "
                          "values of keep_prob (keep_prob 1.0 -> 0.5); "), err
    rc, out, err = start()
    assert rc == 0 and out.startswith(f"reproduce: finished {TINY} with 1 worker; its last "
                                      f"line: [ptb] --resume: the run in {run_dir} is finished: "
                                      "1 epoch, test ppl "), out + err
    # lengthened at a resume: the status reads the newest config, and the command that
    # continues it (printed and in run.json) carries the --set values of this start
    rc, out, err = start("--set", "num_epochs=2")
    assert rc == 0 and "resumed" in out, out + err
    wait_for(lambda: not alive(int((run_dir / "pid").read_text())), "the end of the run")
    r = subprocess.run([sys.executable, "scripts/reproduce.py", "status", "--config", TINY,
                        "--np", "1", "--runs_dir", str(tmp_path / "runs"),
                        "--results_dir", str(tmp_path / "results")],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and f"reproduce: {TINY}, 2 of 2 epochs, " in r.stdout, r.stdout
    run = json.load(open(tmp_path / "results" / "tiny-1workers" / "run.json"))
    assert run["resume"].endswith(" ARGS='--set num_epochs=2 --set steps_per_epoch=150 --set "
                                  "eval_steps=2'"), run["resume"]
