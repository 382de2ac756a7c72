"""Run by test_keras3.py under mpirun, each Keras in a process of its own: Horovod's resume
pattern as its docs give it, each model fitted by no rank before: rank 0 hvd.load_model of a
model one process saved after epoch 1 (Adam, so its slots and step count are rank 0's alone),
the other ranks a fresh model built by a call and compiled with hvd.DistributedOptimizer, then
epoch 2 with BroadcastGlobalVariablesCallback(0). A functional and a subclassed model, each of
its own input width, so that no broadcast traced for one serves the other (a trace made once
with names that agree would hide names that do not). Writes each rank's weights and step count
after epoch 2, and one process's after its own 2 epochs on the whole batch; and what
hvd.broadcast_variables does with plain variables whose names agree (in any order: by name),
differ between the ranks (paired by place), or differ in number too (refused on every rank)
($PROBE_OUT)."""
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import utils  # noqa: E402  first: the Keras PTB_KERAS selects
tf = utils.import_tensorflow()  # as the trainers start it, before Horovod imports it
import numpy as np  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
from keras3_probe import Linear, report  # noqa: E402 -- tests/

keras = tf.keras
BATCH, ROWS = 8, 32
WIDTH = {"functional": 3, "subclassed": 4}


def model_of(kind):
    x = tf.zeros((1, WIDTH[kind]))
    if kind == "subclassed":
        model = Linear()
        model(x)  # built by a call, as a fresh model is (its variables named in its scope)
        return model
    inputs = keras.Input((WIDTH[kind],))
    return keras.Model(inputs, keras.layers.Dense(1, kernel_initializer="zeros")(inputs))


def data(kind, n, rank):
    """This rank's rows of each global batch of 8."""
    rng = np.random.RandomState(WIDTH[kind])
    x = rng.randn(ROWS, WIDTH[kind]).astype("float32")
    y = (x @ rng.randn(WIDTH[kind], 1) + 0.3).astype("float32")
    return (x.reshape(ROWS // BATCH, n, BATCH // n, -1)[:, rank].reshape(-1, WIDTH[kind]),
            y.reshape(ROWS // BATCH, n, BATCH // n, 1)[:, rank].reshape(-1, 1))


def outcome(model):
    return {"weights": [float(w) for w in np.concatenate([w.ravel()
                                                          for w in model.get_weights()])],
            "iterations": int(model.optimizer.iterations.numpy())}


def one_process(kind, path):
    """Plain Keras on the whole batch: epoch 1, saved to `path`, then epoch 2."""
    model = model_of(kind)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.05), loss="mse")
    fit = dict(batch_size=BATCH, shuffle=False, verbose=0)
    model.fit(*data(kind, 1, 0), epochs=1, **fit)
    model.save(path)
    model.fit(*data(kind, 1, 0), epochs=1, **fit)
    return outcome(model)


def resumed(kind, path):
    n, rank = hvd.size(), hvd.rank()
    if rank == 0:
        model = hvd.load_model(path)
    else:
        model = model_of(kind)
        model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.05)),
                      loss="mse")
    model.fit(*data(kind, n, rank), batch_size=BATCH // n, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    return outcome(model)


def broadcast_plain_variables():
    """{case: this rank's values after the broadcast from rank 0, or the error's line}, in this
    order: every broadcast of two variables of shape (2,), so that each reuses the function
    Horovod traced for the first (a name fixed in that trace paired the next list by it)."""
    rank, out = hvd.rank(), {}
    cases = {  # rank 0's variables, then the other ranks': (name, value) each
        "same": ([("a", 1.0), ("b", 2.0)], [("a", 0.0), ("b", 0.0)]),
        "other_order": ([("a", 1.0), ("b", 2.0)], [("b", 0.0), ("a", 0.0)]),
        "other_names": ([("a", 1.0), ("b", 2.0)], [(f"c{rank}", 0.0), (f"d{rank}", 0.0)]),
        "other_count": ([("a", 1.0), ("b", 2.0)], [(f"c{rank}", 0.0)]),
    }
    for case, (root, others) in cases.items():
        made = [tf.Variable([value] * 2, name=f"{case}_{name}") for name, value in
                (root if rank == 0 else others)]
        try:
            hvd_tf.broadcast_variables(made, root_rank=0)
            out[case] = {v.name.split(":")[0][len(case) + 1:]: [float(x) for x in v.numpy()]
                         for v in made}
        except ValueError as e:
            out[case] = str(e)
    return out


def main():
    hvd.init()
    folder = hvd_tf.broadcast_object(tempfile.mkdtemp() if hvd.rank() == 0 else None, 0)
    out = {"rank": hvd.rank()}
    for kind in WIDTH:
        path = os.path.join(folder, f"{kind}.keras")
        if hvd.rank() == 0:
            out[f"one-{kind}"] = one_process(kind, path)
        hvd_tf.allreduce(tf.constant(0.0), name=f"saved_{kind}")  # no rank loads before the save
        out[kind] = resumed(kind, path)
    hvd_tf.allreduce(tf.constant(0.0), name="all_loaded")
    out["plain"] = broadcast_plain_variables()
    if hvd.rank() == 0:
        shutil.rmtree(folder)
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
