"""Resume equals the uninterrupted run, dropout included, and a stop at any point of an epoch
leaves one line per epoch: real processes, real signals, real checkpoints."""
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (REPO, TINY, events, horovodrun, kill_job, list_hosts, mpirun,
                           pause_prefix, paused_python, run_job, run_script, script_env,
                           stop_at_pause, wait_for_pause, waiting_at)

DROPOUT = ["--config", TINY, "--set", "keep_prob=0.5", "--set", "steps_per_epoch=20",
           "--set", "eval_steps=2", "--seed", "3", "--log_every", "1"]


def run(ranks, args):
    """lm_ptb.py for 0 ranks, else lm_ptb_distributed.py under mpirun with that many."""
    r = mpirun((ranks, args)) if ranks else run_script(["lm_ptb.py", *args], timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def losses(run_dir, epoch):
    return [e["loss"] for e in events(run_dir, "progress") if e["epoch"] == epoch]


def test_resumed_run_draws_the_dropout_masks_of_the_uninterrupted_run(corpus, tmp_path):
    """One process; the bf16 test below does the same with 2 ranks, whose masks differ by rank
    (train_steps.noise_seed)."""
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    base = [*DROPOUT, "--data_path", corpus]
    run(0, [*base, "--output_dir", whole, "--set", "num_epochs=2"])
    run(0, [*base, "--output_dir", split, "--set", "num_epochs=1"])
    run(0, [*base, "--output_dir", split, "--set", "num_epochs=2", "--resume"])
    assert len(losses(whole, 2)) == 20
    assert losses(split, 2) == pytest.approx(losses(whole, 2), rel=1e-6)
    # the masks are drawn anew each step: with masks replayed from epoch 1, or none at all,
    # epoch 2 would differ from the above
    no_dropout = str(tmp_path / "no_dropout")
    run(0, [*base, "--output_dir", no_dropout, "--set", "num_epochs=1", "--set", "keep_prob=1.0"])
    assert losses(no_dropout, 1) != pytest.approx(losses(whole, 1), rel=1e-3)


def test_bf16_resume_equals_the_uninterrupted_bf16_run_and_precision_changes_when_asked(
        corpus, tmp_path):
    """2 ranks in bf16 with dropout: a resume replays the uninterrupted run exactly, its masks
    included; the fp32 checkpoint of an fp32 epoch resumes in bf16 (and back) with
    --change_config, each event logging the precision it ran in."""
    base = [*DROPOUT, "--data_path", corpus]
    bf16 = ["--set", "precision='bf16'"]
    whole, split, mixed = (str(tmp_path / name) for name in ("whole", "split", "mixed"))
    run(2, [*base, *bf16, "--output_dir", whole, "--set", "num_epochs=3"])
    run(2, [*base, *bf16, "--output_dir", split, "--set", "num_epochs=1"])
    run(2, [*base, *bf16, "--output_dir", split, "--set", "num_epochs=3", "--resume"])
    assert len(losses(whole, 2)) == 20
    for epoch in (2, 3):
        assert losses(split, epoch) == pytest.approx(losses(whole, epoch), rel=1e-6)
    run(2, [*base, "--output_dir", mixed, "--set", "num_epochs=1"])
    run(2, [*base, *bf16, "--output_dir", mixed, "--set", "num_epochs=2", "--resume",
            "--change_config"])
    run(2, [*base, "--output_dir", mixed, "--set", "num_epochs=3", "--resume", "--change_config"])
    logged = [(e["epoch"], e["config"]["precision"]) for e in events(mixed, "epoch")]
    assert logged == [(1, "fp32"), (2, "bf16"), (3, "fp32")]
    # one model all along: each epoch's losses near the all-bf16 run's, and not equal to them
    for epoch in (1, 2, 3):
        assert losses(mixed, epoch) == pytest.approx(losses(whole, epoch), rel=2e-2)
        assert losses(mixed, epoch) != pytest.approx(losses(whole, epoch), rel=1e-6)


def files_of(run_dir):
    """Every file of a run folder and its bytes: what a refused resume must leave as it was."""
    return {str(p): p.read_bytes() for p in sorted(Path(run_dir).rglob("*")) if p.is_file()}


def test_a_resume_says_what_changed_and_refuses_another_run_in_one_line(corpus, tmp_path):
    """make train / single / reproduce and the Slurm script all add --resume by themselves, so
    the trainer is where a changed config is caught: num_epochs goes on with a line naming it;
    dropout or a learning rate (another experiment under the run's name) is refused, writing
    nothing, unless --change_config asks for it; a finished run says so and trains nothing."""
    out = str(tmp_path / "run")
    base = ["--config", TINY, "--data_path", corpus, "--output_dir", out, "--log_every", "5",
            "--set", "steps_per_epoch=20", "--set", "eval_steps=2"]

    def trainer(*more):
        return run_script(["lm_ptb.py", *base, *more], timeout=180)
    assert trainer("--set", "num_epochs=1").returncode == 0
    before = files_of(out)
    r = trainer("--set", "num_epochs=2", "--set", "keep_prob=0.5", "--set", "learning_rate=0.1",
                "--resume")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == (
        "error: --resume: the run was trained with other values of learning_rate, keep_prob "
        "(learning_rate 1.0 -> 0.1, num_epochs 1 -> 2, keep_prob 1.0 -> 0.5); resume with the "
        "config and --set it was trained with, or pass --change_config to go on with the new "
        "values in this run, or choose another --output_dir for a new run")
    assert files_of(out) == before
    r = trainer("--set", "num_epochs=2", "--seed", "7", "--resume")  # other dropout masks
    assert r.returncode == 2 and r.stderr.startswith(
        "error: --resume: the run was trained with other values of seed (num_epochs 1 -> 2, "
        "seed 1234 -> 7); "), r.stderr
    r = trainer("--set", "num_epochs=2", "--resume")  # the schedule alone goes on
    assert r.returncode == 0, r.stderr
    assert "[ptb] --resume: config changed since the checkpoint: num_epochs 1 -> 2\n" in r.stdout
    r = trainer("--set", "num_epochs=3", "--set", "keep_prob=0.5", "--resume", "--change_config")
    assert r.returncode == 0, r.stderr
    assert ("[ptb] --resume: config changed since the checkpoint: num_epochs 2 -> 3, keep_prob "
            "1.0 -> 0.5\n") in r.stdout
    assert [e["config"]["keep_prob"] for e in events(out, "epoch")] == [1.0, 1.0, 0.5]
    # the change is the run's now: its checkpoint holds it, and the same command is finished
    before = files_of(out)
    r = trainer("--set", "num_epochs=3", "--set", "keep_prob=0.5", "--resume")
    assert r.returncode == 0 and "error" not in r.stderr, r.stderr
    test_ppl = events(out, "test")[-1]["test_ppl"]
    assert r.stdout.splitlines()[-1] == (
        f"[ptb] --resume: the run in {out} is finished: 3 epochs, test ppl {test_ppl:.2f}; to "
        "train it further give a larger num_epochs (--set num_epochs=N), or start a new run in "
        "another --output_dir")
    assert files_of(out).keys() == before.keys()
    assert open(os.path.join(out, "metrics.jsonl"), "rb").read() == before[
        os.path.join(out, "metrics.jsonl")]
    r = trainer("--set", "num_epochs=2", "--set", "keep_prob=0.5", "--resume")
    assert r.returncode == 2 and r.stderr.strip() == (
        "error: --resume: the run has trained 3 epochs, more than num_epochs=2; resume with "
        "num_epochs=3 or more, or evaluate it as it is (evaluate.py perplexity)"), r.stderr


def test_make_single_refuses_a_changed_config_as_the_trainer_does(ptb_path, tmp_path):
    """The Makefile adds --resume by itself once the run's folder holds a run: a second `make
    single` with other ARGS is refused by the trainer's line."""
    runs = tmp_path / "runs"
    env = dict(script_env(), PTB_DATA_PATH=ptb_path)

    def make(args):
        return subprocess.run(["make", "single", f"CONFIG={TINY}", f"RUNS={runs}",
                               "ARGS=--set num_epochs=1 --set steps_per_epoch=20 --set "
                               f"eval_steps=2 {args}"], cwd=REPO, env=env, text=True,
                              capture_output=True, timeout=300)
    assert make("").returncode == 0
    r = make("--set keep_prob=0.5")
    assert r.returncode != 0 and "--resume" in r.stdout, r.stdout + r.stderr
    assert "error: --resume: the run was trained with other values of keep_prob (keep_prob " \
           "1.0 -> 0.5); " in r.stderr, r.stderr
    # (--change_config through ARGS reaches the trainer as any flag does: tested above)


def test_momentum_slots_are_the_same_on_every_rank_after_a_resume(corpus, tmp_path):
    """An optimizer with state (momentum: one slot per weight): rank 0 restores the slots with
    the checkpoint and every rank must take them, or the ranks train apart after a resume."""
    def momentum_run(args):
        cmd = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
               "--oversubscribe", "-bind-to", "none", "-np", "2", sys.executable,
               os.path.join("tests", "momentum_trainer.py"), "lm_ptb_distributed.py", *args]
        r = run_job(cmd, 240, cwd=REPO, env=script_env())
        assert r.returncode == 0, r.stdout + r.stderr
    base = ["--config", TINY, "--data_path", corpus, "--set", "steps_per_epoch=20",
            "--set", "eval_steps=2", "--set", "learning_rate=0.2", "--log_every", "1"]
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    momentum_run([*base, "--output_dir", whole, "--set", "num_epochs=2"])
    momentum_run([*base, "--output_dir", split, "--set", "num_epochs=1"])
    momentum_run([*base, "--output_dir", split, "--set", "num_epochs=2", "--resume"])
    assert losses(split, 1) == losses(whole, 1)
    assert losses(split, 2) == pytest.approx(losses(whole, 2), rel=1e-5)
    # the slots are in the checkpoint, and not zero: momentum was really used
    import tensorflow as tf
    reader = tf.train.load_checkpoint(os.path.join(split, "checkpoints"))
    slots = [n for n in reader.get_variable_to_shape_map()  # tf-keras's names, Keras 3's
             if "/momentum/" in n or n.startswith("optimizer/_variables/")]
    assert len(slots) >= 8 and all(abs(reader.get_tensor(n)).max() > 0 for n in slots)


