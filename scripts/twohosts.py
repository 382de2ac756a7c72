"""Two "hosts" on one machine: network namespaces joined by a link (needs root).

Used by the two-host test and the network study. The link is a veth pair (`two_hosts`), or,
where a delay is wanted, two TUN devices joined by a relay process that holds every packet for a
fixed time (`two_hosts_delayed`): this kernel has no netem qdisc, so tc cannot add latency.
The addresses are TEST-NET-1 (RFC 5737) and exist only inside the namespaces made here, which
are deleted whatever happens.
"""
import contextlib
import fcntl
import heapq
import itertools
import os
import re
import select
import signal
import struct
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CIDR = "192.0.2.0/24"
_PAIRS_MADE = itertools.count()  # this process's pairs, for unique names


def sh(*cmd):
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.strip()}")


@contextlib.contextmanager
def namespaces(device_prefix):
    """Two fresh namespaces with loopback up. Yields [(namespace, address, device name)] for
    hosts a and b; the caller makes the devices. Afterwards the namespaces go, and with them
    the devices moved into them; a device still outside (setup failed first) is deleted too."""
    tag = fresh_tag(delete_orphans())
    hosts = [(f"ptb{tag}{h}", address, f"{device_prefix}{tag}{h}")
             for h, address in (("a", "192.0.2.1"), ("b", "192.0.2.2"))]
    try:
        for ns, _, _ in hosts:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield hosts
    finally:
        for ns, _, device in hosts:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "link", "del", "dev", device], capture_output=True)


def fresh_tag(taken, pid=None):
    """The tag "<pid>x<2 hex digits>" of a new pair, its namespaces "ptb<tag>a" and "ptb<tag>b"
    in none of taken. The digits count this process's pairs: a random pick collided 1 time in
    256 when one process held two pairs at once (the two-host test does), and the second
    `ip netns add` failed. Device names ("vp<tag>a") stay under 16 characters."""
    pid, taken = os.getpid() if pid is None else pid, set(taken)
    for _ in range(256):
        tag = f"{pid}x{next(_PAIRS_MADE) % 256:02x}"
        if not {f"ptb{tag}a", f"ptb{tag}b"} & taken:
            return tag
    raise RuntimeError(f"all 256 namespace pairs of pid {pid} exist; delete them with "
                       f"`ip netns del` (`ip netns list` shows them)")


def delete_orphans():
    """Delete the namespaces of a run that was killed before it could (SIGKILL, a session's
    end): their name holds the pid of the process that made them. Returns those left."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = []
    for ns in (line.split()[0] for line in listed.splitlines() if line.strip()):
        made_by = re.fullmatch(r"ptb(\d+)x[0-9a-f]{2}[ab]", ns)
        if made_by and not alive(int(made_by.group(1))):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        else:
            left.append(ns)
    return left


def alive(pid):
    """True if pid runs (a zombie, killed but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def attach(hosts, *link_settings, device_name=None):
    """Move each host's device into its namespace, give it its address, and bring it up; renamed
    there to device_name if given (the same name on both hosts, as horovodrun's
    --network-interfaces wants: names need only differ within a namespace)."""
    for i, (ns, address, device) in enumerate(hosts):
        sh("ip", "link", "set", device, "netns", ns)
        if device_name:
            sh("ip", "-n", ns, "link", "set", device, "name", device_name)
            device = device_name
            hosts[i] = (ns, address, device)
        if link_settings:
            sh("ip", "-n", ns, "link", "set", device, *link_settings)
        sh("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", device)
        sh("ip", "-n", ns, "link", "set", device, "up")


@contextlib.contextmanager
def two_hosts(device_name=None):
    """Yields [(namespace, address, veth)] for hosts a and b, joined by a veth pair (named
    device_name inside both namespaces, if given)."""
    with namespaces("vp") as hosts:
        sh("ip", "link", "add", hosts[0][2], "type", "veth", "peer", "name", hosts[1][2])
        attach(hosts, device_name=device_name)
        yield hosts


def set_link(host, up):
    """Bring a host's end of the link up or down (down on one end cuts both ways)."""
    ns, _, device = host
    sh("ip", "-n", ns, "link", "set", device, "up" if up else "down")


@contextlib.contextmanager
def two_hosts_delayed(delay_ms):
    """Like two_hosts, but the link holds each packet delay_ms in each direction (the round
    trip grows by 2 x delay_ms). Yields [(namespace, address, tun device)]."""
    with namespaces("tp") as hosts:
        for _, _, device in hosts:
            sh("ip", "tuntap", "add", "dev", device, "mode", "tun")
        relay = subprocess.Popen([sys.executable, os.path.abspath(__file__), "relay",
                                  str(delay_ms), hosts[0][2], hosts[1][2]],
                                 stdout=subprocess.PIPE, text=True)
        try:
            if relay.stdout.readline().strip() != "ready":
                raise RuntimeError("the delay relay did not start")
            # The relay's open files stay attached across the move. Large packets keep its
            # per-packet cost small (tun has no segmentation offload: one MTU per packet).
            attach(hosts, "mtu", "65000")
            yield hosts
        finally:
            relay.terminate()
            relay.wait()


def open_tun(name):
    tunsetiff, iff_tun, iff_no_pi = 0x400454CA, 0x0001, 0x1000
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, tunsetiff, struct.pack("16sH", name.encode(), iff_tun | iff_no_pi))
    return fd


