"""Horovod on Keras 3, TensorFlow's own tf.keras since 2.16, where upstream Horovod 0.28.1 fails at
its first call (horovod issue 4290), and on tf-keras (PTB_KERAS=2), the patched build with real
ranks under mpirun: each probe (tests/keras3_probe.py, keras3_calls_probe.py, fit_probe.py,
fp16_probe.py) is launched once on each Keras and checks many calls; each value is computed by
hand or by one process of plain Keras (docs/keras3.md's matrix names the tests)."""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

from tests.helpers import IS_ROOT, REPO, finish, horovodrun, list_hosts, run_job, script_env


def probe_on_two_ranks(script, ranks=2, env=None, timeout=300):
    """{rank: its results} of `script` run by `ranks` ranks, each writing its own file; a hang
    fails after `timeout` seconds, with every rank killed (tests/helpers.py run_job)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = ["mpirun", *(["--allow-run-as-root"] if IS_ROOT else []), "--oversubscribe",
               "-bind-to", "none", "-np", str(ranks), sys.executable,
               *([script] if isinstance(script, str) else script)]
        r = run_job(cmd, timeout, cwd=REPO, env=script_env(dict(env or {}, PROBE_OUT=out)))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        results = [json.load(open(os.path.join(out, name))) for name in sorted(os.listdir(out))]
    return {result["rank"]: result for result in results}


HANGS = """import os, signal, sys, time
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
    os.kill(os.getpid(), signal.SIGSTOP)  # a stopped rank (a debugger, a frozen host)
time.sleep(600)  # and one that waits for it
"""


def test_a_probe_that_hangs_is_killed_with_every_rank_at_its_timeout(tmp_path):
    """A timeout ends the whole job: subprocess.run's killed mpirun alone, and its ranks, each
    in a process group of its own, went on running (a stopped one for ever). Rank 1 stops
    itself, rank 0 sleeps; neither is left once the timeout has been raised."""
    pids = tmp_path / "pids"
    pids.mkdir()
    (tmp_path / "hangs.py").write_text(HANGS)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        probe_on_two_ranks([str(tmp_path / "hangs.py"), str(pids)], timeout=10)
    assert time.monotonic() - started < 40
    ranks = [int(pid) for pid in os.listdir(pids)]
    assert len(ranks) == 2, ranks  # both had started
    assert not [pid for pid in ranks if alive(pid)], ranks


def alive(pid):
    """A process that runs (or is stopped), not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


KERAS = pytest.mark.parametrize("keras", ["3", "2"], ids=["Keras 3", "tf-keras"])
CALLS = "keras3_calls_probe.py"


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    """probes(script, keras): {rank: its results} of tests/`script` on 2 ranks under that Keras
    ("3" or "2"), launched once for all the tests that read it (a failed launch fails each of
    them with its output). keras3_calls_probe.py saves its models in a folder of its own,
    results["saved"]."""
    launched = {}

    def run(script, keras):
        if (script, keras) not in launched:
            env = {"PTB_KERAS": keras}
            if script == CALLS:
                env["SAVE_TO"] = str(tmp_path_factory.mktemp("saved"))
            try:
                launched[script, keras] = dict(probe_on_two_ranks(
                    os.path.join("tests", script), env=env, timeout=600),
                    saved=env.get("SAVE_TO"))
            except (AssertionError, subprocess.TimeoutExpired) as e:
                launched[script, keras] = e
        if isinstance(launched[script, keras], Exception):
            raise launched[script, keras]
        return launched[script, keras]
    return run


