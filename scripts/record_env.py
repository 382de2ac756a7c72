"""Print the environment record of a results run as JSON: CPU, cores, versions, commit, date."""
import datetime
import json
import os
import platform
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from utils import import_tensorflow  # noqa: E402  (also sets TensorFlow's variables)

# the vector units that set TensorFlow's speed here, and whether oneDNN is on by default
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def first_line(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model():
    """The CPU's name and which of SIMD_FLAGS it has: "AMD EPYC" has come with and without
    AVX-512 here, and the speed (and oneDNN being on) differs between the two."""
    name, flags = platform.processor(), set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):  # the first core's, after its model name
                flags = set(line.split(":", 1)[1].split())
                break
    return f"{name} ({', '.join(f for f in SIMD_FLAGS if f in flags) or 'no AVX2'})"


def record():
    """The environment of a results run (imports TensorFlow and Horovod for their versions)."""
    import horovod
    tf = import_tensorflow()
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
