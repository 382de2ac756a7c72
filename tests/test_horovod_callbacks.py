"""Horovod's Keras callbacks in model.fit on 2 ranks (horovod/_keras/callbacks.py, patches 14, 21,
22 and 24): the broadcast, the metric average, the warm-up and the schedule, on Keras 3 and
tf-keras, a functional and a subclassed model whose ranks start from other weights
(tests/callbacks_probe.py, one launch per Keras that runs every case). Each expected value is
replayed here by hand (numpy), or comes from one process without Horovod."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from tests.callbacks_probe import BATCH, EPOCHS, LR, MODELS, MOMENTUM, STEPS, rows, start_weights
from tests.helpers import IS_ROOT, REPO, kill_job, script_env


def two_ranks(env, saved, timeout=420):
    """{rank: its results} of tests/callbacks_probe.py on 2 ranks, rank 0 saving into `saved`.
    A hang (ranks that disagree on a collective wait forever) fails at `timeout` with mpirun
    and every rank killed (helpers.kill_job: each rank is in a process group of its own)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = ["mpirun", *(["--allow-run-as-root"] if IS_ROOT else []), "--oversubscribe",
               "-bind-to", "none", "-np", "2", sys.executable, "tests/callbacks_probe.py"]
        env = script_env(dict(env, PROBE_OUT=out, SAVE_TO=str(saved)))
        with subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) as run:
            try:
                log, _ = run.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_job(run)
                log, _ = run.communicate()
                pytest.fail(f"hung: killed after {timeout} s\n" + log[-3000:])
        assert run.returncode == 0, log[-3000:]
        ranks = [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in (0, 1)]
    return {out["rank"]: out for out in ranks}


@pytest.fixture(scope="module", params=["3", "2"], ids=["Keras 3", "tf-keras"])
def probe(request, tmp_path_factory):
    """The probe's {rank: its results} on the Keras of the parameter, and its saved files."""
    saved = tmp_path_factory.mktemp("saved")
    return two_ranks({"PTB_KERAS": request.param}, saved), saved


@pytest.fixture
def ranks(probe):
    return probe[0]


def gradient(kernel, bias, x, y):
    """The mean squared error's gradient of x . kernel + bias on rows x, y."""
    d = 2 * (x @ kernel + bias - y) / len(x)
    return x.T @ d, d.sum(0)


def mse(kernel, bias, x, y):
    return float(np.mean((x @ kernel + bias - y) ** 2))


def learning_rates():
    """The learning rate of each batch: over epoch 0 the warm-up, by its formula for 2 ranks
    and 4 batches an epoch, LR / 2 * (1 + (b + 1) / 4) at batch b (0.0625 to 0.1); from epoch
    1 the schedule, LR halved each epoch."""
    warm_up = [LR / 2 * (1 + (b + 1) / STEPS) for b in range(STEPS)]
    return warm_up + [LR * 0.5 ** (e - 1) for e in range(1, EPOCHS) for _ in range(STEPS)]


def momenta(corrected):
    """The momentum of each step: 0.5; corrected (tf-keras's legacy optimizers, whose momentum is
    a variable), times new / old learning rate at each batch where a callback set it (every
    batch of the warm-up, each epoch's first after it), the compiled LR before the first."""
    if not corrected:
        return [MOMENTUM] * EPOCHS * STEPS
    out, old = [], LR
    for step, lr in enumerate(learning_rates()):
        set_here = step < STEPS or step % STEPS == 0
        out.append(MOMENTUM * lr / old if set_here else MOMENTUM)
        old = lr
    return out


def replay(broadcast_after_the_first_batch, corrected):
    """SGD with momentum by hand on the whole batches from rank 0's start: the final weights
    (kernel, bias) and each epoch's loss. Broadcast after the first batch, the first update is
    the mean of each rank's gradient at its own start on its half of the batch (and its loss
    the mean of theirs), applied to rank 0's start."""
    x, y = (a.astype(np.float64) for a in rows())
    kernel, bias = (a.astype(np.float64) for a in start_weights(0))
    velocity, losses = [0.0, 0.0], []
    for step, (lr, momentum) in enumerate(zip(learning_rates(), momenta(corrected))):
        batch = slice(step % STEPS * BATCH, (step % STEPS + 1) * BATCH)
        if step == 0 and broadcast_after_the_first_batch:
            half = BATCH // 2  # rank r's rows of the batch: its r-th half
            halves = [(*(a.astype(np.float64) for a in start_weights(r)),
                       x[batch][r * half:(r + 1) * half], y[batch][r * half:(r + 1) * half])
                      for r in (0, 1)]
            grads = np.mean([np.concatenate([g.ravel() for g in gradient(*half)])
                             for half in halves], axis=0)
            grads = grads[:3].reshape(3, 1), grads[3:]
            losses.append(np.mean([mse(*half) for half in halves]))
        else:
            grads = gradient(kernel, bias, x[batch], y[batch])
            losses.append(mse(kernel, bias, x[batch], y[batch]))
        velocity = [momentum * v - lr * g for v, g in zip(velocity, grads)]
        kernel, bias = kernel + velocity[0], bias + velocity[1]
    return (np.concatenate([kernel.ravel(), bias]),
            [np.mean(losses[e * STEPS:(e + 1) * STEPS]) for e in range(EPOCHS)])