@KERAS
def test_the_tape_the_broadcast_the_optimizer_and_the_elastic_state_on_two_ranks(probes, keras):
    """Patch 10. Rank r's gradient of each weight is r + 1: the shared weight's comes back as the
    mean, 1.5, on both ranks; a registered local source keeps its own, scaled by 1/size as
    Horovod does unless scale_local_gradients=False. Weights that start at 1 and 11 are rank 0's
    1 on both after the broadcast, in place or not, in the same variable objects. On tf-keras
    with both its kinds of optimizer, legacy and new."""
    ranks = probes("keras3_probe.py", keras)
    assert sorted(r for r in ranks if r != "saved") == [0, 1]
    for rank in (0, 1):
        out = ranks[rank]
        assert out["keras"].startswith("Keras 3.") if keras == "3" else out["keras"] == "tf-keras"
        assert out["keras3_variable"] == (keras == "3"), out
        assert out["tape"] == [1.5, (rank + 1) / 2], out
        assert out["tape_unscaled"] == [1.5, rank + 1], out
        assert out["broadcast"] == [1.0, True] and out["broadcast_inplace"] == [1.0, True], out
        kinds = ["keras3"] if keras == "3" else ["new", "legacy"]
        assert [k for k in out if k in ("keras3", "new", "legacy")] == kinds, out
        for kind in kinds:
            calls = out[kind]
            # patch 11: averaged, then clipped by the optimizer itself (not each rank's alone), by
            # both wrappers and with fp16 compression; the class keeps the optimizer's name
            for wrapper in ("optimizer", "keras_optimizer", "fp16"):
                assert calls[wrapper] == [0.94, 0.92, "SGD", 1], (kind, wrapper, calls)
            assert calls["accumulated"] == [1.0, 0.7, 2], calls  # backward_passes_per_step=2
            assert calls["function"] == 0.7, calls  # inside tf.function
            # patch 12: hvd.elastic's state syncs rank 0's weights (every kernel weight 1, rank
            # 1's 11) and epoch, restores what it saved after a change, of either model
            for model in ("functional", "subclassed"):
                assert calls["elastic"][model] == [[1.0], 0, [1.0]], (kind, model, calls)


@KERAS
def test_model_fit_on_two_ranks_with_the_callbacks_is_one_process_on_the_whole_batch(probes,
                                                                                   keras):
    """Patches 10-14 in model.fit: the wrapped optimizer and the broadcast, metric and
    learning-rate callbacks. Two ranks on half of each batch end with the weights and losses of
    one process of plain Keras on all of it, the learning rate halving each epoch as scheduled,
    with a Sequential model from the same weights, and with a functional and a subclassed one
    whose ranks start from weights of their own: the broadcast comes before the first batch
    (patch 14; upstream after it, whose update averaged gradients taken at rank 1's own start).
    On tf-keras with its legacy optimizers, and (the two models apart) its new ones."""
    ranks = probes("fit_probe.py", keras)
    cases = ["sequential", "functional-apart", "subclassed-apart"]
    if keras == "2":
        cases += ["functional-apart-new", "subclassed-apart-new"]
    for rank in (0, 1):
        for case in cases:
            out, one = ranks[rank][case]["ranks"], ranks[rank][case]["one"]
            np.testing.assert_allclose(out["weights"], one["weights"], rtol=1e-5, err_msg=case)
            np.testing.assert_allclose(out["loss"], one["loss"], rtol=1e-5, err_msg=case)
            rates = (0.1, 0.05, 0.025)
            assert out["lr"] == one["lr"] == [float(np.float32(lr)) for lr in rates], case
            assert out["iterations"] == one["iterations"] == 3 * 64 // 16, case
            assert one["loss"][-1] < one["loss"][0] / 5, case  # it trained


@KERAS
def test_model_fit_resumed_by_rank_0_alone_with_adam_is_one_process_from_the_first_batch(
        probes, keras):
    """Horovod's examples restore a checkpoint on rank 0 alone and let the broadcast callback
    even the ranks. With Adam, rank 1 would take its first update with fresh moments and a step
    count of 0: the callback builds the optimizer, so that rank 0's restored moments and count
    are broadcast with the weights before the first batch (patch 14). Rank 1 starts from
    weights of its own; a Sequential model and a subclassed one."""
    ranks = probes("fit_probe.py", keras)
    for rank in (0, 1):
        for case in ("adam-resumed-sequential", "adam-resumed-subclassed"):
            out, one = ranks[rank][case]["ranks"], ranks[rank][case]["one"]
            # the restored count went on: 4 batches of the saved epoch, 3 epochs of 4 more
            assert out["iterations"] == one["iterations"] == 4 + 3 * 4, case
            np.testing.assert_allclose(out["weights"], one["weights"], rtol=1e-5, err_msg=case)
            np.testing.assert_allclose(out["loss"], one["loss"], rtol=1e-5, err_msg=case)


