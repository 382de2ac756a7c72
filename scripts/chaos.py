"""Faults on a schedule: train under many faults in a row and check that nothing was lost.

lm_ptb_elastic.py runs under horovodrun's elastic driver on two "hosts", network namespaces of
this machine joined by a veth link (scripts/twohosts.py; root needed), its output on a small
tmpfs; or, with --launcher mpirun, lm_ptb_distributed.py under mpirun on the same two hosts,
relaunched with --resume after each failure as a scheduler would. Faults come one at a time, each
once the job trains again after the one before and a gap; their order and gaps drawn from a seed
(printed), each kind at least --each times. A job that finishes with faults still to come is
relaunched with the epochs the next fault needs (the reference trains as many). Then it checks:
the epochs all ran, the final valid perplexity is the uninterrupted run's (lm_ptb_distributed.py,
the same global batches), no process of the run is left, every checkpoint on disk loads,
metrics.jsonl is whole, every fault had a line of the trainer's own on the console, and no worker
gave up its rendezvous in a link blip shorter than Gloo's timeout. docs/reliability.md.

    sudo make chaos                                   # about 10 minutes, a new seed
    .venv/bin/python scripts/chaos.py --seed 7 --minutes 3 --faults kill,link_cut
    .venv/bin/python scripts/chaos.py --launcher mpirun
"""
import argparse
import contextlib
import glob
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402
utils.require_setup()  # a Python without .venv's TensorFlow stops here in one line
from scripts import record_env, twohosts  # noqa: E402

REPO = twohosts.REPO
TINY = os.path.join(REPO, "tests", "config_tiny.py")
NIC = "ptbnet"  # the link's name inside both namespaces
# Shorter than the defaults (600 and 30 s) to keep the schedule short, in the same order: a
# collective that waits for a lost peer fails first (Gloo's timeout), so elastic resets; the
# watchdog ends only a process that is still stuck after that.
GLOO_TIMEOUT_S = 15  # Horovod's Gloo collectives and rendezvous (HOROVOD_GLOO_TIMEOUT_SECONDS)
STEP_TIMEOUT_S = 20  # the trainer's watchdog (--set step_timeout_s)
COOLDOWN_S = (2, 4)  # horovodrun's --blacklist-cooldown-range: a failed host may come back
LOG_EVERY = 10
COMMIT_EVERY = 20  # checkpoint_every: a reset or a relaunch loses at most this many steps
# The job's length: about what a fault, its recovery and a gap take on a slow CPU (10 faults took
# 1,260 steps on an AVX2-only EPYC). A job that finishes with faults to come trains the epochs
# the next fault needs (epochs_to_add), up to MAX_EPOCHS, so a fast CPU's job grows to what it
# needs, and a slow one's fault-free tail and uninterrupted reference stay short.
STEPS_PER_FAULT = 150
GAP_S = (1, 4)  # seconds of training at full size between one fault's recovery and the next
EPOCHS = 3
MAX_EPOCHS = 15
# An epoch, the one a relaunch adds above all, holds a gap and a fault's recovery on a fast CPU
# (2 workers train the tiny model at ~60 steps/s on an EPYC with AVX-512, one alone at ~100).
MIN_EPOCH_STEPS = 250
DISK_MB = 64
# A fault needs training left to act on: one injected as the job ends may find nothing to hit (a
# full disk after the last write: stop 62's CI). So a fault waits while the job has less than
# this left at its pace; the job then finishes and trains more epochs for it. It is the
# longest fault the training goes on through (host_leaves, up to 10 s), and a little more.
TAIL_S = 12
# A fault with a rejoin (kill_in_reset, blip_in_reset) needs the survivor still training when
# the driver's replacement starts, and kill_in_reset waits 3-12 s more before its second kill:
# 9-18 s from the first kill to the second in the chaos reports of results/studies/chaos/, while
# the survivor alone goes through steps about twice as fast as two workers do.
REJOIN_TAIL_S = 3 * TAIL_S
RELAUNCH_S = 5  # a relaunch's first steps, slower than the pace it is planned at

