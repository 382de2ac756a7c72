"""The model on real TensorFlow: shapes, state carry, initial loss, cuDNN eligibility."""
import math

import numpy as np
import pytest
import tensorflow as tf

from utils import config
from utils.model import build_model, sequence_loss


@pytest.fixture(scope="module")
def model():
    tf.keras.utils.set_random_seed(0)
    cfg = dict(config.load_config("config_small"), hidden_size=16, keep_prob=0.5)
    return build_model(cfg, vocab_size=50)


def test_shapes(model):
    x = tf.zeros([3, 7], tf.int32)
    logits, state = model(x, model.zero_state(3))
    assert logits.shape == (3, 7, 50)
    assert len(state) == 2 and all(h.shape == c.shape == (3, 16) for h, c in state)


def test_the_embedding_rows_are_gathered_from_the_variable_not_a_read_of_the_table(model):
    """Keras 3's Embedding reads the whole table, then gathers: 2.7-4.2 % of small's train step
    (results/bench/steptime-keras3-1210). Its rows and their gradient are the same."""
    ids = tf.constant([[3, 1, 3]])

    @tf.function(autograph=False)
    def rows():
        with tf.GradientTape() as tape:
            out = model._embed(ids)
            loss = tf.reduce_sum(out * tf.range(16, dtype=tf.float32))
        return out, tape.gradient(loss, model.embedding.trainable_variables[0])
    out, grad = rows()
    ops = [op.type for op in rows.get_concrete_function().graph.get_operations()]
    assert "ResourceGather" in ops and "GatherV2" not in ops, ops
    table = model.embedding.trainable_variables[0].numpy()
    np.testing.assert_array_equal(out.numpy()[0], table[[3, 1, 3]])
    dense = tf.convert_to_tensor(grad).numpy()  # row 3 twice, row 1 once, the rest none
    np.testing.assert_array_equal(dense[[3, 1, 0]], [2 * np.arange(16), np.arange(16),
                                                     np.zeros(16)])


def test_state_carries_across_windows(model):
    x = tf.constant(np.random.RandomState(0).randint(0, 50, size=(2, 8)), tf.int32)
    whole, whole_state = model(x, model.zero_state(2))
    first, state = model(x[:, :5], model.zero_state(2))
    second, state = model(x[:, 5:], state)
    np.testing.assert_allclose(tf.concat([first, second], 1), whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state[1][0], whole_state[1][0], rtol=1e-5, atol=1e-6)
    # a reset state gives a different continuation: the carry is real
    reset, _ = model(x[:, 5:], model.zero_state(2))
    assert np.abs(reset - second).max() > 1e-4


def test_dropout_only_in_training(model):
    x = tf.ones([2, 4], tf.int32)
    a, _ = model(x, model.zero_state(2), training=False)
    b, _ = model(x, model.zero_state(2), training=False)
    np.testing.assert_array_equal(a, b)
    seed = tf.constant([1, 2], tf.int64)
    c, _ = model(x, model.zero_state(2), training=True, noise_seed=seed)
    assert np.abs(c - a).max() > 1e-6
    # the masks are a function of the seed alone, and training without one is refused
    np.testing.assert_array_equal(model(x, model.zero_state(2), training=True, noise_seed=seed)[0], c)
    d, _ = model(x, model.zero_state(2), training=True, noise_seed=tf.constant([1, 3], tf.int64))
    assert np.abs(d - c).max() > 1e-6
    with pytest.raises(ValueError, match="needs noise_seed"):
        model(x, model.zero_state(2), training=True)


def test_initial_loss_is_log_vocab_per_step():
    tf.keras.utils.set_random_seed(1)
    cfg = config.load_config("config_small")
    m = build_model(cfg, vocab_size=10000)
    x = tf.constant(np.random.RandomState(1).randint(0, 10000, size=(20, 20)), tf.int32)
    logits, _ = m(x, m.zero_state(20))
    loss = float(sequence_loss(logits, x))  # summed over 20 steps, mean over batch
    assert loss / 20 == pytest.approx(math.log(10000), rel=0.01)


def test_sequence_loss_sums_time_and_averages_batch():
    logits = tf.math.log(tf.constant([[[0.5, 0.5], [0.25, 0.75]],
                                      [[0.5, 0.5], [0.5, 0.5]]]))
    targets = tf.constant([[0, 1], [1, 0]])
    expected = ((-math.log(0.5) - math.log(0.75)) + (-math.log(0.5) * 2)) / 2
    assert float(sequence_loss(logits, targets)) == pytest.approx(expected, rel=1e-6)


