"""Run under mpirun by test_communication.py: trains a few steps in reduce_type "param" with
the trainer's own pieces and writes, per step, a digest of this rank's weights to
<out_dir>/rank<N>.json (a file each: two ranks' stdout lines can interleave)."""
import hashlib
import json
import sys

import utils  # first: the Keras PTB_KERAS selects (Keras 2 here), utils/__init__.py
utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

import horovod_steps
from data import ptb
from tests.helpers import patterned_sentences
from utils import config, loop, optimizers, train_steps
from utils.model import build_model


class NoLog:
    def progress(self, *a, **k):
        pass


def main(every, steps, out_dir):
    hvd.init()
    cfg = config.load_config("tests/config_tiny.py", [
        "reduce_type='param'", f"param_sync_steps={every}", f"steps_per_epoch={steps}"])
    tf.keras.utils.set_random_seed(hvd.rank())
    words = " <eos> ".join(patterned_sentences(800)).split()
    ids = ptb.to_ids(words, ptb.build_vocab(words))
    x, y = (ptb.shard(a, hvd.rank(), hvd.size()) for a in ptb.windows(ids, 20, 10))
    model = build_model(cfg, int(ids.max()) + 1)
    hvd.broadcast_variables(model.variables, root_rank=0)
    optimizer = optimizers.make_optimizer(cfg)
    step_fn = train_steps.make_train_step(model, optimizer)
    sync = horovod_steps.parameter_averaging(model, cfg)
    digests = []

    def after_step(done, total):
        sync(done, total)
        flat = np.concatenate([w.numpy().ravel() for w in model.trainable_variables])
        digests.append(hashlib.sha256(flat.tobytes()).hexdigest()[:12])
    loop.train_epoch(step_fn, model, x, y, 0, cfg, NoLog(), log_every=steps,
                         average=lambda t: hvd.allreduce(t, op=hvd.Average), after_step=after_step)
    with open(f"{out_dir}/rank{hvd.rank()}.json", "w") as f:
        json.dump({"rank": hvd.rank(), "digests": digests}, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
