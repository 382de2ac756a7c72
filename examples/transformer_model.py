"""A model this project did not design, for the trainers as README "Adapt it" says: a small
Transformer decoder from Keras 3's own layers (keras.layers.MultiHeadAttention with a causal
mask, LayerNormalization, Dense), named by the config's `model` key
(--set "model='examples.transformer_model:build'"). tests/test_adapt.py trains it on 2 ranks
against one process. Keras 3 only: run it with the default PTB_KERAS."""
import keras
import tensorflow as tf


class DecoderBlock(keras.layers.Layer):
    """Pre-norm causal self-attention, then a position-wise feed-forward, each residual."""

    def __init__(self, hidden_size, heads):
        super().__init__()
        self.norm_attention = keras.layers.LayerNormalization()
        self.attention = keras.layers.MultiHeadAttention(heads, hidden_size // heads)
        self.norm_feed_forward = keras.layers.LayerNormalization()
        self.expand = keras.layers.Dense(4 * hidden_size, activation="gelu")
        self.project = keras.layers.Dense(hidden_size)

    def call(self, x):
        y = self.norm_attention(x)
        x = x + self.attention(y, y, use_causal_mask=True)
        return x + self.project(self.expand(self.norm_feed_forward(x)))


class TransformerDecoder(keras.Model):
    """Each window of num_steps words is its own context: the model carries no state between
    windows, so its `state` is a [batch, 1] zero passed through (the trainers carry one)."""

    def __init__(self, vocab_size, hidden_size, num_layers, num_steps, keep_prob, heads=2):
        super().__init__()
        self.dropout_rate = 1.0 - keep_prob
        self.embedding = keras.layers.Embedding(vocab_size, hidden_size)
        # A dense table sliced, not an Embedding looked up: a lookup's gradient is sparse, its
        # rows summed over the batch, and a sparse gradient's global norm (the clip's) is then
        # another on 2 ranks, whose rows are gathered unsummed, than on one process.
        self.position = self.add_weight(shape=(num_steps, hidden_size), name="position",
                                        initializer="random_normal")
        self.num_layers = num_layers
        for number in range(num_layers):  # attributes, not a list: a checkpoint sees each
            setattr(self, f"block_{number}", DecoderBlock(hidden_size, heads))
        self.norm = keras.layers.LayerNormalization()
        self.softmax = keras.layers.Dense(vocab_size)

    def zero_state(self, batch_size):
        return tf.zeros([batch_size, 1])

    def call(self, inputs, state, training=False, noise_seed=None):
        steps = tf.shape(inputs)[1]
        x = self.embedding(inputs) + self.position[:steps][tf.newaxis]
        if training and self.dropout_rate:  # masks from the trainer's seed: exact resumes
            x = tf.nn.experimental.stateless_dropout(x, self.dropout_rate, noise_seed)
        for number in range(self.num_layers):
            x = getattr(self, f"block_{number}")(x)
        return self.softmax(self.norm(x)), state


def build(cfg, vocab_size):
    model = TransformerDecoder(vocab_size, cfg["hidden_size"], cfg["num_layers"],
                               max(cfg["num_steps"], cfg["eval_num_steps"]), cfg["keep_prob"])
    model(tf.zeros([1, 1], tf.int32), model.zero_state(1))  # create the variables now
    return model
