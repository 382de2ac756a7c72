"""Two "hosts" on one machine: network namespaces joined by a veth pair (needs root).

Used by the two-host test and the network study. The addresses are TEST-NET-1 (RFC 5737) and
exist only inside the namespaces made here, which are deleted whatever happens.
"""
import contextlib
import os
import subprocess
import sys
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIDR = "192.0.2.0/24"


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def two_hosts():
    """Yields [(namespace, address, veth)] for hosts a and b."""
    tag = uuid.uuid4().hex[:6]
    hosts = [(f"ptb{tag}a", "192.0.2.1", f"vp{tag}a"), (f"ptb{tag}b", "192.0.2.2", f"vp{tag}b")]
    try:
        for ns, _, _ in hosts:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "add", hosts[0][2], "type", "veth", "peer", "name", hosts[1][2])
        for ns, addr, veth in hosts:
            sh("ip", "link", "set", veth, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", veth)
            sh("ip", "-n", ns, "link", "set", veth, "up")
        yield hosts
    finally:
        for ns, _, _ in hosts:  # deleting a namespace deletes its end of the veth pair too
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def shape(hosts, rate_mbit):
    """Limit both directions of the link to rate_mbit with a token bucket (None: unlimited)."""
    for ns, _, veth in hosts:
        subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", veth, "root"],
                       capture_output=True)
        if rate_mbit:
            burst = max(64 * 1024, int(rate_mbit * 1e6 / 8 / 100))  # 10 ms of traffic
            sh("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", veth, "root", "tbf",
               "rate", f"{rate_mbit}mbit", "burst", str(burst), "latency", "200ms")


def tx_bytes(host):
    ns, _, veth = host
    out = subprocess.run(["ip", "netns", "exec", ns, "cat",
                          f"/sys/class/net/{veth}/statistics/tx_bytes"],
                         capture_output=True, text=True, check=True).stdout
    return int(out)


def mpirun_command(hosts, trainer_args, wrapper=()):
    """mpirun in host a's namespace, one rank per host, in the README's two-host shape."""
    (ns_a, addr_a, _), (_, addr_b, _) = hosts
    return ["ip", "netns", "exec", ns_a, "mpirun", "--allow-run-as-root",
            "-np", "2", "-H", f"{addr_a}:1,{addr_b}:1", "-bind-to", "none", "-map-by", "slot",
            "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONUNBUFFERED=1",
            "-mca", "plm_rsh_agent", os.path.join(REPO, "scripts", "netns_rsh"),
            "-mca", "pml", "ob1", "-mca", "btl", "tcp,self",
            "-mca", "btl_tcp_if_include", CIDR, "-mca", "oob_tcp_if_include", CIDR,
            "-wdir", REPO, *wrapper, sys.executable, "lm_ptb_distributed.py", *trainer_args]