def broadcast_after_the_first_batch(kind, keras3):
    """Where a model has no variables before its first batch on some rank: a subclassed one
    not called on a batch there; on Keras 3 also after model.build(input_shape), which builds
    none of its layers."""
    return kind in ("subclassed_on_rank_0", "subclassed_unbuilt") or (
        keras3 and kind == "subclassed_build_shape")


def broadcast_warnings(said):
    return [w for w in said if w.startswith("BroadcastGlobalVariablesCallback")]


@pytest.mark.parametrize("kind", MODELS)
def test_every_rank_agrees_where_to_broadcast_and_ends_where_sgd_by_hand_ends(ranks, kind):
    """Patch 14 let each rank decide alone whether its model was built: a subclassed model built
    on rank 0 alone (restored there, a fresh one elsewhere) made rank 0 broadcast before the
    first batch while rank 1 went on to its first gradient allreduce, and the job hung; on
    Keras 3, model.build(input_shape) marked a subclassed model built with no variables in its
    layers. The ranks now agree in one allgather. A layer the model's call never uses, or
    uses in training alone, is built on no rank before the first batch: the ranks compare the
    variables made (their count and size), not whether every layer is built, and broadcast
    what there is (patch 39: each warned and broadcast after the first batch, 0.04 from one
    process), and again after the first batch where it made more (the training layer's,
    1 on rank 0 and 2 on rank 1 before it). Where every rank's model has its variables,
    rank 0's weights reach the others before the first batch, and both ranks end where one
    process ends on the whole batches from rank 0's start. Else every rank says so in one
    warning that names the ranks, the broadcast comes after the first batch, and both end
    where the replay ends whose first update is the mean of each rank's gradient at its own
    start. All four callbacks are in each fit: the learning rate is the warm-up's, then the
    schedule's (by their formulas), the momentum corrected where it is a variable (tf-keras's
    legacy optimizers), and the loss of each epoch is the mean over both ranks' rows."""
    keras3 = ranks[0]["keras3"]
    after = broadcast_after_the_first_batch(kind, keras3)
    weights, losses = replay(after, corrected=not keras3)
    lrs = [float(np.float32(lr)) for lr in learning_rates()]
    for rank, out in ranks.items():
        case = out[kind]
        if kind == "subclassed_training_layer":  # its second layer: rank 0's 1s, never moved
            assert case["weights"][len(weights):] == [1.0] * 4, (rank, case["weights"])
        np.testing.assert_allclose(case["weights"][:len(weights)] if
                                   kind == "subclassed_training_layer" else case["weights"],
                                   weights, rtol=1e-5, err_msg=str(rank))
        np.testing.assert_allclose(case["loss"], losses, rtol=1e-5, err_msg=str(rank))
        np.testing.assert_allclose(case["lrs"], lrs, rtol=1e-7)
        said = broadcast_warnings(case["warnings"])
        if not after:
            assert said == [], said
            continue
        unbuilt = "1" if kind == "subclassed_on_rank_0" else "0, 1"
        assert len(said) == 1 and said[0].startswith(
            f"BroadcastGlobalVariablesCallback: the model of rank(s) {unbuilt} has no "
            "variables before the first batch, so rank 0's weights and optimizer state are "
            "broadcast after it"), said
    assert ranks[0][kind]["weights"] == ranks[1][kind]["weights"]


def test_the_warm_up_over_tf_keras_own_sgd_skips_the_momentum_correction_with_a_warning(ranks):
    """tf-keras's own optimizers (not legacy) hold the momentum as a Python number, read when
    the train step is traced: the warm-up's correction failed there at its first batch
    (AttributeError: 'float' object has no attribute 'dtype'). It is skipped, as on Keras 3,
    with one warning from each learning-rate callback: the weights are SGD's by hand without
    it."""
    if ranks[0]["keras3"]:
        pytest.skip("tf-keras's own optimizers; Keras 3's are the matrix above")
    weights, losses = replay(False, corrected=False)
    for out in ranks.values():
        case = out["functional_non_legacy_sgd"]
        np.testing.assert_allclose(case["weights"], weights, rtol=1e-5)
        np.testing.assert_allclose(case["loss"], losses, rtol=1e-5)
        assert [w.split(":")[0] for w in case["warnings"]] == [
            "LearningRateWarmupCallback", "LearningRateScheduleCallback"], case["warnings"]
        assert "momentum_correction is not applied" in case["warnings"][0]


