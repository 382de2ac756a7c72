"""The word-level LSTM language model of Zaremba et al. 2014, in tf.keras."""
import importlib

from utils import import_tensorflow

tf = import_tensorflow()


def choose_lstm_impl(gpus=None):
    """"keras" (cuDNN kernel) where a GPU is visible, else "bptt" (the faster CPU path)."""
    gpus = tf.config.list_logical_devices("GPU") if gpus is None else gpus
    return "keras" if gpus else "bptt"


def _recurrence(z_x, h, c, recurrent_kernel):
    """The Keras LSTM cell's per-step math, gates (i, f, g, o), over z_x [steps, batch, 4 units]
    (the input projection already added). Returns per-step lists of h, c and the gates."""
    hs, cs, gates = [], [], []
    for z in z_x:
        i, f, g, o = tf.split(z + tf.matmul(h, recurrent_kernel), 4, axis=1)
        i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
        c = f * c + i * g
        h = o * tf.tanh(c)
        hs.append(h)
        cs.append(c)
        gates.append((i, f, g, o))
    return hs, cs, gates


def _input_projection(x, kernel, bias):
    """x [batch, steps, features] -> time-major rows [steps * batch, features] and their
    projection, one large matmul for all time steps, as a list of [batch, 4 units] per step."""
    batch, steps, features = x.shape
    rows = tf.reshape(tf.transpose(x, [1, 0, 2]), [-1, features])
    z_x = tf.reshape(tf.matmul(rows, kernel) + bias, [steps, -1, kernel.shape[1]])
    return rows, tf.unstack(z_x)


def unrolled_lstm(cell, x, h, c):
    """tf.keras.layers.LSTM's forward over a static number of steps, differentiated by autodiff.

    Same weights and gate order (i, f, g, o) as the Keras layer. Kept as the reference that
    bptt_lstm is tested and benchmarked against.
    """
    _, z_x = _input_projection(x, cell.kernel, cell.bias)
    hs, cs, _ = _recurrence(z_x, h, c, cell.recurrent_kernel)
    return tf.stack(hs, axis=1), hs[-1], cs[-1]


def bptt_lstm(cell, x, h, c):
    """The same layer with backpropagation through time written by hand: the CPU path.

    Autodiff of the unrolled loop builds the weight gradients as one small product per time
    step, h_{t-1}^T dz_t, and sums them. Here the backward loop only carries dh and dc through
    time; every weight gradient and the input gradient are then one large matmul over all time
    steps at once, as cuDNN and PyTorch do. Same variables as tf.keras.layers.LSTM, so
    checkpoints move freely between this path and the cuDNN one.
    """
    return _bptt(x, h, c, cell.kernel, cell.recurrent_kernel, cell.bias)


@tf.custom_gradient
def _bptt(x, h0, c0, kernel, recurrent_kernel, bias):
    rows, z_x = _input_projection(x, kernel, bias)
    hs, cs, gates = _recurrence(z_x, h0, c0, recurrent_kernel)

    def grad(d_outputs, d_h, d_c):
        units = recurrent_kernel.shape[0]
        steps = len(hs)
        # Per-step factors of the gate gradients, computed for all steps in a few large ops
        # rather than inside the sequential loop: dz = [dc, dc, dc, dh] * factor.
        i, f, g, o = (tf.stack(gate) for gate in zip(*gates))
        c_prev = tf.stack([c0] + cs[:-1])
        tanh_c = tf.tanh(tf.stack(cs))
        dc_from_dh = tf.unstack(o * (1 - tanh_c * tanh_c))
        factor = tf.unstack(tf.concat([g * i * (1 - i), c_prev * f * (1 - f), i * (1 - g * g),
                                       tanh_c * o * (1 - o)], axis=-1))
        forget = tf.unstack(f)
        d_outputs = tf.unstack(tf.transpose(d_outputs, [1, 0, 2]))
        recurrent_t = _transposed(recurrent_kernel)
        d_z = [None] * steps
        for t in reversed(range(steps)):
            d_h = d_h + d_outputs[t]
            d_c = d_c + d_h * dc_from_dh[t]
            d_z[t] = tf.concat([d_c, d_c, d_c, d_h], axis=1) * factor[t]
            d_h = tf.matmul(d_z[t], recurrent_t)
            d_c = d_c * forget[t]
        d_z = tf.concat(d_z, axis=0)  # [steps * batch, 4 units], time-major like `rows`
        h_prev = tf.concat([h0] + hs[:-1], axis=0)
        d_recurrent = tf.matmul(h_prev, d_z, transpose_a=True)
        d_kernel = tf.matmul(rows, d_z, transpose_a=True)
        d_bias = tf.reduce_sum(d_z, axis=0)
        d_x = tf.reshape(tf.matmul(d_z, kernel, transpose_b=True), [steps, -1, x.shape[2]])
        return tf.transpose(d_x, [1, 0, 2]), d_h, d_c, d_kernel, d_recurrent, d_bias

    return (tf.stack(hs, axis=1), hs[-1], cs[-1]), grad


