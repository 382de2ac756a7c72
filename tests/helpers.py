"""Helpers shared by the tests: run the scripts (alone or under mpirun), write small corpora."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from utils import child_env

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(REPO, "tests", "config_tiny.py")  # a model that trains in seconds
IS_ROOT = os.geteuid() == 0


def script_env(extra=None):
    """This process's environment for a script, without TF_USE_LEGACY_KERAS (conftest's import
    of utils set it here): each script must select Keras 2 itself, as it does for a user. Nor
    PYTHONDONTWRITEBYTECODE (set on some CI hosts, not on a user's): files a script writes by
    importing must show in the tests (a config's __pycache__ did, only on a fresh Debian 13)."""
    env = child_env(PYTHONUNBUFFERED="1", **(extra or {}))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run_runner(setup, usage, args=1):
    """The main() of a runner run as `python tests/RUNNER.py ARG SCRIPT [ARGS...]` under the
    script's own launcher (tests/stand_in_gpus.py, tests/trace_trainer.py, tests/pause_at.py):
    setup(ARG), then SCRIPT as __main__ with ARGS, in this process. args: how many ARGs."""
    import runpy
    if len(sys.argv) < args + 2:
        sys.exit(usage)
    setup(*sys.argv[1:args + 1])
    script = sys.argv[args + 1]
    sys.argv = [script, *sys.argv[args + 2:]]
    runpy.run_path(script, run_name="__main__")


def launcher_rank():
    """This process's rank as its launcher numbers it (mpirun, horovodrun, tf_config.py, srun),
    for the runners; 0 alone."""
    for name in ("OMPI_COMM_WORLD_RANK", "HOROVOD_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    if os.environ.get("TF_CONFIG"):
        return int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    return int(os.environ.get("SLURM_PROCID", 0))  # srun's own, where MPI sets none


def need_root():
    """The network-namespace tests run as root only: skipped for a user, a failure in CI."""
    import pytest
    if not IS_ROOT:
        if os.environ.get("CI"):
            pytest.fail("the two-host tests need root (ip netns) and must run in CI")
        pytest.skip("needs root for ip netns")


def horovodrun(hosts_file, args, cooldown=None, env=None, prefix=(), script="lm_ptb_elastic.py"):
    """`script` (lm_ptb_elastic.py) under horovodrun's elastic driver, 1 to 2 workers, the hosts
    listed by launch/discover_hosts.sh from `hosts_file`; in a session of its own (to be killed
    whole). prefix: a runner's path and arguments before the script's (tests/trace_trainer.py)."""
    bin_dir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bin_dir, "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", os.path.join(REPO, "launch/discover_hosts.sh"),
           *(["--blacklist-cooldown-range", *map(str, cooldown)] if cooldown else []),
           sys.executable, *prefix, script, *args]
    env = script_env({"ELASTIC_HOSTS": str(hosts_file),
                      "PATH": bin_dir + os.pathsep + os.environ["PATH"], **(env or {})})
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _processes():
    """{pid: (parent pid, session id, state)} of every process, read from /proc/PID/stat."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                # after the command's ")": state, ppid, pgrp, session, ...
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(name)] = (int(fields[1]), int(fields[3]), fields[0])
    return found


def job_processes(job):
    """The live processes of `job` (a Popen): itself until it is reaped, the session it leads
    if started with start_new_session=True (mpirun's ranks, each in a process group of its
    own, so killpg would miss them) and every descendant (horovodrun's workers, started in
    sessions of their own); zombies, dead already, left out."""
    procs = _processes()
    members = {p for p, (_, sid, _) in procs.items() if sid == job.pid}
    if job.returncode is None:  # not reaped yet: the pid is still the job's
        members.add(job.pid)
    grown = True
    while grown:
        children = {p for p, (ppid, _, _) in procs.items() if ppid in members} - members
        members |= children
        grown = bool(children)
    return {p for p in members if p in procs and procs[p][2] != "Z"}


def kill_job(job):
    """SIGKILL `job` (a Popen) and every process of it, a stopped or hung rank included, and
    reap it. Each is stopped first, so that none starts
    another or leaves the tree (a child whose parent dies is adopted elsewhere) before the
    kill; returns once none is left."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stopped = set()
        while True:  # freeze the tree, a new child included, until it no longer changes
            pids = job_processes(job) - stopped
            if not pids:
                break
            for pid in pids:
                _signal(pid, signal.SIGSTOP)
            stopped |= pids
        for pid in stopped:
            _signal(pid, signal.SIGKILL)
        if job.poll() is None:
            job.wait()
        if not stopped:
            return
        time.sleep(0.05)
    raise RuntimeError(f"processes of job {job.pid} still running: {job_processes(job)}")


def _signal(pid, signum):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def finish(job, timeout=300):
    """Wait for a job started in a session of its own; kill the whole job if it does not end in
    time (a stopped rank included). Returns (returncode, stdout, stderr)."""
    try:
        out, err = job.communicate(timeout=timeout)
    finally:
        if job.poll() is None:
            kill_job(job)
    return job.returncode, out, err


def run_job(cmd, timeout, **kwargs):
    """subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs) in a
    session of its own, where mpirun, horovodrun, make or a script that starts them is
    concerned: subprocess.run's timeout kills the process it started alone, and mpirun's
    hung or stopped ranks went on running after it. At the timeout the whole job is killed
    (kill_job), then TimeoutExpired is raised with what it wrote."""
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True, **kwargs)
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_job(job)
        out, err = job.communicate()
        raise subprocess.TimeoutExpired(cmd, timeout, out, err) from None
    finally:
        if job.poll() is None:  # interrupted (Ctrl-C): not left running either
            kill_job(job)
    return subprocess.CompletedProcess(cmd, job.returncode, out, err)


def pause_prefix(folder, point):
    """The runner's path and arguments before a trainer's that waits at `point` for the test
    (tests/pause_at.py), writing its files in `folder`."""
    return [os.path.join("tests", "pause_at.py"), str(folder), point]


def waiting_at(point, processes):
    """How many of a run's `processes` wait at `point` (pause_prefix): the chief alone at the
    checkpoint of an epoch's end and in validation, every process at the others."""
    kind, *numbers = point.split(":")
    return 1 if kind == "validate" or kind == "save" and len(numbers) == 1 else processes


def paused_python(folder, point):
    """An interpreter for launchers that take one, not a prefix (make's PY, launch/slurm.sbatch's
    PYTHON): it runs the trainers through pause_prefix(folder, point), anything else as the venv's
    Python (make single's data check, say). Returns its path, in `folder`."""
    from shlex import quote
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "python")
    python = quote(sys.executable)
    runner = " ".join(map(quote, [os.path.join(REPO, "tests", "pause_at.py"), str(folder), point]))
    with open(path, "w") as f:
        f.write(f'#!/bin/sh\ncase "$1" in *lm_ptb*.py) exec {python} {runner} "$@";; esac\n'
                f'exec {python} "$@"\n')
    os.chmod(path, 0o755)
    return path


