"""Bad input, checkpoints, resume and faults, with real processes, signals and files on disk."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.helpers import (IS_ROOT, REPO, TINY, finish, go_on, kill_job, mpirun, pause_prefix,
                           run_script, stop_at_pause, wait_for_pause)


def snapshot(folder):
    """Every file under folder with its size and mtime: to prove nothing was written."""
    return {os.path.join(d, f): (os.stat(os.path.join(d, f)).st_size,
                                 os.stat(os.path.join(d, f)).st_mtime_ns)
            for d, _, files in os.walk(folder) for f in files}


def assert_one_line_error(result, message, started):
    assert time.monotonic() - started < 30
    assert_error_line(result.returncode, result.stderr, message, result.stdout + result.stderr)


def assert_error_line(status, stderr, message, shown):
    """Exit status 2 and stderr one `error: ...` line holding message; `shown` if not."""
    assert status == 2, shown
    err = stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: ") and message in err, err


def bad_data(tmp_path, raw):
    """A data folder whose three files all hold `raw`."""
    folder = tmp_path / "bad"
    folder.mkdir()
    for name in ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"):
        (folder / name).write_bytes(raw)
    return folder


def config_file(tmp_path, edit):
    text = open(TINY).read()
    path = tmp_path / "cfg.py"
    path.write_text(edit(text))
    return str(path)


CASES = {
    "unknown config": (lambda t: ["--config", "config_nope"], "unknown config 'config_nope'"),
    "config lacks a key": (lambda t: ["--config", config_file(
        t, lambda s: s.replace("lr_decay = 0.5\n", ""))], "lacks key(s) lr_decay"),
    "config has an unknown key": (lambda t: ["--config", config_file(
        t, lambda s: s + "dropout = 0.1\n")], "has unknown key(s) dropout"),
    "config not a Python file": (lambda t: ["--config", "/etc/passwd"],
                                 "config /etc/passwd is not a Python file"),
    "set unknown key": (lambda t: ["--set", "layers=3"], "unknown key 'layers'"),
    "set wrong type": (lambda t: ["--set", "batch_size=2.5"], "batch_size must be int"),
    "set unparseable": (lambda t: ["--set", "keep_prob=0..5"], "cannot parse '0..5'"),
    "no data, no download": (lambda t: ["--data_path", str(t / "none")], "download of"),
    "empty data file": (lambda t: ["--data_path", str(bad_data(t, b""))],
                        "ptb.train.txt is empty"),
    "too short for a window": (lambda t: ["--data_path", str(bad_data(t, b"a b c\n"))],
                               "too short for one window"),
    "non-UTF-8 data": (lambda t: ["--data_path", str(bad_data(t, b"a \xfe b\n" * 99))],
                       "is not UTF-8 text"),
    "num_steps too long": (lambda t: ["--set", "num_steps=100000"], "too short for one window"),
    "output_dir not writable": (lambda t: ["--output_dir", str(t / "a_file" / "run")],
                                "is not writable"),
    "negative log_every": (lambda t: ["--log_every", "-5"], "--log_every must be 0"),
}


@pytest.fixture(scope="module")
def bad_inputs(corpus, tmp_path_factory):
    """Every case of CASES in a folder of its own, run by lm_ptb.py's main in one process
    (tests/bad_input_runner.py: TensorFlow imported once, not 14 times; 5.0 against 62.6 CPU s
    in CI, docs/testing.md#ci): {case: (its folder, the folder's files before, what the run
    did)}."""
    folders, argvs = {}, {}
    for case, (extra, _) in CASES.items():
        folder = tmp_path_factory.mktemp("bad_input")
        (folder / "a_file").write_text("not a folder")
        argvs[case] = ["--config", TINY, "--data_path", corpus,
                       "--output_dir", str(folder / "out"), *extra(folder)]
        folders[case] = folder
    before = {case: snapshot(folder) for case, folder in folders.items()}
    paths = tmp_path_factory.mktemp("bad_input_runner")
    (paths / "cases.json").write_text(json.dumps(argvs))
    closed = "http://127.0.0.1:9/simple-examples.tgz"  # discard port: nothing listens
    run_script(["tests/bad_input_runner.py", str(paths / "cases.json"),
                str(paths / "results.json")], timeout=300,
               env={"PTB_URL": closed}).check_returncode()
    results = json.loads((paths / "results.json").read_text())
    # as in a process of its own, where the import's lines would join the error's
    assert results["(import)"] == {"stdout": "", "stderr": ""}, results["(import)"]
    return {case: (folders[case], before[case], results[case]) for case in CASES}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_writes_nothing(case, bad_inputs):
    folder, before, result = bad_inputs[case]
    message = CASES[case][1]
    assert result["seconds"] < 30, result  # no hang: each ends at once (a download gives up)
    assert_error_line(result["status"], result["stderr"], message, result)
    assert snapshot(folder) == before


def train(args, script="lm_ptb.py", **kw):
    r = run_script([script, *args], timeout=180, **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.smoke
def test_resume_continues_exactly_and_checkpoint_config_mismatch(corpus, tmp_path):
    base = ["--config", TINY, "--data_path", corpus]
    full, split = str(tmp_path / "full"), str(tmp_path / "split")
    train([*base, "--output_dir", full])
    # The same run stopped after epoch 1 (num_epochs does not enter the checkpoint) ...
    train([*base, "--output_dir", split, "--set", "num_epochs=1"])
    first = metrics(split)
    # ... a fresh start into its folder is refused, so nothing is lost ...
    r = run_script(["lm_ptb.py", *base, "--output_dir", split])
    assert r.returncode == 2 and "holds an earlier run" in r.stderr
    # ... and --resume continues it: the LR schedule and epoch counter go on.
    train([*base, "--output_dir", split, "--resume"])
    events = metrics(split)
    # appended; only the stopped run's test line goes, and the resumed run writes it again
    assert first[-1]["event"] == "test" and events[:len(first) - 1] == first[:-1]
    epochs = [e for e in events if e["event"] == "epoch"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3] and epochs[-1]["lr"] == 0.5
    final = {e["event"]: e for e in metrics(full)}["test"]["test_ppl"]
    resumed = events[-1]["test_ppl"]
    assert resumed == pytest.approx(final, rel=0.005)

    before = snapshot(split)
    started = time.monotonic()
    r = run_script(["lm_ptb.py", *base, "--output_dir", split, "--resume",
                    "--set", "hidden_size=24"])
    assert_one_line_error(r, "does not fit this config", started)
    assert snapshot(split) == before


def test_nan_loss_stops_with_the_epoch_and_step(corpus, tmp_path):
    out = tmp_path / "nan"
    started = time.monotonic()
    r = run_script(["lm_ptb.py", "--config", TINY, "--data_path", corpus, "--output_dir", str(out),
                    "--set", "max_grad_norm=1e30", "--set", "learning_rate=1e38"])
    assert_one_line_error(r, "in epoch 1 between steps", started)
    assert not (out / "checkpoints").exists()


def test_checkpoints_move_between_the_two_scripts(corpus, tmp_path):
    base = ["--config", TINY, "--data_path", corpus, "--set", "steps_per_epoch=20"]
    one_epoch = ["--set", "num_epochs=1"]
    a, b = str(tmp_path / "dist_then_single"), str(tmp_path / "single_then_dist")
    r = mpirun((2, [*base, *one_epoch, "--output_dir", a]))
    assert r.returncode == 0, r.stderr
    train([*base, "--output_dir", a, "--resume"])
    train([*base, *one_epoch, "--output_dir", b])
    r = mpirun((2, [*base, "--output_dir", b, "--resume"]))
    assert r.returncode == 0, r.stderr
    for run_dir in (a, b):
        epochs = [e for e in metrics(run_dir) if e["event"] == "epoch"]
        assert [(e["epoch"], e["world_size"]) for e in epochs][1:] == [
            (2, 1 if run_dir == a else 2), (3, 1 if run_dir == a else 2)]
    # the two routes train the same model on the same global batches
    ppl = [metrics(d)[-1]["test_ppl"] for d in (a, b)]
    assert ppl[0] == pytest.approx(ppl[1], rel=1e-3)


def start_job(args, nranks=2, prefix=()):
    cmd = ["mpirun", *(["--allow-run-as-root"] if IS_ROOT else []), "--oversubscribe",
           "-bind-to", "none", "-np", str(nranks), sys.executable, *prefix,
           "lm_ptb_distributed.py", *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


# Where the fault tests act: 5 steps into epoch 2, both ranks waiting there (tests/pause_at.py)
IN_EPOCH_2 = "progress:2:5"


@pytest.mark.parametrize("how", ["SIGKILL rank 1", "SIGTERM rank 0", "SIGINT mpirun",
                                 "SIGTERM mpirun"])
def test_fault_stops_the_job_and_resume_continues(how, corpus, tmp_path):
    """The fault comes 5 steps into epoch 2 (the ranks wait there for it: tests/pause_at.py);
    a rank not signalled goes on, into a step its peer never joins."""
    out, pause = str(tmp_path / "run"), tmp_path / "pause"
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", out, "--log_every",
            "5", "--set", "num_epochs=2"]
    job = start_job(args, prefix=pause_prefix(pause, IN_EPOCH_2))
    try:
        pids = wait_for_pause(job, pause, count=2)
        assert sorted(pids) == [0, 1]
        started = time.monotonic()
        if how == "SIGKILL rank 1":
            os.kill(pids[1], signal.SIGKILL)
            go_on(pause)
        elif how == "SIGTERM rank 0":
            os.kill(pids[0], signal.SIGTERM)
            go_on(pause)
        else:  # mpirun passes it on to both ranks, a second later
            job.send_signal(signal.SIGINT if how == "SIGINT mpirun" else signal.SIGTERM)
        _, stderr = job.communicate(timeout=60)
        assert time.monotonic() - started < 60
    finally:
        if job.poll() is None:
            kill_job(job)
    assert job.returncode != 0
    if how == "SIGTERM rank 0":
        assert "error: stopped by SIGTERM" in stderr
    assert stderr.count("error: stopped by") <= 1, stderr  # rank 0 alone says it
    assert "Traceback" not in stderr, stderr
    ckpts = os.listdir(os.path.join(out, "checkpoints"))
    assert not [f for f in ckpts if "_temp" in f], ckpts  # no partial checkpoint
    if how != "SIGKILL rank 1":
        return  # one resume is enough: it reads the same epoch checkpoint whatever stopped the job
    done = len(metrics(out))
    r = mpirun((2, [*args, "--resume"]))
    assert r.returncode == 0, r.stdout + r.stderr
    events = metrics(out)
    assert len(events) > done and events[-1]["event"] == "test"
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == [1, 2]


@contextlib.contextmanager
def small_disk(path, size):
    """A real filesystem of `size` (tmpfs), mounted for the test and unmounted after it."""
    if not IS_ROOT:
        if os.environ.get("CI"):
            pytest.fail("the full-disk test needs root (mount) and must run in CI")
        pytest.skip("needs root to mount a tmpfs")
    os.makedirs(path)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.mark.parametrize("ranks", [0, 2], ids=["one process", "2 ranks"])
def test_full_disk_during_a_save_is_one_line_and_resume_continues(ranks, ptb_path, tmp_path):
    """A 4 MiB disk holds the first checkpoint of the tiny model (2.6 MB) but not the second."""
    with small_disk(tmp_path / "disk", "4m") as disk:
        out = disk / "run"
        args = ["--config", TINY, "--data_path", ptb_path, "--output_dir", str(out),
                "--set", "num_epochs=3", "--set", "steps_per_epoch=5", "--set", "eval_steps=1"]
        started = time.monotonic()
        r = mpirun((ranks, args)) if ranks else run_script(["lm_ptb.py", *args])
        assert r.returncode != 0 and time.monotonic() - started < 90
        errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
        assert "Traceback" not in r.stderr, r.stderr
        # one line from the rank that failed, and one from each rank it stopped unless mpirun
        # ended that rank first
        assert 1 <= len(errors) <= max(ranks, 1), errors
        assert "cannot write checkpoint 2" in errors[0] and "No space left" in errors[0]
        assert "{{" not in errors[0] and "[Op:" not in errors[0], errors[0]  # no op names
        assert "ckpt-1, is kept; free space, then rerun with --resume" in errors[0], errors[0]
        # the others' lines give no advice of their own beside the failed rank's
        assert all(line == "error: another rank stopped, so this one stops too (that rank's "
                   "error says why and what to do)" for line in errors[1:]), errors
        folder = out / "checkpoints"
        assert 'model_checkpoint_path: "ckpt-1"' in (folder / "checkpoint").read_text()
        assert not [f for f in os.listdir(folder) if "_temp" in f]
        lines = (out / "metrics.jsonl").read_text().splitlines()
        assert all(json.loads(line) for line in lines)  # every line whole
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        r = mpirun((ranks, [*args, "--resume"])) if ranks else run_script(
            ["lm_ptb.py", *args, "--resume"])
        assert r.returncode == 0, r.stderr
        epochs = [e["epoch"] for e in metrics(out) if e["event"] == "epoch"]
        assert epochs == [1, 2, 3]


def test_a_full_disk_at_a_save_inside_an_epoch_names_the_step_checkpoint_kept(ptb_path,
                                                                               tmp_path):
    """The first checkpoint inside the epoch (2.6 MB) fits a 4 MiB disk, the second does not:
    the error names the first, not "no earlier checkpoint" (the epoch ends' list is empty)."""
    with small_disk(tmp_path / "disk", "4m") as disk:
        out = disk / "run"
        r = run_script(["lm_ptb.py", "--config", TINY, "--data_path", ptb_path,
                        "--output_dir", str(out), "--set", "steps_per_epoch=5",
                        "--set", "checkpoint_every=2", "--set", "eval_steps=1"])
    errors = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    assert errors[0].startswith("error: cannot write checkpoint of epoch 1 step 4"), errors
    assert f"{out}/checkpoints/steps/ckpt-2, is kept; free space" in errors[0], errors


def test_a_partial_line_is_cut_back_when_the_disk_is_full(tmp_path):
    """metrics.jsonl gets whole lines or none: a write the disk takes only in part is undone."""
    from utils.logs import append_whole_line
    with small_disk(tmp_path / "disk", "64k") as disk:
        path = str(disk / "metrics.jsonl")
        append_whole_line(path, "x" * 1000 + "\n")
        with pytest.raises(OSError):
            append_whole_line(path, "y" * 200_000 + "\n")
        assert open(path).read() == "x" * 1000 + "\n"


@pytest.mark.parametrize("ranks", [0, 2], ids=["one process", "2 ranks"])
def test_resume_skips_a_damaged_newest_checkpoint(ranks, corpus, tmp_path):
    out = tmp_path / "run"
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", str(out),
            "--set", "steps_per_epoch=10", "--set", "eval_steps=2"]
    go = (lambda a: mpirun((ranks, a))) if ranks else (lambda a: run_script(["lm_ptb.py", *a]))
    assert go([*args, "--set", "num_epochs=3"]).returncode == 0
    data = out / "checkpoints" / "ckpt-3.data-00000-of-00001"
    os.truncate(data, data.stat().st_size // 2)  # a copy cut short, a disk error
    # evaluate.py takes the same one as the resume below, and says so the same way
    r = run_script(["evaluate.py", "perplexity", "--run", str(out), "--data_path", corpus,
                    "--eval_steps", "2"])
    assert r.returncode == 0 and r.stdout.strip().endswith(
        "| checkpoint ckpt-2, the end of epoch 2 | precision fp32 (the run's)"), r.stdout + r.stderr
    assert r.stderr.startswith(f"warning: checkpoint {out}/checkpoints/ckpt-3 is damaged (") and \
        r.stderr.endswith("); scoring ckpt-2, the end of epoch 2\n") and \
        r.stderr.count("\n") == 1, r.stderr
    r = go([*args, "--set", "num_epochs=4", "--resume"])
    assert r.returncode == 0, r.stderr
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "ckpt-3 is damaged" in warnings[0], r.stderr
    assert "Traceback" not in r.stderr
    epochs = [(e["epoch"], e["lr"]) for e in metrics(out) if e["event"] == "epoch"]
    assert [e for e, _ in epochs] == [1, 2, 3, 4]  # epoch 3 trained again, from ckpt-2

    for name in os.listdir(out / "checkpoints"):  # now every checkpoint is damaged
        if ".data-" in name:
            path = out / "checkpoints" / name
            os.truncate(path, path.stat().st_size // 2)
    started = time.monotonic()
    r = run_script(["lm_ptb.py", *args, "--set", "num_epochs=5", "--resume"])
    assert_one_line_error(r, "loads (damaged: ckpt-4, ckpt-3, ckpt-2)", started)


@pytest.mark.parametrize("frozen", [1, 0], ids=["SIGSTOP rank 1", "SIGSTOP rank 0"])
def test_a_frozen_rank_ends_the_job_and_resume_continues(frozen, corpus, tmp_path):
    """A stopped rank (a frozen node, a stuck filesystem read) leaves its peer blocked in an
    allreduce for ever; the peer's step watchdog ends the job instead. The rank is stopped 5
    steps into epoch 2 (both wait there: tests/pause_at.py), and its peer goes on into the next
    step."""
    out, pause = str(tmp_path / "run"), tmp_path / "pause"
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", out, "--log_every", "5",
            "--set", "num_epochs=2", "--set", "step_timeout_s=20"]
    job = start_job(args, prefix=pause_prefix(pause, IN_EPOCH_2))
    try:
        pids = wait_for_pause(job, pause, count=2)
        started = time.monotonic()
        os.kill(pids[frozen], signal.SIGSTOP)
        go_on(pause)
        _, stderr = job.communicate(timeout=90)
        elapsed = time.monotonic() - started
    finally:
        if job.poll() is None:
            kill_job(job)  # the stopped rank too, in a process group of its own
    assert job.returncode != 0 and 20 <= elapsed < 60, (job.returncode, elapsed, stderr)
    lines = [line for line in stderr.splitlines() if "did not finish" in line]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error: rank {1 - frozen} of 2: a training step did not finish "
                               "in 20 s, so a peer rank is probably stopped or hung"), lines[0]
    newest = os.path.join(out, "checkpoints", "ckpt-1")
    assert f"the newest checkpoint, {newest}, is kept: rerun with --resume" in lines[0], lines[0]
    assert "Traceback" not in stderr, stderr
    assert os.path.exists(os.path.join(out, "checkpoints", "ckpt-1.index"))
    assert not [f for f in os.listdir(os.path.join(out, "checkpoints")) if "_temp" in f]
    if frozen == 0:
        return  # resumed once, after rank 1's freeze: the checkpoint it reads is the same
    r = mpirun((2, [*args, "--resume"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [e["epoch"] for e in metrics(out) if e["event"] == "epoch"] == [1, 2]


def test_rank_0_evaluating_longer_than_the_step_timeout_does_not_trip_the_others(ptb_path,
                                                                                  tmp_path):
    """Rank 1 waits for rank 0's checkpoint, batch-1 validation and test (seconds each) with a
    step timeout of 2 s: its watchdog allows for that work, so the run ends normally. 8,000
    windows each: 3,000 took 1.8 s on an AMD EPYC with AVX-512, under the timeout tested. The
    start-up before the steps (6 s with PTB on an AMD EPYC with AVX2 only, loaded; 1.7-2.1 s
    idle: results/stack/ci/startup-phases-avx2.log) has 30 s more (utils.watchdog.START_UP_S)."""
    out = str(tmp_path / "run")
    args = ["--config", TINY, "--data_path", ptb_path, "--output_dir", out, "--log_every", "10",
            "--set", "num_epochs=1", "--set", "steps_per_epoch=30", "--set", "eval_steps=8000",
            "--set", "valid_batch_size=1", "--set", "valid_num_steps=5",
            "--set", "step_timeout_s=2"]
    r = mpirun((2, args))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "did not finish" not in r.stderr
    events = metrics(out)
    trained, validated, tested = (events[-3]["time"], events[-2]["time"], events[-1]["time"])
    assert [e["event"] for e in events[-3:]] == ["progress", "epoch", "test"]
    assert validated - trained > 2 and tested - validated > 2, (trained, validated, tested)


def test_a_rank_frozen_in_the_start_up_ends_the_job(corpus, tmp_path):
    """The watchdog runs from hvd.init() on: a rank frozen before the broadcast of the starting
    weights leaves the other in that broadcast, which it ends after step_timeout_s and the
    start-up's own 30 s more (utils.watchdog.START_UP_S)."""
    out = str(tmp_path / "run")
    job = start_job(["--config", TINY, "--data_path", corpus, "--output_dir", out,
                     "--set", "model='tests.stop_model:build'", "--set", "step_timeout_s=10"])
    started = time.monotonic()
    returncode, _, stderr = finish(job, timeout=120)
    lines = [line for line in stderr.splitlines() if "did not finish" in line]
    assert returncode != 0 and time.monotonic() - started < 90, stderr
    assert lines == [
        "error: rank 0 of 2: the start-up (data, agreement check, checkpoint, broadcast) did not "
        "finish in 40 s, so a peer rank is probably stopped or hung (or this host is that slow); "
        f"no checkpoint was saved yet in {out}/checkpoints: rerun the same command with --resume "
        "to start afresh (and --set step_timeout_s=N if the steps are really that slow)"], \
        stderr
    assert "Traceback" not in stderr


def test_resuming_with_fewer_steps_per_epoch_than_the_checkpoints_step_is_one_line(
        corpus, tmp_path):
    """A checkpoint 40 steps into an epoch (the run stopped there: tests/pause_at.py), resumed
    by 2 ranks whose epochs are now 30 steps long: refused as a changed config, and with
    --change_config every rank says why it cannot go on in one line instead of failing on a
    name or a division by zero."""
    out, pause = str(tmp_path / "run"), tmp_path / "pause"
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", out,
            "--set", "steps_per_epoch=80", "--set", "checkpoint_every=20", "--log_every", "20"]
    job = subprocess.Popen([sys.executable, *pause_prefix(pause, "save:1:40"), "lm_ptb.py",
                            *args], cwd=REPO, text=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE)
    stop_at_pause(job, pause)
    r = mpirun((2, [*args, "--resume", "--set", "steps_per_epoch=30"]))
    assert r.returncode != 0 and "error: --resume: the run was trained with other values of " \
        "steps_per_epoch (steps_per_epoch 80 -> 30); " in r.stderr, r.stderr
    r = mpirun((2, [*args, "--resume", "--set", "steps_per_epoch=30", "--change_config"]))
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "error: --resume: the checkpoint is 40 steps into epoch 1, which now has 30 " \
        "(steps_per_epoch=30); resume with the steps_per_epoch it was saved with, or more" \
        in r.stderr, r.stderr
    # each rank's error is that one (two ranks' lines can interleave in mpirun's output: only
    # their starts are compared), not a crash on a name or a division by zero
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert all(line.startswith("error: --resume: the checkpoint is ") for line in errors), errors
    assert "UnboundLocalError" not in r.stderr and "ZeroDivisionError" not in r.stderr


# Runs lm_ptb_distributed.main() in this one process and prints whether the step watchdog it
# started still has a deadline when main() returns: a deadline left running would end a process
# that outlives main() (a caller, Horovod's shutdown) with the watchdog's exit 124.
WATCHDOG_AT_RETURN = """import sys
import horovod_steps, lm_ptb_distributed
started = []
start = horovod_steps.start_watchdog
horovod_steps.start_watchdog = lambda *a: started.append(start(*a)) or started[-1]
code = lm_ptb_distributed.main(sys.argv[1:])
print("deadline at return:", started[0]._deadline)
"""


def test_every_return_of_the_trainer_stops_its_watchdog(corpus, tmp_path):
    """A whole run, then a resume of the finished run (it returns before training)."""
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", str(tmp_path / "run"),
            "--set", "num_epochs=1", "--set", "steps_per_epoch=5", "--set", "eval_steps=2"]
    for more in ([], ["--resume"]):
        r = run_script(["-c", WATCHDOG_AT_RETURN, *args, *more], timeout=120)
        assert r.returncode == 0 and "deadline at return: None\n" in r.stdout, r.stdout + r.stderr
    assert "is finished" in r.stdout, r.stdout