def test_lstm_layers_keep_the_cudnn_conditions(model):
    # Keras picks the cuDNN kernel on a GPU only when these hold (Keras 3 asks its TensorFlow
    # backend's own test, Keras 2 records the verdict on the layer).
    for lstm in model.lstms:
        assert lstm.recurrent_dropout == 0 and not lstm.unroll and lstm.use_bias
        if hasattr(lstm, "_could_use_gpu_kernel"):
            assert lstm._could_use_gpu_kernel
        else:
            from keras.src.backend.tensorflow.rnn import _do_lstm_arguments_support_cudnn
            assert _do_lstm_arguments_support_cudnn(lstm.cell.activation,
                                                    lstm.cell.recurrent_activation,
                                                    lstm.unroll, lstm.cell.use_bias)


def test_lstm_implementation_is_chosen_by_device():
    from utils.model import choose_lstm_impl
    assert choose_lstm_impl(gpus=["/device:GPU:0"]) == "keras"  # cuDNN on GPUs
    assert choose_lstm_impl(gpus=[]) == "bptt"
    # the model takes the path of this host's devices (a GPU host runs this suite too)
    expected = "keras" if tf.config.list_logical_devices("GPU") else "bptt"
    assert build_model(config.load_config("config_small"), 20).lstm_impl == expected


def _layer_outputs_and_gradients(lstm, run, x, h, c, weights):
    """A loss that weighs every output and both final states differently, its value pieces and
    its gradients with respect to the weights, the input and the carried-in state."""
    with tf.GradientTape() as tape:
        tape.watch([x, h, c])
        outputs, h_out, c_out = run(x, h, c)
        loss = (tf.reduce_sum(outputs * weights) + tf.reduce_sum(h_out * 0.3)
                + tf.reduce_sum(c_out * 0.7))
    grads = tape.gradient(loss, [*lstm.trainable_variables, x, h, c])
    return [outputs, h_out, c_out] + grads


@pytest.mark.parametrize("batch, steps, units", [(20, 20, 200), (20, 35, 650)],
                         ids=["small", "medium"])
@pytest.mark.smoke
def test_bptt_lstm_equals_keras_and_unrolled_in_value_and_gradient(batch, steps, units):
    """The hand-written backward pass against autodiff of two independent forwards."""
    from utils.model import bptt_lstm, unrolled_lstm
    tf.keras.utils.set_random_seed(7)
    lstm = tf.keras.layers.LSTM(units, return_sequences=True, return_state=True,
                                kernel_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1),
                                recurrent_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1),
                                bias_initializer=tf.keras.initializers.RandomUniform(-0.1, 0.1),
                                unit_forget_bias=False)  # as the model; one draw for the bias
    x = tf.random.stateless_normal([batch, steps, units], [7, 0])
    h = tf.random.stateless_normal([batch, units], [7, 1]) * 0.5
    c = tf.random.stateless_normal([batch, units], [7, 2])
    weights = tf.random.stateless_normal([batch, steps, units], [7, 3])
    lstm(x)
    runs = {"keras": lambda x, h, c: lstm(x, initial_state=[h, c]),
            "unrolled": lambda x, h, c: unrolled_lstm(lstm.cell, x, h, c),
            "bptt": lambda x, h, c: bptt_lstm(lstm.cell, x, h, c)}
    got = {name: _layer_outputs_and_gradients(lstm, tf.function(run), x, h, c, weights)
           for name, run in runs.items()}
    names = ["outputs", "h", "c", "d kernel", "d recurrent kernel", "d bias", "d x", "d h", "d c"]
    for reference in ("keras", "unrolled"):
        for name, a, b in zip(names, got[reference], got["bptt"]):
            a, b = np.asarray(a), np.asarray(b)
            # relative to the tensor's scale: single elements near 0 have no relative precision
            assert np.abs(b - a).max() <= 1e-5 * np.abs(a).max(), (reference, name)
    assert np.abs(np.asarray(got["bptt"][3])).max() > 1e-3  # the gradients are not all zero


