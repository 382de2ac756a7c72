"""lm_ptb_elastic.py under a real Horovod elastic driver (horovodrun), with two "hosts" on this
machine: the driver treats localhost and 127.0.0.1 as two hosts, as Horovod's own elastic tests
do. Workers are lost to SIGKILL, and the discovery script lists the hosts from a file."""
import contextlib
import os
import signal
import time

import pytest

from tests import helpers
from tests.helpers import TINY, go_on, horovodrun, list_hosts, mpirun, pause_prefix, wait_for_pause

ARGS = ["--config", TINY, "--set", "steps_per_epoch=80", "--set", "num_epochs=3",
        "--set", "eval_steps=20", "--set", "checkpoint_every=20", "--log_every", "10"]


def worker_pid(host, out):
    """The pid of the training worker that the driver started for `host` in the run writing to
    `out` (not another test's: make test runs test files side by side)."""
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError):
            continue
        if (b"lm_ptb_elastic.py" in cmdline and out.encode() in cmdline.split(b"\0")
                and b"HOROVOD_RANK" in env and env.get(b"HOROVOD_HOSTNAME") == host.encode()):
            return int(pid)
    return None


def wait_for(condition, what, job, timeout=150):
    deadline = time.monotonic() + timeout
    while not condition():
        assert job.poll() is None, f"the job ended before {what}: {job.communicate()[0][-3000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def events(run_dir, kind):
    """helpers.events, or none while the run has not written its log yet."""
    if not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        return []
    return helpers.events(run_dir, kind)


@contextlib.contextmanager
def ended(job):
    """The job, killed whole (horovodrun, its driver and workers) if the test leaves it
    running."""
    try:
        yield job
    finally:
        if job.poll() is None:
            helpers.kill_job(job)


def frozen_for(pid, seconds, meanwhile=lambda: None):
    os.kill(pid, signal.SIGSTOP)
    meanwhile()
    time.sleep(seconds)
    os.kill(pid, signal.SIGCONT)


def finish(job, timeout=300):
    return helpers.finish(job, timeout)[:2]


@pytest.fixture
def two_hosts(tmp_path):
    path = tmp_path / "hosts.txt"
    list_hosts(path, "localhost:1", "127.0.0.1:1")
    return path


@contextlib.contextmanager
def paused_at(point, two_hosts, args, pause, **kw):
    """horovodrun's job (ended as by `ended`) once both its workers wait at `point` for the test
    to act on them (tests/pause_at.py, its files in `pause`). A worker that joins later goes
    by."""
    with ended(horovodrun(two_hosts, args, prefix=pause_prefix(pause, point), **kw)) as job:
        wait_for_pause(job, pause, count=2)
        yield job


