"""What the machine offers a run: its cores, TensorFlow's threads on them, its bf16 and fp16 units
and GPUs."""
import os

import tensorflow as tf

from utils import stderr_without
from utils.errors import ConfigError


# The CPU flags of matmul units in each reduced precision (Linux names), and the raw line oneDNN
# logs at the first op in that dtype on a CPU without AVX-512
UNITS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}
BF16_FLAGS = UNITS["bf16"]
ONEDNN_NOTES = {"bf16": "oneDNN supports DT_BFLOAT16 only on platforms with AVX-512",
                "fp16": "oneDNN supports DT_HALF only on platforms with AVX-512"}
ONEDNN_BF16_NOTE = ONEDNN_NOTES["bf16"]


def units(precision, cpuinfo=None):
    """Which of UNITS[precision] the CPU has, from /proc/cpuinfo's text (read if not given); []
    where it cannot be read."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return []
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return [flag for flag in UNITS[precision] if flag in flags]


def bf16_units(cpuinfo=None):
    return units("bf16", cpuinfo)


def precision_note(cfg, cpuinfo=None, gpus=None):
    """One line for a bf16 or fp16 run on a CPU without units of that precision, where oneDNN
    falls back to slow kernels; None otherwise (GPUs: docs/gpu.md)."""
    precision = cfg["precision"]
    if precision not in UNITS:
        return None
    if gpus is None:
        gpus = tf.config.list_logical_devices("GPU")
    if gpus or units(precision, cpuinfo):
        return None
    # TensorFlow says so too, once a process, at its first op in that dtype, in a raw log line:
    # that op runs here, its line dropped, so that this note says it once, in words
    with stderr_without(ONEDNN_NOTES[precision]):
        tf.cast(tf.zeros([1]), tf.bfloat16 if precision == "bf16" else tf.float16)
    if precision == "fp16":
        return ("note: precision='fp16' on a CPU without fp16 units (neither avx512_fp16 nor "
                "amx_fp16 in /proc/cpuinfo): TensorFlow emulates float16 here, so "
                "precision='fp32' trains faster; fp16 is for GPUs without bf16 units")
    return ("note: precision='bf16' on a CPU without bf16 units (neither avx512_bf16 nor "
            "amx_bf16 in /proc/cpuinfo): TensorFlow emulates bfloat16 here, so "
            "precision='fp32' trains faster")


def local_gpus(processes, role, fewer):
    """This host's GPUs, each to take memory as it needs it (not all of it at once), for its
    `processes` (Horovod's ranks, tf.distribute's workers: `role`) to take one each; [] on a CPU
    host, whose cores they share. More processes than GPUs is one line naming the fix (`fewer`:
    how the launcher starts fewer per host, {gpus} in it their number)."""
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus and processes > len(gpus):
        n = len(gpus)
        raise ConfigError(
            f"this host runs {processes} {role}s but has {n} GPU{'s' * (n > 1)}, one per {role}: "
            f"start at most {n} {role}{'s' * (n > 1)} per host ({fewer.format(gpus=n)}), or hide "
            "the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU cores")
    return gpus


def available_cores():
    return len(os.sched_getaffinity(0))


def cores_per_process(processes):
    """This host's cores shared among `processes` (its ranks or workers), at least one each."""
    return max(1, available_cores() // processes)


def set_threads(intra_op):
    """Cap TensorFlow's thread pools. They are fixed once TensorFlow has run an op, so when
    main() is called from a process that already ran TensorFlow (a test), they stay as they are."""
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        tf.config.threading.set_inter_op_parallelism_threads(intra_op)
    except RuntimeError:
        pass
