"""Run by test_sync_batch_norm.py under mpirun, on the Keras PTB_KERAS selects (Keras 3; 2:
tf-keras). On 2 ranks, hvd.SyncBatchNormalization, each rank given its share of each batch; on 1
rank, the expected values: keras.layers.BatchNormalization on the whole batch, with no Horovod
call. The same batches in both (seeded), so the ranks' shares put together must give the one
process's outputs, moving mean and moving variance:
- LAYER_CASES: input of 2 to 5 dimensions, rows split evenly or not, masks (given to the layer,
  or set by a Masking layer before it) whose unmasked counts differ by rank, a rank with none;
- model.fit of a functional and of a subclassed model with Horovod's optimizer on 2 ranks, a
  convnet branch (4-D) and a masked sequence branch: their weights after 2 epochs.
Writes one JSON file per rank ($PROBE_OUT)."""
import os
import shutil
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects, before TensorFlow loads
import numpy as np  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from keras3_probe import report  # noqa: E402 -- tests/, the script's own folder
from utils.optimizers import KERAS3  # noqa: E402

tf = utils.import_tensorflow()
keras = tf.keras
optimizers = keras.optimizers if KERAS3 else keras.optimizers.legacy  # Horovod's Keras 2 path

MOMENTUM = 0.5  # the moving statistics take half of the batch's: a wrong one shows
# name: (the batch's shape, rank 0's rows of its 8, the mask's kind: None, "given" to the layer,
# "masking" set by a Masking layer on the all-zero steps, "empty" none of rank 1's rows)
LAYER_CASES = {
    "2d": ((8, 3), 4, None),
    "3d": ((8, 5, 3), 4, None),
    "4d": ((8, 4, 4, 3), 4, None),
    "5d": ((8, 2, 2, 2, 3), 4, None),
    "4d_uneven": ((8, 4, 4, 3), 6, None),
    "3d_uneven": ((8, 5, 3), 5, None),
    "masked": ((8, 5, 3), 4, "given"),
    "masked_uneven": ((8, 5, 3), 3, "given"),
    "masked_4d": ((8, 4, 4, 3), 4, "given"),
    "masking_layer": ((8, 5, 3), 4, "masking"),
    "masked_empty_rank": ((8, 5, 3), 4, "empty"),
    # each channel's mean 2000 beside a spread of 1 to 3: float32's E[x^2] - E[x]^2 lost digits
    "large_mean": ((64, 3), 32, None, 2000.0),
}
# unmasked steps of each of the 8 sequences: rank 0's 4 rows hold 19, rank 1's 4 (in "masked")
LENGTHS = [5, 5, 4, 5, 2, 1, 0, 1]
FIT_LENGTHS = [5, 5, 4, 5, 2, 1, 3, 1]  # none empty: the pooling would divide by 0
IMAGE, SEQUENCE = (4, 4, 3), (5, 3)  # the model.fit cases' two inputs, a row's shapes
FIT_ROWS, FIT_BATCH, FIT_EPOCHS = 16, 8, 2


def batch(shape, seed):
    """A batch whose channels have means 0, 1, 2 and scales 1, 2, 3, rows from 4 on shifted by 1
    (a rank normalizing by its own rows is off by much)."""
    x = np.random.RandomState(seed).randn(*shape) * [1.0, 2.0, 3.0] + [0.0, 1.0, 2.0]
    x[4:] += 1.0
    return x.astype("float32")


def sequence_mask(shape, kind, seed):
    """[rows, steps] booleans: LENGTHS' first steps of each row (rank 1's none if "empty"); on 4-D
    input, each position kept with chance 1/2 (rows 0-3 more: 3/4)."""
    if len(shape) == 4:
        chance = np.where(np.arange(shape[0]) < 4, 0.75, 0.5)[:, None, None]
        return np.random.RandomState(seed).rand(*shape[:3]) < chance
    lengths = LENGTHS[:4] + [0] * 4 if kind == "empty" else LENGTHS
    return np.arange(shape[1])[None, :] < np.array(lengths)[:, None]


def share(rows, first):
    """This rank's rows of the whole batch: rank 0 its `first`, rank 1 the rest; one process all."""
    if hvd.size() == 1:
        return rows
    return rows[:first] if hvd.rank() == 0 else rows[first:]


