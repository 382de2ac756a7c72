"""What Horovod's optimizer and tape wrappers do with the gradients they do not simply average:
Keras' own gradient accumulation inside a LossScaleOptimizer (patch 19), and local gradients
where the job is elastic, whose size is an int32 tensor (patches 32-34). The probe
(tests/wrapper_probe.py) is one 2-rank launch per Keras; expected values are by hand."""
import pytest

from tests.test_keras3 import probe_on_two_ranks

KERAS = pytest.mark.parametrize("keras", ["3", "2"], ids=["Keras 3", "tf-keras"])


def once_per_keras(script, **env):
    """{keras: {rank: results}} of `script` on 2 ranks, each Keras launched once (when first
    asked for)."""
    runs = {}

    def run(keras):
        if keras not in runs:
            runs[keras] = probe_on_two_ranks(script, env=dict(env, PTB_KERAS=keras))
        return runs[keras]
    return run


@pytest.fixture(scope="module")
def wrapper():
    """tests/wrapper_probe.py."""
    return once_per_keras("tests/wrapper_probe.py")


def test_accumulation_inside_a_loss_scale_optimizer_is_refused(wrapper):
    """Patch 19 looks through a LossScaleOptimizer: backward_passes_per_step=2 around one whose
    SGD has gradient_accumulation_steps=2 passed the check and failed at its first counted pass
    ("AttributeError: ... 'assign_add'": iterations is a tensor under accumulation). Since
    patch 41 Horovod's wrapper goes around that SGD itself, inside the LossScaleOptimizer, and
    the check refuses it as the SGD's own."""
    for out in wrapper("3").values():
        assert out["accumulation"] == {"refused": (
            "hvd.DistributedOptimizer: backward_passes_per_step=2 and the optimizer's own "
            "gradient_accumulation_steps=2 both accumulate gradients over "
            "steps; give one of them (backward_passes_per_step sums the passes before the "
            "allreduce, so it also saves allreduces)")}, out


def by_hand(rank):
    """A local weight's value after one step (gradient r + 1 over 2 ranks, learning rate 0.1)."""
    return round(1 - 0.1 * (rank + 1) / 2, 6)


@KERAS
def test_an_elastic_tapes_local_source_is_scaled_by_the_size(wrapper, keras):
    """Patch 33: hvd.DistributedGradientTape with a local source under HOROVOD_ELASTIC=1 divided
    the float gradient by the int32 size tensor: "TypeError: `x` and `y` must have the same
    dtype, got tf.float32 != tf.int32". Eager, in a tf.function (where upstream's later fix,
    float() of the size, cannot run), and a local embedding's sparse rows."""
    for rank, out in wrapper(keras).items():
        assert out["tape"] == out["tape_function"] == [1.5, (rank + 1) / 2], out
        assert out["tape_sparse"] == ["IndexedSlices", (rank + 1) / 2], out


@KERAS
def test_an_elastic_optimizers_local_variable_is_scaled_by_the_size(wrapper, keras):
    """Patch 34 (tf-keras: Horovod's Keras 2 optimizer, the legacy SGD and the newer one; the
    same TypeError as above) and patch 20 (Keras 3): a local weight steps by its own gradient
    over the size, a shared one by the mean."""
    for rank, out in wrapper(keras).items():
        assert out["optimizer_local"] == [0.85, by_hand(rank)], out
        if keras == "2":
            assert out["optimizer_local_new"] == [0.85, by_hand(rank)], out


@KERAS
def test_backward_passes_with_an_elastic_local_variable(wrapper, keras):
    """Patch 32: backward_passes_per_step=2 sums the passes in Horovod's eager helper, which
    divided the local sum by the int32 size tensor (the same TypeError). The first pass
    updates nothing; the second applies the shared mean of the sums, 3 (1 - 0.3 = 0.7), and the
    local sum over the size, r + 1 (0.9, 0.8)."""
    for rank, out in wrapper(keras).items():
        assert out["passes_local"] == [1.0, 1.0, 0.7, round(1 - 0.1 * (rank + 1), 6)], out
