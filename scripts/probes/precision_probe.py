"""What the two precision probes (large_products.py, recurrent_products.py) share: TensorFlow as
the trainers import it, a median timer, the header line naming the CPU and its bf16 units."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
import utils  # noqa: E402
tf = utils.import_tensorflow()  # as the trainers start it, before the modules that load it
from scripts.record_env import cpu_model  # noqa: E402
from utils.hardware import bf16_units  # noqa: E402


def timed(fn, reps):
    """ms of fn() to its numpy value, median of reps runs after one to warm up."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn().numpy()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def header():
    print(f"{cpu_model()}; bf16 units: {', '.join(bf16_units()) or 'none'}")
