"""The trainer loop's parts timed in one process, in turns (from the repository root):
    PTB_DATA_PATH=... TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python scripts/probes/loopparts.py 15
and the same with .venv-tf2.15/bin/python. Ms per step, median of 15 rounds of 10 steps of
small: fixed ids, one real window, windows sliced beforehand or from the epoch's tensors, with
the signals deferred and the loss summed as the loop does, and loop.train_epoch itself."""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
import utils  # noqa: E402
tf = utils.import_tensorflow()  # as the trainers start it, before the modules that load it
from data import ptb  # noqa: E402
from utils import config, loop  # noqa: E402
from utils.model import build_model  # noqa: E402
from utils.optimizers import make_optimizer  # noqa: E402
from utils.signals import signals_deferred  # noqa: E402
from utils.train_steps import make_train_step  # noqa: E402


class QuietLog:
    """The run log train_epoch reports its progress to, saying nothing."""
    def progress(self, *args, **kwargs):
        pass


def variants(step, model, cfg, x, y):
    """name: run(n, at) of n steps from window `at`, each a way to feed the step."""
    X, Y = tf.constant(x), tf.constant(y)
    ids = tf.random.stateless_uniform([20, 20], [1, 2], maxval=10000, dtype=tf.int32)
    real0, real0y = tf.constant(x[5]), tf.constant(y[5])

    def fixed_random(n, at):
        s = model.zero_state(20)
        for _ in range(n):
            loss, s = step(ids, ids, s)
        float(loss)

    def fixed_real(n, at):
        s = model.zero_state(20)
        for _ in range(n):
            loss, s = step(real0, real0y, s)
        float(loss)

    def presliced(n, at):
        xs = [tf.constant(x[at + k]) for k in range(n)]
        ys = [tf.constant(y[at + k]) for k in range(n)]
        s = model.zero_state(20)
        for k in range(n):
            loss, s = step(xs[k], ys[k], s)
        float(loss)

    def sliced(n, at):
        s = model.zero_state(20)
        for k in range(n):
            loss, s = step(X[at + k], Y[at + k], s)
        float(loss)

    def sliced_deferred_pending(n, at):
        s, pending = model.zero_state(20), tf.constant(0.0)
        for k in range(n):
            with signals_deferred():
                loss, s = step(X[at + k], Y[at + k], s)
            pending += loss
        float(pending)

    def train_epoch(n, at):
        loop.train_epoch(step, model, x[at:at + n], y[at:at + n], 0,
                         dict(cfg, steps_per_epoch=n), QuietLog(), log_every=n)

    return [fixed_random, fixed_real, presliced, sliced, sliced_deferred_pending, train_epoch]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    rounds = int(argv[0]) if argv else 15
    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    cfg = config.load_config("config_small")
    model = build_model(cfg, 10000)
    step = make_train_step(model, make_optimizer(cfg))
    x, y = ptb.windows(ptb.load_corpus(os.environ["PTB_DATA_PATH"]).train, 20, 20, "train")
    fns = variants(step, model, cfg, x, y)
    fns[0](3, 0)  # traces the step
    times = {f.__name__: [] for f in fns}
    at = 0
    for r in range(rounds):
        for f in fns[r % len(fns):] + fns[:r % len(fns)]:
            t0 = time.perf_counter()
            f(10, at)
            times[f.__name__].append((time.perf_counter() - t0) * 100)
        at += 10
    print("TensorFlow", tf.__version__)
    for name, ms in times.items():
        print(f"  {name:<26} {statistics.median(ms):6.1f} ms/step")


if __name__ == "__main__":
    main()
