"""Using a trained model without Horovod: perplexity, generation, SavedModel, TensorBoard."""
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import evaluate
from data import ptb
from tests.helpers import REPO, TINY, mpirun, patterned_sentences, write_corpus


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained by lm_ptb_distributed.py on 2 ranks; its corpus has <unk>."""
    root = tmp_path_factory.mktemp("use")
    train = [s if i % 7 else s.replace("today", "<unk>")
             for i, s in enumerate(patterned_sentences(2400, 0))]
    data = str(write_corpus(root / "data", train, patterned_sentences(200, 1),
                            patterned_sentences(200, 2)))
    run = str(root / "run")
    r = mpirun((2, ["--config", TINY, "--data_path", data, "--output_dir", run,
                    "--set", "num_epochs=2"]))
    assert r.returncode == 0, r.stdout + r.stderr
    return data, run


def test_perplexity_in_a_process_where_horovod_cannot_be_imported(trained):
    data, run = trained
    code = ("import runpy, sys; sys.modules['horovod'] = None; "  # any `import horovod` raises
            "sys.argv = ['evaluate.py'] + sys.argv[1:]; "
            "runpy.run_path('evaluate.py', run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code, "perplexity", "--run", run,
                        "--data_path", data], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    reported = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))][-1]
    assert reported["event"] == "test" and reported["world_size"] == 2
    assert r.stdout.strip() == f"test ppl {reported['test_ppl']:.2f}"


def test_generation_is_reproducible_and_handles_unknown_words(trained):
    data, run = trained
    corpus = ptb.load_corpus(data)
    model = evaluate.load_model(run, evaluate.run_config(run), len(corpus.vocab))
    first = evaluate.generate(model, corpus.vocab, "the cat", 25, 1.0, seed=1)
    assert first == evaluate.generate(model, corpus.vocab, "the cat", 25, 1.0, seed=1)
    assert first != evaluate.generate(model, corpus.vocab, "the cat", 25, 1.0, seed=2)
    assert first.startswith("the cat ") and len(first.split()) >= 20
    assert set(first.split()) <= set(corpus.vocab) - {"<eos>"}
    text = evaluate.generate(model, corpus.vocab, "the zebra", 5, 0.5, seed=0)
    assert text.startswith("the <unk> ")
    with pytest.raises(evaluate.ConfigError, match="temperature"):
        evaluate.generate(model, corpus.vocab, "the", 5, 0.0, seed=0)


def test_saved_model_runs_with_plain_tensorflow_and_no_repo(trained, tmp_path):
    data, run = trained
    export_dir = str(tmp_path / "export")
    r = subprocess.run([sys.executable, "evaluate.py", "export", "--run", run, "--data_path", data,
                        "--export_dir", export_dir], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    probe = ("import json, sys, tensorflow as tf\n"
             "assert not any('ptb' in p or p in ('', '.') for p in sys.path), sys.path\n"
             "m = tf.saved_model.load(sys.argv[1])\n"
             "out = m.signatures['serving_default'](words=tf.constant([['the', 'cat', 'sees']]))\n"
             "print(json.dumps({'p': out['probabilities'].numpy()[0].tolist(),\n"
             "                  'vocab': [w.decode() for w in out['vocabulary'].numpy()]}))\n")
    r = subprocess.run([sys.executable, "-I", "-c", probe, export_dir], cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=120,
                       env={"PATH": os.environ["PATH"], "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert r.returncode == 0, r.stderr
    loaded = json.loads(r.stdout.strip().splitlines()[-1])
    corpus = ptb.load_corpus(data)
    assert loaded["vocab"] == sorted(corpus.vocab, key=corpus.vocab.get)
    model = evaluate.load_model(run, evaluate.run_config(run), len(corpus.vocab))
    ids = tf.constant([[corpus.vocab[w] for w in ("the", "cat", "sees")]])
    logits, _ = model(ids, model.zero_state(1))
    expected = tf.nn.softmax(logits[0, -1]).numpy()
    np.testing.assert_allclose(loaded["p"], expected, rtol=1e-4, atol=1e-6)
    assert sum(loaded["p"]) == pytest.approx(1.0, abs=1e-4)


def test_tensorboard_summaries_on_rank0(trained):
    _, run = trained
    files = glob.glob(os.path.join(run, "tensorboard", "events.out.tfevents.*"))
    assert len(files) == 1  # rank 0 alone
    tags = {v.tag for f in files for e in tf.compat.v1.train.summary_iterator(f)
            for v in e.summary.value}
    assert {"train/perplexity", "train/lr", "train/words_per_sec", "valid/perplexity",
            "test/perplexity"} <= tags
