"""Start N tf.distribute workers on this host, each with its own TF_CONFIG; or print the
TF_CONFIG of each of several hosts.

    python launch/tf_config.py -n 2 -- python lm_ptb_tf_distribute.py --config config_small
    python launch/tf_config.py --print a:23456,b:23456   # one line to run on each host
    srun python launch/tf_config.py --slurm -- python lm_ptb_tf_distribute.py ...  # each task

The workers' output goes through unchanged. When a worker fails, the others, left waiting in a
collective for ever, are stopped (SIGTERM, then SIGKILL after --grace seconds) and the launcher
exits with the failed worker's status; SIGINT or SIGTERM is passed on to every worker.
With --slurm, run once per task by srun: the task's TF_CONFIG comes from Slurm's variables (its
nodes, tasks per node, task id; ports from --port up on each node) and the command replaces
the launcher, so srun's signals and --kill-on-bad-exit reach the worker itself.
"""
import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time


def tf_config(addresses, index):
    return json.dumps({"cluster": {"worker": addresses},
                       "task": {"type": "worker", "index": index}})


def expand_counts(text):
    """Slurm's tasks per node, '2(x3),1' -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        count, _, times = part.partition("(x")
        counts += [int(count)] * int(times.rstrip(")") or 1)
    return counts


def slurm_tf_config(env, port):
    """This srun task's TF_CONFIG: tasks laid out in blocks over the step's nodes, as srun does
    by default (task i on the node whose block holds i), the k-th task of a node on port + k."""
    missing = [v for v in ("SLURM_PROCID", "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")
               if v not in env]
    if missing:
        raise SystemExit(f"error: --slurm: {', '.join(missing)} not set; run it under srun, "
                         "once per task (srun python launch/tf_config.py --slurm -- ...)")
    if env.get("SLURM_DISTRIBUTION", "block").split(":")[0] not in ("block", ""):
        raise SystemExit(f"error: --slurm: tasks distributed {env['SLURM_DISTRIBUTION']!r}; "
                         "this launcher assumes srun's default, --distribution=block")
    try:
        hosts = subprocess.run(["scontrol", "show", "hostnames", env["SLURM_STEP_NODELIST"]],
                               capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError) as e:
        raise SystemExit(f"error: --slurm: 'scontrol show hostnames' failed ({e}); "
                         "run it on a node of the job, where Slurm's commands are installed")
    counts = expand_counts(env["SLURM_STEP_TASKS_PER_NODE"])
    addresses = [f"{host}:{port + k}" for host, n in zip(hosts, counts) for k in range(n)]
    return tf_config(addresses, int(env["SLURM_PROCID"]))


def free_ports(n):
    """n ports free on this host now (the OS picks them; held until all are picked)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_workers(n, command, grace):
    addresses = [f"localhost:{port}" for port in free_ports(n)]
    # PTB_LOCAL_WORKER: the workers share this terminal, so that a line each would say alike
    # (a Python without TensorFlow, say) is said by worker 0 alone (utils.LAUNCHER_RANKS)
    procs = [subprocess.Popen(command, env=dict(os.environ, TF_CONFIG=tf_config(addresses, i),
                                                PTB_LOCAL_WORKER=str(i)))
             for i in range(n)]

    def pass_on(signum, frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, pass_on)

    failed = None
    while any(p.poll() is None for p in procs) and failed is None:
        time.sleep(0.2)
        failed = next((p for p in procs if p.poll() not in (None, 0)), None)
    if failed is not None:
        deadline = time.monotonic() + grace
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return failed.returncode if failed.returncode > 0 else 128 - failed.returncode
    return 0


def parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--workers", type=int, default=0, help="workers to start on this host")
    p.add_argument("--print", dest="hosts", default="",
                   help="HOST:PORT,HOST:PORT,...: print each host's TF_CONFIG line instead")
    p.add_argument("--slurm", action="store_true",
                   help="under srun, once per task: this task's TF_CONFIG from Slurm's variables")
    p.add_argument("--port", type=int, default=23456, help="--slurm: each node's first port")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds the other workers get to stop after one failed")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the worker's command")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.hosts:
        addresses = args.hosts.split(",")
        if not all(a.rpartition(":")[2].isdigit() and a.rpartition(":")[0] for a in addresses):
            p.exit(2, f"error: --print {args.hosts}: give HOST:PORT,HOST:PORT,...\n")
        for i, address in enumerate(addresses):
            print(f"# on {address.rpartition(':')[0]}:\nexport TF_CONFIG={shlex.quote(tf_config(addresses, i))}")
        return 0
    if args.slurm:
        if not command:
            p.exit(2, "error: --slurm: give the worker's command after --\n")
        os.execvpe(command[0], command,
                   dict(os.environ, TF_CONFIG=slurm_tf_config(os.environ, args.port)))
    if args.workers < 1 or not command:
        p.exit(2, "error: give -n N (1 or more) and the worker's command after --, e.g. "
                  "-n 2 -- python lm_ptb_tf_distribute.py --config config_small\n")
    return run_workers(args.workers, command, args.grace)


if __name__ == "__main__":
    sys.exit(main())
