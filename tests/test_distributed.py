"""Real Horovod ranks under real mpirun, on CPU: equivalence with one process, sharding,
rank-0-only output, launch errors, and two "hosts" joined by a veth pair or by a link with
added delay."""
import json
import os
import re
import time
import subprocess
import sys

import numpy as np
import pytest

from scripts import twohosts
from tests.helpers import (REPO, TINY, first_loss, checkpoint_weights, events, mpirun, need_root,
                           run_job, run_script)
from utils.cli import RANK_0_FIRST_S
from utils.config import load_config

# Equivalence: keep_prob 1 and 60 logged steps; one step = 4 rows x 5 tokens of real PTB.
# Clipping acts (max_grad_norm below the global norm: checked below), so that it is the global
# batch's gradient that gets clipped, not each rank's before the average.
EQUIV_SET = ["--set", "hidden_size=16", "--set", "batch_size=4", "--set", "num_steps=5",
             "--set", "num_epochs=2", "--set", "max_epoch=1", "--set", "steps_per_epoch=30",
             "--set", "eval_steps=5", "--set", "keep_prob=1.0", "--set", "max_grad_norm=0.25",
             "--log_every", "1", "--seed", "7"]


def test_horovods_subgraphs_are_traced_without_autograph():
    """Patch 09: Horovod wraps its gradient allreduce (and broadcast) in tf.function subgraphs;
    with AutoGraph off their first trace costs a few seconds less in every rank. A Python `if`
    on a tensor is what AutoGraph would have rewritten into a tf.cond: without it, tracing
    refuses it."""
    import tensorflow as tf
    import horovod.tensorflow as hvd_tf

    def branches_on_a_tensor(x):
        if x > 0:
            return x
        return -x
    with pytest.raises(tf.errors.OperatorNotAllowedInGraphError):
        hvd_tf._make_subgraph(branches_on_a_tensor)(tf.constant(1.0))
    assert float(tf.function(branches_on_a_tensor)(tf.constant(-2.0))) == 2.0  # AutoGraph's


def first_step(ptb_path):
    """The loss and the pre-clip global gradient norm of EQUIV_SET's first step, computed here
    from the same seed, config and data as the trainer's."""
    import tensorflow as tf
    from data import ptb
    from utils import config, train_steps
    from utils.model import build, sequence_loss
    sets = [EQUIV_SET[i + 1] for i, flag in enumerate(EQUIV_SET) if flag == "--set"]
    cfg = config.load_config(TINY, sets)
    corpus = ptb.load_corpus(ptb_path)
    x, y = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    train_steps.seed_everything(7)
    model = build(cfg, len(corpus.vocab))
    with tf.GradientTape() as tape:
        logits, _ = model(tf.constant(x[0]), model.zero_state(cfg["batch_size"]), training=True,
                          noise_seed=train_steps.noise_seed(7, 0, 0))
        loss = sequence_loss(logits, tf.constant(y[0]))
    grads = tape.gradient(loss, model.trainable_variables)
    return float(loss) / cfg["num_steps"], float(tf.linalg.global_norm(
        [tf.convert_to_tensor(g) for g in grads])), cfg["max_grad_norm"]


