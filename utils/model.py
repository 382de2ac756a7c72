"""The word-level LSTM language model of Zaremba et al. 2014, in tf.keras."""
import importlib

import tensorflow as tf

# The config's precision -> the dtype of the matmuls' operands (utils/config.py checks the name)
COMPUTE_DTYPES = {"fp32": tf.float32, "bf16": tf.bfloat16, "fp16": tf.float16}
# and the Keras mixed policy of the cuDNN path's LSTM layers in each
MIXED_POLICIES = {"bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def choose_lstm_impl(gpus=None):
    """"keras" (cuDNN kernel) where a GPU is visible, else "bptt" (the faster CPU path)."""
    gpus = tf.config.list_logical_devices("GPU") if gpus is None else gpus
    return "keras" if gpus else "bptt"


def _recurrence(z_x, h, c, recurrent_kernel):
    """The Keras LSTM cell's per-step math, gates (i, f, g, o), over z_x [steps, batch, 4 units]
    (the input projection already added). Returns per-step lists of h, c and the gates, and of h
    as the recurrent product's operand (h itself in fp32; in bf16, h cast once per step, which
    is what the backward pass multiplies by). The gates and the cell state stay in z_x's dtype
    (fp32) whatever the recurrent kernel's: only the product runs in bf16."""
    hs, cs, gates, operands = [], [], [], []
    h_op = tf.cast(h, recurrent_kernel.dtype)  # a no-op in fp32
    for z in z_x:
        i, f, g, o = tf.split(z + tf.cast(tf.matmul(h_op, recurrent_kernel), z.dtype), 4, axis=1)
        i, f, g, o = tf.sigmoid(i), tf.sigmoid(f), tf.tanh(g), tf.sigmoid(o)
        c = f * c + i * g
        h = o * tf.tanh(c)
        h_op = tf.cast(h, recurrent_kernel.dtype)
        hs.append(h)
        cs.append(c)
        gates.append((i, f, g, o))
        operands.append(h_op)
    return hs, cs, gates, operands


def _input_projection(x, kernel, bias):
    """x [batch, steps, features] -> time-major rows [steps * batch, features] and their
    projection, one large matmul for all time steps, as a list of [batch, 4 units] per step.
    The product runs in the kernel's dtype (bf16 or fp32); the bias is added in fp32."""
    batch, steps, features = x.shape
    rows = tf.reshape(tf.transpose(tf.cast(x, kernel.dtype), [1, 0, 2]), [-1, features])
    z_x = tf.cast(tf.matmul(rows, kernel), bias.dtype) + bias
    return rows, tf.unstack(tf.reshape(z_x, [steps, -1, kernel.shape[1]]))


def unrolled_lstm(cell, x, h, c, compute_dtype=tf.float32):
    """tf.keras.layers.LSTM's forward over a static number of steps, differentiated by autodiff.

    Same weights and gate order (i, f, g, o) as the Keras layer. Kept as the reference that
    bptt_lstm is tested and benchmarked against; compute_dtype as for bptt_lstm.
    """
    _, z_x = _input_projection(x, tf.cast(cell.kernel, compute_dtype), cell.bias)
    hs, cs, _, _ = _recurrence(z_x, h, c, tf.cast(cell.recurrent_kernel, compute_dtype))
    return tf.stack(hs, axis=1), hs[-1], cs[-1]


def bptt_lstm(cell, x, h, c, compute_dtype=tf.float32):
    """The same layer with backpropagation through time written by hand: the CPU path.

    Autodiff of the unrolled loop builds the weight gradients as one small product per time
    step, h_{t-1}^T dz_t, and sums them. Here the backward loop only carries dh and dc through
    time; every weight gradient and the input gradient are then one large matmul over all time
    steps at once, as cuDNN and PyTorch do. Same variables as tf.keras.layers.LSTM, so
    checkpoints move freely between this path and the cuDNN one.

    compute_dtype tf.bfloat16: every product (input projection, recurrent, and their gradients)
    takes bf16 operands, the weights cast once per call and h once per time step; everything
    else (the gates, the cell state, the outputs, the gradients it returns) stays fp32.
    """
    return _bptt(x, h, c, tf.cast(cell.kernel, compute_dtype),
                 tf.cast(cell.recurrent_kernel, compute_dtype), tf.convert_to_tensor(cell.bias))


@tf.custom_gradient
def _bptt(x, h0, c0, kernel, recurrent_kernel, bias):
    # The weights come in as tensors, cast or read (not variables: a variable read inside a
    # custom gradient needs the `variables` argument, and the cast's or the read's own
    # gradient takes ours back to the fp32 variable).
    rows, z_x = _input_projection(x, kernel, bias)
    hs, cs, gates, operands = _recurrence(z_x, h0, c0, recurrent_kernel)
    compute = kernel.dtype

    def grad(d_outputs, d_h, d_c):
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
        times_recurrent_t = _times_transposed(recurrent_kernel)
        d_z, d_z_ops = [None] * steps, [None] * steps
        for t in reversed(range(steps)):
            d_h = d_h + d_outputs[t]
            d_c = d_c + d_h * dc_from_dh[t]
            d_z[t] = tf.concat([d_c, d_c, d_c, d_h], axis=1) * factor[t]
            d_z_ops[t] = tf.cast(d_z[t], compute)
            d_h = tf.cast(times_recurrent_t(d_z_ops[t]), d_c.dtype)
            d_c = d_c * forget[t]
        d_bias = tf.reduce_sum(tf.concat(d_z, axis=0), axis=0)  # summed in fp32
        d_z = tf.concat(d_z_ops, axis=0)  # [steps * batch, 4 units], time-major like `rows`
        h_prev = tf.concat([tf.cast(h0, compute)] + operands[:-1], axis=0)
        d_recurrent = tf.matmul(h_prev, d_z, transpose_a=True)
        d_kernel = tf.matmul(rows, d_z, transpose_a=True)
        d_x = tf.reshape(tf.matmul(d_z, kernel, transpose_b=True), [steps, -1, x.shape[2]])
        return (tf.cast(tf.transpose(d_x, [1, 0, 2]), x.dtype), d_h, d_c, d_kernel, d_recurrent,
                d_bias)

    return (tf.stack(hs, axis=1), hs[-1], cs[-1]), grad


def _times_transposed(matrix):
    """A function d -> d . matrix^T for the backward loop's recurrent products, in the form
    that ran fastest here for matrix's dtype (one medium layer's 35 products, AMD EPYC with
    avx512_bf16): in fp32, matrix^T as a tensor of its own (6.2 ms against 13.5 with
    transpose_b); in bf16, transpose_b (4.2 ms against 4.6; large 22.6 against 35.6)."""
    if matrix.dtype == tf.float32:
        matrix_t = _transposed(matrix)
        return lambda d: tf.matmul(d, matrix_t)
    return lambda d: tf.matmul(d, matrix, transpose_b=True)


def _transposed(matrix):
    """matrix^T as a tensor of its own. Grappler folds a plain 2-D transpose into the matmul
    (transpose_b=True), whose fp32 oneDNN kernel re-lays the whole matrix out at every call:
    2.4x slower for the 35 small products of a medium layer here. A 3-D permutation is not
    folded."""
    rows, cols = matrix.shape
    return tf.reshape(tf.transpose(tf.reshape(matrix, [rows, cols, 1]), [1, 0, 2]), [cols, rows])


class PTBModel(tf.keras.Model):
    """Embedding -> num_layers LSTM -> softmax, dropout on the non-recurrent connections.

    The LSTM state is an explicit input and output, so the training loop can carry it from
    one window to the next and reset it at each epoch.

    precision "bf16": every matmul (the LSTM's and the softmax's, and their gradients) takes
    bfloat16 operands; the variables, the activations between layers, the dropout masks, the
    LSTM state, the logits and the loss stay fp32 (docs/precision.md says why each cast sits
    where it does). On the cuDNN path the LSTM layers run under Keras' mixed_bfloat16 policy.
    precision "fp16": the same with float16 operands (mixed_float16), for GPUs without bf16
    units; float16's narrow range needs the loss scaled (utils.optimizers.make_optimizer).
    """

    def __init__(self, vocab_size, hidden_size, num_layers, keep_prob, init_scale,
                 lstm_impl=None, precision="fp32"):
        super().__init__()
        self.lstm_impl = lstm_impl or choose_lstm_impl()
        self.precision = precision
        self.compute = COMPUTE_DTYPES[precision]
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
        # In bf16 and fp16 the Keras path takes Keras' mixed policy (fp32 variables, bf16 or
        # fp16 compute); the CPU paths cast by hand instead and keep the layer's own policy.
        policy = MIXED_POLICIES.get(precision) if self.lstm_impl == "keras" else None
        self.lstms = [tf.keras.layers.LSTM(hidden_size, return_sequences=True, return_state=True,
                                           kernel_initializer=init(), recurrent_initializer=init(),
                                           unit_forget_bias=False, dtype=policy)
                      for _ in range(num_layers)]
        # Each also an attribute of its own: Keras 3 does not give a checkpoint the layers of a
        # list, and a model-only restore (evaluate.py) would score fresh LSTM weights unwarned.
        for number, lstm in enumerate(self.lstms):
            setattr(self, f"lstm_{number}", lstm)
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
        checkpoint draws the masks the uninterrupted run drew (see train_steps.noise_seed).
        """
        x = self._dropout(self._embed(inputs), training, noise_seed, 0)
        new_state = []
        for layer, (lstm, (h, c)) in enumerate(zip(self.lstms, state), start=1):
            if self.lstm_impl != "keras" and lstm.built and x.shape[1] is not None:
                run = bptt_lstm if self.lstm_impl == "bptt" else unrolled_lstm
                x, h, c = run(lstm.cell, x, h, c, self.compute)
            else:  # a mixed-policy layer takes and gives bf16; the model's state stays fp32
                h, c = (tf.cast(t, lstm.compute_dtype) for t in (h, c))
                x, h, c = (tf.cast(t, tf.float32)
                           for t in lstm(x, initial_state=[h, c], training=training))
            x = self._dropout(x, training, noise_seed, layer)
            new_state.append((h, c))
        return self._logits(x), tuple(new_state)

    def _embed(self, ids):
        """The embedding's rows for ids, gathered from the variable itself (ResourceGather), as
        tf-keras's Embedding did. Keras 3's reads the whole table into a tensor first, then
        gathers: 2.7-4.2 % of small's train step, timed in turns (docs/keras3.md)."""
        if not self.embedding.built:
            self.embedding.build((None, None))
        table = self.embedding.embeddings
        return tf.nn.embedding_lookup(table if isinstance(table, tf.Variable) else table.value,
                                      ids)

    def _logits(self, x):
        if self.compute == tf.float32 or not self.softmax.built:  # fp32, or the build call
            return self.softmax(x)
        # The product in bf16, its [batch * steps, vocab] result and the bias add in fp32, so
        # that the loss's logsumexp over 10,000 words sees fp32 logits.
        kernel, bias = self.softmax.kernel, self.softmax.bias
        rows = tf.reshape(tf.cast(x, self.compute), [-1, x.shape[-1]])
        logits = tf.cast(tf.matmul(rows, tf.cast(kernel, self.compute)), tf.float32) + bias
        return tf.reshape(logits, tf.concat([tf.shape(x)[:-1], [self.vocab_size]], 0))

    def _dropout(self, x, training, noise_seed, layer):
        if not training or self.dropout_rate == 0:
            return x
        if noise_seed is None:
            raise ValueError("PTBModel: training with dropout needs noise_seed (a [2] int64 "
                             "seed, e.g. train_steps.noise_seed(seed, rank, step))")
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
                     cfg["init_scale"], lstm_impl,
                     cfg.get("precision", "fp32"))  # runs logged before the key existed
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
