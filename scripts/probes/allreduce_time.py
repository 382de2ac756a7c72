"""Milliseconds per step of Horovod's allreduce of one config's dense gradients (each layer's
kernel, recurrent kernel and bias, the softmax's weights and bias: large's 204 MB), one
allreduce per tensor in one tf.function, as the trainer's DistributedOptimizer issues them, and
the allgather of each rank's embedding rows (IndexedSlices); median of 8 after 4 warm-up; rank
0 prints. Usage: mpirun -np 2 python allreduce_time.py [config_small|config_medium|config_large]
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.environ.get("REPO", "."))
from utils import config, import_tensorflow  # noqa: E402
tf = import_tensorflow()
import horovod.tensorflow as hvd  # noqa: E402

VOCAB = 10000


def gradient_shapes(cfg):
    h = cfg["hidden_size"]
    return [(h, 4 * h), (h, 4 * h), (4 * h,)] * cfg["num_layers"] + [(h, VOCAB), (VOCAB,)]


def main():
    name = sys.argv[1] if len(sys.argv) > 1 else "config_large"
    cfg = config.load_config(name)
    os.environ.setdefault("OMPI_MCA_mpi_yield_when_idle", "1")
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    grads = [tf.random.normal(s, seed=i) for i, s in enumerate(gradient_shapes(cfg))]
    rows = cfg["batch_size"] // hvd.size() * cfg["num_steps"]
    embedding_rows = tf.random.normal([rows, cfg["hidden_size"]])

    @tf.function
    def reduce_all(gs, sparse):
        return [hvd.allreduce(g, op=hvd.Average) for g in gs] + [hvd.allgather(sparse)]

    times = []
    for _ in range(12):
        t0 = time.perf_counter()
        out = reduce_all(grads, embedding_rows)
        float(tf.reduce_sum(out[0][:1]))
        times.append(time.perf_counter() - t0)
    mb = sum(int(tf.size(g)) for g in grads) * 4 / 1e6
    if hvd.rank() == 0:
        print(f"{name}, {os.environ.get('VARIANT', 'default')}: "
              f"{statistics.median(times[4:]) * 1e3:.1f} ms for {mb:.1f} MB dense + "
              f"{rows} embedding rows a rank ({[round(t * 1e3, 1) for t in times[4:]]})",
              flush=True)


if __name__ == "__main__":
    main()