# What each kind does, and which launchers it applies to.
KINDS = {
    "kill": ("SIGKILL of a worker", ("elastic", "mpirun")),
    "stop": (f"SIGSTOP of a worker for {STEP_TIMEOUT_S + 10} s, longer than the step timeout",
             ("elastic", "mpirun")),
    "term": ("SIGTERM of a worker (a preemption notice)", ("elastic", "mpirun")),
    "kill_in_save": ("SIGKILL of the worker writing a checkpoint, while it writes",
                     ("elastic", "mpirun")),
    "kill_in_reset": ("SIGKILL of a worker, then of the worker the driver starts to replace it "
                      "while the job resets to take it in", ("elastic",)),
    "blip_in_reset": ("SIGKILL of the worker on the driver's host, then the link down for 3 s "
                      "at the other worker's end while it rejoins", ("elastic",)),
    "link_blip": ("the link down for 2 s, under every timeout", ("elastic", "mpirun")),
    "link_cut": (f"the link down for {GLOO_TIMEOUT_S + STEP_TIMEOUT_S + 10} s, longer than "
                 "every timeout", ("elastic", "mpirun")),
    "disk_full": ("the output disk full for 3 s", ("elastic", "mpirun")),
    "host_leaves": ("a host gone from the discovery list for 5-10 s, then back", ("elastic",)),
}
# The trainer's own lines (not Horovod's or MPI's): rank 0's reset line, a stop's or an error's
# one line, a relaunch's resume line.
OWN_LINE = re.compile(r"(\[ptb\] reset \|.*|\[ptb\] --resume: .*|error: .*)")
# Horovod's rendezvous giving up on the driver (http_store.cc's throw, the same text with or
# without patch 08): the worker ends, and with it the elastic job. Legitimate after a link cut
# longer than Gloo's timeout, never in a blip shorter than it (patch 08: it retried 3 times in
# 1.5 s).
RENDEZVOUS_ABORT = "HTTP request failed"
BLIPS = ("link_blip", "blip_in_reset")


SAID = []  # every line printed, for the report's .log


def say(text):
    SAID.append(f"chaos: {text}")
    print(SAID[-1], flush=True)


