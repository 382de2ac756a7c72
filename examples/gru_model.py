"""Another model for the trainers, as README "Adapt it" says: a GRU language model, built by a
function that the config's `model` key names (--set "model='examples.gru_model:build'";
tests/test_adapt.py trains it on 2 ranks)."""
import tensorflow as tf


class GRUModel(tf.keras.Model):
    def __init__(self, vocab_size, hidden_size, keep_prob):
        super().__init__()
        self.hidden_size, self.dropout_rate = hidden_size, 1.0 - keep_prob
        self.embedding = tf.keras.layers.Embedding(vocab_size, hidden_size)
        self.gru = tf.keras.layers.GRU(hidden_size, return_sequences=True, return_state=True)
        self.softmax = tf.keras.layers.Dense(vocab_size)

    def zero_state(self, batch_size):
        return tf.zeros([batch_size, self.hidden_size])

    def call(self, inputs, state, training=False, noise_seed=None):
        x = self.embedding(inputs)
        if training and self.dropout_rate:  # masks from the trainer's seed: exact resumes
            x = tf.nn.experimental.stateless_dropout(x, self.dropout_rate, noise_seed)
        x, state = self.gru(x, initial_state=state)
        return self.softmax(x), state


def build(cfg, vocab_size):
    model = GRUModel(vocab_size, cfg["hidden_size"], cfg["keep_prob"])
    model(tf.zeros([1, 1], tf.int32), model.zero_state(1))  # create the variables now
    return model
