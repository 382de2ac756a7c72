"""Seconds per step of Horovod's allreduce of large's dense gradients (2 LSTM kernels, the
softmax weights, the biases: 204 MB), one allreduce per tensor in one tf.function, as the
trainer's DistributedOptimizer issues them; median of 8 after 2 warm-up; rank 0 prints."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.environ.get("REPO", "."))
from utils import import_tensorflow  # noqa: E402
tf = import_tensorflow()
import horovod.tensorflow as hvd  # noqa: E402

os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
shapes = [(3000, 6000), (6000,), (3000, 6000), (6000,), (1500, 10000), (10000,)]
grads = [tf.random.normal(s, seed=i) for i, s in enumerate(shapes)]


@tf.function
def reduce_all(gs):
    return [hvd.allreduce(g, op=hvd.Average) for g in gs]


times = []
for i in range(10):
    t0 = time.perf_counter()
    out = reduce_all(grads)
    float(tf.reduce_sum(out[0][:1, :1]))
    times.append(time.perf_counter() - t0)
mb = sum(int(tf.size(g)) for g in grads) * 4 / 1e6
if hvd.rank() == 0:
    print(f"{os.environ.get('VARIANT', 'default')}: {statistics.median(times[2:]) * 1e3:.0f} ms "
          f"for {mb:.0f} MB ({[round(t * 1e3) for t in times[2:]]})", flush=True)
