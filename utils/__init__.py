"""Everything the two trainers share that is not about distribution.

Imported before TensorFlow (every script does so), it sets the two variables TensorFlow reads
once, when it is first imported."""
import importlib.util
import os

# TensorFlow >= 2.16 makes tf.keras Keras 3. Horovod 0.28.1's DistributedOptimizer averages the
# gradients inside a Keras 2 optimizer's minimize() (its _compute_gradients), a hook Keras 3's
# optimizers do not have; tf-keras (Keras 2) is installed beside TensorFlow for that. Forced,
# not defaulted: with Keras 3 the distributed step would not be the single-process step.
# Without tf-keras (TensorFlow <= 2.15, whose tf.keras is Keras 2) the variable would break
# tf.keras, so it is left alone; make_optimizer refuses a Keras 3 in one line.
if importlib.util.find_spec("tf_keras"):
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up notes out of the log


def child_env(**extra):
    """This process's environment for a child Python, without TF_USE_LEGACY_KERAS: the child may
    be another venv (TensorFlow 2.15 fails with it), and its own utils sets it where it belongs."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    return dict(env, **extra)