def stopped_at(point, args, pause):
    """lm_ptb.py with args, stopped by a SIGTERM at `point` (tests/pause_at.py waits there, in
    the folder `pause`, for the signal); returns its stderr."""
    job = subprocess.Popen([sys.executable, *pause_prefix(pause, point), "lm_ptb.py", *args],
                           cwd=REPO, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=script_env())
    stderr = stop_at_pause(job, pause)[1]
    assert job.returncode == 128 + signal.SIGTERM, stderr
    return stderr


def one_line_per_epoch(run_dir, num_epochs):
    epochs = [e["epoch"] for e in events(run_dir, "epoch")]
    assert epochs == list(range(1, num_epochs + 1))
    assert len(events(run_dir, "test")) == 1
    per_epoch = [[e["step"] for e in events(run_dir, "progress") if e["epoch"] == k]
                 for k in epochs]
    assert all(steps == sorted(set(steps)) for steps in per_epoch), per_epoch


def test_stop_during_training_resumes_with_one_line_per_epoch(ptb_path, tmp_path):
    out = str(tmp_path / "run")
    args = ["--config", TINY, "--data_path", ptb_path, "--output_dir", out, "--log_every", "5",
            "--set", "steps_per_epoch=60", "--set", "eval_steps=5", "--set", "num_epochs=3"]
    stopped_at("progress:2:20", args, tmp_path / "pause")
    assert [e["epoch"] for e in events(out, "epoch")] == [1]
    assert events(out, "progress")[-1]["step"] == 20
    resumed = run_script(["lm_ptb.py", *args, "--resume"], timeout=180)
    resumed.check_returncode()
    one_line_per_epoch(out, 3)
    assert f"[ptb] --resume: continuing from {out}/checkpoints/ckpt-1 (the end of epoch 1)" \
        in resumed.stdout.splitlines(), resumed.stdout
    # TensorFlow's warnings about checkpoint values left unread (the in-epoch ones) read like a
    # damaged checkpoint at the end of every resumed run's log
    assert "could not be found in the restored object" not in resumed.stderr, resumed.stderr