@pytest.mark.smoke
def test_two_ranks_equal_one_process_and_only_rank0_writes(ptb_path, tmp_path):
    single, dist, rank1 = tmp_path / "single", tmp_path / "dist", tmp_path / "rank1"
    common = ["--config", TINY, "--data_path", ptb_path, *EQUIV_SET]
    r = run_script(["lm_ptb.py", *common, "--output_dir", str(single)], timeout=180)
    assert r.returncode == 0, r.stderr
    # rank 1 gets its own --output_dir: it must stay empty, since only rank 0 writes.
    r = mpirun((1, [*common, "--output_dir", str(dist)]), (1, [*common, "--output_dir", str(rank1)]))
    assert r.returncode == 0, r.stdout + r.stderr
    assert not rank1.exists()

    one = [e["loss"] for e in events(single, "progress")]
    two = [e["loss"] for e in events(dist, "progress")]
    assert len(one) == len(two) == 60
    rel = np.abs(np.array(one) - np.array(two)) / np.abs(one)
    assert rel.max() < 1e-4, rel
    assert one[0] != pytest.approx(one[-1], rel=1e-2)  # it trained: the losses moved
    # clipping acted: the first step's gradient (from the trainer's own first weights, as its
    # logged loss shows) is longer than max_grad_norm
    loss, norm, max_norm = first_step(ptb_path)
    assert loss == pytest.approx(one[0], rel=1e-5) and norm > 2 * max_norm, (loss, norm)

    assert {e["world_size"] for e in events(dist, "epoch")} == {2}
    a, b = checkpoint_weights(single), checkpoint_weights(dist)
    assert a.keys() == b.keys() and len(a) >= 8
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5, err_msg=name)
    # the train perplexity rank 0 reports is the global one, not its shard's
    assert events(dist, "epoch")[-1]["train_ppl"] == pytest.approx(
        events(single, "epoch")[-1]["train_ppl"], rel=1e-4)


def test_two_ranks_equal_one_process_in_bf16(ptb_path, tmp_path):
    """precision bf16: the same update on 1 and 2 ranks within bf16's rounding (the 2 ranks'
    weight gradients are products over half the rows each, rounded apart: 1.4e-4 measured over
    these 60 steps), and bf16 really ran on the ranks: at init_scale 1 the first step's loss (a
    forward pass of the same weights on the same rows) is bf16's, 8e-8 from one process's, where
    fp32's is 3e-5 away. Over the whole run bf16 and fp32 differ by no more than 1 and 2 ranks
    do (1.5e-4), so the trajectory alone would pass a 2-rank run that trained in fp32."""
    sets = [*EQUIV_SET, "--set", "init_scale=1.0"]
    common = ["--config", TINY, "--data_path", ptb_path, *sets]
    bf16 = ["--set", "precision='bf16'"]
    runs = {name: tmp_path / name for name in ("single", "dist", "fp32")}
    for name, args in (("single", bf16), ("fp32", [])):
        r = run_script(["lm_ptb.py", *common, *args, "--output_dir", str(runs[name])],
                       timeout=180)
        assert r.returncode == 0, r.stderr
    r = mpirun((2, [*common, *bf16, "--output_dir", str(runs["dist"])]))
    assert r.returncode == 0, r.stdout + r.stderr
    one, two, fp32 = (np.array([e["loss"] for e in events(path, "progress")])
                      for path in runs.values())
    assert len(one) == len(two) == 60
    assert (np.abs(one - two) / one).max() < 3e-3
    assert two[0] == pytest.approx(one[0], rel=1e-6)
    assert abs(fp32[0] - one[0]) > 1e-5 * one[0]  # bf16's first step is not fp32's
    # the first step as computed here, in each precision, from the same weights and rows
    values = [sets[i + 1] for i, flag in enumerate(sets) if flag == "--set"]
    assert one[0] == pytest.approx(first_loss(ptb_path, TINY, values, 7, "bf16"), rel=1e-6)
    assert fp32[0] == pytest.approx(first_loss(ptb_path, TINY, values, 7, "fp32"), rel=1e-6)


def fp16_skips(run_dir):
    """(steps skipped, loss scale) of a finished fp16 run: the steps the trainer ran (its
    progress lines, one a step) less the steps its optimizer took, and its last checkpoint's
    loss scale."""
    import tensorflow as tf
    kept = tf.train.load_checkpoint(str(run_dir / "checkpoints" / "ckpt-2"))
    taken = int(kept.get_tensor(
        "optimizer/inner_optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"))
    return (len(events(run_dir, "progress")) - taken,
            float(kept.get_tensor("optimizer/dynamic_scale/.ATTRIBUTES/VARIABLE_VALUE")))


