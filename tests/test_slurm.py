"""launch/slurm.sbatch under a real Slurm (one node, 2 CPUs, daemons started by the test)."""
import os
import subprocess
import sys
import time
import types

import pytest

from tests import slurm
from tests.helpers import REPO, TINY, events, go_on, paused_python, wait_for_pause


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = slurm.missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(why + "; CI must run the Slurm test")
        pytest.skip(why)
    with slurm.local_slurm(str(tmp_path_factory.mktemp("slurm"))) as running:
        yield running


def submit(cluster, ptb_path, out, job_log, extra_env, *trainer_args):
    """sbatch launch/slurm.sbatch with 2 tasks on the tiny config; returns the job id."""
    env = dict(cluster.env, CONFIG=TINY, PTB_DATA_PATH=ptb_path, OUTPUT_DIR=out,
               PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    env.update(extra_env)
    r = cluster.run("sbatch", "--parsable", "-n", "2", f"--output={job_log}",
                    "launch/slurm.sbatch", "--log_every", "5", *trainer_args, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def test_sbatch_trains_with_2_tasks_stops_on_scancel_and_requeue_continues(cluster, ptb_path,
                                                                           tmp_path):
    out, job_log = str(tmp_path / "run"), str(tmp_path / "job.out")
    # the TERM comes 5 steps into epoch 2, where both tasks wait for it (tests/pause_at.py
    # through the script's PYTHON)
    pause = tmp_path / "pause"
    trained = ["--set", "num_epochs=3", "--set", "steps_per_epoch=60", "--set", "eval_steps=10"]
    job = submit(cluster, ptb_path, out, job_log,
                 {"PYTHON": paused_python(pause, "progress:2:5")}, *trained)
    # what wait_for_pause asks of a process, asked of the Slurm job
    running = types.SimpleNamespace(
        poll=lambda: None if cluster.state(job) in ("PENDING", "RUNNING") else 1,
        communicate=lambda: open(job_log).read() + cluster.logs())
    wait_for_pause(running, pause, count=2)
    assert cluster.run("scancel", "--signal=TERM", job).returncode == 0
    assert cluster.wait(job, ("FAILED", "COMPLETED", "CANCELLED"), timeout=60) == "FAILED"
    go_on(pause)  # the requeued job, through the same PYTHON, goes by
    stopped = open(job_log).read()
    assert "error: stopped by SIGTERM" in stopped and "Traceback" not in stopped, stopped
    assert not [f for f in os.listdir(os.path.join(out, "checkpoints")) if "_temp" in f]
    assert [e["epoch"] for e in events(out, "epoch")] == [1]

    # The stopped job's step daemons must be gone before it starts again (else its new step
    # collides with the old one's leftovers: Slurm itself holds a requeued job two minutes)
    deadline = time.monotonic() + 60
    while subprocess.run(["pgrep", "-x", "slurmstepd"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "slurmstepd of the stopped job still runs"
        time.sleep(0.3)
    assert cluster.run("scontrol", "requeue", job).returncode == 0
    deadline = time.monotonic() + 30
    while cluster.field(job, "Restarts") != "1":  # the requeue has taken effect
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.3)
    # and start it now instead of after the hold
    assert cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now").returncode == 0
    assert cluster.wait(job, ("COMPLETED", "FAILED"), timeout=240) == "COMPLETED", \
        open(job_log).read()
    log = open(job_log).read()
    assert "(restart 1), 2 tasks" in log and "--resume" in log, log
    epochs = events(out, "epoch")
    assert [(e["epoch"], e["world_size"]) for e in epochs] == [(1, 2), (2, 2), (3, 2)]
    assert events(out, "test")[-1]["world_size"] == 2

    # the script adds --resume to a folder that holds a run, so another dropout for the same
    # folder is refused in one line, as by `make train`; the same job again is told it is done
    refused_log, done_log = str(tmp_path / "refused.out"), str(tmp_path / "done.out")
    job = submit(cluster, ptb_path, out, refused_log, {}, *trained, "--set", "keep_prob=0.5")
    assert cluster.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=240) == "FAILED"
    assert "error: --resume: the run was trained with other values of keep_prob (keep_prob " \
        "1.0 -> 0.5); " in open(refused_log).read(), open(refused_log).read()
    job = submit(cluster, ptb_path, out, done_log, {}, *trained)
    assert cluster.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=240) == "COMPLETED"
    assert f"--resume: the run in {out} is finished: 3 epochs" in open(done_log).read()
    assert events(out, "epoch") == epochs


def test_sbatch_with_tf_distribute_trains_with_2_tasks(cluster, ptb_path, tmp_path):
    """TRAINER=tf.distribute: each srun task gets its TF_CONFIG from launch/tf_config.py
    --slurm, and the two workers train together."""
    out, job_log = str(tmp_path / "run"), str(tmp_path / "job.out")
    job = submit(cluster, ptb_path, out, job_log, {"TRAINER": "tf.distribute"},
                 "--set", "num_epochs=1", "--set", "steps_per_epoch=20", "--set", "eval_steps=5")
    assert cluster.wait(job, ("COMPLETED", "FAILED", "CANCELLED"), timeout=240) == "COMPLETED", \
        open(job_log).read() + cluster.logs()
    assert [e["world_size"] for e in events(out, "test")] == [2]
    assert open(job_log).read().count("test ppl") == 1  # worker 0 alone reports


def test_tf_config_slurm_outside_srun_is_one_line_and_counts_expand():
    sys.path.insert(0, os.path.join(REPO, "launch"))
    import tf_config
    assert tf_config.expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert tf_config.expand_counts("4") == [4]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run([sys.executable, "launch/tf_config.py", "--slurm", "--", "true"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "run it under srun" in lines[0], r.stderr
