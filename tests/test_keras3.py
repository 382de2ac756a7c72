"""Horovod on Keras 3, TensorFlow's own tf.keras since 2.16, where upstream Horovod 0.28.1 fails at
its first call (horovod issue 4290): the patched build with real ranks under mpirun, each value
computed by hand (tests/keras3_probe.py)."""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from tests.helpers import IS_ROOT, REPO, script_env


def probe_on_two_ranks(script, ranks=2, env=None, timeout=300):
    """{rank: its results} of `script` run by `ranks` ranks, each writing its own file; a hang
    fails after `timeout` seconds."""
    with tempfile.TemporaryDirectory() as out:
        cmd = ["mpirun", *(["--allow-run-as-root"] if IS_ROOT else []), "--oversubscribe",
               "-bind-to", "none", "-np", str(ranks), sys.executable, script]
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                           env=script_env(dict(env or {}, PROBE_OUT=out)))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        results = [json.load(open(os.path.join(out, name))) for name in sorted(os.listdir(out))]
    return {result["rank"]: result for result in results}


def test_the_tape_the_broadcast_the_optimizer_and_the_elastic_state_on_two_ranks():
    """Patch 10. Rank r's gradient of each weight is r + 1: the shared weight's comes back as the
    mean, 1.5 on both ranks; a registered local source keeps its own, scaled by 1/size as
    Horovod does unless scale_local_gradients=False. Weights that start at 1 and 11 are rank 0's
    1 on both after the broadcast, in place or not, in the same keras.Variable objects."""
    ranks = probe_on_two_ranks("tests/keras3_probe.py")
    assert sorted(ranks) == [0, 1]
    for rank, out in ranks.items():
        assert out["keras"].startswith("3."), out
        assert out["tape"] == [1.5, (rank + 1) / 2], out
        assert out["tape_unscaled"] == [1.5, rank + 1], out
        assert out["broadcast"] == [1.0, True] and out["broadcast_inplace"] == [1.0, True], out
        # patch 11: averaged, then clipped by the optimizer itself (not each rank's alone), by
        # both wrappers and with fp16 compression; the class keeps the optimizer's name
        for wrapper in ("optimizer", "keras_optimizer", "fp16"):
            assert out[wrapper] == [0.94, 0.92, "SGD", 1], (wrapper, out)
        assert out["accumulated"] == [1.0, 0.7, 2], out  # backward_passes_per_step=2
        assert out["function"] == 0.7, out  # inside tf.function
        # patch 12: hvd.elastic's state syncs rank 0's weights and epoch, restores its save
        assert out["elastic"] == [1.0, 0, 1.0], out


@pytest.mark.parametrize("keras", ["3", "2"], ids=["Keras 3", "tf-keras"])
def test_model_fit_on_two_ranks_with_the_callbacks_is_one_process_on_the_whole_batch(keras):
    """Patches 10-13 in Keras 3's own model.fit: the wrapped optimizer and the broadcast, metric
    and learning-rate callbacks. Two ranks on half of each batch end with the weights and losses
    of one process on all of it; the learning rate halves each epoch as scheduled; ranks that
    start from other weights end equal, the broadcast having evened them."""
    choice = {"PTB_KERAS": keras}
    one = probe_on_two_ranks("tests/fit_probe.py", ranks=1, env=choice)[0]
    two = probe_on_two_ranks("tests/fit_probe.py", env=choice)
    for out in two.values():
        np.testing.assert_allclose(out["weights"], one["weights"], rtol=1e-5)
        np.testing.assert_allclose(out["loss"], one["loss"], rtol=1e-5)
        assert out["lr"] == one["lr"] == [float(np.float32(lr)) for lr in (0.1, 0.05, 0.025)]
    assert one["loss"][-1] < one["loss"][0] / 5  # it trained
    # ranks that start elsewhere: the broadcast comes before the first batch (patch 14; upstream
    # after it, whose update averaged gradients taken at rank 1's own start), so they train as
    # one process from the first update
    apart = probe_on_two_ranks("tests/fit_probe.py", env=dict(choice, SEED_BY_RANK="1"))
    for out in apart.values():
        np.testing.assert_allclose(out["weights"], one["weights"], rtol=1e-5)
        np.testing.assert_allclose(out["loss"], one["loss"], rtol=1e-5)


