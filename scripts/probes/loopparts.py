# The trainer loop's parts timed in one process, in turns (from the repository root):
#   PTB_DATA_PATH=... TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python scripts/probes/loopparts.py 15
# and the same with .venv-tf2.15/bin/python. Ms per step, median of 15 rounds of 10 steps.
import os, sys, time, statistics
sys.path.insert(0, os.getcwd())  # run from the repository root
import utils  # noqa
import tensorflow as tf
from utils import config, training
from utils.cli import signals_deferred
from utils.model import build_model
from data import ptb
tf.config.threading.set_intra_op_parallelism_threads(2)
tf.config.threading.set_inter_op_parallelism_threads(2)
cfg = config.load_config("config_small")
model = build_model(cfg, 10000)
step = training.make_train_step(model, training.make_optimizer(cfg))
x, y = ptb.windows(ptb.load_corpus(os.environ["PTB_DATA_PATH"]).train, 20, 20, "train")
X, Y = tf.constant(x), tf.constant(y)
ids = tf.random.stateless_uniform([20, 20], [1, 2], maxval=10000, dtype=tf.int32)
real0 = tf.constant(x[5]); real0y = tf.constant(y[5])
state = model.zero_state(20)
for _ in range(3):
    l, state = step(ids, ids, state)
float(l)
def fixed_random(n, at):
    s = model.zero_state(20)
    for _ in range(n): l, s = step(ids, ids, s)
    float(l)
def fixed_real(n, at):
    s = model.zero_state(20)
    for _ in range(n): l, s = step(real0, real0y, s)
    float(l)
def presliced(n, at):
    xs = [tf.constant(x[at+k]) for k in range(n)]; ys = [tf.constant(y[at+k]) for k in range(n)]
    s = model.zero_state(20)
    for k in range(n): l, s = step(xs[k], ys[k], s)
    float(l)
def sliced(n, at):
    s = model.zero_state(20)
    for k in range(n): l, s = step(X[at+k], Y[at+k], s)
    float(l)
def sliced_deferred_pending(n, at):
    s = model.zero_state(20); pending = tf.constant(0.0)
    for k in range(n):
        with signals_deferred():
            l, s = step(X[at+k], Y[at+k], s)
        pending += l
    float(pending)
class Q:
    def progress(self, *a, **k): pass
def train_epoch(n, at):
    training.train_epoch(step, model, x[at:at+n], y[at:at+n], 0, dict(cfg, steps_per_epoch=n), Q(), log_every=n)
fns = [fixed_random, fixed_real, presliced, sliced, sliced_deferred_pending, train_epoch]
times = {f.__name__: [] for f in fns}
at = 0
for r in range(int(sys.argv[1]) if len(sys.argv) > 1 else 15):
    order = fns[r % len(fns):] + fns[:r % len(fns)]
    for f in order:
        t0 = time.perf_counter(); f(10, at); times[f.__name__].append((time.perf_counter() - t0) * 100)
    at += 10
print("TensorFlow", tf.__version__)
for k, v in times.items():
    print(f"  {k:<26} {statistics.median(v):6.1f} ms/step")
