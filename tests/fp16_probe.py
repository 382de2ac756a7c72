"""Run by test_keras3.py under mpirun: model.fit of a linear regression under the mixed_float16
policy with Horovod's optimizer, on the Keras PTB_KERAS selects (Keras 3; PTB_KERAS=2 tf-keras,
its legacy and its new optimizers), where one row of one batch overflows float16 in each epoch
(its rank alone sees it when 2 ranks split the batch). One process on the whole batch skips
that step and halves its loss scale; the ranks must do the same, together.

Cases: inner, compile() wraps Horovod's optimizer in a LossScaleOptimizer; outer, Horovod's
wraps a LossScaleOptimizer given to compile(); each with a functional and a subclassed model;
reload, rank 0 saves the model after epoch 1 and every rank goes on from hvd.load_model of it,
its loss scale and steps included; resume, the same but rank 0 alone loads it and the others
go on from a fresh model compiled as in inner (Horovod's resume pattern), the broadcast
callback bringing them rank 0's weights, loss scale and steps; resume_outer, the others' model
compiled as in outer; resume_outer_built, the same with their LossScaleOptimizer built first. Every model starts at 0, so all start alike. The one process
is plain Keras (no Horovod) on every rank, before the ranks train. Writes one JSON file per
rank ($PROBE_OUT): for each case the weights, the loss scale, the steps counted, which optimizer
is Horovod's, and after fit one more allreduce, which pairs with another rank's only if every
rank ran the same collectives in fit."""
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
from keras3_probe import KERAS3, Linear, keras_name, optimizer_modules, report  # noqa: E402 -- tests/

keras = tf.keras
BATCH, ROWS, OVERFLOW_BATCH = 8, 32, 2


def model_of(kind):
    """A linear regression of 3 features started at 0 (kernel and bias), built."""
    if kind == "subclassed":
        model = Linear()
        model(tf.zeros((1, 3)))
        return model
    x = keras.Input((3,))
    return keras.Model(x, keras.layers.Dense(1, kernel_initializer="zeros")(x))


