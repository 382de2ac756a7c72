"""Median small train-step time (ms) of this venv, one config of env settings; run in turns by
steptime_turns.sh. Its argument: intra-op threads (2); STEPS (60), BATCH and INTER in the
environment."""
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import utils  # noqa: E402  (sets TF_USE_LEGACY_KERAS where PTB_KERAS=2 asks)
tf = utils.import_tensorflow()  # as the trainers start it, before the modules that load it
from utils import config  # noqa: E402
from utils.model import build_model  # noqa: E402
from utils.optimizers import make_optimizer  # noqa: E402
from utils.train_steps import make_train_step  # noqa: E402


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    threads = int(argv[0]) if argv else 2
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(int(os.environ.get("INTER", threads)))
    cfg = config.load_config("config_small")
    batch = int(os.environ.get("BATCH", cfg["batch_size"]))
    model = build_model(cfg, 10000)
    step = make_train_step(model, make_optimizer(cfg))
    rng = tf.random.stateless_uniform([batch, cfg["num_steps"]], [1, 2], maxval=10000,
                                      dtype=tf.int32)
    state = model.zero_state(batch)
    times = []
    for _ in range(int(os.environ.get("STEPS", 60))):
        t0 = time.perf_counter()
        loss, state = step(rng, rng, state)
        float(loss)
        times.append(time.perf_counter() - t0)
    print(json.dumps({"tf": tf.__version__, "ms": 1000 * statistics.median(times[5:]),
                      "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS"), "threads": threads,
                      "inter": os.environ.get("INTER"), "jit": os.environ.get("JIT")}))


if __name__ == "__main__":
    main()
