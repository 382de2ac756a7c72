"""Runs a trainer as if its host had N GPUs, for the tests of GPU pinning on a machine without
one: `python tests/stand_in_gpus.py N lm_ptb_distributed.py ARGS...`, under mpirun or
launch/tf_config.py like the trainer itself.

TensorFlow's list of physical GPUs answers N stand-in devices (its list of all devices too,
where Keras 3's compile() looks to choose XLA); setting one visible or its memory growth is
recorded, and printed as `stand-in GPUs: <who> pinned <device>` (who: this process's Horovod
local rank or tf.distribute worker index), instead of reaching a driver. Everything else, the
trainer's own check of ranks against GPUs included, runs as it is; the trainer then computes on
the CPU (its model chooses its kernels from the logical devices, which stay CPUs).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  selects the Keras before TensorFlow loads, as every script does
from tests.helpers import run_runner  # noqa: E402

tf = utils.import_tensorflow()


def who():
    """This process as its launcher numbers it on this host."""
    if "OMPI_COMM_WORLD_LOCAL_RANK" in os.environ:
        return f"local rank {os.environ['OMPI_COMM_WORLD_LOCAL_RANK']}"
    if "TF_CONFIG" in os.environ:
        return f"worker {json.loads(os.environ['TF_CONFIG'])['task']['index']}"
    return "the one process"


def stand_in(count):
    gpus = [tf.config.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU")
            for i in range(count)]
    real_list, real_visible = tf.config.list_physical_devices, tf.config.set_visible_devices

    def list_physical_devices(device_type=None):
        if device_type is None:  # all of them, as a GPU host lists them
            return real_list() + list(gpus)
        return list(gpus) if device_type == "GPU" else real_list(device_type)

    def set_visible_devices(devices, device_type=None):
        if device_type != "GPU":
            return real_visible(devices, device_type)
        # one device or a list of them (a PhysicalDevice is itself a tuple)
        for device in [devices] if isinstance(devices, tf.config.PhysicalDevice) else devices:
            os.write(1, f"stand-in GPUs: {who()} pinned {device.name}\n".encode())  # one write

    # tf.compat.v2.config too: tf-keras reads it there (its optimizers take XLA for their update
    # wherever a GPU is listed)
    for config in (tf.config, tf.compat.v2.config):
        config.list_physical_devices = list_physical_devices
        config.set_visible_devices = set_visible_devices
        config.experimental.set_memory_growth = lambda device, enable: None


USAGE = "usage: python tests/stand_in_gpus.py N SCRIPT [ARGS...]"


def setup(count):
    if not count.isdigit():
        sys.exit(USAGE)
    stand_in(int(count))


if __name__ == "__main__":
    run_runner(setup, USAGE)
