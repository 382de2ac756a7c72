"""utils.optimizers' SGD, on hand-computed updates: the clip by the global norm, the step of a
dense weight, and a sparse gradient (an embedding's) applied by its rows, never made dense."""
import numpy as np
import pytest

from utils import import_tensorflow
from utils.optimizers import create_slots, make_optimizer

tf = import_tensorflow()


def one_update(max_grad_norm, optimizer=None):
    """w = [1, 2] with gradient [3, 0]; E (3 x 2) with the rows [0, 2] and [0, 2], both at
    index 1 (a word seen twice): [0, 4] on row 1. The update is compiled, as the trainers' is;
    by make_optimizer's SGD unless another optimizer is given."""
    variable = getattr(tf.keras, "Variable", tf.Variable)  # Keras 3's, or tf-keras's plain one
    w, e = variable([1.0, 2.0]), variable(np.arange(6, dtype=np.float32).reshape(3, 2))
    optimizer = optimizer or make_optimizer({"learning_rate": 0.5,
                                             "max_grad_norm": max_grad_norm})
    create_slots(optimizer, [w, e])

    @tf.function(autograph=False)
    def update():
        sparse = tf.IndexedSlices(tf.constant([[0.0, 2.0], [0.0, 2.0]]), tf.constant([1, 1]),
                                  tf.constant([3, 2]))
        optimizer.apply_gradients([(tf.constant([3.0, 0.0]), w), (sparse, e)])
    update()
    ops = {op.type for op in update.get_concrete_function().graph.get_operations()}
    return w.numpy(), e.numpy(), ops


def test_the_global_norm_clip_scales_both_gradients_and_the_step_is_lr_times_that():
    # The global norm is over a sparse gradient's rows as they come, a word seen twice counting
    # twice (TensorFlow's clip, tf-keras's, Keras 3's own): sqrt(3^2 + 2^2 + 2^2) = sqrt(17).
    # Over a clip of 1, both gradients x 1/sqrt(17), then x lr 0.5.
    scale = 1 / np.sqrt(17)
    w, e, _ = one_update(1.0)
    np.testing.assert_allclose(w, [1.0 - 0.5 * 3 * scale, 2.0], rtol=1e-6)
    np.testing.assert_allclose(e, [[0, 1], [2, 3 - 0.5 * 4 * scale], [4, 5]], rtol=1e-6)
    # a clip above the norm leaves the gradients as they are
    w, e, _ = one_update(10.0)
    np.testing.assert_allclose(w, [1.0 - 0.5 * 3.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(e, [[0, 1], [2, 3 - 0.5 * 4.0], [4, 5]], rtol=1e-6)


def test_a_sparse_gradient_is_applied_by_its_rows_never_made_dense():
    """Keras 3's own SGD makes it dense ([vocab, hidden] each step, UnsortedSegmentSum, then a
    dense AssignSubVariableOp) and steps dense weights in two kernels: docs/keras3.md."""
    _, _, ops = one_update(1.0)
    assert ops & {"ResourceScatterSub", "ResourceScatterAdd"}, sorted(ops)
    assert "ResourceApplyGradientDescent" in ops, sorted(ops)
    assert not ops & {"UnsortedSegmentSum", "AssignSubVariableOp", "Square"}, sorted(ops)


@pytest.mark.skipif(not hasattr(tf.keras, "Variable"), reason="Keras 3's own SGD to compare")
def test_the_same_update_as_keras_own_sgd():
    ours = one_update(1.0)
    keras_own = one_update(1.0, tf.keras.optimizers.SGD(learning_rate=0.5, global_clipnorm=1.0))
    np.testing.assert_allclose(ours[0], keras_own[0], rtol=1e-6)
    np.testing.assert_allclose(ours[1], keras_own[1], rtol=1e-6)
    assert "ResourceApplyGradientDescent" not in keras_own[2]  # the comparison is with another