def paused(folder):
    """{rank: pid} of the processes that wait in `folder` (tests/pause_at.py's files)."""
    import re
    names = os.listdir(folder) if os.path.isdir(folder) else []
    return {int(name[len("paused-"):]): int(open(os.path.join(folder, name)).read())
            for name in names if re.fullmatch(r"paused-\d+", name)}


def wait_for_pause(job, folder, count=1, timeout=300):
    """{rank: pid} of the `count` processes of `job` that wait at their point (pause_prefix),
    once they all do. Fails with the job's output if it ends first or they never get there."""
    import time
    deadline = time.monotonic() + timeout
    while len(paused(folder)) < count:
        assert job.poll() is None, f"the run ended before its pause: {job.communicate()}"
        assert time.monotonic() < deadline, f"no pause within {timeout} s"
        time.sleep(0.05)
    return paused(folder)


def go_on(folder):
    """The processes waiting at their point go on, and no process waits there from now on."""
    open(os.path.join(folder, "go"), "w").close()


def stop_at_pause(job, folder, count=1, signum=None, timeout=120):
    """`signum` (SIGTERM) to `job` once its `count` processes wait at their point (pause_prefix):
    it lands there, whatever the machine's load; then waits for the job to end. Returns its
    (stdout, stderr)."""
    import signal
    try:
        wait_for_pause(job, folder, count)
        job.send_signal(signum or signal.SIGTERM)
        return job.communicate(timeout=timeout)
    finally:  # a hang or a failed wait leaves no rank running (kill_job)
        if job.poll() is None:
            kill_job(job)


def list_hosts(path, *hosts):
    """What the discovery script prints from now on (replaced whole: it may read at any time)."""
    (path.parent / "hosts.tmp").write_text("".join(f"{h}\n" for h in hosts))
    os.replace(path.parent / "hosts.tmp", path)


def run_script(args, timeout=300, env=None):
    """Run a repo script in a fresh interpreter; returns CompletedProcess with text output."""
    return run_job([sys.executable, *args], timeout, cwd=REPO, env=script_env(env))


def write_corpus(folder, train, valid, test):
    """Write a PTB-format corpus (one sentence per line) into folder."""
    os.makedirs(folder, exist_ok=True)
    for name, lines in (("ptb.train.txt", train), ("ptb.valid.txt", valid), ("ptb.test.txt", test)):
        with open(os.path.join(folder, name), "w") as f:
            f.write("".join(f" {line} \n" for line in lines))
    return folder


