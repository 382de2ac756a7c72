"""The word-level LSTM language model of Zaremba et al. 2014, in tf.keras."""
import tensorflow as tf


def choose_lstm_impl(gpus=None):
    """"keras" (cuDNN kernel) where a GPU is visible, else "unrolled" (the faster CPU path)."""
    gpus = tf.config.list_logical_devices("GPU") if gpus is None else gpus
    return "keras" if gpus else "unrolled"


def unrolled_lstm(cell, x, h, c):
    """The Keras LSTM cell's own math over a static number of steps, faster on CPU.

    Same weights and gate order (i, f, g, o) as tf.keras.layers.LSTM, so checkpoints move
    freely between this path and the cuDNN one. The input projection of all time steps is
    one large matmul; only the small recurrent matmul stays inside the loop, and the loop is
    unrolled in the graph (no while-loop bookkeeping per step).
    """
    batch, steps, features = x.shape
    projected = tf.matmul(tf.reshape(x, [-1, features]), cell.kernel) + cell.bias
    projected = tf.unstack(tf.reshape(projected, [-1, steps, 4 * cell.units]), axis=1)
    outputs = []
    for z_x in projected:
        z = z_x + tf.matmul(h, cell.recurrent_kernel)
        i, f, g, o = tf.split(z, 4, axis=1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(o) * tf.tanh(c)
        outputs.append(h)
    return tf.stack(outputs, axis=1), h, c


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
        self.dropouts = [tf.keras.layers.Dropout(1.0 - keep_prob) for _ in range(num_layers + 1)]
        self.softmax = tf.keras.layers.Dense(vocab_size, kernel_initializer=init(),
                                             bias_initializer=init())

    def zero_state(self, batch_size):
        zeros = tf.zeros([batch_size, self.hidden_size])
        return tuple((zeros, zeros) for _ in range(self.num_layers))

    def call(self, inputs, state, training=False):
        """inputs [batch, steps] int ids -> logits [batch, steps, vocab], new state."""
        x = self.dropouts[0](self.embedding(inputs), training=training)
        new_state = []
        for lstm, dropout, (h, c) in zip(self.lstms, self.dropouts[1:], state):
            if self.lstm_impl == "unrolled" and lstm.built and x.shape[1] is not None:
                x, h, c = unrolled_lstm(lstm.cell, x, h, c)
            else:
                x, h, c = lstm(x, initial_state=[h, c], training=training)
            x = dropout(x, training=training)
            new_state.append((h, c))
        return self.softmax(x), tuple(new_state)


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