# fp16_probe.py's rows: one overflows float16 in each of its 2 epochs, so the loss scale is
# halved twice from Keras's 32768; Keras 3 does not count a skipped step (8 batches, 6 steps),
# tf-keras's LossScaleOptimizer does (8)
FP16_SCALE = 32768 / 2 ** 2
FP16_STEPS = {"3": 2 * 4 - 2, "2": 2 * 4}


def fp16_agrees(ranks, case, keras, one, horovods):
    """Each rank's run of `case`: Horovod's optimizer where `horovods` says, the loss scale
    and step count of the two overflows skipped, one process's weights (within float16's
    rounding of a half batch against the whole), and the same collectives on every rank."""
    for rank in (0, 1):
        out = ranks[rank][case]
        assert out["horovods"] == horovods, (case, out)
        assert (out["scale"], out["iterations"], out["after"]) == (
            FP16_SCALE, FP16_STEPS[keras], 1.0), (case, out)
        np.testing.assert_allclose(out["weights"], one["weights"], rtol=1e-3, err_msg=case)
    assert ranks[0][case]["weights"] == ranks[1][case]["weights"], case


@KERAS
def test_mixed_float16_skips_an_overflow_on_every_rank_together_with_one_loss_scale(probes,
                                                                                  keras):
    """Keras' mixed_float16 through model.fit, the overflowing row rank 1's alone (tests/
    fp16_probe.py). inner: compile() wraps Horovod's optimizer in a LossScaleOptimizer, whose
    check of the gradients came before the average on Keras 3, each rank's own: rank 0 went into
    the allreduce, rank 1 skipped it, and the job hung (killed at 90 s; patch 16 makes the ranks
    agree). outer: hvd.DistributedOptimizer of a LossScaleOptimizer, which failed in from_config
    (patch 15, on tf-keras too); on tf-keras Horovod's wraps it and checks the averaged
    gradients, on Keras 3 it goes inside it, as compile() puts it (patch 41: ranks whose
    optimizers came by the two orders hung). Either way, with a functional
    and a subclassed model, both ranks skip the steps one process skips on the whole batch,
    keep one scale, take the same updates and run the same collectives (the one after fit
    pairs). On tf-keras each case with one of its two kinds of optimizer (fp16_probe.cases)."""
    ranks = probes("fp16_probe.py", keras)
    kinds = ["keras3"] if keras == "3" else ["new", "legacy"]
    for rank in (0, 1):
        for kind in kinds:  # one process, by hand: 2 overflows skipped
            one = ranks[rank]["one"][kind]
            assert (one["scale"], one["iterations"]) == (FP16_SCALE, FP16_STEPS[keras]), one
    one = ranks[0]["one"][kinds[0]]
    for wrap in ("inner", "outer"):
        for model in ("functional", "subclassed"):
            # Keras 3: Horovod's wrapper of a LossScaleOptimizer goes inside it (patch 41)
            fp16_agrees(ranks, f"{wrap}-{model}", keras, one, "inner" if keras == "3" else wrap)