class Job:
    """The training job and its relaunches: the processes, the console lines, the metrics."""

    def __init__(self, launcher, hosts, out, args, workdir):
        self.launcher, self.hosts, self.out, self.args = launcher, hosts, out, args
        self.epochs = EPOCHS  # one more for each relaunch after an end with faults to come
        self.hosts_file = os.path.join(workdir, "hosts.txt")
        self.console = open(os.path.join(workdir, "console.log"), "w")
        self.ssh_dir = os.path.join(workdir, "bin")
        os.makedirs(self.ssh_dir)
        os.symlink(os.path.join(REPO, "scripts", "netns_rsh"), os.path.join(self.ssh_dir, "ssh"))
        self.lines = []  # (time, line) of the trainer's own, from every launch
        self.aborts = []  # (time, line) of a worker's rendezvous giving up, from every launch
        self.proc, self.launches = None, 0
        self.inodes = {twohosts.netns_inode(ns): address for ns, address, _ in hosts}
        self.progress_times = set()  # every progress line's time, kept though a reset drops it
        threading.Thread(target=self._watch_progress, daemon=True).start()
        self.list_hosts(*(address for _, address, _ in hosts))

    def list_hosts(self, *addresses):
        """What the discovery script prints from now on (replaced whole)."""
        with open(self.hosts_file + ".tmp", "w") as f:
            f.write("".join(f"{a}:1\n" for a in addresses))
        os.replace(self.hosts_file + ".tmp", self.hosts_file)

    def command(self):
        resume = ["--resume"] if self.launches else []
        trainer = [*self.args, "--set", f"num_epochs={self.epochs}", "--output_dir", self.out,
                   *resume]
        if self.launcher == "mpirun":
            return twohosts.mpirun_command(self.hosts, trainer)
        ns_a = self.hosts[0][0]
        return ["ip", "netns", "exec", ns_a, os.path.join(os.path.dirname(sys.executable),
                                                           "horovodrun"),
                "-np", "2", "--min-np", "1", "--max-np", "2", "--network-interfaces", NIC,
                "--blacklist-cooldown-range", *map(str, COOLDOWN_S),
                "--host-discovery-script", os.path.join(REPO, "launch", "discover_hosts.sh"),
                sys.executable, "lm_ptb_elastic.py", *trainer]

    def start(self):
        env = dict(os.environ, PYTHONUNBUFFERED="1", ELASTIC_HOSTS=self.hosts_file,
                   NETNS_OF=twohosts.netns_of(self.hosts),
                   HOROVOD_GLOO_TIMEOUT_SECONDS=str(GLOO_TIMEOUT_S),
                   PATH=os.pathsep.join([self.ssh_dir, os.path.dirname(sys.executable),
                                         os.environ["PATH"]]))
        env.pop("TF_USE_LEGACY_KERAS", None)
        self.proc = subprocess.Popen(self.command(), cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.launches += 1
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc):
        for line in proc.stdout:
            self.console.write(line)
            self.console.flush()
            found = OWN_LINE.search(line)
            if found:
                self.lines.append((time.time(), found.group(1)))
            if RENDEZVOUS_ABORT in line:
                self.aborts.append((time.time(), line.strip()))

    def _watch_progress(self):
        while True:
            self.progress_times.update(e["time"] for e in events(self.out)
                                       if e["event"] == "progress")
            time.sleep(0.2)

    def recovered(self, since, gap_s):
        """Whether the job has trained gap_s seconds again since a fault that ended at `since`
        (at any size: elastic may take a while to grow back, and a fault may come meanwhile)."""
        progress = [e["time"] for e in events(self.out) if e["event"] == "progress"
                    and e["time"] > since]
        return bool(progress) and time.time() - min(progress) >= gap_s

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def workers(self):
        """{pid: host address} of the run's training processes (found by their output folder)."""
        found = {}
        script = b"lm_ptb_elastic.py" if self.launcher == "elastic" else b"lm_ptb_distributed.py"
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().split(b"\0")
                inode = os.readlink(f"/proc/{pid}/ns/net")
            except OSError:
                continue
            # the interpreter running the script itself, not the launchers and shells around it
            if cmdline[1:2] == [script] and self.out.encode() in cmdline \
                    and twohosts.alive(int(pid)):
                found[int(pid)] = self.inodes.get(inode, "?")
        return found

    def leftovers(self):
        """Processes that name the run's output folder (workers, launchers, agents)."""
        r = subprocess.run(["pgrep", "-f", self.out], capture_output=True, text=True)
        return [int(p) for p in r.stdout.split() if int(p) != os.getpid()]

    def end(self):
        """Kill what is left of the run, the launcher's session first."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in self.leftovers():
            send(pid, signal.SIGCONT)  # one a fault stopped would otherwise stay, stopped
            send(pid, signal.SIGKILL)


def send(pid, sig):
    """os.kill that tells whether the process was there: a worker may end on its own between
    being picked and being signalled (its job ended, another fault took it)."""
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def events(out):
    """metrics.jsonl's events; a line cut by a full disk or a kill is skipped here and caught
    by the final check."""
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        with contextlib.suppress(ValueError):
            found.append(json.loads(line))
    return found


def pace(events, per_epoch):
    """(global step, seconds a step) at the job's last three progress lines; None before it has
    two, or when they do not move forward (a reset between them)."""
    progress = [(e["time"], global_step(e["epoch"], e["step"], per_epoch))
                for e in events if e["event"] == "progress"][-3:]
    if len(progress) < 2:
        return None
    (t0, g0), (t1, g1) = progress[0], progress[-1]
    if g1 <= g0 or t1 <= t0:
        return None
    return g1, (t1 - t0) / (g1 - g0)


def seconds_left(events, per_epoch, epochs):
    """Seconds of training the job has left at the pace of its last three progress lines; None
    when that pace is not known."""
    known = pace(events, per_epoch)
    if known is None:
        return None
    step, seconds = known
    return (epochs * per_epoch - step) * seconds


def tail_s(kind):
    """The training a fault of this kind needs left when it comes."""
    return REJOIN_TAIL_S if kind in ("kill_in_reset", "blip_in_reset") else TAIL_S


def epochs_to_add(events, per_epoch, kind, gap_s):
    """Epochs a relaunch adds for the next fault: its gap and its tail at the finished launch's
    pace, and RELAUNCH_S for the relaunch's first steps; one when that pace is not known."""
    known = pace(events, per_epoch)
    if known is None:
        return 1
    return max(1, math.ceil((gap_s + tail_s(kind) + RELAUNCH_S) / (per_epoch * known[1])))


def position(out):
    """(epoch, step) of the newest progress line, or None."""
    progress = [(e["epoch"], e["step"]) for e in events(out) if e["event"] == "progress"]
    return progress[-1] if progress else None


