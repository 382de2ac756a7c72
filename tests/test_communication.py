"""Horovod communication options, each on real ranks under mpirun."""
import json

import numpy as np
import pytest

from tests.helpers import REPO, TINY, events, mpirun, run_script
from utils import config


def run(corpus, out, *sets):
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", str(out), "--log_every", "1",
            "--set", "num_epochs=1", "--set", "eval_steps=20"]
    for s in sets:
        args += ["--set", s]
    r = mpirun((2, args))
    assert r.returncode == 0, r.stdout + r.stderr
    return np.array([e["loss"] for e in events(out, "progress")])


def test_fp16_trains_like_the_default(corpus, tmp_path):
    """(sparse_as_dense against the default: in the test below, with clipping acting.)"""
    base = run(corpus, tmp_path / "base")
    fp16 = run(corpus, tmp_path / "fp16", "fp16_allreduce=True", "timeline=True")
    # float16 on the wire: close, not equal
    assert np.abs(fp16 - base).max() / base.max() < 2e-2
    assert not np.array_equal(fp16, base)
    timeline = open(tmp_path / "fp16" / "timeline.json").read()
    assert "ALLREDUCE" in timeline or "NEGOTIATE_ALLREDUCE" in timeline


def test_sparse_as_dense_clips_another_norm_but_by_too_little_to_matter(ptb_path, tmp_path):
    """The dense embedding gradient sums the rows of a word that occurs several times in the
    batch before the global norm is taken; the allgathered slices do not. So when clipping
    acts, the two clip different norms, but the embedding is a tiny part of the global norm
    here, and the losses agree to 1e-5 all the same."""
    import tensorflow as tf
    from data import ptb
    from utils import config
    from utils.model import build_model, sequence_loss
    corpus = ptb.load_corpus(ptb_path)
    x, y = (tf.constant(a[0]) for a in ptb.windows(corpus.train, 20, 10))
    tf.keras.utils.set_random_seed(1)
    model = build_model(config.load_config(TINY), len(corpus.vocab))
    with tf.GradientTape() as tape:
        loss = sequence_loss(model(x, model.zero_state(20), training=True)[0], y)
    embedding, *rest = tape.gradient(loss, model.trainable_variables)
    assert isinstance(embedding, tf.IndexedSlices)
    sparse_norm = float(tf.norm(embedding.values))
    dense_norm = float(tf.norm(tf.convert_to_tensor(embedding)))
    assert abs(dense_norm - sparse_norm) > 0.01 * sparse_norm  # repeated words: other norms
    assert float(tf.linalg.global_norm(rest)) > 100 * dense_norm  # but a tiny part of the whole

    clip = ("max_grad_norm=0.5", "steps_per_epoch=10")
    base = run(ptb_path, tmp_path / "base", *clip)
    dense = run(ptb_path, tmp_path / "dense", "sparse_as_dense=True", *clip)
    free = run(ptb_path, tmp_path / "free", "max_grad_norm=1e9", "steps_per_epoch=10")
    assert np.abs(free - base).max() / base.max() > 1e-3  # clipping acts at 0.5
    np.testing.assert_allclose(dense, base, rtol=1e-5)


def test_scale_lr_multiplies_by_the_workers(corpus, tmp_path):
    run(corpus, tmp_path / "scaled", "scale_lr=True", "steps_per_epoch=4")
    assert {e["lr"] for e in events(tmp_path / "scaled", "progress")} == {2.0}
    lines = [json.loads(l) for l in open(tmp_path / "scaled" / "metrics.jsonl")]
    assert lines[-1]["config"]["scale_lr"] is True


def test_param_averaging_every_step_equals_gradient_averaging(corpus, tmp_path):
    # With plain SGD, averaging the weights after every step gives
    # mean_r(w - lr * g_r) = w - lr * mean_r(g_r): the gradient-averaged update, as long as
    # clipping does not act (it clips each rank's gradient here, the mean in grad mode), so the
    # clipping norm is set out of reach.
    base = run(corpus, tmp_path / "grad", "max_grad_norm=1e9", "steps_per_epoch=30")
    param = run(corpus, tmp_path / "param", "max_grad_norm=1e9", "steps_per_epoch=30",
                "reduce_type='param'", "param_sync_steps=1")
    np.testing.assert_allclose(param, base, rtol=1e-4)


def test_param_sync_makes_ranks_equal_only_at_syncs(tmp_path):
    import sys
    from tests.helpers import IS_ROOT, run_job
    r = run_job(["mpirun", *(["--allow-run-as-root"] if IS_ROOT else []), "--oversubscribe",
                 "-np", "2", sys.executable, "-m", "tests.param_sync_probe", "3", "7",
                 str(tmp_path)], 180, cwd=REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    a, b = (json.loads((tmp_path / f"rank{rank}.json").read_text())["digests"] for rank in (0, 1))
    assert len(a) == len(b) == 7
    synced = [3, 6, 7]  # every 3 steps, and the epoch's last step
    for step in range(1, 8):
        assert (a[step - 1] == b[step - 1]) == (step in synced), step


def test_bad_reduce_type_is_refused():
    from utils import config
    with pytest.raises(config.ConfigError, match="reduce_type must be one of 'grad', 'param'"):
        config.load_config(TINY, ["reduce_type='params'"])


def test_two_passes_at_half_the_batch_equal_one_pass_at_the_full_batch(corpus, tmp_path):
    from tests.helpers import checkpoint_weights
    one = run(corpus, tmp_path / "one", "steps_per_epoch=30")
    two = run(corpus, tmp_path / "two", "steps_per_epoch=30", "backward_passes_per_step=2")
    np.testing.assert_allclose(two, one, rtol=1e-5)
    a, b = checkpoint_weights(tmp_path / "one"), checkpoint_weights(tmp_path / "two")
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_passes_that_do_not_divide_the_rows_are_refused(corpus, tmp_path):
    r = mpirun((2, ["--config", TINY, "--data_path", corpus, "--output_dir", str(tmp_path / "x"),
                    "--set", "backward_passes_per_step=3"]), timeout=120)
    assert r.returncode != 0
    assert "10 rows per worker (batch_size=20, 2 workers) do not split into " \
           "backward_passes_per_step=3 slices" in r.stderr


def test_parameter_averaging_refuses_saves_inside_an_epoch_in_one_line(corpus, tmp_path):
    """A save inside an epoch would hold rank 0's weights between two averagings: refused by
    the config, and by the elastic trainer, whose commits are such saves, before any rank
    starts Horovod."""
    with pytest.raises(config.ConfigError) as e:
        config.load_config(TINY, ["reduce_type='param'", "checkpoint_every=5"])
    assert str(e.value).startswith("reduce_type='param' cannot save inside an epoch "
                                   "(checkpoint_every=5; ")
    r = run_script(["lm_ptb_elastic.py", "--config", TINY, "--data_path", corpus,
                    "--output_dir", str(tmp_path / "run"), "--set", "reduce_type='param'"],
                   timeout=120)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: reduce_type='param' cannot save inside an epoch "
                               "(checkpoint_every=100; lm_ptb_elastic.py's commits"), r.stderr
    assert not (tmp_path / "run").exists()