def test_the_momentum_warning_is_given_under_mixed_float16(ranks):
    """Patch 22's warning read `momentum` from the model's optimizer, which under mixed_float16
    is a LossScaleOptimizer (compile() wraps one around Horovod's, or Horovod's wraps one) with
    no momentum: silent. It looks through both now: one warning either way."""
    for out in ranks.values():
        for wrap, case in out["mixed_float16"].items():  # tf-keras: inner alone (the probe)
            said = case["warnings"]
            assert len(said) == 1 and said[0].startswith(
                "LearningRateWarmupCallback: momentum_correction is not applied"), (wrap, said)


def test_a_model_loaded_without_horovods_optimizer_is_named_in_one_warning(ranks):
    """keras.models.load_model of a model saved with Horovod's optimizer gives the optimizer it
    wrapped (patch 24 on Keras 3; the wrapper's class name on Keras 2, as upstream): each rank
    then trains alone on its own rows, without a word, and the ranks end apart. The broadcast
    callback, which every Horovod model.fit takes, now says so in one warning and names the
    fix; hvd.load_model's Horovod optimizer keeps the ranks equal, without the warning."""
    for out in ranks.values():
        said = out["loaded"]["keras"]["warnings"]
        assert len(said) == 1 and said[0].startswith(
            "BroadcastGlobalVariablesCallback: the model's optimizer (SGD) is not Horovod's "
            "DistributedOptimizer, so after the broadcast each of the 2 ranks trains alone"), said
        assert "hvd.load_model" in said[0]
        assert out["loaded"]["hvd"]["warnings"] == []
    assert ranks[0]["loaded"]["keras"]["weights"] != ranks[1]["loaded"]["keras"]["weights"]
    assert ranks[0]["loaded"]["hvd"]["weights"] == ranks[1]["loaded"]["hvd"]["weights"]


def test_adam_restored_on_rank_0_alone_is_one_process_from_the_first_batch(ranks):
    """Patch 14 builds the optimizer before the first batch so that rank 0's restored Adam state
    is broadcast with its weights; tf-keras's own Adam (not legacy) takes its optimizer.build
    branch, which no test ran. A subclassed model, rank 0 restoring one epoch of one process
    while rank 1 starts elsewhere with a fresh Adam: two more epochs end where one process
    without Horovod, restored, ends on the whole batches, its step count 4 + 2 * 4."""
    for out in ranks.values():
        case = out["resume_adam"]
        one_weights, one_steps = case["one"]
        assert one_steps == case["iterations"] == STEPS * 3, case
        np.testing.assert_allclose(case["weights"], one_weights, rtol=1e-5)
        assert case["warnings"] == [], case


def test_horovod_keras_broadcast_callback_keeps_keras3_local_variables_local(ranks):
    """Patch 21's horovod/keras/callbacks.py half: horovod.keras's callback refused Keras 3
    variables as local_variables ('All local variables must be of tf.Variable type'). Every
    weight frozen at its rank's number; root rank 1's reach rank 0 but for the local first
    layer's. horovod.keras is the keras package's, Keras 3 whatever tf.keras is: tf-keras's
    model.fit cannot take its callbacks (they lack tf-keras's hooks), so this runs on Keras 3."""
    if not ranks[0]["keras3"]:
        pytest.skip("horovod.keras imports the keras package: Keras 3")
    assert ranks[0]["horovod_keras_local"] == [[0.0], [1.0]], ranks[0]
    assert ranks[1]["horovod_keras_local"] == [[1.0], [1.0]], ranks[1]


LOAD_WITHOUT_HOROVOD = """import sys
sys.modules["horovod"] = None  # Horovod cannot be imported here
import tf_keras
optimizer = tf_keras.models.load_model(sys.argv[1]).optimizer
print(type(optimizer).__module__, type(optimizer).__name__)
"""


def test_a_model_saved_with_horovods_optimizer_in_tf_keras_own_format_loads(probe):
    """tf-keras's own format (.keras, the one it recommends over .h5) records the optimizer's
    class module, which was Horovod's (horovod._keras): the model loaded neither without
    Horovod nor with it ('Could not locate class 'SGD''), not even by hvd.load_model. The
    wrapper takes the module of the optimizer it wraps (patch 24, as on Keras 3)."""
    ranks, saved = probe
    if ranks[0]["keras3"]:
        pytest.skip("tf-keras's format; Keras 3's: test_keras3.py")
    r = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_HOROVOD,
                        str(saved / "tf_keras_model.keras")], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=script_env({"TF_USE_LEGACY_KERAS": "1"}))
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["tf_keras.src.optimizers.legacy.gradient_descent", "SGD"]
