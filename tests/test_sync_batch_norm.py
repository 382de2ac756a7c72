"""hvd.SyncBatchNormalization (Horovod patches 23, 27 and 28) on 2 ranks, on Keras 3 and on
tf-keras: each rank's share of a batch is normalized as keras.layers.BatchNormalization
normalizes the whole batch in one process, and the moving mean and variance of every rank are
that process's (tests/sync_bn_probe.py; the expected values are the one process's, a run of its
own). One 2-rank run and one 1-process run per Keras serve every test."""
import numpy as np
import pytest

from tests.test_keras3 import probe_on_two_ranks

# float32 sums in another order (each rank's, then the allreduce's)
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module", params=["3", "2"], ids=["Keras 3", "tf-keras"])
def runs(request):
    """(one process's results, {rank: its results}) of tests/sync_bn_probe.py."""
    choice = {"PTB_KERAS": request.param}
    one = probe_on_two_ranks("tests/sync_bn_probe.py", ranks=1, env=choice)[0]
    two = probe_on_two_ranks("tests/sync_bn_probe.py", env=choice)
    for out in (one, *two.values()):
        assert out["keras3"] == (request.param == "3"), out["keras3"]
    return one, two


def assert_like_one_process(runs, case, outputs_within=TOLERANCE):
    """Rank 0's outputs then rank 1's are the one process's on the whole batch, and each rank's
    moving mean and variance are its."""
    one, two = runs
    expected = one["layer"][case]
    outputs = np.concatenate([np.asarray(two[rank]["layer"][case]["out"]) for rank in (0, 1)])
    np.testing.assert_allclose(outputs, expected["out"], **outputs_within,
                               err_msg=f"{case}: outputs")
    for rank in (0, 1):
        for got, want, what in zip(two[rank]["layer"][case]["moving"], expected["moving"],
                                   ("moving mean", "moving variance")):
            np.testing.assert_allclose(got, want, **TOLERANCE,
                                       err_msg=f"{case}: rank {rank}'s {what}")


def test_a_4d_batch_on_two_ranks_is_batch_normalization_of_the_whole_batch(runs):
    """The convnet case the layer exists for: an (8, 4, 4, 3) batch split 4 and 4. On tf-keras
    patch 23 passed `fused` only to a BatchNormalization whose __init__ names it, and tf-keras's
    takes it through **kwargs: the layer chose its fused kernel, which never syncs, and each rank
    normalized by its own rows without a word. fused=True is refused, as upstream does."""
    assert_like_one_process(runs, "4d")
    for out in runs[1].values():
        assert out["layer"]["4d"]["fused"] in (None, False), out["layer"]["4d"]  # None: Keras 3
        assert out["fused_true"] == "SyncBatchNormalization does not support fused=True.", out


@pytest.mark.parametrize("case", ["2d", "3d", "5d"])
def test_input_of_2_3_and_5_dimensions(runs, case):
    """(8, 3), (8, 5, 3) and (8, 2, 2, 2, 3) batches split 4 and 4 (tf-keras fused the 5-D
    one too)."""
    assert_like_one_process(runs, case)


@pytest.mark.parametrize("case", ["4d_uneven", "3d_uneven", "masked_uneven"])
def test_ranks_with_unequal_rows(runs, case):
    """Rows split 6 and 2, 5 and 3, 3 and 5 (a batch's last, a dataset's remainder): the
    statistics are those of all the rows, each rank weighted by its count (upstream averaged
    the ranks' means alike, as though each held as many)."""
    assert_like_one_process(runs, case)


@pytest.mark.parametrize("case", ["masked", "masked_4d", "masking_layer", "masked_empty_rank"])
def test_a_mask_counts_its_unmasked_steps_alone_on_every_rank(runs, case):
    """A mask as BatchNormalization takes one, on a (8, 5, 3) sequence batch (rank 0's rows 19
    unmasked steps, rank 1's 4; or none) and on a (8, 4, 4, 3) batch: given in the call, or set
    by a Masking layer before it. Keras 3 hands a mask only to a call() that names `mask`, and
    a mask given did reach the statistics, but each rank's counted as much as the other's."""
    assert_like_one_process(runs, case)


@pytest.mark.parametrize("kind", ["functional", "subclassed"])
def test_model_fit_on_two_ranks_is_one_process_on_the_whole_batch(runs, kind):
    """model.fit with Horovod's optimizer, 2 epochs of 2 batches of 8 rows split 4 and 4, of a
    model of two branches, each normalized: a convnet's (4-D) and a masked sequence's (rank
    0's rows longer than rank 1's). Every weight, the moving statistics among them, ends where
    one process with Keras' BatchNormalization and the plain optimizer ends on the whole
    batches: the statistics' gradients go through the allreduce too. Two layers in one model
    had one name ('sync_batch_normalization'), which a functional model refuses."""
    one, two = runs
    for rank in (0, 1):
        got, want = two[rank]["fit"][kind], one["fit"][kind]
        assert isinstance(got, list), got  # not the error its model failed with
        assert [len(w) for w in got] == [len(w) for w in want], (rank, kind)
        for i, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_allclose(g, w, **TOLERANCE,
                                       err_msg=f"{kind}: rank {rank}'s weight {i}")


def test_a_saved_model_loads_back_horovods_layer_and_goes_on_in_sync(runs):
    """A convnet fitted an epoch on 2 ranks, saved by rank 0, loaded by hvd.load_model on both,
    fitted another: its weights, the moving statistics among them, are one process's with
    Keras' BatchNormalization saved and loaded alike. Before patch 36 tf-keras loaded its own
    SyncBatchNormalization of that name, which syncs only under a tf.distribute strategy (the
    ranks' moving means then 0.1 apart after the epoch, no warning), and Keras 3 failed to load
    the file. "old.keras": a file whose layer bears the bare class name, as saved before the
    class was registered; ".h5" on tf-keras (Keras 3's own .h5 loader keeps no optimizer
    state, so its fit fails in one process)."""
    one, two = runs
    assert sorted(two[0]["reload"]) == sorted(one["reload"]) == sorted(
        [".keras", "old.keras"] + ([] if one["keras3"] else [".h5"]))
    for suffix, want in one["reload"].items():
        assert isinstance(want, dict), want
        for rank in (0, 1):
            got = two[rank]["reload"][suffix]
            assert isinstance(got, dict), (rank, suffix, got)  # not the error it failed with
            assert got["normalization"] == (
                "horovod.tensorflow.sync_batch_norm.SyncBatchNormalization"), (rank, suffix, got)
            for i, (g, w) in enumerate(zip(got["weights"], want["weights"])):
                np.testing.assert_allclose(g, w, **TOLERANCE,
                                           err_msg=f"{suffix}: rank {rank}'s weight {i}")


def test_a_mean_large_beside_the_spread_keeps_its_variance(runs):
    """(64, 3) rows of mean 2000 and spread 1 to 3, split 32 and 32: the ranks' variance was
    E[x^2] - E[x]^2 of float32 sums, which kept too few digits (upstream's formula, and Keras
    3's own synchronized layer's); patch 40 sums in float64. Against one process's
    BatchNormalization, whose two passes lose none. The outputs within 2.5e-4: float32's step
    at 2000 is 1.2e-4, so the mean each side rounds to float32 may differ by a step (before
    the patch they were up to 0.12 off, on both Keras)."""
    assert_like_one_process(runs, "large_mean", outputs_within=dict(rtol=0, atol=2.5e-4))