def test_two_ranks_equal_one_process_in_fp16_with_one_loss_scale(ptb_path, tmp_path):
    """precision fp16 (float16 operands, the loss scaled by Keras 3's LossScaleOptimizer inside
    Horovod's optimizer): the same steps on 1 and 2 ranks within float16's rounding, and float16
    ran: the first step's loss is float16's, computed here. No step of these overflows at
    Keras's first loss scale, 32768 (counted: none skipped, the scale unchanged). So a third
    run, of 2 ranks at init_scale 2, whose first gradients overflow: it skips steps, its
    scale halved at each (the steps skipped counted as the steps the trainer ran less the
    optimizer's steps taken), and trains on to the end, where ranks that disagreed on a skip
    would have left one in an allreduce the other skipped (patch 16's hang). Against one
    process such a run cannot be held: a rank's half-batch mean gradient is twice a whole
    batch's per row, so float16 overflows on 2 ranks where one process may not."""
    sets = [*EQUIV_SET, "--set", "init_scale=1.0"]
    common = ["--config", TINY, "--data_path", ptb_path, *sets, "--set", "precision='fp16'"]
    runs = {name: tmp_path / name for name in ("single", "dist")}
    r = run_script(["lm_ptb.py", *common, "--output_dir", str(runs["single"])], timeout=180)
    assert r.returncode == 0, r.stderr
    r = mpirun((2, [*common, "--output_dir", str(runs["dist"])]))
    assert r.returncode == 0, r.stdout + r.stderr
    one, two = (np.array([e["loss"] for e in events(path, "progress")])
                for path in runs.values())
    assert len(one) == len(two) == 2 * 30
    assert (np.abs(one - two) / one).max() < 3e-3
    assert two[0] == pytest.approx(one[0], rel=1e-6)
    values = [sets[i + 1] for i, flag in enumerate(sets) if flag == "--set"]
    assert one[0] == pytest.approx(first_loss(ptb_path, TINY, values, 7, "fp16"), rel=1e-6)
    assert abs(first_loss(ptb_path, TINY, values, 7, "fp32") - one[0]) > 1e-6 * one[0]
    assert [fp16_skips(path) for path in runs.values()] == [(0, 32768.0)] * 2
    overflowing = tmp_path / "overflowing"
    r = mpirun((2, [*common, "--set", "init_scale=2.0", "--output_dir", str(overflowing)]))
    assert r.returncode == 0, r.stdout + r.stderr
    skipped, scale = fp16_skips(overflowing)
    # the scale grows only after 2,000 steps without an overflow: halved at each skip
    assert skipped >= 1 and scale == 32768 / 2 ** skipped, (skipped, scale)
    losses = [e["loss"] for e in events(overflowing, "progress")]
    assert len(losses) == 2 * 30 and all(np.isfinite(losses)), losses


def test_four_ranks_train_and_three_ranks_fail_cleanly(ptb_path, tmp_path):
    args = ["--config", TINY, "--data_path", ptb_path, "--set", "steps_per_epoch=10",
            "--set", "num_epochs=1", "--set", "eval_steps=5", "--threads", "1"]
    r = mpirun((4, [*args, "--output_dir", str(tmp_path / "four")]), timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    assert events(tmp_path / "four", "test")[0]["world_size"] == 4

    r = mpirun((3, [*args, "--output_dir", str(tmp_path / "three")]), timeout=120)
    assert r.returncode == 2
    assert said(r.stderr) == ["error: batch_size=20 is not divisible by 3 workers; use a worker "
                              "count that divides it or --set batch_size=<multiple of 3>"]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "three").exists()


def said(stderr):
    """The job's error lines: one per job where every rank has the error (utils/cli.py)."""
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_rank_with_another_config_stops_all(ptb_path, tmp_path):
    args = ["--config", TINY, "--data_path", ptb_path, "--output_dir", str(tmp_path / "run")]
    r = mpirun((1, args), (1, [*args, "--set", "num_epochs=2"]), timeout=120)
    assert r.returncode == 2
    line, = said(r.stderr)
    assert line.startswith("error: ranks started with different config (per rank: ")
    assert line.endswith("give every rank the same --config and --set")


