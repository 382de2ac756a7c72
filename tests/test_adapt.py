"""README "Adapt it to your model and data", followed literally: another model, defined outside
the trainers and named by the config's `model` key, trained by the distributed script on 2
ranks, on a corpus that is just a folder of three tokenized text files."""
import numpy as np

from tests.helpers import TINY, checkpoint_weights, events, mpirun


def test_a_gru_from_examples_trains_with_two_ranks(corpus, tmp_path):
    out = tmp_path / "gru"
    r = mpirun((2, ["--config", TINY, "--data_path", corpus, "--output_dir", str(out),
                    "--set", "model='examples.gru_model:build'", "--set", "num_epochs=3",
                    "--set", "keep_prob=0.8", "--log_every", "10"]))
    assert r.returncode == 0, r.stdout + r.stderr
    epochs = events(out, "epoch")
    assert [e["world_size"] for e in epochs] == [2, 2, 2]
    # it learns the corpus
    assert epochs[-1]["valid_ppl"] < 0.5 * epochs[0]["train_ppl"], [
        (e["train_ppl"], e["valid_ppl"]) for e in epochs]
    names = list(checkpoint_weights(out))
    assert any("gru" in n for n in names) and not any("lstm" in n for n in names), names
    assert np.isfinite(events(out, "test")[0]["test_ppl"])


def test_a_model_that_cannot_be_loaded_is_one_line(corpus, tmp_path):
    from tests.helpers import run_script
    r = run_script(["lm_ptb.py", "--config", TINY, "--data_path", corpus,
                    "--output_dir", str(tmp_path / "x"), "--set", "model='tests.nothing:build'"])
    assert r.returncode == 2 and r.stderr.strip().startswith("error: model 'tests.nothing:build'")
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_keras3_transformer_trains_with_two_ranks_as_one_process(ptb_path, tmp_path):
    """A model from Keras 3's own layers (examples/transformer_model.py: MultiHeadAttention with a
    causal mask) through the unchanged trainers: 2 ranks give one process's losses and weights,
    and evaluate.py scores its checkpoint as the run's own test did."""
    from tests.helpers import run_script
    from tests.test_distributed import EQUIV_SET
    common = ["--config", TINY, "--data_path", ptb_path, *EQUIV_SET,
              "--set", "model='examples.transformer_model:build'"]
    single, dist = tmp_path / "single", tmp_path / "dist"
    r = run_script(["lm_ptb.py", *common, "--output_dir", str(single)], timeout=240)
    assert r.returncode == 0, r.stderr
    r = mpirun((2, [*common, "--output_dir", str(dist)]))
    assert r.returncode == 0, r.stdout + r.stderr
    one, two = (np.array([e["loss"] for e in events(run, "progress")]) for run in (single, dist))
    assert len(one) == len(two) == 60
    assert one[-1] < 0.9 * one[0]  # it trained
    assert (np.abs(one - two) / one).max() < 1e-4
    a, b = checkpoint_weights(single), checkpoint_weights(dist)
    assert a.keys() == b.keys() and any("attention" in n for n in a), list(a)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5, err_msg=name)
    r = run_script(["evaluate.py", "perplexity", "--run", str(dist), "--split", "test",
                    "--eval_steps", "5"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"test ppl {events(dist, 'test')[0]['test_ppl']:.2f} "), r.stdout