def batch_norm():
    """The layer under test on 2 ranks; on 1, Keras' own, the expected values. tf-keras's own
    unfused: its fused kernel (its choice for 4-D and 5-D input) ignores a mask, with a warning,
    and moves the moving variance toward the rows' sample variance (n / (n - 1) times the
    variance it normalizes by), where its unfused path and Keras 3 take the variance itself;
    SyncBatchNormalization has no fused kernel."""
    if hvd.size() > 1:
        return hvd_tf.SyncBatchNormalization(momentum=MOMENTUM)
    unfused = {} if KERAS3 else {"fused": False}
    return keras.layers.BatchNormalization(momentum=MOMENTUM, **unfused)


def layer_case(shape, first, mask_kind, offset=0.0, seed=0):
    """This rank's outputs and the layer's moving mean and variance after one training call, on
    batch(shape, seed) + offset."""
    x = batch(shape, seed) + np.float32(offset)
    mask = sequence_mask(shape, mask_kind, seed) if mask_kind else None
    layer = batch_norm()
    if mask_kind == "masking":  # the padded steps all zeros; Keras hands their mask on itself
        x = np.where(mask[..., None], x, 0.0).astype("float32")
        out = layer(keras.layers.Masking(0.0)(share(x, first)), training=True)
    elif mask is not None:
        out = layer(share(x, first), training=True, mask=share(mask, first))
    else:
        out = layer(share(x, first), training=True)
    return {"out": np.asarray(out).tolist(),
            "moving": [np.asarray(layer.moving_mean).tolist(),
                       np.asarray(layer.moving_variance).tolist()],
            "fused": getattr(layer, "fused", None)}  # tf-keras's; Keras 3 has no fused kernel


class TwoBranches(keras.Model):
    """The subclassed model: fit_model's layers, called in call()."""

    def __init__(self, image, sequence, head):
        super().__init__()
        self.image, self.sequence, self.head = image, sequence, head

    def call(self, inputs, training=None):
        # `training` passed on: Keras 3 runs a subclassed model's inner layers as in inference
        # when its call() does not take it; the mask reaches them through Keras alone
        parts = []
        for branch, x in zip((self.image, self.sequence), inputs):
            for layer in branch:
                x = layer(x, training=training)
            parts.append(x)
        x = parts
        for layer in self.head:
            x = layer(x, training=training)
        return x


def fit_model(kind):
    """A model of two branches, each through a normalization: a convnet's (4-D) and a sequence
    model's whose padded steps are masked (Masking, then a Dense that hands the mask on to the
    normalization and to the pooling), joined by a Dense; weights seeded, so runs start alike."""
    seeded = [keras.initializers.GlorotUniform(seed=seed) for seed in (1, 2, 3)]
    image = [keras.layers.Conv2D(3, 2, padding="same", kernel_initializer=seeded[0]),
             batch_norm(), keras.layers.Flatten()]
    sequence = [keras.layers.Masking(0.0), keras.layers.Dense(3, kernel_initializer=seeded[1]),
                batch_norm(), keras.layers.GlobalAveragePooling1D()]
    head = [keras.layers.Concatenate(), keras.layers.Dense(1, kernel_initializer=seeded[2])]
    if kind == "subclassed":
        return TwoBranches(image, sequence, head)
    inputs = [keras.Input(IMAGE), keras.Input(SEQUENCE)]
    parts = []
    for branch, x in zip((image, sequence), inputs):
        for layer in branch:
            x = layer(x)
        parts.append(x)
    return keras.Model(inputs, head[1](head[0](parts)))


def fit_case(kind):
    """The weights (the normalizations' moving statistics among them) after model.fit: on 2
    ranks, each global batch of 8 rows split 4 and 4, Horovod's optimizer; on 1, the whole."""
    images, sequences = batch((FIT_ROWS,) + IMAGE, seed=7), batch((FIT_ROWS,) + SEQUENCE, seed=8)
    # each batch's rows 0-3 (rank 0's) long, 4-7 (rank 1's) short
    steps = np.arange(SEQUENCE[0])[None, :] < np.array(FIT_LENGTHS * (FIT_ROWS // 8))[:, None]
    sequences = np.where(steps[..., None], sequences, 0.0).astype("float32")
    y = images.reshape(FIT_ROWS, -1).mean(axis=1) + sequences.reshape(FIT_ROWS, -1).mean(axis=1)
    model = fit_model(kind)
    sgd = optimizers.SGD(learning_rate=0.02)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd) if hvd.size() > 1 else sgd, loss="mse")
    model.fit([mine(images), mine(sequences)], mine(y[:, None]), batch_size=FIT_BATCH // hvd.size(),
              epochs=FIT_EPOCHS, shuffle=False, verbose=0)
    return [w.ravel().tolist() for w in model.get_weights()]