@pytest.mark.parametrize("refused", ["--set", "--baseline"])
def test_a_refusal_every_rank_makes_is_said_by_rank_0_alone(refused, corpus, tmp_path):
    """A bad --set is refused before Horovod starts (the rank comes from mpirun's environment),
    a baseline of another config after it: every rank refuses alike, rank 0 says it, the other
    waits for mpirun to end it, and the job ends with rank 0's status."""
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", str(tmp_path / "run")]
    if refused == "--set":
        args += ["--set", "hidden_size=-1"]
        line = "error: --set: hidden_size must be > 0, got -1"
    else:
        medium = {"name": "config_medium", **load_config("config_medium")}
        baseline = tmp_path / "medium.jsonl"
        baseline.write_text(json.dumps({"event": "epoch", "epoch": 1, "epoch_time_s": 100.0,
                                        "config": medium}) + "\n")
        args += ["--baseline", str(baseline)]
        line = f"error: --baseline {baseline} is a run of config_medium, whose "
    r = mpirun((2, args), timeout=180)
    assert r.returncode == 2, r.stdout + r.stderr
    error, = said(r.stderr)
    assert error.startswith(line), error
    # mpirun names the process that failed first: rank 0, not the one that waited
    assert re.search(r"Process name: \[\[\d+,\d+\],0\]", r.stderr), r.stderr
    assert "Traceback" not in r.stderr


def test_an_error_of_one_rank_alone_is_still_said_by_that_rank(corpus, tmp_path):
    """Rank 1 without the data (hosts without a shared filesystem): rank 0 has no such error to
    say, so rank 1 says its own once it has waited RANK_0_FIRST_S for it, and mpirun ends rank
    0, which says why it stops too."""
    args = ["--config", TINY, "--output_dir", str(tmp_path / "run")]
    nowhere = tmp_path / "nowhere"
    started = time.monotonic()
    r = mpirun((1, [*args, "--data_path", corpus]), (1, [*args, "--data_path", str(nowhere)]),
               timeout=240)
    # the job's status is the first to end's: rank 1's 2, or rank 0's 1 if it saw rank 1 go first
    assert r.returncode in (1, 2) and time.monotonic() - started >= RANK_0_FIRST_S, r.stderr
    assert said(r.stderr)[0] == (
        f"error: rank 1 finds no PTB files in {nowhere} (rank 0 has them): without a shared "
        "filesystem, copy them to every host or point --data_path at a shared folder"), r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("what", ["truncated data", "other text, same length", "log_every"])
