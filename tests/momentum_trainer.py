"""A trainer with another optimizer, as README's "Adapt it" invites: `make_optimizer` replaced
by SGD with momentum (a slot per weight), then the trainer named first run as a script.

    mpirun -np 2 python tests/momentum_trainer.py lm_ptb_distributed.py --config ... --resume
"""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402
tf = utils.import_tensorflow()  # as the trainers start it, before utils.optimizers imports it
from utils import optimizers  # noqa: E402


def make_optimizer(cfg):
    sgd = tf.keras.optimizers.SGD if optimizers.KERAS3 else tf.keras.optimizers.legacy.SGD
    return sgd(learning_rate=cfg["learning_rate"], momentum=0.9,
               global_clipnorm=cfg["max_grad_norm"])


optimizers.make_optimizer = make_optimizer
script, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_path(script, run_name="__main__")