@pytest.mark.parametrize("keras", ["3", "2"], ids=["Keras 3", "tf-keras"])
def test_model_fit_resumed_by_rank_0_alone_with_adam_is_one_process_from_the_first_batch(
        tmp_path, keras):
    """Horovod's examples restore a checkpoint on rank 0 alone and let the broadcast callback
    even the ranks. With Adam, rank 1 would take its first update with fresh moments and a step
    count of 0: the callback builds the optimizer, so that rank 0's restored moments and count
    are broadcast with the weights before the first batch (patch 14)."""
    saved, choice = str(tmp_path / "ckpt"), {"PTB_KERAS": keras}
    first = probe_on_two_ranks("tests/fit_probe.py", ranks=1, env=dict(choice, SAVE=saved))[0]
    assert first["iterations"] == 4  # 64 rows, batches of 16
    one = probe_on_two_ranks("tests/fit_probe.py", ranks=1, env=dict(choice, RESUME=saved))[0]
    assert one["iterations"] == 4 + 3 * 4  # the restored count went on
    two = probe_on_two_ranks("tests/fit_probe.py",
                             env=dict(choice, RESUME=saved, SEED_BY_RANK="1"))
    for out in two.values():
        assert out["iterations"] == one["iterations"], out
        np.testing.assert_allclose(out["weights"], one["weights"], rtol=1e-5)
        np.testing.assert_allclose(out["loss"], one["loss"], rtol=1e-5)


@pytest.mark.parametrize("wrap", ["inner", "outer"])
def test_mixed_float16_skips_an_overflow_on_every_rank_together_with_one_loss_scale(wrap):
    """Keras' mixed_float16 through model.fit, the overflowing row rank 1's alone (tests/
    fp16_probe.py). inner: compile() wraps Horovod's optimizer in a LossScaleOptimizer, whose
    check of the gradients came before the average, each rank's own: rank 0 went into the
    allreduce, rank 1 skipped it, and the job hung (killed at 90 s; patch 16 makes the ranks
    agree). outer: Horovod's optimizer wraps a LossScaleOptimizer, which failed in from_config
    (patch 15) and checks the averaged gradients. Either way, both ranks skip the step one
    process skips on the whole batch, keep one scale (32768 halved at each of the 2 epochs'
    overflow), take the same updates, and run the same collectives (the one after fit pairs)."""
    one = probe_on_two_ranks("tests/fp16_probe.py", ranks=1, env={"WRAP": wrap})[0]
    two = probe_on_two_ranks("tests/fp16_probe.py", env={"WRAP": wrap}, timeout=180)
    assert one["scale"] == 32768 / 4 and one["iterations"] == 2 * 4 - 2, one
    for out in two.values():
        assert (out["wrapped"], out["horovods"]) == ("LossScaleOptimizer", wrap), out
        assert (out["scale"], out["iterations"], out["after"]) == (one["scale"],
                                                                   one["iterations"], 1.0), out
        # float16's rounding of a half batch against the whole one
        np.testing.assert_allclose(out["weights"], one["weights"], rtol=1e-3)
    assert two[0]["weights"] == two[1]["weights"]


def test_hvd_load_model_of_a_mixed_float16_model_goes_on_with_its_loss_scale(tmp_path):
    """Patches 25 and 15 together: a model compiled under mixed_float16 is saved with a
    LossScaleOptimizer around its SGD; hvd.load_model wraps that in Horovod's (as WRAP=outer
    above), whose loss scale (halved once in epoch 1) and step count must come back, and whose
    ranks must again skip epoch 2's overflow together: 2 ranks saved and loaded after epoch 1
    end where one process ends without a stop."""
    one = probe_on_two_ranks("tests/fp16_probe.py", ranks=1)[0]
    two = probe_on_two_ranks("tests/fp16_probe.py", env={"RELOAD": str(tmp_path / "m.keras")},
                             timeout=180)
    assert one["scale"] == 32768 / 4 and one["iterations"] == 2 * 4 - 2, one
    for out in two.values():
        assert (out["wrapped"], out["horovods"]) == ("LossScaleOptimizer", "outer"), out
        assert (out["scale"], out["iterations"], out["after"]) == (one["scale"],
                                                                   one["iterations"], 1.0), out
        np.testing.assert_allclose(out["weights"], one["weights"], rtol=1e-3)
    assert two[0]["weights"] == two[1]["weights"]