class Faults:
    """Injects one fault of each kind into the job, with the schedule's random choices."""

    def __init__(self, job, rng, tmpfs):
        self.job, self.rng, self.tmpfs = job, rng, tmpfs
        self.was = None  # set by a fault that came out as another kind

    def pick_worker(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            workers = self.job.workers()
            if workers:
                pid = self.rng.choice(sorted(workers))
                return pid, workers[pid]
            time.sleep(0.1)
        return None, None

    def signal(self, sig):
        pid, host = self.pick_worker()
        if pid is None:
            return None
        return f"pid {pid} on {host}" if send(pid, sig) else None

    def kill(self):
        return self.signal(signal.SIGKILL)

    def term(self):
        return self.signal(signal.SIGTERM)

    def stop(self):
        self.both_hosts()  # a freeze with no peer to wait for it would test nothing
        pid, host = self.pick_worker()
        if pid is None:
            return None
        if not send(pid, signal.SIGSTOP):
            return None
        try:
            time.sleep(STEP_TIMEOUT_S + 10)
        finally:
            send(pid, signal.SIGCONT)
        return f"pid {pid} on {host}"

    def kill_in_save(self, timeout=120):
        """Watch the workers' open files; the first one with a file open in the checkpoint
        folder is stopped there, checked to be still writing, and killed. None if no write
        was seen (the job ended first, say): the fault is tried again later."""
        folder = os.path.join(self.job.out, "checkpoints")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.job.alive():
            workers, listed = self.job.workers(), time.monotonic()
            while time.monotonic() - listed < 0.5:  # the workers' files, every millisecond
                for pid, host in workers.items():
                    path = writing(pid, folder)
                    if path and send(pid, signal.SIGSTOP):
                        still = writing(pid, folder)
                        send(pid, signal.SIGKILL)
                        when = "writing" if still else "just after writing"
                        name = os.path.relpath(still or path, folder)
                        return f"pid {pid} on {host}, {when} {name}"
                time.sleep(0.001)
        return None

    def kill_in_reset(self):
        self.both_hosts()
        first_pid, host = self.pick_worker()
        if first_pid is None:
            return None
        if not send(first_pid, signal.SIGKILL):
            return None
        # the driver starts a new worker on that host after its cooldown; kill it while the
        # job takes it in (between its start and the step after the reset)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and self.job.alive():
            new = [p for p, h in self.job.workers().items() if h == host and p != first_pid]
            if new:
                time.sleep(self.rng.uniform(3, 12))
                send(new[0], signal.SIGKILL)
                return f"pid {first_pid} on {host}, then its replacement pid {new[0]}"
            time.sleep(0.1)
        # only the first kill happened: count it as a kill, and try this kind again later
        self.was = "kill"
        return f"pid {first_pid} on {host} (kill_in_reset: the job ended or no replacement came)"

    def blip_in_reset(self):
        """The survivor of a kill rejoins through the driver's rendezvous on the other host,
        across a link that is down for a moment (Horovod patch 08). The survivor is held
        (SIGSTOP) while the dead worker's connections close, so that it finds them closed only
        once the link is down, and its rejoin falls inside the blip."""
        if len(self.both_hosts()) < 2:
            return None
        driver_host, other = self.job.hosts
        workers = self.job.workers()
        dead = [p for p, h in workers.items() if h == driver_host[1]]
        survivor = [p for p, h in workers.items() if h == other[1]]
        if not dead or not survivor:
            return None
        if not send(survivor[0], signal.SIGSTOP):
            return None
        try:
            send(dead[0], signal.SIGKILL)
            deadline = time.monotonic() + 5
            while twohosts.alive(dead[0]) and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)  # its connections' ends reach the survivor's kernel
            twohosts.set_link(other, up=False)  # at the survivor's end: its connects fail at once
        finally:
            send(survivor[0], signal.SIGCONT)
        try:
            time.sleep(3)
        finally:
            twohosts.set_link(other, up=True)
        return (f"pid {dead[0]} on {driver_host[1]}, then {other[1]}'s end of the link for "
                f"3 s as pid {survivor[0]} rejoins")

    def link(self, seconds):
        if not self.both_hosts():
            return None
        host = self.rng.choice(self.job.hosts)
        twohosts.set_link(host, up=False)
        try:
            time.sleep(seconds)
        finally:
            twohosts.set_link(host, up=True)
        return f"{host[1]}'s end, {seconds} s"

    def link_blip(self):
        return self.link(2)

    def link_cut(self):
        return self.link(GLOO_TIMEOUT_S + STEP_TIMEOUT_S + 10)

    def disk_full(self):
        filler = os.path.join(self.tmpfs, "filler")
        with open(filler, "wb") as f:
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * (1 << 20))
                    f.flush()
        time.sleep(3)
        os.remove(filler)
        return f"{DISK_MB} MB tmpfs filled for 3 s"

    def both_hosts(self, within_s=60):
        """The hosts with a worker, after waiting up to within_s for both to have one (a fault
        of the link or of the host list, or a freeze, needs two workers to mean anything)."""
        deadline = time.monotonic() + within_s
        while len(set(self.job.workers().values())) < 2 and time.monotonic() < deadline \
                and self.job.alive():
            time.sleep(0.2)
        return sorted(set(self.job.workers().values()))

    def host_leaves(self):
        """One of the hosts that have a worker is dropped from the list, then listed again."""
        hosts = self.both_hosts()
        if not hosts:
            return None
        gone = self.rng.choice(hosts)
        self.job.list_hosts(*(a for _, a, _ in self.job.hosts if a != gone))
        seconds = self.rng.uniform(5, 10)
        time.sleep(seconds)
        self.job.list_hosts(*(a for _, a, _ in self.job.hosts))
        return f"{gone} gone for {seconds:.1f} s"