def _transposed(matrix):
    """matrix^T as a tensor of its own. Grappler folds a plain 2-D transpose into the matmul
    (transpose_b=True), whose oneDNN kernel re-lays the whole matrix out at every call: 2.4x
    slower for the 35 small products of a medium layer here. A 3-D permutation is not folded."""
    rows, cols = matrix.shape
    return tf.reshape(tf.transpose(tf.reshape(matrix, [rows, cols, 1]), [1, 0, 2]), [cols, rows])


class PTBModel(tf.keras.Model):
    """Embedding -> num_layers LSTM -> softmax, dropout on the non-recurrent connections.

    The LSTM state is an explicit input and output, so the training loop can carry it from
    one window to the next and reset it at each epoch.
    """

    def __init__(self, vocab_size, hidden_size, num_layers, keep_prob, init_scale,
                 lstm_impl=None):
        super().__init__()
        self.lstm_impl = lstm_impl or choose_lstm_impl()
        def init():  # a fresh initializer per variable, as Keras wants for distinct draws
            return tf.keras.initializers.RandomUniform(-init_scale, init_scale)
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.embedding = tf.keras.layers.Embedding(vocab_size, hidden_size,
                                                   embeddings_initializer=init())
        # Keep Keras' defaults that select the cuDNN kernel on a GPU: tanh / sigmoid,
        # no recurrent dropout, not unrolled, with bias. Dropout sits between layers instead.
        # As in the paper's code, the forget-gate bias starts at 0 (unit_forget_bias=False).
        self.lstms = [tf.keras.layers.LSTM(hidden_size, return_sequences=True, return_state=True,
                                           kernel_initializer=init(), recurrent_initializer=init(),
                                           unit_forget_bias=False)
                      for _ in range(num_layers)]
        self.dropout_rate = 1.0 - keep_prob
        self.softmax = tf.keras.layers.Dense(vocab_size, kernel_initializer=init(),
                                             bias_initializer=init())

    def zero_state(self, batch_size):
        zeros = tf.zeros([batch_size, self.hidden_size])
        return tuple((zeros, zeros) for _ in range(self.num_layers))

    def call(self, inputs, state, training=False, noise_seed=None):
        """inputs [batch, steps] int ids -> logits [batch, steps, vocab], new state.

        noise_seed: a [2] int64 seed for the dropout masks, needed in training with dropout.
        The masks are a function of it alone (stateless random ops), so a run resumed from a
        checkpoint draws the masks the uninterrupted run drew (see training.noise_seed).
        """
        x = self._dropout(self.embedding(inputs), training, noise_seed, 0)
        new_state = []
        for layer, (lstm, (h, c)) in enumerate(zip(self.lstms, state), start=1):
            if self.lstm_impl != "keras" and lstm.built and x.shape[1] is not None:
                run = bptt_lstm if self.lstm_impl == "bptt" else unrolled_lstm
                x, h, c = run(lstm.cell, x, h, c)
            else:
                x, h, c = lstm(x, initial_state=[h, c], training=training)
            x = self._dropout(x, training, noise_seed, layer)
            new_state.append((h, c))
        return self.softmax(x), tuple(new_state)

    def _dropout(self, x, training, noise_seed, layer):
        if not training or self.dropout_rate == 0:
            return x
        if noise_seed is None:
            raise ValueError("PTBModel: training with dropout needs noise_seed (a [2] int64 "
                             "seed, e.g. training.noise_seed(seed, rank, step))")
        seed = tf.random.experimental.stateless_fold_in(noise_seed, layer)
        return tf.nn.experimental.stateless_dropout(x, self.dropout_rate, seed)


def build(cfg, vocab_size):
    """The model the config's `model` key names ("module:function", called with the config and
    the vocabulary size; default build_model below), its variables created. Another model needs
    only that function: call(inputs, state, training, noise_seed) -> (logits, state) and
    zero_state(batch), as PTBModel has."""
    from utils.config import ConfigError
    spec = cfg.get("model", "utils.model:build_model")  # runs logged before the key existed
    module, _, name = spec.partition(":")
    try:
        builder = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as e:
        raise ConfigError(f"model {spec!r} cannot be loaded ({e}); give "
                          "'module:function', importable from the repository folder") from None
    return builder(cfg, vocab_size)


def build_model(cfg, vocab_size, lstm_impl=None):
    model = PTBModel(vocab_size, cfg["hidden_size"], cfg["num_layers"], cfg["keep_prob"],
                     cfg["init_scale"], lstm_impl)
    model(tf.zeros([1, 1], tf.int32), model.zero_state(1))  # create the variables now
    return model


def sequence_loss(logits, targets):
    """Cross-entropy summed over time steps, averaged over the batch (the paper's loss).

    Written as logsumexp - logit of the target: the same value and gradient as
    sparse_softmax_cross_entropy_with_logits, whose CPU kernel was 1.5x slower here.
    """
    xent = (tf.reduce_logsumexp(logits, axis=-1)
            - tf.gather(logits, targets, axis=-1, batch_dims=2))
    return tf.reduce_sum(tf.reduce_mean(xent, axis=0))
