"""Print the environment record of a results run as JSON: CPU, cores, versions, commit, date."""
import datetime
import json
import os
import platform
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
import utils  # noqa: E402
utils.require_setup()  # a Python without .venv's TensorFlow stops here in one line
from utils import import_tensorflow  # noqa: E402

# the vector units that set TensorFlow's speed here, and whether oneDNN is on by default
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def first_line(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_model(cpuinfo="/proc/cpuinfo"):
    """The CPU's name, family and model, and which of SIMD_FLAGS it has: "AMD EPYC" has come
    here as a Zen 3 (family 25 model 1) and a Zen 4 (model 17), with and without AVX-512, and
    the speed (and oneDNN being on by default) differs between them."""
    fields, flags = {}, set()
    with open(cpuinfo) as f:
        for line in f:
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "flags":  # the first core's, after its name, family and model
                flags = set(value.split())
                break
            fields.setdefault(key, value.strip())
    name = fields.get("model name") or platform.processor()
    if fields.get("cpu family") and fields.get("model"):
        name += f" family {fields['cpu family']} model {fields['model']}"
    return f"{name} ({', '.join(f for f in SIMD_FLAGS if f in flags) or 'no AVX2'})"


def keras_version(tf):
    """tf.keras's: Keras 3's own version, or tf-keras's (PTB_KERAS=2: "tf-keras 2.21.0")."""
    version = getattr(tf.keras, "__version__", None)
    if version:
        return version
    import tf_keras
    return f"tf-keras {tf_keras.__version__}"


def record():
    """The environment of a results run (imports TensorFlow and Horovod for their versions)."""
    tf = import_tensorflow()  # first, as the trainers start it (its variables recorded too)
    import horovod
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cpu": cpu_model(),
        "cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras_version(tf),
        "horovod": horovod.__version__,
        "mpirun": first_line(["mpirun", "--version"]),
        "commit": commit(),
    }


def commit(repo=REPO):
    """HEAD's short hash, with " and changes" when a tracked file differs from it: a run from
    an edited tree is not the commit's run."""
    head = first_line(["git", "-C", repo, "rev-parse", "--short", "HEAD"])
    changed = first_line(["git", "-C", repo, "status", "--porcelain", "--untracked-files=no"])
    return f"{head} and changes" if head and changed else head


def main():
    json.dump(record(), sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