def writing(pid, folder):
    """A file in `folder` (or below) that process pid has open, or None."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(folder + os.sep):
                    return target
    except OSError:
        pass
    return None


def schedule(kinds, each, minutes, rng):
    """The faults in order: each kind `each` times, more (random kinds) to fill the minutes at
    about two faults a minute (a fault, its recovery and a gap take 20-40 s here), shuffled."""
    faults = [k for k in kinds for _ in range(each)]
    while kinds and len(faults) < minutes * 2:
        faults.append(rng.choice(kinds))
    rng.shuffle(faults)
    return faults


def trainer_args(data_path, per_epoch):
    return ["--config", TINY, "--data_path", data_path, "--log_every", str(LOG_EVERY),
            "--set", f"steps_per_epoch={per_epoch}",
            "--set", "eval_steps=50", "--set", f"checkpoint_every={COMMIT_EVERY}",
            "--set", f"step_timeout_s={STEP_TIMEOUT_S}"]


@contextlib.contextmanager
def small_disk(folder):
    """A DISK_MB tmpfs at folder: the run's output, which a fault can fill."""
    os.makedirs(folder)
    twohosts.sh("mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", folder)
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", folder], capture_output=True)


def run(opts):
    env = record_env.record()
    say(f"{env['date_utc']} UTC, commit {env['commit']}, {env['cpu']}, {env['cores']} cores, "
        f"TF {env['tensorflow']}, Horovod {env['horovod']}; "
        f"scripts/chaos.py {' '.join(opts.argv)}")
    rng = random.Random(opts.seed)
    kinds = [k for k in opts.faults if opts.launcher in KINDS[k][1]]
    faults = schedule(kinds, opts.each, opts.minutes, rng)
    per_epoch = max(-(-(len(faults) + 1) * STEPS_PER_FAULT // EPOCHS), MIN_EPOCH_STEPS)
    gaps = [rng.uniform(*GAP_S) for _ in faults]
    say(f"seed {opts.seed}, launcher {opts.launcher}, {len(faults)} faults over "
        f"{per_epoch * EPOCHS} steps: " + ", ".join(faults))
    workdir = tempfile.mkdtemp(prefix="ptb-chaos-")
    report = {"env": env, "seed": opts.seed, "launcher": opts.launcher,
              "steps_per_epoch": per_epoch, "faults": [], "launches": 0}
    try:
        with twohosts.two_hosts(device_name=NIC) as hosts, \
                small_disk(os.path.join(workdir, "out")) as out:
            job = Job(opts.launcher, hosts, os.path.join(out, "run"),
                      trainer_args(opts.data_path, per_epoch), workdir)
            started = time.time()
            try:
                pending = drive(job, Faults(job, rng, out), list(zip(faults, gaps)), report,
                                deadline=time.monotonic() + opts.minutes * 60 * 4 + 600)
            finally:  # a crash of this driver too: no worker of the job may stay, stopped or not
                job.end()
            report.update(wall_s=time.time() - started, launches=job.launches,
                          not_injected=[k for k, _ in pending], num_epochs=job.epochs)
            time.sleep(1)
            report.update(leftovers=job.leftovers(), lines=job.lines, aborts=job.aborts,
                          events=events(job.out),
                          progress_times=sorted(job.progress_times),
                          checkpoints=check_checkpoints(job.out),
                          metrics_whole=metrics_whole(job.out), returncode=job.proc.returncode)
    finally:
        if opts.results:  # the whole console (horovodrun's, mpirun's, the trainer's lines)
            os.makedirs(opts.results, exist_ok=True)
            shutil.copy(os.path.join(workdir, "console.log"), os.path.join(
                opts.results, f"chaos-{opts.launcher}-seed{opts.seed}.console.log"))
        shutil.rmtree(workdir, ignore_errors=True)
    report["total_steps"] = per_epoch * report["num_epochs"]
    report["reference"], report["reference_rc"] = uninterrupted(
        [*trainer_args(opts.data_path, per_epoch),
         "--set", f"num_epochs={report['num_epochs']}"])
    return report


def drive(job, inject, pending, report, deadline):
    """Runs the job to its end, relaunching it after each failure and injecting the pending
    (fault, gap) in turn; the ones it could not inject."""
    job.start()
    since = time.time()
    while time.monotonic() < deadline:
        if not job.alive():
            if job.proc.returncode == 0:
                # A lone worker trains the tiny model at ~100 steps/s here: while a fault
                # waits for the driver to grow the job back, the last steps can run out.
                if not pending or job.epochs >= MAX_EPOCHS:
                    return pending
                (kind, gap), before = pending[0], job.epochs
                job.epochs = min(MAX_EPOCHS, job.epochs + epochs_to_add(
                    events(job.out), report["steps_per_epoch"], kind, gap))
                say(f"the job finished with {len(pending)} faults still to come: relaunched "
                    f"with --resume for {job.epochs - before} more epoch(s), {job.epochs} in all")
            else:
                say(f"the job ended with status {job.proc.returncode}: relaunched with "
                    "--resume, as a scheduler would")
            job.end()  # nothing of it may stay (a worker on the other host)
            job.start()
            # The next fault waits for this launch's own training: the last launch's progress
            # lines would let it in while the workers start (stop 71's CI: kill_in_reset hit a
            # relaunch before its first step three times, and never came as itself).
            since = time.time()
            continue
        if pending and job.recovered(since, pending[0][1]) and job_goes_on(
                job, report, pending[0][0]):
            since = inject_next(job, inject, pending, report)
            continue
        time.sleep(0.2)
    say("the run did not finish in time")
    return pending


def job_goes_on(job, report, kind):
    """Whether the job has the training left that this kind of fault needs (or its pace is not
    known yet)."""
    left = seconds_left(events(job.out), report["steps_per_epoch"], job.epochs)
    return left is None or left >= tail_s(kind)


def inject_next(job, inject, pending, report):
    """Injects the first pending fault (put back if it did not happen or came out as another
    kind); the time it ended."""
    kind, gap = pending.pop(0)
    moment, before = time.time(), position(job.out)
    inject.was = None
    what = getattr(inject, kind)()
    if inject.was:  # it came out as another kind: this one again later
        pending.insert(0, (kind, gap))
        kind = inject.was
    ended = time.time()
    if what is None:  # the job ended first: again once it is back
        pending.insert(0, (kind, gap))
        return ended
    say(f"{kind} at epoch {before[0]} step {before[1]}: {what}" if before else
        f"{kind} before the first progress line: {what}")
    report["faults"].append({"kind": kind, "time": moment, "what": what, "ended": ended,
                             "before": before})
    return ended


def uninterrupted(args):
    """The reference: the same training without faults, 2 ranks under mpirun; its epoch events
    and exit status."""
    reference = os.path.join(tempfile.mkdtemp(prefix="ptb-chaos-ref-"), "run")
    say("the uninterrupted run: lm_ptb_distributed.py, 2 ranks, the same arguments")
    r = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
                        "-bind-to", "none", sys.executable, "lm_ptb_distributed.py", *args,
                        "--output_dir", reference], cwd=REPO, capture_output=True, text=True)
    epochs = [e for e in events(reference) if e["event"] == "epoch"]
    shutil.rmtree(os.path.dirname(reference), ignore_errors=True)
    return epochs, r.returncode