def data(n, rank):
    """This rank's rows of each global batch of 8, the last row of batch 2 overflowing float16
    (max 65504) in the forward pass: with 2 ranks it is rank 1's alone. Small targets, a model
    started at 0: no gradient of an ordinary row comes near float16's limit at the default
    scale (32768), so the planted row's step is the only one skipped in each epoch."""
    rng = np.random.RandomState(0)
    x = rng.randn(ROWS, 3).astype("float32")
    y = 0.01 * (x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.3)
    x[OVERFLOW_BATCH * BATCH + BATCH - 1] = 1e6
    return (x.reshape(ROWS // BATCH, n, BATCH // n, 3)[:, rank].reshape(-1, 3),
            y.reshape(ROWS // BATCH, n, BATCH // n, 1)[:, rank].reshape(-1, 1))


def outcome(model, after):
    scaling = model.optimizer
    inner = getattr(scaling, "inner_optimizer", None)
    return {"wrapped": type(scaling).__name__,
            # Horovod's class: the LossScaleOptimizer itself, or the optimizer inside it
            "horovods": ("outer" if is_horovods(scaling) else
                         "inner" if is_horovods(inner) else None),
            "weights": [float(w) for w in np.concatenate([w.ravel()
                                                          for w in model.get_weights()])],
            "scale": float((scaling.dynamic_scale if KERAS3 else scaling.loss_scale).numpy()),
            "iterations": int(scaling.iterations.numpy()), "after": after}


def is_horovods(optimizer):
    return hasattr(optimizer, "_hvd_allreduce") or hasattr(optimizer, "_allreduce_grads")


def one_process(module):
    """Plain Keras on the whole batch: compile() wraps the SGD in a LossScaleOptimizer."""
    model = model_of("functional")
    model.compile(optimizer=module.SGD(learning_rate=0.05), loss="mse")
    model.fit(*data(1, 0), batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return outcome(model, None)


def compiled(kind, module, wrap):
    model = model_of(kind)
    sgd = module.SGD(learning_rate=0.05)
    if wrap == "outer":
        optimizer = hvd.DistributedOptimizer(keras.mixed_precision.LossScaleOptimizer(sgd))
    elif wrap == "outer_built":  # its LossScaleOptimizer built before Horovod's wraps it
        scaling = keras.mixed_precision.LossScaleOptimizer(sgd)
        scaling.build(model.trainable_variables)
        optimizer = hvd.DistributedOptimizer(scaling)
    else:
        optimizer = hvd.DistributedOptimizer(sgd)
    model.compile(optimizer=optimizer, loss="mse")
    return model


def ranks(kind, module, wrap, reload_to=None, load_on_every_rank=True, others_wrap=None):
    n, rank = hvd.size(), hvd.rank()
    model = compiled(kind, module, wrap)
    fit = dict(batch_size=BATCH // n, shuffle=False, verbose=0)
    broadcast = lambda: [hvd.callbacks.BroadcastGlobalVariablesCallback(0)]  # noqa: E731 one a fit
    if reload_to:  # epoch 1, saved by rank 0, loaded by all (or rank 0 alone), then epoch 2
        model.fit(*data(n, rank), epochs=1, callbacks=broadcast(), **fit)
        if rank == 0:
            model.save(reload_to)
        hvd.allreduce(tf.constant(0.0), name=f"saved_{kind}")  # no rank loads before the save
        if rank == 0 or load_on_every_rank:
            model = hvd.load_model(reload_to)
        else:
            model = compiled(kind, module, others_wrap or wrap)
        model.fit(*data(n, rank), epochs=1, callbacks=broadcast(), **fit)
    else:
        model.fit(*data(n, rank), epochs=2, callbacks=broadcast(), **fit)
    after = hvd.allreduce(tf.constant(float(rank)), op=hvd.Sum, name=f"after_{kind}_{wrap}")
    return outcome(model, float(after))


def cases():
    """{name: (model, optimizer module, wrap)}: on Keras 3 each model wrapped either way; on
    tf-keras each model and each wrapping once with each of its two kinds of optimizer."""
    modules = optimizer_modules()
    if KERAS3:
        module = modules["keras3"]
        return {f"{wrap}-{kind}": (kind, module, wrap)
                for wrap in ("inner", "outer") for kind in ("functional", "subclassed")}
    return {"inner-functional": ("functional", modules["legacy"], "inner"),
            "inner-subclassed": ("subclassed", modules["new"], "inner"),
            "outer-functional": ("functional", modules["new"], "outer"),
            "outer-subclassed": ("subclassed", modules["legacy"], "outer")}


def reload_cases():
    """hvd.load_model of a model saved after epoch 1, on Keras 3, each model (.keras files). Not
    on tf-keras: its .keras file keeps no LossScaleOptimizer's loss scale (keras.models.load_model
    itself starts it again at 32768), and hvd.load_model of its HDF5 file fails (docs/keras3.md)."""
    if not KERAS3:
        return {}
    return {f"{how}-{kind}": (kind, optimizer_modules()["keras3"], "keras", how)
            for how in ("reload", "resume", "resume_outer", "resume_outer_built")
            for kind in ("functional", "subclassed")}


def kept_state():
    """Keras 3: hvd.DistributedOptimizer of a LossScaleOptimizer built and set by hand (loss
    scale 8, step counter 7; its SGD's 2 steps and momentum 0.19 in every slot), and of one not
    built around an SGD built and set alone, and of a plain SGD built and set so (no loss
    scale): what the optimizers Horovod made hold, and which is Horovod's; and what one step of
    Horovod's AdamW with a variable excluded from its weight decay does."""
    model = model_of("functional")
    out = {}
    for case in ("built", "inner_built", "plain_built"):
        sgd = keras.optimizers.SGD(learning_rate=0.05, momentum=0.9)
        scaling = keras.mixed_precision.LossScaleOptimizer(sgd, initial_scale=256)
        if case == "built":
            scaling.build(model.trainable_variables)
            scaling.dynamic_scale.assign(8.0)
            scaling.step_counter.assign(7)
        else:
            sgd.build(model.trainable_variables)
        sgd.iterations.assign(2)
        for slot in sgd.momentums:
            slot.assign(tf.fill(slot.shape, 0.19))
        if case == "plain_built":
            made = hvd.DistributedOptimizer(sgd)
            out[case] = {"horovods": "outer" if is_horovods(made) else None,
                         "iterations": int(made.iterations.numpy()),
                         "momentums": [float(v) for slot in made.momentums
                                       for v in slot.numpy().ravel()]}
            continue
        made = hvd.DistributedOptimizer(scaling)
        inner = made.inner_optimizer
        out[case] = {"horovods": "inner" if is_horovods(inner) else None,
                     "built": made.built,
                     "scale": float(made.dynamic_scale.numpy()) if made.built else None,
                     "step_counter": int(made.step_counter.numpy()) if made.built else None,
                     "iterations": int(inner.iterations.numpy()),
                     "momentums": [float(v) for slot in inner.momentums
                                   for v in slot.numpy().ravel()]}
    # AdamW with its bias left undecayed: one step of zero gradients decays the kernel alone
    adamw = keras.optimizers.AdamW(learning_rate=0.1, weight_decay=0.5)
    adamw.exclude_from_weight_decay(var_names=["bias"])
    kernel = keras.Variable(np.ones(2), name="kernel")
    bias = keras.Variable(np.ones(1), name="bias")
    hvd.DistributedOptimizer(adamw).apply([tf.zeros(2), tf.zeros(1)], [kernel, bias])
    out["adamw_excluded"] = {"kernel": [float(v) for v in kernel.numpy()],
                             "bias": [float(v) for v in bias.numpy()]}
    return out


def main():
    hvd.init()
    keras.mixed_precision.set_global_policy("mixed_float16")
    out = {"rank": hvd.rank(), "keras": keras_name(),
           "one": {kind: one_process(module) for kind, module in optimizer_modules().items()}}
    for name, (kind, module, wrap) in cases().items():
        out[name] = ranks(kind, module, wrap)
    folder = hvd_tf.broadcast_object(tempfile.mkdtemp() if hvd.rank() == 0 else None, 0)
    for name, (kind, module, suffix, how) in reload_cases().items():
        out[name] = ranks(kind, module, "inner", reload_to=os.path.join(folder, f"{name}.{suffix}"),
                          load_on_every_rank=how == "reload",
                          others_wrap={"resume_outer": "outer",
                                       "resume_outer_built": "outer_built"}.get(how))
    if KERAS3:
        out["kept_state"] = kept_state()
    if hvd.rank() == 0:  # every rank has loaded (the allreduce after its fit paired)
        shutil.rmtree(folder)
    report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