@pytest.fixture(scope="module")
def calls(tmp_path_factory):
    """tests/keras3_calls_probe.py on 2 ranks: {rank: its results}, and where rank 0 saved."""
    saved = str(tmp_path_factory.mktemp("saved") / "model.keras")
    return probe_on_two_ranks("tests/keras3_calls_probe.py", env={"SAVE_TO": saved}), saved


def test_apply_takes_the_variables_as_an_iterator(calls):
    """Patch 17: apply(grads, a generator) spent the generator before the update, which then
    updated nothing (the weight stayed 1)."""
    for out in calls[0].values():
        assert out["apply_iterator"] == [0.85], out


def test_a_process_set_reaches_the_allreduce_through_both_wrappers(calls):
    """process_set of horovod.tensorflow.keras's and horovod.tensorflow's DistributedOptimizer
    of a Keras 3 optimizer: each rank in a set of its own steps by its own gradient r + 1
    (0.9, 0.8); averaged over the global set both would be at 0.85."""
    for rank, out in calls[0].items():
        assert out["own_process_set"] == [round(1 - 0.1 * (rank + 1), 6)] * 2, out


def test_op_and_groups_reach_the_keras_wrapper_from_horovod_tensorflows(calls):
    """Patch 18: horovod.tensorflow.DistributedOptimizer(a Keras optimizer, op=hvd.Sum,
    groups=...) averaged anyway (1 - 0.1 * 1.5); now it sums (1 - 0.1 * 3)."""
    for out in calls[0].values():
        assert out["op_sum"] == [0.7], out


def test_passes_beside_keras_own_accumulation_are_refused_in_one_line(calls):
    """Patch 19: both accumulate; together they failed inside the step ('iterations' is a
    tensor under gradient_accumulation_steps)."""
    for out in calls[0].values():
        assert out["accumulation"].startswith(
            "hvd.DistributedOptimizer: backward_passes_per_step=2 and the optimizer's own "
            "gradient_accumulation_steps=2 both accumulate gradients over steps; give one of "
            "them"), out


def test_a_local_variable_in_an_elastic_job_and_the_partial_optimizer(calls):
    """Patch 20: under HOROVOD_ELASTIC the size is an int32 tensor, and a float gradient divided
    by it failed. The local weight keeps its own gradient over 2, (r + 1) / 2: 0.95 on rank 0,
    0.9 on rank 1; the shared one is averaged. horovod.keras's PartialDistributedOptimizer with
    a local layer gives the same on Keras 3 (its upstream test calls Keras 2's private
    _compute_gradients, which Keras 3 lacks)."""
    for rank, out in calls[0].items():
        assert out["elastic_local"] == [0.85, (0.95, 0.9)[rank]], out
        assert out["partial"] == [0.85, (0.95, 0.9)[rank]], out


def test_the_broadcast_callback_keeps_keras3_local_variables_local(calls):
    """Patch 21: local_variables of Keras 3 layers were refused ('All local variables must be of
    tf.Variable type'). Every weight starts at its rank's number; root rank 1's reach rank 0
    but for the local first layer's."""
    ranks = calls[0]
    assert ranks[0]["broadcast_local"] == [[0.0], [1.0]], ranks[0]
    assert ranks[1]["broadcast_local"] == [[1.0], [1.0]], ranks[1]


def test_the_warmups_momentum_correction_on_keras3_is_one_warning(calls):
    """Patch 22: Keras 3's optimizer reads its momentum when the train step is traced, so the
    correction cannot act; it was skipped without a word."""
    for out in calls[0].values():
        assert len(out["warmup"]) == 1 and out["warmup"][0].startswith(
            "LearningRateWarmupCallback: momentum_correction is not applied on Keras 3"), out
        assert out["warmup_off"] == [], out