def check_checkpoints(out):
    """{checkpoint prefix: None if it loads, else the error}, for every one on disk, all read in
    one fresh interpreter (TensorFlow's import is most of its time)."""
    code = ("import sys, tensorflow as tf\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n"
            "        r = tf.train.load_checkpoint(p)\n"
            "        [r.get_tensor(n) for n in r.get_variable_to_shape_map()]\n"
            "        print('ok', p, sep='\\t', flush=True)\n"
            "    except Exception as e:\n"
            "        print('error', p, ' '.join(str(e).split()), sep='\\t', flush=True)\n")
    prefixes = sorted(p[:-len(".index")] for p in
                      glob.glob(os.path.join(out, "checkpoints", "**", "*.index"), recursive=True))
    if not prefixes:
        return {}
    r = subprocess.run([sys.executable, "-c", code, *prefixes], capture_output=True, text=True)
    said = {}
    for line in r.stdout.splitlines():
        verdict, _, rest = line.partition("\t")
        prefix, _, error = rest.partition("\t")
        said[prefix] = None if verdict == "ok" else error or "?"
    # a prefix the interpreter never reached (it crashed first) carries its last words
    last = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
    return {os.path.relpath(p, out): said.get(p, last) for p in prefixes}


def metrics_whole(out):
    """Problems of metrics.jsonl: lines that do not parse, progress out of order or repeated."""
    problems = []
    try:
        with open(os.path.join(out, "metrics.jsonl")) as f:
            lines = f.read().splitlines()
    except OSError as e:
        return [f"unreadable: {e}"]
    parsed = []
    for n, line in enumerate(lines, 1):
        try:
            parsed.append(json.loads(line))
        except ValueError:
            problems.append(f"line {n} does not parse: {line[:80]!r}")
    progress = [(e["epoch"], e["step"]) for e in parsed if e["event"] == "progress"]
    if progress != sorted(set(progress)):
        problems.append("progress lines repeated or out of order")
    return problems


