"""A real one-node Slurm for the tests: munged, slurmctld and slurmd of Debian's slurm-wlm,
started as root in a temporary folder and stopped afterwards (scripts/setup_slurm.sh installs
the packages)."""
import contextlib
import os
import shutil
import socket
import subprocess
import time

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel")


def missing():
    """Why a Slurm cannot be started here, or None."""
    if os.geteuid() != 0:
        return "the Slurm test needs root (it starts munged, slurmctld and slurmd)"
    absent = [d for d in DAEMONS if not shutil.which(d)]
    if absent:
        return (f"no {', '.join(absent)}: install Slurm with scripts/setup_slurm.sh (Debian "
                "slurm-wlm and munge)")
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(folder, host, cpus):
    paths = {name: os.path.join(folder, name) for name in ("state", "spool", "logs")}
    for path in paths.values():
        os.makedirs(path, exist_ok=True)
    conf = f"""ClusterName=ptbtest
SlurmctldHost={host}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={folder}/munge.socket
CredType=cred/munge
StateSaveLocation={paths['state']}
SlurmdSpoolDir={paths['spool']}
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={paths['logs']}/slurmctld.log
SlurmdLogFile={paths['logs']}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
KillWait=30
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
    path = os.path.join(folder, "slurm.conf")
    with open(path, "w") as f:
        f.write(conf)
    return path


class Slurm:
    """Commands against the running cluster (SLURM_CONF points at its config)."""

    def __init__(self, folder, conf):
        self.folder = folder
        self.env = dict(os.environ, SLURM_CONF=conf)

    def run(self, *cmd, env=None, cwd=None):
        return subprocess.run(cmd, env=env or self.env, cwd=cwd, capture_output=True, text=True,
                              timeout=60)

    def field(self, job, name):
        """One field of `scontrol show job`: JobState (PENDING, RUNNING, COMPLETED, FAILED,
        ...), Restarts, ..."""
        r = self.run("scontrol", "show", "job", str(job))
        for field in r.stdout.split():
            if field.startswith(name + "="):
                return field.split("=", 1)[1]
        return None

    def state(self, job):
        return self.field(job, "JobState")

    def wait(self, job, states, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(job)
            if state in states:
                return state
            time.sleep(0.5)
        raise TimeoutError(f"job {job} not in {states} after {timeout} s (state {state}); "
                           f"{self.logs()}")

    def logs(self):
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            path = os.path.join(self.folder, "logs", name)
            if os.path.exists(path):
                out.append(f"--- {name}:\n" + "".join(open(path).readlines()[-30:]))
        return "\n".join(out)


@contextlib.contextmanager
def local_slurm(folder, cpus=2):
    """munged with a fresh key, then slurmctld and slurmd, all in `folder`; stopped on exit."""
    host = socket.gethostname().split(".")[0]
    conf = write_config(folder, host, cpus)
    key = os.path.join(folder, "munge.key")
    subprocess.run(["mungekey", "--create", "--keyfile", key], check=True, capture_output=True)
    os.chmod(key, 0o600)
    daemons = []
    try:
        daemons.append(subprocess.Popen(
            ["munged", "--foreground", "--force", f"--key-file={key}",
             f"--socket={folder}/munge.socket", f"--pid-file={folder}/munged.pid",
             f"--log-file={folder}/logs/munged.log", f"--seed-file={folder}/munged.seed"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        _wait_for(lambda: os.path.exists(f"{folder}/munge.socket"), "munged's socket")
        env = dict(os.environ, SLURM_CONF=conf)
        for daemon in ("slurmctld", "slurmd"):
            daemons.append(subprocess.Popen([daemon, "-D", "-f", conf], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        slurm = Slurm(folder, conf)
        _wait_for(lambda: "idle" in slurm.run("sinfo", "-h", "-o", "%T").stdout,
                  "an idle Slurm node", slurm)
        yield slurm
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in reversed(daemons):
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


def _wait_for(ready, what, slurm=None, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.3)
    raise TimeoutError(f"no {what} after {timeout} s" + (f"; {slurm.logs()}" if slurm else ""))