def test_sync_batch_normalization_normalizes_by_every_ranks_rows(calls):
    """Patch 23: on Keras 3 it failed at construction ('Unrecognized keyword arguments passed to
    BatchNormalization: {'fused': False}'). Rank 0's rows 1 and 3, rank 1's 5 and 7, by the
    mean 4 and variance 5 of all four (epsilon 1e-3)."""
    expected = [round((x - 4) / np.sqrt(5 + 1e-3), 5) for x in (1, 3, 5, 7)]
    ranks = calls[0]
    assert ranks[0]["sync_bn"] + ranks[1]["sync_bn"] == pytest.approx(expected, abs=1e-5)


LOAD_WITHOUT_HOROVOD = """import sys
sys.modules["horovod"] = None  # Horovod cannot be imported here
import keras
model = keras.models.load_model(sys.argv[1])
optimizer = model.optimizer
print(type(optimizer).__name__, optimizer.momentum, round(float(optimizer.learning_rate), 6),
      int(optimizer.iterations))
"""


def test_a_model_saved_with_horovods_optimizer_loads_without_horovod(calls):
    """Patch 24: Keras 3 saves the optimizer by its class's module, which was horovod._keras:
    without Horovod the model did not load ('Could not locate class SGD'). Loaded: the SGD it
    wrapped, its momentum, learning rate and 2 steps."""
    ranks, saved = calls
    assert {out["saved_module"] for out in ranks.values()} == {"keras.src.optimizers.sgd"}
    r = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_HOROVOD, saved], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env=script_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["SGD", "0.5", "0.1", "2"], r.stdout


def test_hvd_load_model_gives_horovods_optimizer_with_the_saved_state(calls):
    """Patch 25: on Keras 3, hvd.load_model returned the model with the plain SGD it was saved
    with (Keras 3 looks the optimizer up by its class's name, not Horovod's lower-case ones), so
    each rank trained apart. Now its optimizer is Horovod's, with the 2 saved steps and the
    velocity: one step of rank r's gradient r + 1 moves both ranks by the mean, and a model.fit
    on each rank's own rows leaves them equal."""
    ranks = calls[0]
    for out in ranks.values():
        assert out["load_model"][:3] == [True, 2, True], out
    assert ranks[0]["load_model"][3] == ranks[1]["load_model"][3], ranks


def test_backward_passes_in_model_fit_are_keras_own_accumulation_on_the_whole_batch(calls):
    """backward_passes_per_step=2 with the passes averaged, in model.fit on 2 ranks of 2 rows a
    batch: the weight of one process on both ranks' 4 rows with Keras's
    gradient_accumulation_steps=2, after 4 batches (2 updates). Horovod counts every pass as a
    step (4 iterations), as its Keras 2 optimizer does; Keras counts the updates (2)."""
    for out in calls[0].values():
        assert out["passes_in_fit"] == [True, True, 4, 2], out


def test_an_embeddings_sparse_gradient_is_averaged_as_rows_or_dense(calls):
    """sparse_as_dense with real IndexedSlices on a Keras 3 optimizer: rank r's lookup of row r
    with gradient r + 1, averaged: row 0 at 1 - 0.1 * 1 / 2, row 1 at 1 - 0.1 * 2 / 2, the same
    as rows (allgathered) or dense (allreduced)."""
    for out in calls[0].values():
        assert out["sparse"] == out["sparse_as_dense"] == ["IndexedSlices", [0.95, 0.9]], out


def test_fp16_compression_rounds_what_float16_cannot_hold(calls):
    """Gradients 1 + 2^-12 and 3: compressed to float16 the mean is 2 (the 2^-12 lost), without
    compression 2 + 2^-13; a weight at 0 steps by it at learning rate 1."""
    for out in calls[0].values():
        assert out["fp16_compression"] == [-2.0, -(2 + 2.0 ** -13)], out


def test_an_elastic_reset_brings_back_adams_moments_and_step_count(calls):
    """hvd.elastic's KerasState over Horovod's Adam: a commit, one more step, a reset: the
    optimizer's variables (its step count and non-zero moments) are the committed ones, and the
    weight is where one step from the commit puts it on both ranks."""
    for out in calls[0].values():
        assert out["elastic_adam"] == [True, [0.900001], True], out