# Relative, on the final valid perplexity (why: docs/reliability.md). mpirun relaunches resume
# with the same 2 ranks, exactly; elastic switches between 1 and 2 workers, whose summation
# orders differ, so its trajectory is as far from the uninterrupted one as another seed's.
TOLERANCE = {"mpirun": 0.001, "elastic": 0.03}


def global_step(epoch, step, per_epoch):
    return (epoch - 1) * per_epoch + step


def resumed_at(line, per_epoch):
    """The global step a reset or a relaunch went on from, from its line."""
    found = re.search(r"again from epoch (\d+) step (\d+)|\(epoch (\d+) step (\d+)\)"
                      r"|\(the end of epoch (\d+)\)", line)
    if not found:
        return None
    g = found.groups()
    if g[0]:
        return global_step(int(g[0]), int(g[1]), per_epoch)
    if g[2]:
        return global_step(int(g[2]), int(g[3]), per_epoch)
    return int(g[4]) * per_epoch


def per_fault(report):
    """Each fault's figures: its lines, the steps it rolled back, the seconds to progress."""
    faults, per_epoch = report["faults"], report["steps_per_epoch"]
    ends = [f["time"] for f in faults[1:]] + [float("inf")]
    for fault, end in zip(faults, ends):
        mine = [(t, line) for t, line in report["lines"] if fault["time"] <= t < end]
        lines = fault["lines"] = [line for _, line in mine]
        fault["aborts"] = [line for t, line in report["aborts"] if fault["time"] <= t < end]
        # recovered at its last reset or relaunch line, or when it ended if it had none
        recovery = [t for t, line in mine if "reset |" in line or "--resume:" in line]
        start = max(recovery) if recovery else fault["ended"]
        before = global_step(*fault["before"], per_epoch) if fault["before"] else 0
        back = [b for b in (resumed_at(line, per_epoch) for line in lines) if b is not None]
        fault["rolled_back"] = max([0] + [before - b for b in back])
        after = [t for t in report["progress_times"] if t > start]
        fault["to_progress_s"] = (min(after) - fault["time"]) if after and min(after) < end \
            else None
    return faults