def test_ranks_with_other_data_or_flags_stop_all(what, ptb_path, tmp_path):
    """A copy of the data that differs on one host (no shared filesystem), or a flag that must
    agree, ends the job with one line instead of a hang at the epoch end or another model."""
    other = tmp_path / "other"
    other.mkdir()
    for name in ("ptb.train.txt", "ptb.valid.txt", "ptb.test.txt"):
        text = open(os.path.join(ptb_path, name)).read()
        if name == "ptb.train.txt" and what == "truncated data":
            text = text[:len(text) // 2]
        if name == "ptb.train.txt" and what == "other text, same length":
            text = text.replace(" the ", " tha ", 50)
        (other / name).write_text(text)
    args = ["--config", TINY, "--output_dir", str(tmp_path / "run")]
    mine = [*args, "--data_path", ptb_path]
    theirs = [*args, "--data_path", str(other)]
    if what == "log_every":
        theirs = [*mine, "--log_every", "7"]
    started = time.monotonic()
    r = mpirun((1, mine), (1, theirs), timeout=120)
    assert r.returncode != 0 and time.monotonic() - started < 90
    key = "log_every" if what == "log_every" else "data"
    assert f"error: ranks started with different {key} (per rank: " in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_pairs_made_by_one_process_are_named_apart():
    """Two pairs at once in one process (the fixture below) once drew the same random suffix and
    the second `ip netns add` failed (CI, stop 72). The suffix counts pairs instead, and skips
    names still taken."""
    tags = [twohosts.fresh_tag([]) for _ in range(256)]
    assert len(set(tags)) == 256
    taken = [f"ptb7x{i:02x}{h}" for i in range(256) for h in "ab" if i != 0x2a]
    assert twohosts.fresh_tag(taken, pid=7) == "7x2a"
    taken.append("ptb7x2ab")  # one of the pair taken makes the pair taken
    with pytest.raises(RuntimeError, match="all 256 namespace pairs of pid 7 exist"):
        twohosts.fresh_tag(taken, pid=7)


@pytest.fixture
def hosts():
    """Two hosts, made while another pair with the same two addresses exists (another run's)."""
    need_root()
    with twohosts.two_hosts(), twohosts.two_hosts() as made:
        yield made


def test_launch_agent_finds_each_pair_of_hosts_by_its_map_not_by_address():
    need_root()
    agent = os.path.join(REPO, "scripts", "netns_rsh")
    with twohosts.two_hosts() as first, twohosts.two_hosts() as second:
        for pair in (first, second):
            env = {**os.environ, "NETNS_OF": twohosts.netns_of(pair)}
            for ns, address, _ in pair:
                r = subprocess.run([agent, address, "readlink", "/proc/self/ns/net"], env=env,
                                   capture_output=True, text=True, timeout=30)
                inode = twohosts.netns_inode(ns)
                assert r.returncode == 0 and r.stdout.strip() == inode, r.stderr
        r = subprocess.run([agent, "192.0.2.9", "true"], capture_output=True, text=True,
                           env={**os.environ, "NETNS_OF": twohosts.netns_of(first)}, timeout=30)
    assert r.returncode == 255 and r.stderr.count("\n") == 1
    assert "host 192.0.2.9 is not in NETNS_OF" in r.stderr


MAKE_HOSTS_AND_WAIT = """
import sys, time
sys.path.insert(0, sys.argv[1])
from scripts import twohosts
with twohosts.two_hosts() as hosts:
    print(" ".join(ns for ns, _, _ in hosts), flush=True)
    time.sleep(600)
"""


def test_namespaces_of_a_killed_run_are_deleted_by_the_next():
    need_root()
    maker = subprocess.Popen([sys.executable, "-c", MAKE_HOSTS_AND_WAIT, REPO],
                             stdout=subprocess.PIPE, text=True)
    orphans = maker.stdout.readline().split()
    maker.kill()
    maker.wait()

    def listed():
        return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout

    assert len(orphans) == 2 and all(ns in listed() for ns in orphans)
    with twohosts.two_hosts():
        assert not [ns for ns in orphans if ns in listed()]


ECHO_SERVER = """
import socket
s = socket.socket()
s.bind(("192.0.2.2", 5555)); s.listen(1); print("listening", flush=True)
c, _ = s.accept()
while (b := c.recv(1)):
    c.sendall(b)
"""
ECHO_CLIENT = """
import socket, time
c = socket.create_connection(("192.0.2.2", 5555), timeout=10)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
rtts = []
for _ in range(5):
    t = time.perf_counter(); c.sendall(b"x"); c.recv(1); rtts.append(time.perf_counter() - t)
print(min(rtts) * 1000)
"""


def round_trip_ms(hosts):
    (ns_a, _, _), (ns_b, _, _) = hosts
    server = subprocess.Popen(["ip", "netns", "exec", ns_b, sys.executable, "-c", ECHO_SERVER],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "listening"
        r = subprocess.run(["ip", "netns", "exec", ns_a, sys.executable, "-c", ECHO_CLIENT],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return float(r.stdout)
    finally:
        server.kill()
        server.wait()


def test_delayed_link_adds_its_delay_and_carries_a_two_host_run(ptb_path, tmp_path):
    need_root()
    with twohosts.two_hosts_delayed(0) as hosts:
        undelayed = round_trip_ms(hosts)
    with twohosts.two_hosts_delayed(25) as hosts:
        delayed = round_trip_ms(hosts)  # 25 ms each way
        out = tmp_path / "run"
        cmd = twohosts.mpirun_command(hosts, [
            "--config", TINY, "--data_path", ptb_path, "--output_dir", str(out),
            "--set", "steps_per_epoch=10", "--set", "num_epochs=1", "--set", "eval_steps=5"])
        r = run_job(cmd, 240, cwd=REPO)
        assert r.returncode == 0, r.stdout + r.stderr
        sent = twohosts.tx_bytes(hosts[0])
    assert undelayed < 10 and 50 <= delayed < 50 + 30, (undelayed, delayed)
    assert events(out, "test")[0]["world_size"] == 2
    assert sent > 10 * 4 * 32 * 10000  # ten allreduces hold at least the 32 x 10,000 softmax
    assert not [ns for ns, _, _ in hosts if ns in subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True).stdout]


def test_two_hosts_over_veth(ptb_path, tmp_path, hosts):
    out = tmp_path / "run"
    marker = tmp_path / "netns"
    marker.mkdir()
    record_netns = ["sh", "-c", f'readlink /proc/self/ns/net > {marker}/rank$OMPI_COMM_WORLD_RANK'
                                ' && exec "$0" "$@"']
    cmd = twohosts.mpirun_command(hosts, [
        "--config", TINY, "--data_path", ptb_path, "--output_dir", str(out),
        "--set", "steps_per_epoch=20", "--set", "num_epochs=1", "--set", "eval_steps=5"],
        wrapper=record_netns)
    r = run_job(cmd, 240, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = {p: (marker / p).read_text().strip() for p in ("rank0", "rank1")}
    namespaces = [twohosts.netns_inode(ns) for ns, _, _ in hosts]
    assert ranks == {"rank0": namespaces[0], "rank1": namespaces[1]} and len(set(namespaces)) == 2
    test_event = events(out, "test")[0]
    # 20 steps of the tiny model: better than the untrained model's perplexity, the vocabulary
    assert test_event["world_size"] == 2 and 1 < test_event["test_ppl"] < 10000


@pytest.mark.smoke
def test_horovodrun_gloo_on_one_host(ptb_path, tmp_path):
    horovodrun = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    out = tmp_path / "gloo"
    r = run_job([horovodrun, "--gloo", "-np", "2", "-H", "localhost:2", sys.executable,
                 "lm_ptb_distributed.py", "--config", TINY, "--data_path", ptb_path,
                 "--output_dir", str(out), "--set", "steps_per_epoch=10", "--set",
                 "num_epochs=1", "--set", "eval_steps=5"], 180, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert events(out, "test")[0]["world_size"] == 2


def test_each_rank_pins_its_own_gpu_and_more_ranks_than_gpus_is_one_line(corpus, tmp_path):
    """Horovod 2 through the trainer's own path, on stand-in GPUs (tests/stand_in_gpus.py: this
    machine has none): 2 ranks on a host of 2 GPUs take one each, by local rank, and train (on
    the CPU); 2 ranks on a host of 1 stop before any work, in one line (rank 0's) naming the fix,
    where gpus[hvd.local_rank()] would end rank 1 in an IndexError. A trainer that stopped
    calling the check, or pinned by another number, fails here."""
    args = ["--config", TINY, "--data_path", corpus, "--set", "steps_per_epoch=5",
            "--set", "num_epochs=1", "--set", "eval_steps=2"]
    r = mpirun((2, [*args, "--output_dir", str(tmp_path / "two")]), stand_in_gpus=2)
    assert r.returncode == 0, r.stdout + r.stderr
    pinned = sorted(re.findall(r"stand-in GPUs: local rank \d pinned \S+GPU:\d", r.stdout))
    assert pinned == ["stand-in GPUs: local rank 0 pinned /physical_device:GPU:0",
                      "stand-in GPUs: local rank 1 pinned /physical_device:GPU:1"], r.stdout
    assert events(tmp_path / "two", "test")[0]["world_size"] == 2
    r = mpirun((2, [*args, "--output_dir", str(tmp_path / "one")]), stand_in_gpus=1)
    assert r.returncode != 0 and "stand-in GPUs:" not in r.stdout, r.stdout
    line = ("error: this host runs 2 ranks but has 1 GPU, one per rank: start at most 1 rank per "
            "host (mpirun -H host:1, horovodrun -H host:1), or hide the GPUs "
            "(CUDA_VISIBLE_DEVICES=) to train on the CPU cores\n")
    # rank 0's line alone: every rank has the error, and mpirun ends rank 1 (utils/cli.py)
    assert r.stderr.count(line) == 1 and r.stderr.count("error:") == 1, r.stderr
    assert not (tmp_path / "one" / "metrics.jsonl").exists()