FIRST_EPOCH = ["--config", TINY, "--log_every", "5", "--set", "num_epochs=2",
               "--set", "steps_per_epoch=60", "--set", "eval_steps=5"]
IN_FIRST_EPOCH = "progress:1:10"  # where the tests of a stop before the first checkpoint stop


def assert_started_afresh_once(run_dir, stdout, epochs=2):
    checkpoints = os.path.join(run_dir, "checkpoints")
    assert f"[ptb] --resume: no checkpoint in {checkpoints} yet, so this run starts afresh" \
        in stdout.splitlines(), stdout
    one_line_per_epoch(run_dir, epochs)
    steps = [e["step"] for e in events(run_dir, "progress") if e["epoch"] == 1]
    assert steps[0] == 5 and steps == sorted(set(steps)), steps  # the stopped attempt's dropped


def test_a_stop_before_the_first_checkpoint_is_rerun_by_the_same_command(corpus, tmp_path):
    """Stopped in its first epoch, a run has a log and no checkpoint: its last line says there
    is none, and the command with --resume (what make, reproduce and Slurm add to a folder that
    holds a run) starts it afresh instead of refusing."""
    out = str(tmp_path / "run")
    args = [*FIRST_EPOCH, "--data_path", corpus, "--output_dir", out]
    stderr = stopped_at(IN_FIRST_EPOCH, args, tmp_path / "pause")
    assert not os.path.exists(os.path.join(out, "checkpoints", "checkpoint"))
    assert stderr.strip().splitlines()[-1] == (
        f"error: stopped by SIGTERM; no checkpoint was saved yet in {out}/checkpoints: rerun the "
        "same command with --resume to start afresh"), stderr
    r = run_script(["lm_ptb.py", *args, "--resume"], timeout=180)
    assert r.returncode == 0, r.stderr
    assert_started_afresh_once(out, r.stdout)
    assert "[ptb] --resume: continuing from" not in r.stdout


