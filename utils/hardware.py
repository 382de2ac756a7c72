"""What the machine offers a run: its cores, TensorFlow's threads on them, and bf16 units."""
import os

from utils import import_tensorflow

tf = import_tensorflow()


BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # the CPU flags of bf16 matmul units (Linux names)


def bf16_units(cpuinfo=None):
    """Which of BF16_FLAGS the CPU has, from /proc/cpuinfo's text (read if not given); [] where
    it cannot be read."""
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
    return [flag for flag in BF16_FLAGS if flag in flags]


def precision_note(cfg, cpuinfo=None, gpus=None):
    """One line for a bf16 run on a CPU without bf16 units, where oneDNN falls back to slow
    kernels; None otherwise (GPUs: docs/gpu.md)."""
    if cfg["precision"] != "bf16":
        return None
    if gpus is None:
        gpus = tf.config.list_logical_devices("GPU")
    if gpus or bf16_units(cpuinfo):
        return None
    return ("note: precision='bf16' on a CPU without bf16 units (neither avx512_bf16 nor "
            "amx_bf16 in /proc/cpuinfo): TensorFlow emulates bfloat16 here, so "
            "precision='fp32' trains faster")


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
