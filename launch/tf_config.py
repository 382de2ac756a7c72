"""Start N tf.distribute workers on this host, each with its own TF_CONFIG; or print the
TF_CONFIG of each of several hosts.

    python launch/tf_config.py -n 2 -- python lm_ptb_tf_distribute.py --config config_small
    python launch/tf_config.py --print a:23456,b:23456   # one line to run on each host

The workers' output goes through unchanged. When a worker fails, the others, left waiting in a
collective for ever, are stopped (SIGTERM, then SIGKILL after --grace seconds) and the launcher
exits with the failed worker's status; SIGINT or SIGTERM is passed on to every worker.
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
    procs = [subprocess.Popen(command, env=dict(os.environ, TF_CONFIG=tf_config(addresses, i)))
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-n", "--workers", type=int, default=0, help="workers to start on this host")
    p.add_argument("--print", dest="hosts", default="",
                   help="HOST:PORT,HOST:PORT,...: print each host's TF_CONFIG line instead")
    p.add_argument("--grace", type=float, default=10.0,
                   help="seconds the other workers get to stop after one failed")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the worker's command")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.hosts:
        addresses = args.hosts.split(",")
        if not all(a.rpartition(":")[2].isdigit() and a.rpartition(":")[0] for a in addresses):
            p.exit(2, f"error: --print {args.hosts}: give HOST:PORT,HOST:PORT,...\n")
        for i, address in enumerate(addresses):
            print(f"# on {address.rpartition(':')[0]}:\nexport TF_CONFIG={shlex.quote(tf_config(addresses, i))}")
        return 0
    if args.workers < 1 or not command:
        p.exit(2, "error: give -n N (1 or more) and the worker's command after --, e.g. "
                  "-n 2 -- python lm_ptb_tf_distribute.py --config config_small\n")
    return run_workers(args.workers, command, args.grace)


if __name__ == "__main__":
    sys.exit(main())
