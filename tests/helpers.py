"""Helpers shared by the tests: run the scripts (alone or under mpirun), write small corpora."""
import contextlib
import json
import os
import subprocess
import sys

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


def run_runner(setup, usage):
    """The main() of a runner run as `python tests/RUNNER.py ARG SCRIPT [ARGS...]` under the
    script's own launcher (tests/stand_in_gpus.py, tests/trace_trainer.py): setup(ARG), then
    SCRIPT as __main__ with ARGS, in this process."""
    import runpy
    if len(sys.argv) < 3:
        sys.exit(usage)
    setup(sys.argv[1])
    script = sys.argv[2]
    sys.argv = [script, *sys.argv[3:]]
    runpy.run_path(script, run_name="__main__")


def need_root():
    """The network-namespace tests run as root only: skipped for a user, a failure in CI."""
    import pytest
    if not IS_ROOT:
        if os.environ.get("CI"):
            pytest.fail("the two-host tests need root (ip netns) and must run in CI")
        pytest.skip("needs root for ip netns")


def horovodrun(hosts_file, args, cooldown=None, env=None, prefix=()):
    """lm_ptb_elastic.py under horovodrun's elastic driver, 1 to 2 workers, the hosts listed
    by launch/discover_hosts.sh from `hosts_file`; in a session of its own (to be killed whole).
    prefix: a runner's path and arguments before the script's (tests/trace_trainer.py)."""
    bin_dir = os.path.dirname(sys.executable)
    cmd = [os.path.join(bin_dir, "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", os.path.join(REPO, "launch/discover_hosts.sh"),
           *(["--blacklist-cooldown-range", *map(str, cooldown)] if cooldown else []),
           sys.executable, *prefix, "lm_ptb_elastic.py", *args]
    env = script_env({"ELASTIC_HOSTS": str(hosts_file),
                      "PATH": bin_dir + os.pathsep + os.environ["PATH"], **(env or {})})
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def finish(job, timeout=300):
    """Wait for a job started in a session of its own; kill the whole session if it does not end
    in time (a stopped rank included). Returns (returncode, stdout, stderr)."""
    import signal
    try:
        out, err = job.communicate(timeout=timeout)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    return job.returncode, out, err


def term_once_saved(job, checkpoint, timeout=120):
    """SIGTERM to a job once `checkpoint` exists (a preemption right after that save); waits for
    it to stop. Fails with its stderr if it ends first or the save does not come in time."""
    import signal
    import time
    deadline = time.monotonic() + timeout
    while not os.path.exists(checkpoint):
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()[1]
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
    job.communicate(timeout=60)


def list_hosts(path, *hosts):
    """What the discovery script prints from now on (replaced whole: it may read at any time)."""
    (path.parent / "hosts.tmp").write_text("".join(f"{h}\n" for h in hosts))
    os.replace(path.parent / "hosts.tmp", path)


def run_script(args, timeout=300, env=None):
    """Run a repo script in a fresh interpreter; returns CompletedProcess with text output."""
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=script_env(env))


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
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=script_env(env))


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