def test_two_ranks_stopped_before_the_first_checkpoint_rerun_under_mpirun(corpus, tmp_path):
    """mpirun's SIGTERM, passed on to both ranks while they wait at step 10 of the first epoch
    (tests/pause_at.py)."""
    out, pause = str(tmp_path / "run"), tmp_path / "pause"
    args = ["--config", TINY, "--log_every", "5", "--set", "num_epochs=1",
            "--set", "steps_per_epoch=60", "--set", "eval_steps=5", "--data_path", corpus,
            "--output_dir", out]
    cmd = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--oversubscribe",
           "-bind-to", "none", "-np", "2", sys.executable, *pause_prefix(pause, IN_FIRST_EPOCH),
           "lm_ptb_distributed.py", *args]
    job = subprocess.Popen(cmd, cwd=REPO, text=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=script_env(), start_new_session=True)
    stderr = stop_at_pause(job, pause, count=2)[1]  # mpirun passes it to both ranks
    assert job.returncode != 0
    said = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert said and all("no checkpoint was saved yet" in line for line in said), stderr
    assert "finished epoch's checkpoint" not in stderr
    # what the rerun shows, a start afresh with the stopped attempt's lines dropped, is in its
    # first steps and its epoch line
    r = mpirun((2, [*args, "--resume"]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert_started_afresh_once(out, r.stdout, epochs=1)


def test_make_single_stopped_in_its_first_epoch_continues_with_make_single(ptb_path, tmp_path):
    """What a new user does: `make single`, Ctrl-C (SIGINT to the whole foreground group) in
    the first epoch, `make single` again."""
    runs, pause = tmp_path / "runs", tmp_path / "pause"
    make = ["make", "single", f"CONFIG={TINY}", f"RUNS={runs}",
            f"ARGS={' '.join(FIRST_EPOCH[2:])}"]
    env = dict(script_env(), PTB_DATA_PATH=ptb_path)  # `make data` md5-checks it: real PTB
    out = str(runs / "config_tiny-single")
    # the trainer waits at step 10 for the Ctrl-C (make's own PY through tests/pause_at.py)
    job = subprocess.Popen([*make, f"PY={paused_python(pause, IN_FIRST_EPOCH)}"], cwd=REPO,
                           env=env, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           start_new_session=True)
    try:
        wait_for_pause(job, pause)
        os.killpg(job.pid, signal.SIGINT)
        stderr = job.communicate(timeout=60)[1]
    finally:
        if job.poll() is None:
            kill_job(job)
    assert job.returncode != 0 and "error: stopped by SIGINT; no checkpoint was saved yet" \
        in stderr, stderr
    r = run_job(make, 300, cwd=REPO, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "--resume" in r.stdout  # make added it: the folder holds a run
    assert_started_afresh_once(out, r.stdout)


def test_stop_during_validation_keeps_the_epoch(ptb_path, tmp_path):
    """The checkpoint comes before validation: a stop there loses nothing, and the resumed run
    writes the missing epoch line, with the valid perplexity of the saved model."""
    out = str(tmp_path / "run")
    args = ["--config", TINY, "--data_path", ptb_path, "--output_dir", out, "--log_every", "5",
            "--set", "steps_per_epoch=30", "--set", "num_epochs=2", "--set", "eval_steps=5"]
    stopped_at("validate:2", args, tmp_path / "pause")  # in epoch 2's first valid window
    assert [e["epoch"] for e in events(out, "epoch")] == [1]
    assert os.path.exists(os.path.join(out, "checkpoints", "ckpt-2.index"))
    run_script(["lm_ptb.py", *args, "--resume"], timeout=180).check_returncode()
    one_line_per_epoch(out, 2)
    rebuilt = events(out, "epoch")[1]
    # the same checkpoint evaluated by an uninterrupted run of the same length
    whole = str(tmp_path / "whole")
    run_script(["lm_ptb.py", *args[:5], whole, *args[6:]], timeout=180).check_returncode()
    reference = events(whole, "epoch")[1]
    assert rebuilt["valid_ppl"] == pytest.approx(reference["valid_ppl"], rel=1e-4)
    assert rebuilt["train_ppl"] == pytest.approx(reference["train_ppl"], rel=1e-4)


def test_two_ranks_stopped_during_validation_log_the_epoch_at_the_resume(ptb_path, tmp_path):
    """The resumed run's rank 0 learns from its log that an epoch lacks its line; it validates
    that epoch, with the saved model, and writes the line, while the other rank waits for it
    (who validates and who waits: test_at_a_resume_the_chief_alone_validates_...)."""
    out, pause = str(tmp_path / "run"), tmp_path / "pause"
    args = ["--config", TINY, "--data_path", ptb_path, "--output_dir", out, "--log_every", "5",
            "--set", "steps_per_epoch=30", "--set", "num_epochs=1", "--set", "eval_steps=5"]
    cmd = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--oversubscribe",
           "-bind-to", "none", "-np", "2", sys.executable, *pause_prefix(pause, "validate:1"),
           "lm_ptb_distributed.py", *args]
    job = subprocess.Popen(cmd, cwd=REPO, text=True, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, env=script_env(), start_new_session=True)
    stop_at_pause(job, pause)  # rank 0 in its first valid window, rank 1 waiting for it
    assert not events(out, "epoch")
    assert os.path.exists(os.path.join(out, "checkpoints", "ckpt-1.index"))
    r = mpirun((2, [*args, "--resume"]))
    assert r.returncode == 0, r.stdout + r.stderr
    one_line_per_epoch(out, 1)
    # the same checkpoint evaluated by an uninterrupted 2-rank run of the same length (2 ranks,
    # as the tiny config at this learning rate grows apart from one process within 2 epochs:
    # valid 964 against 1,013 at epoch 2, with the code before this test too)
    whole = str(tmp_path / "whole")
    run(2, [*args[:5], whole, *args[6:]])
    assert events(out, "epoch")[0]["valid_ppl"] == pytest.approx(
        events(whole, "epoch")[0]["valid_ppl"], rel=1e-6)


IN_EPOCH = ["--config", TINY, "--set", "steps_per_epoch=60", "--set", "num_epochs=1",
            "--set", "eval_steps=2", "--set", "checkpoint_every=20", "--seed", "3",
            "--log_every", "1"]


def launch(launcher, args, hosts_dir=None, env=None, prefix=()):
    """lm_ptb.py, lm_ptb_distributed.py on 2 ranks, lm_ptb_tf_distribute.py on 2 workers
    (launch/tf_config.py) or lm_ptb_elastic.py under horovodrun's elastic driver (two "hosts" of
    this machine, as in test_elastic.py: given one host of 2 slots, the job printed nothing for
    200 s here), in a session of its own (killed whole). prefix: a runner's path and arguments
    before the script's (pause_prefix)."""
    if launcher == "elastic":
        list_hosts(hosts_dir / "hosts.txt", "localhost:1", "127.0.0.1:1")
        return horovodrun(hosts_dir / "hosts.txt", args, env=env, prefix=prefix)
    script = {"2 ranks": "lm_ptb_distributed.py", "tf.distribute": "lm_ptb_tf_distribute.py"}
    cmd = [sys.executable, *prefix, script.get(launcher, "lm_ptb.py"), *args]
    if launcher == "2 ranks":
        cmd = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []),
               "--oversubscribe", "-bind-to", "none", "-np", "2", *cmd]
    if launcher == "tf.distribute":
        cmd = [sys.executable, os.path.join("launch", "tf_config.py"), "-n", "2", "--", *cmd]
    return subprocess.Popen(cmd, cwd=REPO, env=script_env(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


PROCESSES = {"one process": 1, "2 ranks": 2, "tf.distribute": 2, "elastic": 2}


def killed_at(point, launcher, args, pause, hosts_dir=None, env=None):
    """Start the run, then SIGKILL its whole session (the launcher and every process: a machine
    taken away) while it waits at `point` (tests/pause_at.py, its files in `pause`)."""
    job = launch(launcher, args, hosts_dir, env, prefix=pause_prefix(pause, point))
    try:
        wait_for_pause(job, pause, count=waiting_at(point, PROCESSES[launcher]))
    finally:  # the whole group, though mpirun has gone: a rank may outlive it
        kill_job(job)


def kill_inside_the_epoch(launcher, args, run_dir, pause):
    """Kill the run 5 steps after its checkpoint inside the epoch (step 20)."""
    killed_at("progress:1:25", launcher, args, pause)
    assert [e["step"] for e in events(run_dir, "progress")][-1] == 25


def test_resume_inside_an_epoch_gives_the_uninterrupted_losses_in_one_process(ptb_path,
                                                                               tmp_path):
    """With dropout: the masks come from (seed, rank, optimizer step), all restored."""
    whole, split = str(tmp_path / "whole"), str(tmp_path / "split")
    args = [*IN_EPOCH, "--data_path", ptb_path, "--set", "keep_prob=0.5"]
    run(0, [*args, "--output_dir", whole])
    kill_inside_the_epoch("one process", [*args, "--output_dir", split], split,
                          tmp_path / "pause")
    run(0, [*args, "--output_dir", split, "--resume"])
    assert len(losses(whole, 1)) == 60
    assert [e["step"] for e in events(split, "progress")] == list(range(1, 61))
    assert losses(split, 1) == pytest.approx(losses(whole, 1), rel=1e-5)
    assert events(split, "epoch")[-1]["train_ppl"] == pytest.approx(
        events(whole, "epoch")[-1]["train_ppl"], rel=1e-5)
    # the resumed epoch's time is that of the steps after its checkpoint, and says so (the
    # tables scale it); the whole run's is that of all its steps
    resumed = events(split, "epoch")[-1]
    assert resumed["steps"] == 60 and resumed["steps_run"] == 40, resumed
    assert "steps_run" not in events(whole, "epoch")[-1]


def test_resume_inside_an_epoch_with_2_or_4_ranks_gives_the_2_rank_losses(ptb_path, tmp_path):
    """The checkpoint holds the LSTM state of every row of the global batch, so 4 ranks go on
    from 2 ranks' checkpoint with the same global batches (keep_prob 1: each rank draws its
    own dropout masks, so other ranks would draw others)."""
    whole, split, four = (str(tmp_path / name) for name in ("whole", "split", "four"))
    args = [*IN_EPOCH, "--data_path", ptb_path]
    run(2, [*args, "--output_dir", whole])
    kill_inside_the_epoch("2 ranks", [*args, "--output_dir", split], split, tmp_path / "pause")
    shutil.copytree(split, four)
    run(2, [*args, "--output_dir", split, "--resume"])
    run(4, [*args, "--output_dir", four, "--resume"])
    for resumed in (split, four):
        assert losses(resumed, 1) == pytest.approx(losses(whole, 1), rel=1e-5)
    assert events(four, "progress")[-1]["world_size"] == 4


@pytest.mark.parametrize("launcher", ["one process", "2 ranks", "elastic"])
def test_a_new_run_saves_inside_its_first_epoch_before_its_first_log_line(launcher, corpus,
                                                                         tmp_path):
    """checkpoint_every=3 with --log_every 50: the first save comes before anything is logged,
    so before anything else has made the run's folder. Killed after it (every process), the
    run resumes from it and ends as the uninterrupted run does."""
    args = ["--config", TINY, "--data_path", corpus, "--set", "checkpoint_every=3",
            "--set", "steps_per_epoch=60", "--set", "num_epochs=1", "--set", "eval_steps=1",
            "--log_every", "50"]
    whole, out = tmp_path / "whole", tmp_path / "new" / "run"
    job = launch(launcher, [*args, "--output_dir", str(whole)], tmp_path)
    assert job.wait(timeout=300) == 0, job.communicate()[0][-3000:]
    killed_at("save:1:3", launcher, [*args, "--output_dir", str(out)], tmp_path / "pause",
              tmp_path)
    assert (out / "checkpoints" / "steps" / "checkpoint").exists()  # written last: a whole save
    assert not os.path.exists(out / "metrics.jsonl"), "a log line came before the kill"
    job = launch(launcher, [*args, "--output_dir", str(out), "--resume"], tmp_path)
    assert job.wait(timeout=300) == 0, job.communicate()[0][-3000:]
    assert [e["epoch"] for e in events(out, "epoch")] == [1]
    assert events(out, "epoch")[0]["valid_ppl"] == pytest.approx(
        events(whole, "epoch")[0]["valid_ppl"], rel=1e-5)


@pytest.mark.parametrize("launcher", ["2 ranks", "tf.distribute", "elastic"])
def test_at_a_resume_the_chief_alone_validates_the_cut_epoch_and_the_others_wait(
        launcher, ptb_path, tmp_path):
    """The trainers share one protocol around an epoch's validation, at its end as at a resume
    from the checkpoint of an epoch whose validation a stop cut short: the chief validates and
    writes the line, every other worker waits for it (allowing for it) before it trains on.
    Each window of the model records its process and time: in the resumed run one process
    validates, and no other starts training before that validation is over."""
    calls = tmp_path / "calls.txt"
    out = str(tmp_path / "run")
    args = ["--config", TINY, "--data_path", ptb_path, "--output_dir", out, "--log_every", "5",
            "--set", "steps_per_epoch=30", "--set", "num_epochs=2", "--set", "eval_steps=40",
            "--set", "model='tests.slow_model:build_recorded'"]
    env = {"PTB_TEST_CALLS": str(calls)}
    # killed once the chief has saved ckpt-1 (whole, its pointer file written last), before it
    # validates
    killed_at("save:1", launcher, args, tmp_path / "pause", tmp_path, env)
    assert "ckpt-1" in open(os.path.join(out, "checkpoints", "checkpoint")).read()
    # a rank in a process group of its own outlives the session's SIGKILL: the machine is gone
    deadline = time.monotonic() + 30
    while subprocess.run(["pkill", "-KILL", "-f", out]).returncode == 0:
        assert time.monotonic() < deadline, "a process of the killed run stays"
        time.sleep(0.2)
    assert not events(out, "epoch"), "the stop came after the epoch's validation"
    resumed_at = time.time()
    job = launch(launcher, [*args, "--resume"], tmp_path, env)
    output = job.communicate(timeout=300)[0]
    assert job.returncode == 0, output[-3000:]
    one_line_per_epoch(out, 2)
    records = [line.split() for line in calls.read_text().splitlines()]
    records = [(int(pid), kind, float(t)) for pid, kind, t in records if float(t) > resumed_at]
    validating = {pid for pid, kind, _ in records if kind == "eval"}
    assert len(validating) == 1, records
    [chief] = validating
    first_step = min(t for pid, kind, t in records if pid == chief and kind == "train")
    replayed = [t for pid, kind, t in records if pid == chief and kind == "eval" and t < first_step]
    assert len(replayed) == 40  # the cut epoch's validation, before the chief trains on
    others = {pid for pid, _, _ in records} - {chief}
    assert others, "no other worker trained"
    for pid in others:
        assert min(t for p, kind, t in records if p == pid) > max(replayed), pid