def patterned_sentences(n, seed=0):
    """A corpus an LSTM learns fast: a few sentence templates with a shared structure."""
    import random
    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "the bird", "my friend", "the teacher"]
    verbs = ["sees", "likes", "finds", "follows"]
    objects = ["the ball", "a tree", "the house", "the river", "a car", "the moon"]
    return [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} today"
            for _ in range(n)]


def mpirun(*apps, timeout=420, extra=(), env=None, stand_in_gpus=None, prefix=()):
    """Run lm_ptb_distributed.py under mpirun: each app is (nprocs, its arguments), the ranks
    numbered in the apps' order. Several apps run through tests/per_rank.py, not mpirun's MPMD
    form, which Debian 13's Open MPI cannot run (see there). The timeout bounds a hang, not the
    speed: 2,000 tiny steps of 2 ranks outgrew 180 s on a 2-core AVX2-only EPYC while make
    test's other worker and CI's fresh-machine build shared the cores. stand_in_gpus=N: each
    rank sees N GPUs of tests/stand_in_gpus.py; prefix: a runner's path and arguments before the
    script's (tests/trace_trainer.py); one app only for either."""
    cmd = ["mpirun", *(["--allow-run-as-root"] if IS_ROOT else []), "--oversubscribe",
           "-bind-to", "none", "-x", "PYTHONUNBUFFERED=1", *extra,
           "-np", str(sum(n for n, _ in apps)), sys.executable]
    if len(apps) == 1:
        if stand_in_gpus is not None:
            prefix = [os.path.join("tests", "stand_in_gpus.py"), str(stand_in_gpus), *prefix]
        cmd += [*prefix, "lm_ptb_distributed.py", *apps[0][1]]
    else:
        cmd += [os.path.join("tests", "per_rank.py"),
                json.dumps([list(args) for n, args in apps for _ in range(n)])]
    return run_job(cmd, timeout, cwd=REPO, env=script_env(env))


def events(run_dir, kind):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [e for e in map(json.loads, f) if e["event"] == kind]


def checkpoint_weights(run_dir):
    """The model's weights in the run's newest epoch checkpoint, by their path from the model
    (model/lstm_0/cell/kernel...): found through the checkpoint's object graph, since a tensor's
    key is its shortest path, which on Keras 3 runs through the optimizer for some."""
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2
    reader = tf.train.load_checkpoint(os.path.join(run_dir, "checkpoints"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    weights, seen = {}, set()

    def walk(node, path):
        if node in seen:
            return
        seen.add(node)
        for attribute in graph.nodes[node].attributes:
            weights[path] = reader.get_tensor(attribute.checkpoint_key)
        for child in graph.nodes[node].children:
            walk(child.node_id, f"{path}/{child.local_name}")
    model, = (c.node_id for c in graph.nodes[0].children if c.local_name == "model")
    walk(model, "model")
    return weights


def edit_checkpoint_config(prefix, changes=None):
    """Rewrite the checkpoint at `prefix` (ckpt-N) with its saved config changed by `changes`,
    or without a saved config at all when changes is None (as checkpoints written before they
    held one): every other tensor, the object graph included, is written back as it was."""
    import tensorflow as tf
    from utils.checkpoints import RUN_CONFIG_KEY
    reader = tf.train.load_checkpoint(prefix)
    values = {name: reader.get_tensor(name) for name in reader.get_variable_to_dtype_map()}
    if changes is None:
        del values[RUN_CONFIG_KEY]
    else:
        values[RUN_CONFIG_KEY] = json.dumps({**json.loads(values[RUN_CONFIG_KEY]), **changes})
    names = sorted(values)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[values[name] for name in names])


def first_loss(data_path, config_path, sets, seed, precision):
    """The per-token loss of a trainer's first training step (its first progress line with
    --log_every 1), computed here in `precision` from the same seed, config, --set values and
    first batch: the trainer's initial weights are a function of the seed alone."""
    import tensorflow as tf
    from data import ptb
    from utils import config, train_steps
    from utils.model import build, sequence_loss
    cfg = dict(config.load_config(config_path, sets), precision=precision)
    corpus = ptb.load_corpus(data_path)
    x, y = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    train_steps.seed_everything(seed)
    model = build(cfg, len(corpus.vocab))
    logits, _ = model(tf.constant(x[0]), model.zero_state(cfg["batch_size"]), training=True,
                      noise_seed=train_steps.noise_seed(seed, 0, 0))
    return float(sequence_loss(logits, tf.constant(y[0]))) / cfg["num_steps"]


@contextlib.contextmanager
def read_only_folder(path):
    """A real folder that refuses writes, for the test: as root (whom permissions do not stop) a
    read-only tmpfs mounted there, else a folder of mode 0555."""
    os.makedirs(path)
    if IS_ROOT:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)],
                       check=True)
    else:
        os.chmod(path, 0o555)
    try:
        yield path
    finally:
        if IS_ROOT:
            subprocess.run(["umount", "-l", str(path)], check=True)
        else:
            os.chmod(path, 0o755)
