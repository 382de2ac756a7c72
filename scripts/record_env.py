"""Print the environment record of a results run as JSON: CPU, cores, versions, commit, date."""
import datetime
import json
import os
import platform
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def first_line(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def record():
    """The environment of a results run (imports TensorFlow and Horovod for their versions)."""
    import horovod
    import tensorflow as tf
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "horovod": horovod.__version__,
        "mpirun": first_line(["mpirun", "--version"]),
        "commit": first_line(["git", "rev-parse", "--short", "HEAD"]),
    }


def main():
    json.dump(record(), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
