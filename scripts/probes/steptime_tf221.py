"""Median small train-step time (ms) of this venv, one config of env settings; run in turns."""
import os, sys, time, statistics, json
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import utils  # noqa: sets TF_USE_LEGACY_KERAS where tf_keras exists
import tensorflow as tf
from utils import config, training
from utils.model import build_model
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 2
tf.config.threading.set_intra_op_parallelism_threads(threads)
tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("INTER", threads)))
cfg = config.load_config("config_small")
batch = int(os.environ.get("BATCH", cfg["batch_size"]))
model = build_model(cfg, 10000)
step = training.make_train_step(model, training.make_optimizer(cfg))
rng = tf.random.stateless_uniform([batch, cfg["num_steps"]], [1, 2], maxval=10000, dtype=tf.int32)
state = model.zero_state(batch)
times = []
for k in range(int(os.environ.get("STEPS", 60))):
    t0 = time.perf_counter()
    loss, state = step(rng, rng, state)
    float(loss)
    times.append(time.perf_counter() - t0)
print(json.dumps({"tf": tf.__version__, "ms": 1000 * statistics.median(times[5:]),
                  "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"), "threads": threads, "inter": os.environ.get("INTER"), "jit": os.environ.get("JIT")}))