def verdict(report):
    """Print the table and the checks; True if every check holds."""
    faults = per_fault(report)
    kinds = sorted({f["kind"] for f in faults}, key=list(KINDS).index)
    say("| fault | injected | with a line of the trainer's | steps rolled back | "
        "s from the fault to training again: median, max |")
    say("| --- | --- | --- | --- | --- |")
    for kind in kinds:
        mine = [f for f in faults if f["kind"] == kind]
        waits = [f["to_progress_s"] for f in mine if f["to_progress_s"] is not None]
        say(f"| {kind} | {len(mine)} | {sum(bool(f['lines']) for f in mine)} | "
            f"{sum(f['rolled_back'] for f in mine)} | "
            + (f"{statistics.median(waits):.1f}, {max(waits):.1f}" if waits else "—") + " |")
    epochs = [e for e in report["events"] if e["event"] == "epoch"]
    final = epochs[-1]["valid_ppl"] if epochs else None
    # like with like: the reference's epoch of the same number as the faulted run's last
    ref = next((e["valid_ppl"] for e in report["reference"]
                if epochs and e["epoch"] == epochs[-1]["epoch"]), None)
    reference_epochs = [e["epoch"] for e in report["reference"]]
    wanted = list(range(1, report["num_epochs"] + 1))
    if final and ref:
        say(f"final valid perplexity {final:.2f}, uninterrupted {ref:.2f} "
            f"({(final / ref - 1) * 100:+.2f} %); {report['launches']} launches, "
            f"{report['wall_s'] / 60:.1f} min")
    tolerance = TOLERANCE[report["launcher"]]
    short = [k for k in report["kinds"] if sum(f["kind"] == k for f in faults) < report["each"]]
    silent = [f"{f['kind']} at {f['before']}" for f in faults
              if not f["lines"] and f["kind"] != "link_blip"]
    gave_up = [f"{f['kind']} at {f['before']}" for f in faults
               if f["kind"] in BLIPS and f["aborts"]]
    # (check, held, what failed it): each check's name once, its detail beside it
    results = [
        ("the uninterrupted reference ran every epoch (exit status 0)",
         report["reference_rc"] == 0 and reference_epochs == wanted,
         f"exit status {report['reference_rc']}, epochs {reference_epochs}"),
        ("every fault of the schedule injected, each kind at least --each times",
         not report["not_injected"] and not short,
         f"not injected {report['not_injected']}, short {short}"),
        ("the job finished its epochs",
         report["returncode"] == 0 and [e["epoch"] for e in epochs] == wanted and
         any(e["event"] == "test" for e in report["events"]), ""),
        (f"the final valid perplexity is the uninterrupted run's within {tolerance:.1%}",
         bool(final and ref) and abs(final / ref - 1) <= tolerance,
         f"{final} against {ref}" if ref else "no reference epoch of the same number"),
        ("no process of the run is left", not report["leftovers"],
         f"pids {report['leftovers']}"),
        ("every checkpoint on disk loads", all(v is None for v in report["checkpoints"].values()),
         str({k: v for k, v in report["checkpoints"].items() if v})),
        ("metrics.jsonl parses line by line, each step once, in order",
         not report["metrics_whole"], "; ".join(report["metrics_whole"])),
        ("every fault had a line of the trainer's (a short link blip may pass unseen)",
         not silent, ", ".join(silent)),
        ("no worker's rendezvous gave up in a blip shorter than Gloo's timeout",
         not gave_up, ", ".join(gave_up)),
    ]
    for name, ok, detail in results:
        say(("ok: " if ok else "FAILED: ") + name + ("" if ok else f" ({detail})"))
    checks = {name: ok for name, ok, _ in results}
    report["checks"] = checks
    return all(checks.values())


def saved(report):
    """The report as written to results/: the epochs and the test instead of every event."""
    kept = {k: v for k, v in report.items() if k not in ("events", "progress_times")}
    kept["epochs"] = [e for e in report["events"] if e["event"] in ("epoch", "test")]
    return kept


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launcher", choices=("elastic", "mpirun"), default="elastic")
    parser.add_argument("--seed", type=int, default=None, help="default: a new one, printed")
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--each", type=int, default=3, help="faults of each kind, at least")
    parser.add_argument("--faults", default=",".join(KINDS),
                        help="kinds, comma-separated: " + ", ".join(KINDS))
    parser.add_argument("--data_path", default=os.environ.get("PTB_DATA_PATH", "data/ptb"))
    parser.add_argument("--results", default=None,
                        help="write the report here: <results>/chaos-<launcher>-seed<seed>.json")
    opts = parser.parse_args(argv)
    opts.argv = sys.argv[1:] if argv is None else argv
    opts.faults = [k.strip() for k in opts.faults.split(",") if k.strip()]
    unknown = [k for k in opts.faults if k not in KINDS]
    if unknown:
        parser.error(f"unknown fault kind {unknown[0]!r}: choose from {', '.join(KINDS)}")
    if os.geteuid() != 0:
        parser.error("the two hosts are network namespaces and the disk a tmpfs: run as root")
    opts.seed = opts.seed if opts.seed is not None else random.SystemRandom().randrange(10 ** 6)
    report = run(opts)
    report["kinds"], report["each"] = [k for k in opts.faults
                                       if opts.launcher in KINDS[k][1]], opts.each
    ok = verdict(report)
    if opts.results:
        os.makedirs(opts.results, exist_ok=True)
        path = os.path.join(opts.results, f"chaos-{opts.launcher}-seed{opts.seed}")
        say(f"report: {path}.json, this text: {path}.log")
        with open(path + ".json", "w") as f:  # all but the raw events and progress times
            json.dump(saved(report), f, indent=1, default=str)
        with open(path + ".log", "w") as f:
            f.write("\n".join(SAID) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