def relay(delay_ms, name_a, name_b):
    """Forward IP packets between two TUN devices, each one delay_ms after it arrived."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    a, b = open_tun(name_a), open_tun(name_b)
    peer, delay, queue, seq = {a: b, b: a}, delay_ms / 1000, [], 0
    print("ready", flush=True)
    while True:
        wait = max(0.0, queue[0][0] - time.monotonic()) if queue else None
        for fd in select.select([a, b], [], [], wait)[0]:
            while True:
                try:
                    packet = os.read(fd, 65536)
                except BlockingIOError:
                    break
                seq += 1  # keeps the order of packets due at the same time
                heapq.heappush(queue, (time.monotonic() + delay, seq, peer[fd], packet))
        while queue and queue[0][0] <= time.monotonic():
            _, _, fd, packet = heapq.heappop(queue)
            try:
                os.write(fd, packet)
            except OSError:  # the device went down: the packet is lost, as on a real link
                pass


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


def netns_inode(ns):
    """The namespace's identity, as /proc/PID/ns/net of a process in it reads."""
    return subprocess.run(["ip", "netns", "exec", ns, "readlink", "/proc/self/ns/net"],
                          capture_output=True, text=True, check=True).stdout.strip()


def netns_of(hosts):
    """The map scripts/netns_rsh reads: "ADDRESS=NAMESPACE ..."."""
    return " ".join(f"{address}={ns}" for ns, address, _ in hosts)


def mpirun_command(hosts, trainer_args, wrapper=()):
    """mpirun in host a's namespace, one rank per host, in the README's two-host shape."""
    (ns_a, addr_a, _), (_, addr_b, _) = hosts
    # netns_rsh finds each host's namespace by this map, not by address: every pair made
    # here has the same two addresses, and another run's pair may exist at the same time.
    return ["ip", "netns", "exec", ns_a, "env", f"NETNS_OF={netns_of(hosts)}",
            "mpirun", "--allow-run-as-root",
            "-np", "2", "-H", f"{addr_a}:1,{addr_b}:1", "-bind-to", "none", "-map-by", "slot",
            "-x", "PATH", "-x", "LD_LIBRARY_PATH", "-x", "PYTHONUNBUFFERED=1",
            "-mca", "plm_rsh_agent", os.path.join(REPO, "scripts", "netns_rsh"),
            "-mca", "pml", "ob1", "-mca", "btl", "tcp,self",
            "-mca", "btl_tcp_if_include", CIDR, "-mca", "oob_tcp_if_include", CIDR,
            "-wdir", REPO, *wrapper, sys.executable, "lm_ptb_distributed.py", *trainer_args]


if __name__ == "__main__" and sys.argv[1:2] == ["relay"]:
    relay(float(sys.argv[2]), sys.argv[3], sys.argv[4])