def test_hvd_load_model_of_a_mixed_float16_model_goes_on_with_its_loss_scale(probes):
    """Patches 25 and 35 on Keras 3: a model compiled under mixed_float16 is saved with a
    LossScaleOptimizer around its SGD; hvd.load_model keeps it outside Horovod's wrapper of
    the SGD (as compile() puts it, inner above), with its loss scale (halved once in epoch 1)
    and step count, and the ranks must again skip epoch 2's overflow together: 2 ranks saved
    and loaded after epoch 1 end where one process ends without a stop, with a functional and
    a subclassed model. resume: rank 0 alone loads, rank 1 compiles a fresh model as inner
    does (Horovod's resume pattern); resume_outer: rank 1 compiles hvd.DistributedOptimizer
    of a LossScaleOptimizer, which patch 41 makes the same order. Wrapped the other way round,
    as before patch 35 (or with patch 35 alone, in resume_outer), rank 0 waited in one
    collective and rank 1 in another: the job hung. (Not on tf-keras, whose own
    files keep no loss scale: docs/keras3.md.)"""
    ranks = probes("fp16_probe.py", "3")
    for how in ("reload", "resume", "resume_outer", "resume_outer_built"):
        for model in ("functional", "subclassed"):
            fp16_agrees(ranks, f"{how}-{model}", "3", ranks[0]["one"]["keras3"], "inner")


def test_horovods_optimizer_of_a_built_optimizer_keeps_its_state(probes):
    """Patches 41, 43 and 44 on Keras 3: hvd.DistributedOptimizer of a LossScaleOptimizer goes
    inside it whether or not it was built (resume_outer_built above: a built one was wrapped the
    other way round and the job hung beside rank 0's hvd.load_model), and what was built keeps
    its values, set by hand before (tests/fp16_probe.py kept_state): a built one its loss scale
    8 (the optimizer made anew started at 256), step counter 7, the SGD's 2 steps and its
    momentum slots at 0.19 (4 numbers: a kernel of 3 and a bias); an SGD built alone inside one
    not built, its own 2 steps and slots (once made anew from its config: 0 and zeros); a plain
    SGD built alike (43) its own; and AdamW its exclusions from the weight decay (44)."""
    for rank in (0, 1):
        kept = probes("fp16_probe.py", "3")[rank]["kept_state"]
        for case, built, scale, counter in (("built", True, 8.0, 7),
                                            ("inner_built", False, None, None)):
            out = dict(kept[case])
            np.testing.assert_allclose(out.pop("momentums"), [0.19] * 4, rtol=1e-6, err_msg=case)
            assert out == {"horovods": "inner", "built": built, "scale": scale,
                           "step_counter": counter, "iterations": 2}, (case, out)
        # patch 43: a plain SGD built and set alike (the optimizer made from its config had
        # no momentum slots yet and counted from 0: a fit went on at step 0, with no word)
        out = dict(kept["plain_built"])
        np.testing.assert_allclose(out.pop("momentums"), [0.19] * 4, rtol=1e-6)
        assert out == {"horovods": "outer", "iterations": 2}, out
        # patch 44: AdamW (learning rate 0.1, weight decay 0.5) with its bias excluded from the
        # decay, one step of zero gradients (no update): the kernel 1 - 0.1 * 0.5, the bias kept
        # (made anew from its config, Horovod's AdamW decayed the bias too: 0.95)
        np.testing.assert_allclose(kept["adamw_excluded"]["kernel"], [0.95] * 2, rtol=1e-6)
        assert kept["adamw_excluded"]["bias"] == [1.0], kept["adamw_excluded"]


