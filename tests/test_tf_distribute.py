"""lm_ptb_tf_distribute.py: real workers of MultiWorkerMirroredStrategy on localhost ports."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from scripts import twohosts
from tests.helpers import (REPO, TINY, events, go_on, need_root, pause_prefix, run_script,
                           script_env, wait_for_pause)

BOUNDED = ["--config", TINY, "--set", "num_epochs=1", "--set", "steps_per_epoch=30",
           "--set", "eval_steps=5", "--log_every", "5"]


def launch(n, args, timeout=420):
    """launch/tf_config.py -n N: N workers on this host, each with its TF_CONFIG. The timeout
    bounds a hang, as helpers.mpirun's: 2 tiny epochs of 2 workers outgrew 240 s beside a busy
    loop on each core of a machine shared with other tests (load 23)."""
    return subprocess.run([sys.executable, "launch/tf_config.py", "-n", str(n), "--",
                           sys.executable, "lm_ptb_tf_distribute.py", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env=script_env())


def worker(index, ports, args, prefix=()):
    """One worker started by hand, as on its own host: its TF_CONFIG, its own session. prefix:
    a runner's path and arguments before the script's (pause_prefix)."""
    tf_config = {"cluster": {"worker": [f"localhost:{p}" for p in ports]},
                 "task": {"type": "worker", "index": index}}
    return subprocess.Popen([sys.executable, *prefix, "lm_ptb_tf_distribute.py", *args], cwd=REPO,
                            env=script_env({"TF_CONFIG": json.dumps(tf_config)}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def train_ppls(run_dir):
    return [e["train_ppl"] for e in events(run_dir, "progress")]


def test_two_workers_train_as_one_process_and_worker_0_alone_reports(corpus, tmp_path):
    """With max_grad_norm this low the clip acts at every step: a clip of each worker's
    gradient before their sum (Keras 3's optimizer under tf.distribute, unless
    sum_before_clipping) would move twice as far and part from one process at once."""
    single, two = tmp_path / "single", tmp_path / "two"
    args = [*BOUNDED, "--set", "max_grad_norm=0.25", "--data_path", corpus]
    r = run_script(["lm_ptb.py", *args, "--output_dir", str(single)])
    assert r.returncode == 0, r.stderr
    r = launch(2, [*args, "--output_dir", str(two)])
    assert r.returncode == 0, r.stderr
    expected, got = train_ppls(single), train_ppls(two)
    assert len(got) == len(expected) == 6
    for step, (a, b) in enumerate(zip(expected, got)):
        assert abs(b - a) / a < 1e-3, (step, a, b)
    assert {e["world_size"] for e in events(two, "progress")} == {2}
    assert r.stdout.count("epoch 1/1 done") == 1 and r.stdout.count("test ppl") == 1, r.stdout


def test_one_worker_without_tf_config_is_lm_ptb(corpus, tmp_path):
    single, alone = tmp_path / "single", tmp_path / "alone"
    for script, out in (("lm_ptb.py", single), ("lm_ptb_tf_distribute.py", alone)):
        r = run_script([script, *BOUNDED, "--data_path", corpus, "--output_dir", str(out)])
        assert r.returncode == 0, r.stderr
    assert train_ppls(alone) == train_ppls(single)


def test_a_lost_worker_ends_the_other_in_one_line_and_resume_finishes(corpus, tmp_path):
    """Worker 1's host is lost right after the first checkpoint inside epoch 1 (both workers
    wait there: tests/pause_at.py); worker 0 goes on, into a step the other never joins."""
    run, pause = tmp_path / "run", tmp_path / "pause"
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", str(run), "--set",
            "num_epochs=2", "--set", "checkpoint_every=20", "--log_every", "10"]
    ports = [23950 + os.getpid() % 40, 23990 + os.getpid() % 40]
    workers = [worker(i, ports, args, pause_prefix(pause, "save:1:20")) for i in range(2)]
    try:
        wait_for_pause(workers[0], pause, count=2)
    finally:
        os.killpg(workers[1].pid, signal.SIGKILL)  # its host is gone
        go_on(pause)
    started = time.monotonic()
    _, err = workers[0].communicate(timeout=90)
    workers[1].wait()
    assert workers[0].returncode not in (0, None)
    assert time.monotonic() - started < 60
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: worker 0: a collective with the other workers failed"), err

    r = launch(2, [*args, "--resume"])
    assert r.returncode == 0, r.stderr
    assert [e["epoch"] for e in events(run, "epoch")] == [1, 2]
    whole = tmp_path / "uninterrupted"
    r = launch(2, [*args[:args.index("--output_dir")], "--output_dir", str(whole),
                   *args[args.index("--output_dir") + 2:]])
    assert r.returncode == 0, r.stderr
    resumed, expected = events(run, "test")[0]["test_ppl"], events(whole, "test")[0]["test_ppl"]
    assert abs(resumed - expected) / expected < 1e-4, (resumed, expected)


def test_a_bad_tf_config_or_workers_that_disagree_stop_in_one_line(corpus, tmp_path):
    r = run_script(["lm_ptb_tf_distribute.py", *BOUNDED, "--data_path", corpus],
                   env={"TF_CONFIG": '{"cluster": {"worker": ["localhost:1"]}, "task": {}}'})
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
        "error: TF_CONFIG must be"), r.stderr

    ports = [24030 + os.getpid() % 40, 24070 + os.getpid() % 40]
    out = str(tmp_path / "disagree")
    workers = [worker(i, ports, [*BOUNDED, "--data_path", corpus, "--output_dir", out,
                                 "--set", f"max_grad_norm={5 + i}"]) for i in range(2)]
    for w in workers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 2, err
        assert err.strip().splitlines()[-1].startswith(
            "error: workers started with different config"), err


@pytest.mark.parametrize("sets, named", [
    (["fp16_allreduce=True"], "fp16_allreduce=True: Horovod's option, "),
    (["sparse_as_dense=True", "reduce_type='param'"],
     "reduce_type='param', sparse_as_dense=True: Horovod's options, "),
    (["timeline=True"], "timeline=True: Horovod's option, ")])
def test_horovods_own_options_are_refused_in_one_line(corpus, tmp_path, sets, named):
    """Nothing here acts on them: a run would log them in every event as if it had."""
    r = run_script(["lm_ptb_tf_distribute.py", *BOUNDED, "--data_path", corpus, "--output_dir",
                    str(tmp_path / "run"), *[w for s in sets for w in ("--set", s)]])
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith(f"error: {named}which tf.distribute has no counterpart of; "
                               "leave "), r.stderr
    assert r.stderr.endswith("at the default (drop the --set), or train with "
                             "lm_ptb_distributed.py\n"), r.stderr
    assert not (tmp_path / "run").exists()


def test_more_workers_than_gpus_on_a_host_is_one_line(corpus, tmp_path):
    """Step 2 through the trainer's own path on stand-in GPUs (tests/stand_in_gpus.py): 2
    workers on a host of 1 GPU stop before the strategy starts, each with one line naming the
    fix, instead of sharing the one GPU unsaid."""
    r = subprocess.run([sys.executable, "launch/tf_config.py", "-n", "2", "--",
                        sys.executable, "tests/stand_in_gpus.py", "1", "lm_ptb_tf_distribute.py",
                        *BOUNDED, "--data_path", corpus, "--output_dir", str(tmp_path / "run")],
                       cwd=REPO, capture_output=True, text=True, timeout=120, env=script_env())
    assert r.returncode == 2 and "stand-in GPUs:" not in r.stdout, r.stdout + r.stderr
    line = ("error: this host runs 2 workers but has 1 GPU, one per worker: start at most 1 "
            "worker per host (launch/tf_config.py -n 1, or at most 1 of TF_CONFIG's workers on "
            "this host), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU cores\n")
    assert line in r.stderr and r.stderr.count("error:") <= 2, r.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_two_hosts_over_veth(ptb_path, tmp_path):
    """One worker in each of two network namespaces, as on two machines: TF_CONFIG names their
    addresses, and the gradients cross the veth link."""
    need_root()
    out = str(tmp_path / "run")
    with twohosts.two_hosts() as hosts:
        addresses = [f"{address}:23456" for _, address, _ in hosts]
        before = twohosts.tx_bytes(hosts[1])
        procs = []
        for i, (ns, _, _) in enumerate(hosts):
            tf_config = json.dumps({"cluster": {"worker": addresses},
                                    "task": {"type": "worker", "index": i}})
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", ns, sys.executable, "lm_ptb_tf_distribute.py",
                 "--config", TINY, "--data_path", ptb_path, "--output_dir", out,
                 "--set", "steps_per_epoch=20", "--set", "num_epochs=1", "--set", "eval_steps=5"],
                cwd=REPO, env=script_env({"TF_CONFIG": tf_config}), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True))
        results = [p.communicate(timeout=240) for p in procs]
        sent = twohosts.tx_bytes(hosts[1]) - before
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stdout + stderr
    assert events(out, "test")[0]["world_size"] == 2
    assert sent > 20 * 4 * 32 * 10000  # 20 steps' gradients hold at least the 32 x 10,000 softmax


def test_a_worker_whose_peer_never_starts_stops_in_one_line(corpus, tmp_path):
    ports = [24110 + os.getpid() % 40, 24150 + os.getpid() % 40]
    alone = worker(0, ports, [*BOUNDED, "--data_path", corpus, "--output_dir",
                              str(tmp_path / "alone"), "--set", "step_timeout_s=5"])
    started = time.monotonic()
    _, err = alone.communicate(timeout=120)
    assert alone.returncode != 0 and time.monotonic() - started < 60, err
    assert err.strip().splitlines()[-1].startswith(
        "error: worker 0: not every worker of TF_CONFIG started within 5 s"), err


def test_a_frozen_worker_ends_the_job_in_one_line_and_resume_continues(corpus, tmp_path):
    """A stopped worker (a frozen node) stops sending the coordination service's heartbeats:
    the strategy itself fails the other's collective after about 10 s, before the step
    watchdog's 60 s, and the launcher then ends the stopped one (SIGKILL after --grace). Worker 1
    is stopped 5 steps into epoch 2 (both wait there: tests/pause_at.py), and worker 0 goes on
    into the next step."""
    run, pause = tmp_path / "run", tmp_path / "pause"
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", str(run), "--log_every",
            "5", "--set", "num_epochs=3", "--set", "step_timeout_s=60"]
    launcher = subprocess.Popen([sys.executable, "launch/tf_config.py", "-n", "2", "--grace", "5",
                                 "--", sys.executable, *pause_prefix(pause, "progress:2:5"),
                                 "lm_ptb_tf_distribute.py", *args],
                                cwd=REPO, env=script_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        os.kill(wait_for_pause(launcher, pause, count=2)[1], signal.SIGSTOP)
        go_on(pause)
        started = time.monotonic()
        _, err = launcher.communicate(timeout=120)
        elapsed = time.monotonic() - started
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode != 0 and elapsed < 45, (launcher.returncode, elapsed, err)
    assert "stopped sending heartbeats" in err, err
    assert err.strip().splitlines()[-1].startswith(
        "error: worker 0: a collective with the other workers failed"), err
    assert "Traceback" not in err and "retracing" not in err, err
    r = launch(2, [*args, "--resume"])
    assert r.returncode == 0, r.stderr
    assert [e["epoch"] for e in events(run, "epoch")][-2:] == [2, 3]
