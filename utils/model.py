"""The word-level LSTM language model of Zaremba et al. 2014, in tf.keras."""
import tensorflow as tf


class PTBModel(tf.keras.Model):
    """Embedding -> num_layers LSTM -> softmax, dropout on the non-recurrent connections.

    The LSTM state is an explicit input and output, so the training loop can carry it from
    one window to the next and reset it at each epoch.
    """

    def __init__(self, vocab_size, hidden_size, num_layers, keep_prob, init_scale):
        super().__init__()
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
            x, h, c = lstm(x, initial_state=[h, c], training=training)
            x = dropout(x, training=training)
            new_state.append((h, c))
        return self.softmax(x), tuple(new_state)


def build_model(cfg, vocab_size):
    model = PTBModel(vocab_size, cfg["hidden_size"], cfg["num_layers"], cfg["keep_prob"],
                     cfg["init_scale"])
    model(tf.zeros([1, 1], tf.int32), model.zero_state(1))  # create the variables now
    return model


def sequence_loss(logits, targets):
    """Cross-entropy summed over time steps, averaged over the batch (the paper's loss)."""
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
    return tf.reduce_sum(tf.reduce_mean(xent, axis=0))