@KERAS
def test_horovods_resume_pattern_with_models_no_rank_fitted_ends_at_one_processs_weights(keras):
    """Patch 42: rank 0 hvd.load_model of a model saved by one process after an epoch of Adam,
    rank 1 a fresh model built by a call and compiled with Horovod's optimizer, neither fitted
    before (tests/resume_probe.py), then an epoch with BroadcastGlobalVariablesCallback(0). On
    Keras 3 the subclassed model's variables are named `linear/dense/kernel` where it was built
    and `dense/kernel` where it was loaded, its Adam's slots alike; the broadcasts, named after
    them, never paired and model.fit hung (the probe killed at its timeout). A functional and a
    subclassed model on each Keras end at the weights and step count of one process's 2 epochs
    on the whole batch, on both ranks."""
    ranks = probe_on_two_ranks(os.path.join("tests", "resume_probe.py"), env={"PTB_KERAS": keras},
                               timeout=240)
    for kind in ("functional", "subclassed"):
        one = ranks[0][f"one-{kind}"]
        assert one["iterations"] == 2 * 4, one  # 2 epochs of 4 batches, by hand
        for rank in (0, 1):
            out = ranks[rank][kind]
            assert out["iterations"] == one["iterations"], (kind, rank, out)
            np.testing.assert_allclose(out["weights"], one["weights"], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{kind}, rank {rank}")
    # plain variables (patch 42's rule, whatever made them): names that differ are paired by
    # place, names that agree by name in any order, and a different number of variables under
    # other names is refused on every rank (it hung: rank 0 waited for its second broadcast)
    assert ranks[0]["plain"]["other_count"] == ranks[1]["plain"]["other_count"]
    assert ("ranks have different variables, by other names and in other numbers "
            "(rank 0: 2, rank 1: 1)") in ranks[0]["plain"]["other_count"], ranks[0]["plain"]
    # (each list of the same shapes: Horovod's traced function, reused, fixed the first list's
    # names, and rank 1's b took rank 0's a)
    for rank in (0, 1):
        a, b = ("a", "b") if rank == 0 else (f"c{rank}", f"d{rank}")
        assert ranks[rank]["plain"]["other_names"] == {a: [1.0] * 2, b: [2.0] * 2}, ranks[rank]
        for case in ("same", "other_order"):
            assert ranks[rank]["plain"][case] == {"a": [1.0] * 2, "b": [2.0] * 2}, ranks[rank]


def test_apply_takes_the_variables_as_an_iterator(probes):
    """Patch 17 (Keras 3's apply(); Keras 2's optimizers have none): apply(grads, a generator)
    spent the generator before the update, which then updated nothing (the weight stayed 1)."""
    for rank in (0, 1):
        assert probes(CALLS, "3")[rank]["apply_iterator"] == [0.85]


@KERAS
def test_a_process_set_reaches_the_allreduce_through_both_wrappers(probes, keras):
    """process_set of horovod.tensorflow.keras's and horovod.tensorflow's DistributedOptimizer:
    each rank in a set of its own steps by its own gradient r + 1 (0.9, 0.8); averaged over the
    global set both would be at 0.85."""
    for rank in (0, 1):
        out = probes(CALLS, keras)[rank]
        assert out["own_process_set"] == [round(1 - 0.1 * (rank + 1), 6)] * 2, out


@KERAS
def test_op_and_groups_reach_the_keras_wrapper_from_horovod_tensorflows(probes, keras):
    """Patches 18 and 29: horovod.tensorflow.DistributedOptimizer(a Keras optimizer, op=hvd.Sum,
    groups=...) averaged anyway and dropped the groups: now each weight of the subclassed model
    (kernels from 1, biases from 0) steps by the sum of the ranks' gradients 1 and 2, 0.1 * 3,
    not their mean; and its allreduces are Horovod's grouped ones, one for the group of the two
    kernels and one for each bias, which is in no group (Horovod's rule): 3, and no plain one
    (with the groups dropped: 4 plain ones). The model's weights share names on Keras 3, which
    groups matched by name left the first layer's weights without a gradient, unmoved."""
    for rank in (0, 1):
        weights, ops = probes(CALLS, keras)[rank]["op_and_groups"]
        # hidden kernel (1x2), hidden bias (2), output kernel (2x1), output bias (1)
        assert weights == [0.7, 0.7, -0.3, -0.3, 0.7, 0.7, -0.3], weights
        assert ops == {"HorovodAllreduce": 0, "HorovodGroupedAllreduce": 3}, ops


def test_passes_beside_keras_own_accumulation_are_refused_in_one_line(probes):
    """Patch 19: both accumulate; together they failed inside the step ('iterations' is a
    tensor under gradient_accumulation_steps). Keras 3's alone: tf-keras has no
    gradient_accumulation_steps."""
    for rank in (0, 1):
        assert probes(CALLS, "3")[rank]["accumulation"].startswith(
            "hvd.DistributedOptimizer: backward_passes_per_step=2 and the optimizer's own "
            "gradient_accumulation_steps=2 both accumulate gradients over steps; give one of "
            "them")


def test_a_local_variable_in_an_elastic_job(probes):
    """Patch 20, on Keras 3: under HOROVOD_ELASTIC the size is an int32 tensor, and a float
    gradient divided by it failed. The local weight keeps its own gradient over 2, (r + 1) / 2:
    0.95 on rank 0, 0.9 on rank 1; the shared one is averaged."""
    for rank in (0, 1):
        assert probes(CALLS, "3")[rank]["elastic_local"] == [0.85, (0.95, 0.9)[rank]]


@KERAS
def test_the_partial_distributed_optimizer_keeps_a_local_layers_gradient(probes, keras):
    """horovod.keras's PartialDistributedOptimizer with a local layer: the shared weight is
    averaged (0.85), the local one keeps its rank's gradient over 2 (its upstream test calls
    Keras 2's private _compute_gradients, which Keras 3 lacks)."""
    for rank in (0, 1):
        assert probes(CALLS, keras)[rank]["partial"] == [0.85, (0.95, 0.9)[rank]]


def test_the_broadcast_callback_keeps_keras3_local_variables_local(probes):
    """Patch 21: local_variables of Keras 3 layers were refused ('All local variables must be of
    tf.Variable type'). Every weight starts at its rank's number; root rank 1's reach rank 0
    but for the local first layer's."""
    ranks = probes(CALLS, "3")
    assert ranks[0]["broadcast_local"] == [[0.0], [1.0]], ranks[0]
    assert ranks[1]["broadcast_local"] == [[1.0], [1.0]], ranks[1]


def test_the_warmups_momentum_correction_on_keras3_is_one_warning(probes):
    """Patch 22: Keras 3's optimizer reads its momentum when the train step is traced, so the
    correction cannot act; it was skipped without a word."""
    for rank in (0, 1):
        out = probes(CALLS, "3")[rank]
        assert len(out["warmup"]) == 1 and out["warmup"][0].startswith(
            "LearningRateWarmupCallback: momentum_correction is not applied on Keras 3"), out
        assert out["warmup_off"] == [], out


def test_sync_batch_normalization_normalizes_by_every_ranks_rows(probes):
    """Patch 23: on Keras 3 it failed at construction ('Unrecognized keyword arguments passed to
    BatchNormalization: {'fused': False}'). Rank 0's rows 1 and 3, rank 1's 5 and 7, by the
    mean 4 and variance 5 of all four (epsilon 1e-3)."""
    expected = [round((x - 4) / np.sqrt(5 + 1e-3), 5) for x in (1, 3, 5, 7)]
    ranks = probes(CALLS, "3")
    assert ranks[0]["sync_bn"] + ranks[1]["sync_bn"] == pytest.approx(expected, abs=1e-5)


LOAD_WITHOUT_HOROVOD = """import sys
sys.modules["horovod"] = None  # Horovod cannot be imported here
import keras
model = keras.models.load_model(sys.argv[1])
optimizer = model.optimizer
print(type(optimizer).__name__, optimizer.momentum, round(float(optimizer.learning_rate), 6),
      int(optimizer.iterations))
"""


def test_a_model_saved_with_horovods_optimizer_loads_without_horovod(probes):
    """Patch 24: Keras 3 saves the optimizer by its class's module, which was horovod._keras:
    without Horovod the model did not load ('Could not locate class SGD'). Loaded: the SGD it
    wrapped, its momentum, learning rate and 2 steps."""
    ranks = probes(CALLS, "3")
    assert {module for rank in (0, 1) for module in ranks[rank]["saved_module"].values()} == {
        "keras.src.optimizers.sgd"}
    saved = os.path.join(ranks["saved"], "sequential-keras3.keras")
    r = run_job([sys.executable, "-c", LOAD_WITHOUT_HOROVOD, saved], 120, cwd=REPO,
                env=script_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["SGD", "0.5", "0.1", "2"], r.stdout


@KERAS
def test_hvd_load_model_gives_horovods_optimizer_with_the_saved_state(probes, keras):
    """Patch 25: hvd.load_model returned the model with the plain SGD it was saved with (Keras 3,
    and tf-keras's own .keras files, look the optimizer up by its class's name and module, not
    Horovod's lower-case ones), so each rank trained apart. Now its optimizer is Horovod's, with
    the saved state, by hand (keras3_calls_probe.save): 2 steps, each weight 0.38 and its
    velocity 0.18; one step of rank r's gradient r + 1 moves every weight by the mean, to
    0.38 + 0.5 * 0.18 - 0.1 * 1.5 = 0.32 (0.23 had the velocity been lost); a model.fit on each
    rank's own rows leaves them equal. Keras 3: a functional and a subclassed model (.keras
    files); tf-keras: both in .keras files with its new optimizers, the functional one in HDF5
    with either kind (legacy_opts=True for the legacy ones)."""
    ranks = probes(CALLS, keras)
    models = (["functional-keras3-keras", "subclassed-keras3-keras"] if keras == "3" else
              ["functional-new-keras", "subclassed-new-keras", "functional-new-h5",
               "functional-legacy-h5"])
    assert sorted(ranks[0]["load_model"]) == sorted(models)
    for model in models:
        for rank in (0, 1):
            horovods, steps, velocity, loaded, stepped, _ = ranks[rank]["load_model"][model]
            assert (horovods, steps) == (True, 2), (model, ranks[rank]["load_model"][model])
            assert velocity == [0.18] * 3 and loaded == [0.38] * 3, (model, velocity, loaded)
            assert stepped == [0.32] * 3, (model, stepped)
        assert ranks[0]["load_model"][model][5] == ranks[1]["load_model"][model][5], model


@KERAS
def test_backward_passes_in_model_fit_are_one_process_on_the_whole_batch(probes, keras):
    """backward_passes_per_step=2 with the passes averaged, in model.fit on 2 ranks of 2 rows a
    batch: the weight of one process taking each update on both ranks' 4 batches' 8 rows (on
    Keras 3 with Keras's gradient_accumulation_steps=2 on batches of 4, on tf-keras batches of
    8), after 4 batches (2 updates). Horovod counts every pass as a step (4 iterations), as its
    Keras 2 optimizer does; one process counts the updates (2)."""
    for rank in (0, 1):
        assert probes(CALLS, keras)[rank]["passes_in_fit"] == [True, True, 4, 2]


@KERAS
def test_an_embeddings_sparse_gradient_is_averaged_as_rows_or_dense(probes, keras):
    """sparse_as_dense with real IndexedSlices: rank r's lookup of row r with gradient r + 1,
    averaged: row 0 at 1 - 0.1 * 1 / 2, row 1 at 1 - 0.1 * 2 / 2, the same as rows (allgathered)
    or dense (allreduced)."""
    for rank in (0, 1):
        out = probes(CALLS, keras)[rank]
        assert out["sparse"] == out["sparse_as_dense"] == ["IndexedSlices", [0.95, 0.9]], out


@KERAS
def test_fp16_compression_rounds_what_float16_cannot_hold(probes, keras):
    """Gradients 1 + 2^-12 and 3: compressed to float16 the mean is 2 (the 2^-12 lost), without
    compression 2 + 2^-13; a weight at 0 steps by it at learning rate 1."""
    for rank in (0, 1):
        out = probes(CALLS, keras)[rank]
        assert out["fp16_compression"] == [-2.0, -(2 + 2.0 ** -13)], out


def adams_first_step(gradient, legacy, lr=0.1, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """A weight at 1 after Adam's first update by `gradient`, by hand: w - alpha * m / (sqrt(v)
    + epsilon), alpha = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) at step t = 1, m = (1 - beta_1)
    * g, v = (1 - beta_2) * g^2. Near lr * (1 - epsilon / (g sqrt(1 - beta_2))), but for the
    float32 the optimizer computes in: beta^t is float32's power of float32(beta) (0.999 is
    0.99900001287...), and 1 - beta is taken in Python's float64 by Keras 3's and tf-keras's new
    Adam, in float32 by tf-keras's legacy one (its ResourceApplyAdam kernel)."""
    f32 = lambda value: float(np.float32(value))  # noqa: E731
    power_1, power_2 = f32(beta_1), f32(beta_2)
    moment_1, moment_2 = (f32(beta_1), f32(beta_2)) if legacy else (beta_1, beta_2)
    alpha = lr * np.sqrt(1 - power_2) / (1 - power_1)
    m, v = (1 - moment_1) * gradient, (1 - moment_2) * gradient ** 2
    return 1 - alpha * m / (np.sqrt(v) + epsilon)


@KERAS
def test_an_elastic_reset_brings_back_adams_moments_and_step_count(probes, keras):
    """hvd.elastic's KerasState over Horovod's Adam: a commit, one more step, a reset: the
    optimizer's variables (its step count and non-zero moments) are the committed ones, and the
    weight is where Adam's first step from 1 by the averaged gradient 1.5 put it, by hand
    (0.9000009 on Keras 3: 0.1 less 2.1e-6 of it for epsilon and 6.4e-6 for float32's 0.999)."""
    kinds = {"keras3": False} if keras == "3" else {"new": False, "legacy": True}
    for rank in (0, 1):
        out = probes(CALLS, keras)[rank]["elastic_adam"]
        assert sorted(out) == sorted(kinds), out
        for kind, legacy in kinds.items():
            restored, weight, moments = out[kind]
            assert restored and moments, (kind, out[kind])
            # float32's spacing at 0.9 is 6e-8
            assert weight == pytest.approx(adams_first_step(1.5, legacy), abs=1e-7), (kind,
                                                                                      weight)
            assert abs(weight - 0.9) > 1e-7  # epsilon's and float32's share seen


@pytest.mark.parametrize("keras, model", [("3", "subclassed"), ("2", "functional")],
                         ids=["Keras 3 subclassed", "tf-keras functional"])
def test_hvd_elastic_run_restores_the_last_commit_when_a_worker_is_lost(tmp_path, keras, model):
    """hvd.elastic.run under horovodrun's elastic driver (tests/elastic_run_probe.py): 2 workers
    commit a KerasState every 2 steps; after step 3 one host's worker exits; the other's next
    allreduce fails, the state goes back to step 2's commit (patch 12: a Keras 3 optimizer's
    variables, restored and synced) and the survivor alone takes steps 3-6. By hand, SGD at
    0.1 with momentum 0.9 from 1: 2 steps by the mean gradient 1.5, then 4 by its own, 1; a
    restore that kept step 3's weights or lost the velocity ends elsewhere."""
    hosts = tmp_path / "hosts.txt"
    list_hosts(hosts, "localhost:1", "127.0.0.1:1")
    out = tmp_path / "out"
    out.mkdir()
    job = horovodrun(hosts, [], script=os.path.join("tests", "elastic_run_probe.py"),
                     env={"PTB_KERAS": keras, "MODEL": model, "PROBE_OUT": str(out)})
    returncode, output, _ = finish(job, timeout=300)
    assert returncode == 0, output[-3000:]
    assert os.listdir(out) == ["rank0.json"], output[-3000:]  # the survivor's alone
    result = json.load(open(out / "rank0.json"))
    weight, velocity = 1.0, 0.0
    for gradient in (1.5, 1.5, 1, 1, 1, 1):
        velocity = 0.9 * velocity - 0.1 * gradient
        weight += velocity
    assert result["weights"] == [pytest.approx(weight, abs=2e-6)], (weight, result)
    assert result["velocity"] == [pytest.approx(velocity, abs=2e-6)], (velocity, result)
    assert (result["iterations"], result["sizes"], result["resets"]) == (
        6, [2, 2, 1, 1, 1, 1], [1]), result