def test_models_of_the_three_lstm_paths_agree_in_value_and_gradient():
    cfg = dict(config.load_config("config_small"), hidden_size=24)
    tf.keras.utils.set_random_seed(3)
    keras_model = build_model(cfg, 40, lstm_impl="keras")
    others = [build_model(cfg, 40, lstm_impl=impl) for impl in ("unrolled", "bptt")]
    for m in others:
        m.set_weights(keras_model.get_weights())  # same variables, same layout
    x = tf.constant(np.random.RandomState(3).randint(0, 40, size=(4, 9)), tf.int32)
    results = []
    for m in [keras_model, *others]:
        state = tuple((tf.random.stateless_normal([4, 24], [i, 0]),
                       tf.random.stateless_normal([4, 24], [i, 1])) for i in range(2))
        with tf.GradientTape() as tape:
            logits, new_state = m(x, state, training=True)
            loss = sequence_loss(logits, x)
        results.append((logits, new_state[1][1], tape.gradient(loss, m.trainable_variables)))
    la, sa, ga = results[0]
    for lb, sb, gb in results[1:]:
        np.testing.assert_allclose(lb, la, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(sb, sa, rtol=1e-5, atol=1e-5)
        for a, b in zip(ga, gb):
            np.testing.assert_allclose(tf.convert_to_tensor(b), tf.convert_to_tensor(a),
                                       rtol=1e-4, atol=1e-6)


def test_sequence_loss_equals_tensorflows_cross_entropy():
    logits = tf.random.stateless_normal([3, 5, 50], [1, 2]) * 4
    targets = tf.random.stateless_uniform([3, 5], [3, 4], maxval=50, dtype=tf.int32)
    expected = tf.reduce_sum(tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits), 0))
    assert float(sequence_loss(logits, targets)) == pytest.approx(float(expected), rel=1e-6)


@pytest.mark.smoke
def test_loss_trajectory_matches_the_keras_layer_and_sparse_cross_entropy(ptb_path, tmp_path,
                                                                         monkeypatch):
    """The CPU fast path must not move perplexity: 60 steps of the tiny config stay within 1e-3
    of the same run on the plain Keras LSTM layer and sparse_softmax_cross_entropy_with_logits
    (the implementation before the fast path), from the same seed, weights and rows."""
    import json
    import lm_ptb
    from utils import model as model_module, train_steps

    def losses(name):
        lm_ptb.main(["--config", "tests/config_tiny.py", "--data_path", ptb_path,
                     "--set", "hidden_size=16", "--set", "batch_size=4", "--set", "num_steps=5",
                     "--set", "num_epochs=2", "--set", "max_epoch=1", "--set",
                     "steps_per_epoch=30", "--set", "eval_steps=5", "--log_every", "1",
                     "--seed", "7", "--output_dir", str(tmp_path / name)])
        events = [json.loads(line) for line in open(tmp_path / name / "metrics.jsonl")]
        return np.array([e["loss"] for e in events if e["event"] == "progress"])

    fast = losses("fast")
    monkeypatch.setattr(model_module, "choose_lstm_impl", lambda gpus=None: "keras")
    monkeypatch.setattr(train_steps, "sequence_loss", lambda logits, targets: tf.reduce_sum(
        tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=targets, logits=logits), 0)))
    reference = losses("reference")
    assert len(fast) == len(reference) == 60
    assert fast[0] != pytest.approx(fast[-1], rel=1e-2)  # it trained
    rel = np.abs(fast - reference) / reference
    assert rel.max() < 1e-3, rel.max()


def test_accumulating_step_splits_the_rows_and_matches_one_pass():
    from utils import optimizers, train_steps
    cfg = dict(config.load_config("config_small"), hidden_size=12)
    x = tf.constant(np.random.RandomState(5).randint(0, 30, size=(4, 6)), tf.int32)
    results = []
    for passes in (1, 2):
        tf.keras.utils.set_random_seed(5)
        m = build_model(cfg, 30)
        step = train_steps.make_train_step(m, optimizers.make_optimizer(cfg), passes)
        loss, state = step(x, x, m.zero_state(4))
        results.append((float(loss), state[1][0].numpy(), [v.numpy() for v in m.variables]))
        if passes == 2:  # three rows cannot be cut in two: the rows really are split
            with pytest.raises(ValueError, match="evenly divisible by 2"):
                step(x[:3], x[:3], m.zero_state(3))
    (l1, s1, w1), (l2, s2, w2) = results
    assert l2 == pytest.approx(l1, rel=1e-6)
    np.testing.assert_allclose(s2, s1, rtol=1e-5, atol=1e-6)
    for a, b in zip(w1, w2):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
