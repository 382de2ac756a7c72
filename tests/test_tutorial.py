"""The training step against TensorFlow's PTB tutorial (tensorflow/models, tutorials/rnn/ptb,
ptb_word_lm.py at v1.13, whose table README sets ours beside), written out here as that graph
computes it, from the same weights and dropout masks: its LSTM cell (one kernel over [input, h],
gates in the order i, j, f, o, forget_bias 0), dropout on the embedding and on every layer's
output, the softmax, its sequence loss summed over time and averaged over the batch, the clip by
the global norm of every gradient (the embedding's as its rows, a row per occurrence) and plain
SGD. Real medium and small configs, real PTB windows: the losses and the weights after three
steps must agree to float32 rounding (docs/training.md, "Against the tutorial")."""
import numpy as np
import pytest
import tensorflow as tf

from data import ptb
from utils import config
from utils.model import build_model, sequence_loss
from utils.optimizers import make_optimizer
from utils.train_steps import make_train_step, noise_seed, seed_everything

SEED = 7


def tutorial_weights(model):
    """Our model's weights in the tutorial's layout: per layer one kernel [input + units,
    4 units] and bias, gate columns reordered from Keras' (i, f, g, o) to (i, j=g, f, o)."""
    def reorder(w):
        i, f, g, o = np.split(w, 4, axis=-1)
        return np.concatenate([i, g, f, o], axis=-1)
    layers = [(reorder(np.concatenate([lstm.cell.kernel.numpy(),
                                       lstm.cell.recurrent_kernel.numpy()])),
               reorder(lstm.cell.bias.numpy())) for lstm in model.lstms]
    return {"embedding": model.embedding.embeddings.numpy(), "layers": layers,
            "softmax_w": model.softmax.kernel.numpy(), "softmax_b": model.softmax.bias.numpy()}


def tutorial_step(variables, x, y, state, keep_prob, lr, max_grad_norm, step):
    """One step of the tutorial's training graph on tf.Variables of tutorial_weights; the
    dropout masks those our model draws at optimizer step `step` (the same stateless seeds)."""
    embedding, layers = variables["embedding"], variables["layers"]
    batch, steps = x.shape

    def dropout(t, site):  # the mask our model draws at this site, by its seeds
        if keep_prob >= 1:
            return t
        seed = tf.random.experimental.stateless_fold_in(noise_seed(SEED, 0, step), site)
        return tf.nn.experimental.stateless_dropout(t, 1 - keep_prob, seed)

    trainable = [embedding, *[v for layer in layers for v in layer], variables["softmax_w"],
                 variables["softmax_b"]]
    with tf.GradientTape() as tape:
        inputs = dropout(tf.nn.embedding_lookup(embedding, x), 0)
        new_state = []
        for number, ((kernel, bias), (h, c)) in enumerate(zip(layers, state), start=1):
            outputs = []
            for t in range(steps):
                z = tf.matmul(tf.concat([inputs[:, t, :], h], 1), kernel) + bias
                i, j, f, o = tf.split(z, 4, axis=1)
                c = c * tf.sigmoid(f + 0.0) + tf.sigmoid(i) * tf.tanh(j)
                h = tf.tanh(c) * tf.sigmoid(o)
                outputs.append(h)
            new_state.append((h, c))
            inputs = dropout(tf.stack(outputs, axis=1), number)
        logits = tf.matmul(tf.reshape(inputs, [-1, inputs.shape[-1]]),
                           variables["softmax_w"]) + variables["softmax_b"]
        xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.reshape(y, [-1]), logits=logits)
        cost = tf.reduce_sum(tf.reduce_mean(tf.reshape(xent, [batch, steps]), axis=0))
    grads, norm = tf.clip_by_global_norm(tape.gradient(cost, trainable), max_grad_norm)
    for grad, var in zip(grads, trainable):
        if isinstance(grad, tf.IndexedSlices):
            var.scatter_sub(tf.IndexedSlices(grad.values * lr, grad.indices))
        else:
            var.assign_sub(grad * lr)
    return float(cost), float(norm), new_state


@pytest.mark.parametrize("name, sets", [
    ("config_medium", {}),
    # a clip that acts at every step, so that how the norm counts the embedding's rows shows
    ("config_medium", {"max_grad_norm": 0.25}),
    ("config_small", {})])
def test_three_steps_equal_the_tutorials_graph(ptb_path, name, sets):
    cfg = dict(config.load_config(name), **sets)
    corpus = ptb.load_corpus(ptb_path)
    xs, ys = ptb.windows(corpus.train, cfg["batch_size"], cfg["num_steps"], "train")
    seed_everything(SEED)
    model = build_model(cfg, len(corpus.vocab), lstm_impl="bptt")
    theirs = tutorial_weights(model)
    variables = {"embedding": tf.Variable(theirs["embedding"]),
                 "layers": [(tf.Variable(k), tf.Variable(b)) for k, b in theirs["layers"]],
                 "softmax_w": tf.Variable(theirs["softmax_w"]),
                 "softmax_b": tf.Variable(theirs["softmax_b"])}
    optimizer = make_optimizer(cfg)
    step = make_train_step(model, optimizer, seed=SEED)
    ours_state = theirs_state = model.zero_state(cfg["batch_size"])
    norms = []
    for n in range(3):
        loss, ours_state = step(tf.constant(xs[n]), tf.constant(ys[n]), ours_state)
        cost, norm, theirs_state = tutorial_step(variables, tf.constant(xs[n]),
                                                 tf.constant(ys[n]), theirs_state,
                                                 cfg["keep_prob"], cfg["learning_rate"],
                                                 cfg["max_grad_norm"], n)
        assert float(loss) == pytest.approx(cost, rel=2e-6), n
        norms.append(norm)
    if "max_grad_norm" in sets:
        assert min(norms) > 4 * sets["max_grad_norm"], norms  # the clip acted at every step
    after = tutorial_weights(model)
    for ours, expected in ((after["embedding"], variables["embedding"]),
                           (after["softmax_w"], variables["softmax_w"]),
                           (after["softmax_b"], variables["softmax_b"]),
                           *[(a, v) for (k, b), (vk, vb) in zip(after["layers"],
                                                                variables["layers"])
                             for a, v in ((k, vk), (b, vb))]):
        expected = expected.numpy()
        assert np.abs(ours - expected).max() <= 1e-5 * np.abs(expected).max() + 1e-7
    # and the steps moved the weights: equal after training, not merely at the start
    assert np.abs(after["softmax_b"] - theirs["softmax_b"]).max() > 1e-3


def test_the_loss_is_the_tutorials_sequence_loss():
    """Summed over time, averaged over the batch, by hand on 2 x 2 logits."""
    logits = tf.constant([[[2.0, 0.0], [0.0, 1.0]], [[1.0, 1.0], [3.0, 0.0]]])
    targets = tf.constant([[0, 1], [1, 0]])
    per_token = [[np.log(1 + np.exp(-2.0)), np.log(1 + np.exp(-1.0))],
                 [np.log(2.0), np.log(1 + np.exp(-3.0))]]
    expected = sum(np.mean([per_token[0][t], per_token[1][t]]) for t in range(2))
    assert float(sequence_loss(logits, targets)) == pytest.approx(expected, rel=1e-6)
