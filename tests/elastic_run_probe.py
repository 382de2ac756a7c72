"""Run by test_keras3.py under horovodrun's elastic driver, 2 workers (on the hosts localhost and
127.0.0.1): a function under @hvd.elastic.run, with hvd.elastic.KerasState of a model (MODEL:
functional or subclassed) and Horovod's SGD with momentum, on the Keras PTB_KERAS selects.

Every weight starts at 1 and rank r's gradient of it is r + 1. The state commits every 2 steps;
after step 3 (uncommitted) the worker on 127.0.0.1 exits, as a lost host's would. The other's
next allreduce fails, hvd.elastic.run restores the commit of step 2 (the weights and the
optimizer's velocity and step count), the driver goes on with 1 worker, and it takes steps 3-6
alone. The survivor writes its results ($PROBE_OUT/rank0.json): its weights, the optimizer's
velocity and step count, the worker count at each step it took and the resets it saw."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects
tf = utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import numpy as np  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from keras3_probe import KERAS3, keras_name, models, report, step  # noqa: E402 -- tests/

keras = tf.keras
STEPS, COMMIT_EVERY, LOST_AFTER = 6, 2, 3


def main():
    hvd.init()
    model = models(1, value=1.0)[os.environ["MODEL"]]
    for variable in model.trainable_variables:  # the biases too: every weight from 1
        variable.assign(tf.ones(variable.shape))
    module = keras.optimizers if KERAS3 else keras.optimizers.legacy
    optimizer = hvd.DistributedOptimizer(module.SGD(learning_rate=0.1, momentum=0.9))
    state = hvd.elastic.KerasState(model, optimizer, batch=0, sizes=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(hvd.size())])

    @hvd.elastic.run
    def train(state):
        while state.batch < STEPS:
            if state.batch == LOST_AFTER and os.environ["HOROVOD_HOSTNAME"] == "127.0.0.1":
                os._exit(1)  # this host is lost, its step 3 uncommitted on the other
            step(optimizer, [tf.fill(v.shape, hvd.rank() + 1.0)
                             for v in model.trainable_variables], model.trainable_variables)
            state.batch += 1
            state.sizes = state.sizes + [hvd.size()]
            if state.batch % COMMIT_EVERY == 0:
                state.commit()

    train(state)
    velocity = [v for v in (optimizer.variables if KERAS3 else optimizer.variables())
                if tuple(v.shape) in {tuple(w.shape) for w in model.trainable_variables}]
    report({"rank": hvd.rank(), "keras": keras_name(), "model": os.environ["MODEL"],
            "weights": sorted({round(float(v), 6) for w in model.trainable_variables
                               for v in np.ravel(w.numpy())}),
            "velocity": sorted({round(float(v), 6) for w in velocity
                                for v in np.ravel(w.numpy())}),
            "iterations": int(optimizer.iterations.numpy()), "sizes": state.sizes,
            "resets": resets})
    return 0


if __name__ == "__main__":
    sys.exit(main())
