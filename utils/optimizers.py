"""The optimizer of the paper (SGD, clipped by the global norm) and its state made up front."""
from utils import import_tensorflow
from utils.errors import TrainingError

tf = import_tensorflow()


def make_optimizer(cfg):
    # Legacy Keras SGD clips by global norm in apply_gradients. Horovod's DistributedOptimizer
    # averages the gradients before that, in _compute_gradients, which minimize() calls (see
    # make_train_step), so the clipped norm is that of the global batch's gradient and a
    # distributed update equals the single-process update.
    if tf.keras.__name__.startswith("keras._tf_keras"):  # Keras 3 (2.15: keras.api._v2)
        raise TrainingError("tf.keras is Keras 3: TensorFlow was imported before utils, which "
                            "selects Keras 2 (TF_USE_LEGACY_KERAS=1), or tf-keras is not "
                            "installed; import utils first, and install requirements-no-deps.txt")
    return tf.keras.optimizers.legacy.SGD(learning_rate=cfg["learning_rate"],
                                          global_clipnorm=cfg["max_grad_norm"])


def create_slots(optimizer, variables):
    """The optimizer's state (momentum, Adam's moments: a slot per weight) made now. Legacy Keras
    makes it at the first update, after a checkpoint's restore and the ranks' broadcast: then
    only the restoring rank would hold the saved state, and the ranks would train apart."""
    with optimizer._distribution_strategy_scope():  # tf.distribute: slots beside their weights
        optimizer._create_all_weights(variables)