def test_a_lost_worker_shrinks_the_job_which_grows_back_and_finishes(ptb_path, two_hosts,
                                                                      tmp_path):
    out, pause = str(tmp_path / "run"), tmp_path / "pause"
    # a failed host may come back after 1-2 seconds; killed at a step logged past the commit at
    # step 40: a reset goes back to 40
    with paused_at("progress:1:50", two_hosts, [*ARGS, "--data_path", ptb_path,
                                                  "--output_dir", out], pause,
                   cooldown=(1, 2)) as job:
        killed_at = time.time()
        list_hosts(two_hosts, "localhost:1")  # the second host is gone with its worker
        os.kill(worker_pid("127.0.0.1", out), signal.SIGKILL)
        go_on(pause)
        # the survivor goes on alone from its last commit
        wait_for(lambda: any(e["world_size"] == 1 for e in events(out, "progress")),
                 "progress at world size 1", job, timeout=60)
        alone = min(e["time"] for e in events(out, "progress") if e["world_size"] == 1)
        assert alone - killed_at < 60
        # then the discovery script lists the host again, and its cooldown lets it back in.
        # Alone, the tiny config's remaining ~200 steps take about 5 s here, about the cooldown
        # plus the driver's discovery: on a faster CPU the job ended before the host was back
        # (CI, world sizes [2, 1, 1, 1]). So the survivor is held meanwhile; the driver's note
        # that the host is back waits in its socket (Horovod's client sets no timeout) and is
        # read at SIGCONT, before the survivor's next commit.
        # 4x the cooldown's upper end, plus the driver's discovery each second
        frozen_for(worker_pid("localhost", out), 8,
                   meanwhile=lambda: list_hosts(two_hosts, "localhost:1", "127.0.0.1:1"))
        rc, output = finish(job)
    assert rc == 0, output[-3000:]
    epochs = events(out, "epoch")
    assert [e["epoch"] for e in epochs] == [1, 2, 3], epochs
    assert epochs[0]["world_sizes"][:2] == [2, 1] and all(e["world_sizes"] for e in epochs)
    sizes = [n for e in epochs for n in e["world_sizes"]]
    assert 2 in sizes[sizes.index(1):], sizes  # grew back after shrinking
    # each reset said what it did, in a line and an event of rank 0's
    resets = events(out, "reset")
    assert [(r["workers_before"], r["workers_after"], r["lost"], r["added"]) for r in resets][:2] \
        == [(2, 1, ["127.0.0.1"], []), (1, 2, [], ["127.0.0.1"])], resets
    lost, back = resets[:2]
    assert lost["epoch"] == 1 and lost["step"] % 20 == 0 and back["rolled_back_steps"] == 0
    assert lost["step"] + lost["rolled_back_steps"] == 50, lost  # the survivor was at 50
    n = lost["rolled_back_steps"]
    line = " | ".join(["[ptb] reset | workers 2 → 1", "lost 127.0.0.1",
                       *([f"{n} steps of 2 workers rolled back"] if n else []),
                       f"again from epoch 1 step {lost['step']}"])
    assert any(out_line.endswith(line) for out_line in output.splitlines()), (line, output)
    assert epochs[0].get("rolled_back") == ([{"workers": 2, "steps": n}] if n else None)
    # progress is logged twice as often as committed: a reset drops the lines past its commit
    progress = [(e["epoch"], e["step"]) for e in events(out, "progress")]
    assert progress == sorted(set(progress)), progress
    # the same length uninterrupted, with lm_ptb_distributed.py: the same global batches
    reference = str(tmp_path / "reference")
    r = mpirun((2, [*ARGS, "--data_path", ptb_path, "--output_dir", reference]))
    assert r.returncode == 0, r.stderr
    assert epochs[-1]["valid_ppl"] == pytest.approx(events(reference, "epoch")[-1]["valid_ppl"],
                                                    rel=0.02)


def test_the_last_worker_lost_ends_the_job_and_resume_continues(ptb_path, two_hosts, tmp_path):
    out, pause = str(tmp_path / "run"), tmp_path / "pause"
    args = [*ARGS, "--data_path", ptb_path, "--output_dir", out, "--set", "num_epochs=2"]
    with paused_at("progress:1:40", two_hosts, args, pause) as job:
        os.kill(worker_pid("localhost", out), signal.SIGKILL)
        os.kill(worker_pid("127.0.0.1", out), signal.SIGKILL)
        rc, output = finish(job, timeout=120)
    assert rc != 0, output[-3000:]
    assert "Horovod detected that one or more processes exited with non-zero status" in output
    assert not events(out, "epoch")

    rc, output = finish(horovodrun(two_hosts, [*args, "--resume"]))
    assert rc == 0, output[-3000:]
    assert [e["epoch"] for e in events(out, "epoch")] == [1, 2]
    steps = [e["step"] for e in events(out, "progress") if e["epoch"] == 1]
    assert steps == sorted(set(steps)) and steps[-1] == 80, steps  # continued, not restarted


def test_a_new_rank_0_keeps_the_checkpoints_saved_before_it(ptb_path, two_hosts, tmp_path):
    """Rank 0's worker lost after epoch 1: the other worker, rank 0 from then on, goes on saving
    checkpoints, and the list on disk still names the one the old rank 0 saved (so it can stand
    in for a damaged newer one); read at the start, before it existed, it would be dropped."""
    out, pause = str(tmp_path / "run"), tmp_path / "pause"
    with paused_at("progress:2:10", two_hosts,
                   [*ARGS, "--data_path", ptb_path, "--output_dir", out], pause) as job:
        first_chief = next(h for h in ("localhost", "127.0.0.1") if chief_is(h, out))
        survivor = "127.0.0.1" if first_chief == "localhost" else "localhost"
        list_hosts(two_hosts, f"{survivor}:1")
        os.kill(worker_pid(first_chief, out), signal.SIGKILL)
        go_on(pause)
        rc, output = finish(job)
    assert rc == 0, output[-3000:]
    assert [e["epoch"] for e in events(out, "epoch")] == [1, 2, 3]
    import tensorflow as tf
    listed = tf.train.get_checkpoint_state(os.path.join(out, "checkpoints"))
    assert [os.path.basename(p) for p in listed.all_model_checkpoint_paths] == \
        ["ckpt-1", "ckpt-2", "ckpt-3"]