def mine(rows):
    """This rank's share of each global batch of FIT_BATCH rows: 4 and 4 on 2 ranks."""
    n = hvd.size()
    return rows.reshape(FIT_ROWS // FIT_BATCH, n, FIT_BATCH // n, *rows.shape[1:])[
        :, hvd.rank()].reshape(-1, *rows.shape[1:])


def reload_case(suffix):
    """A convnet (4-D input) fitted for an epoch, saved by rank 0 as `suffix` (".keras", ".h5",
    or "old.keras": a .keras file whose layer bears the bare class name, as Horovod saved it
    before it registered the class), loaded for the next epoch by hvd.load_model on every rank
    (keras.models.load_model of Keras' own layer on 1): the weights at the end, and the class
    of the loaded normalization."""
    images = batch((FIT_ROWS,) + IMAGE, seed=9)
    y = images.reshape(FIT_ROWS, -1).mean(axis=1)[:, None]
    x = keras.Input(IMAGE)
    layers = [keras.layers.Conv2D(3, 2, padding="same",
                                  kernel_initializer=keras.initializers.GlorotUniform(seed=4)),
              batch_norm(), keras.layers.Flatten(),
              keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=5))]
    out = x
    for layer in layers:
        out = layer(out)
    model = keras.Model(x, out)
    sgd = optimizers.SGD(learning_rate=0.02)
    model.compile(optimizer=hvd.DistributedOptimizer(sgd) if hvd.size() > 1 else sgd, loss="mse")
    fit = dict(x=mine(images), y=mine(y), batch_size=FIT_BATCH // hvd.size(), shuffle=False,
               verbose=0)
    model.fit(epochs=1, **fit)
    path = hvd_tf.broadcast_object(os.path.join(tempfile.mkdtemp(), "model" + suffix)
                                   if hvd.rank() == 0 else None, 0)
    if hvd.rank() == 0:
        model.save(path)
        if suffix == "old.keras":
            with zipfile.ZipFile(path) as saved:
                files = {name: saved.read(name) for name in saved.namelist()}
            files["config.json"] = files["config.json"].replace(b'"Horovod>SyncBatchNormalization"',
                                                                b'"SyncBatchNormalization"')
            with zipfile.ZipFile(path, "w") as old:
                for name, data in files.items():
                    old.writestr(name, data)
    hvd_tf.allreduce(tf.constant(0.0), name="saved" + suffix)  # no rank loads before the save
    try:
        if hvd.size() == 1:
            model = keras.models.load_model(path)
            if not KERAS3:  # its config keeps no fused=False, and build() chose the kernel
                model.layers[2].fused = False
        else:  # tf-keras: the saved optimizer is its legacy one (Horovod's Keras 2 path)
            model = hvd.load_model(path, **({} if KERAS3 else {"legacy_opts": True}))
        model.fit(epochs=1, **fit)
    finally:
        hvd_tf.allreduce(tf.constant(0.0), name="loaded" + suffix)  # every rank has read it
        if hvd.rank() == 0:
            shutil.rmtree(os.path.dirname(path))
    return {"weights": [w.ravel().tolist() for w in model.get_weights()],
            "normalization": type(model.layers[2]).__module__ + "." +
                             type(model.layers[2]).__name__}


def refused_fused():
    """What fused=True gets: one line, as upstream (there is no fused kernel that syncs)."""
    try:
        hvd_tf.SyncBatchNormalization(fused=True)
    except ValueError as e:
        return str(e)
    return None


def or_error(case, *args):
    """case(*args)'s results, or the one line it failed with (at its model's making or loading,
    on every rank alike, before the next collective)."""
    try:
        return case(*args)
    except (ValueError, TypeError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def main():
    hvd.init()
    out = {"rank": hvd.rank(), "keras3": KERAS3, "fused_true": refused_fused()}
    out["layer"] = {name: layer_case(*case, seed=i)
                    for i, (name, case) in enumerate(LAYER_CASES.items())}
    out["fit"] = {kind: or_error(fit_case, kind) for kind in ("functional", "subclassed")}
    # Keras 3's own .h5 loader keeps no optimizer state: its model.fit fails in one process
    # ("Unknown variable"), and hvd.load_model refuses it in one line (docs/keras3.md)
    suffixes = (".keras", "old.keras") if KERAS3 else (".keras", "old.keras", ".h5")
    out["reload"] = {suffix: or_error(reload_case, suffix) for suffix in suffixes}
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
