"""The four trainers write their epoch loop out each (lm_ptb.py's, with Horovod's, elastic's and
tf.distribute's steps between its lines): run on the tiny config with tests/trace_trainer.py,
they must agree on who trains, who saves the epoch's checkpoint and when (before the
validation), who validates, logs and tests, and who waits for whom."""
import os
import subprocess
import sys

from tests.helpers import (REPO, TINY, finish, horovodrun, list_hosts, mpirun, run_script,
                           script_env)

ARGS = ["--config", TINY, "--set", "num_epochs=2", "--set", "steps_per_epoch=6",
        "--set", "eval_steps=2"]
# One epoch: rank 0 saves its checkpoint before it validates, logs the epoch, then waits with
# the others, who only train and wait; after the last epoch rank 0 alone tests.
EPOCH = {0: ["train {n}", "save {n}", "validate", "log epoch {n}", "wait"],
         1: ["train {n}", "wait"]}
EXPECTED = {rank: ["wait", *[e.format(n=n) for n in (1, 2) for e in EPOCH[rank]],
                   *(["test", "log test"] if rank == 0 else []), "wait"] for rank in (0, 1)}


def traced(path):
    """{rank: its events in order} from a trace file."""
    by_rank = {}
    with open(path) as f:
        for line in f:
            rank, event = line.rstrip("\n").split(" ", 1)
            by_rank.setdefault(int(rank), []).append(event)
    return by_rank


def runner(trace):
    return [os.path.join("tests", "trace_trainer.py"), str(trace)]


def test_the_four_trainers_share_one_epoch_loop(corpus, tmp_path):
    data = ["--data_path", corpus]
    trace = {name: tmp_path / f"{name}.trace" for name in
             ("lm_ptb", "distributed", "elastic", "tf_distribute")}

    r = run_script([*runner(trace["lm_ptb"]), "lm_ptb.py", *ARGS, *data,
                    "--output_dir", str(tmp_path / "one")])
    assert r.returncode == 0, r.stderr
    r = mpirun((2, [*ARGS, *data, "--output_dir", str(tmp_path / "hvd")]),
               prefix=runner(trace["distributed"]))
    assert r.returncode == 0, r.stdout + r.stderr
    hosts = tmp_path / "hosts.txt"
    list_hosts(hosts, "localhost:1", "127.0.0.1:1")
    code, out, _ = finish(horovodrun(hosts, [*ARGS, *data, "--output_dir",
                                             str(tmp_path / "elastic")],
                                     prefix=runner(trace["elastic"])))
    assert code == 0, out[-3000:]
    r = subprocess.run([sys.executable, "launch/tf_config.py", "-n", "2", "--", sys.executable,
                        *runner(trace["tf_distribute"]), "lm_ptb_tf_distribute.py", *ARGS, *data,
                        "--output_dir", str(tmp_path / "tfd")], cwd=REPO, capture_output=True,
                       text=True, timeout=300, env=script_env())
    assert r.returncode == 0, r.stdout + r.stderr

    for name in ("distributed", "elastic", "tf_distribute"):
        assert traced(trace[name]) == EXPECTED, (name, traced(trace[name]))
    # one process: rank 0's loop, with nobody to wait for
    assert traced(trace["lm_ptb"]) == {0: [e for e in EXPECTED[0] if e != "wait"]}