def test_a_frozen_worker_is_waited_for_through_the_reset_and_both_go_on(ptb_path, two_hosts,
                                                                          tmp_path):
    """A worker stopped (SIGSTOP) for longer than Gloo's timeout and the step timeout together:
    its peer's collective fails at Gloo's 5 s and it resets, waiting for the driver; the step's
    10 s watchdog no longer ends it there (it did: the frozen worker went on alone). When the
    stopped one goes on, both reset and the job finishes at 2 workers, in one launch."""
    out, pause = str(tmp_path / "run"), tmp_path / "pause"
    with paused_at("progress:1:30", two_hosts,
                   [*ARGS, "--data_path", ptb_path, "--output_dir", out,
                    "--set", "step_timeout_s=10"], pause,
                   env={"HOROVOD_GLOO_TIMEOUT_SECONDS": "5"}) as job:
        frozen_for(worker_pid("127.0.0.1", out), 20, meanwhile=lambda: go_on(pause))
        rc, output = finish(job)
    assert rc == 0, output[-3000:]
    assert "did not finish in" not in output, output[-3000:]
    resets = events(out, "reset")
    assert resets and resets[0]["workers_before"] == resets[0]["workers_after"] == 2, resets
    assert [e["epoch"] for e in events(out, "epoch")] == [1, 2, 3]


def chief_is(host, out):
    """Whether the worker the driver started for `host` is rank 0."""
    pid = worker_pid(host, out)
    with open(f"/proc/{pid}/environ", "rb") as f:
        return b"HOROVOD_RANK=0\0" in f.read() + b"\0"


def test_a_worker_count_that_does_not_divide_the_batch_is_refused_in_one_line():
    import lm_ptb_elastic
    from utils.config import ConfigError
    cfg = {"batch_size": 20, "backward_passes_per_step": 1}
    for workers in (1, 2, 4, 5, 10, 20):
        lm_ptb_elastic.refuse_indivisible(cfg, workers)
    with pytest.raises(ConfigError) as e:
        lm_ptb_elastic.refuse_indivisible(cfg, 3)
    assert str(e.value).startswith("the job now has 3 workers: batch_size=20 is not divisible "
                                   "by 3 workers"), e.value
    with pytest.raises(ConfigError, match="do not split into backward_passes_per_step=4"):
        lm_ptb_elastic.refuse_indivisible(dict(cfg, backward_passes_per_step=4), 2)


def test_a_reset_is_told_by_the_workers_that_were_there_and_all_agree():
    """elastic_membership.py by hand: 2 workers at step 50 of epoch 1, the one on 127.0.0.1 lost,
    the survivor back at the commit of step 40; then a new worker on 127.0.0.1 at step 60."""
    from utils.checkpoints import Position
    from elastic_membership import Membership
    first, second = Membership("localhost"), Membership("127.0.0.1")
    gathered = [first.mine(), second.mine()]
    assert first.start(gathered, Position(0)) is None
    assert second.start(gathered, Position(0)) is None
    for worker in (first, second):
        worker.counting(0)(50, 80)  # epoch 1 (counted from 0 by train_epoch), step 50
    assert first.start([first.mine()], Position(0, 40)) == {
        "workers_before": 2, "workers_after": 1, "lost": ["127.0.0.1"], "added": [],
        "epoch": 1, "step": 40, "rolled_back_steps": 10}
    first.counting(0)(60, 80)
    new = Membership("127.0.0.1")
    gathered = [first.mine(), new.mine()]  # a commit at 60, then the grow-back: nothing lost
    change = {"workers_before": 1, "workers_after": 2, "lost": [], "added": ["127.0.0.1"],
              "epoch": 1, "step": 60, "rolled_back_steps": 0}
    assert first.start(gathered, Position(0, 60)) == change == new.start(gathered, Position(0, 60))
    assert first.epoch_done() == new.epoch_done() == [(2, 10)]
    assert first.epoch_done() == []
    # a reset during the validation after epoch 1's end commit rolls nothing back
    first.counting(0)(80, 80)
    assert first.start([first.mine()], Position(1))["rolled_back_steps"] == 0
