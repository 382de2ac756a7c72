"""Using a trained model without Horovod: perplexity, generation, SavedModel, TensorBoard."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import evaluate
from data import ptb
from tests.helpers import (REPO, TINY, edit_checkpoint_config, mpirun, patterned_sentences,
                           script_env, write_corpus)

NEWEST = "checkpoint ckpt-2, the end of epoch 2"  # what evaluate.py names for the trained run


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
    test_windows = len(ptb.windows(ptb.load_corpus(data).test, 1, 20)[0])
    assert r.stdout.strip() == (f"test ppl {reported['test_ppl']:.2f} | {test_windows * 20} "
                                "tokens scored in windows of 1 x 20 (the whole test set) | "
                                f"{NEWEST} | precision fp32 (the run's)")


def trained_model(run, vocab_size):
    checkpoint = evaluate.Checkpoint(run, evaluate.run_checkpoints(run)[0])
    return evaluate.load_model(run, checkpoint, checkpoint.cfg, vocab_size)


def evaluate_copy(trained, tmp_path, edit_config=None, data=None, extra=()):
    """evaluate.py perplexity on a copy of the trained run, the config saved in its newest
    checkpoint edited."""
    import shutil
    data_path, run = trained
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    if edit_config:
        edit_checkpoint_config(str(copy / "checkpoints" / "ckpt-2"), edit_config)
    return subprocess.run([sys.executable, "evaluate.py", "perplexity", "--run", str(copy),
                           "--data_path", data or data_path, *extra], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_perplexity_scores_the_whole_test_set_whatever_the_run_used(trained, tmp_path):
    data, run = trained
    reported = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))][-1]
    r = evaluate_copy(trained, tmp_path, {"eval_steps": 2})  # as after a smoke run
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"test ppl {reported['test_ppl']:.2f} | ")
    assert "(the whole test set)" in r.stdout
    r = evaluate_copy(trained, tmp_path / "few", extra=["--eval_steps", "3"])
    assert r.returncode == 0 and r.stdout.strip().endswith(
        f"| 60 tokens scored in windows of 1 x 20 | {NEWEST} | precision fp32 (the run's)"), \
        r.stdout
    # the valid set in the training layout: what the trainer logged for the last epoch
    last_valid = [e for e in map(json.loads, open(os.path.join(run, "metrics.jsonl")))
                  if e["event"] == "epoch"][-1]["valid_ppl"]
    r = evaluate_copy(trained, tmp_path / "valid", extra=["--split", "valid", "--batch_size",
                                                          "20", "--num_steps", "10"])
    assert r.returncode == 0 and r.stdout.startswith(f"valid ppl {last_valid:.2f} | "), r.stdout


def test_perplexity_says_its_precision_and_runs_either_on_the_same_checkpoint(trained,
                                                                               tmp_path):
    """The fp32 run's checkpoint scored in bf16 (--precision), and a checkpoint of bf16 training
    scored in bf16 by default: each says so; bf16 moves the perplexity by well under 1 %."""
    data, run = trained
    reported = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))][-1]
    results = {}
    for name, edit, extra in (("flag", None, ["--precision", "bf16"]),
                              ("logged", {"precision": "bf16"}, []),
                              ("back", {"precision": "bf16"}, ["--precision", "fp32"])):
        r = evaluate_copy(trained, tmp_path / name, edit, extra=extra)
        assert r.returncode == 0, r.stderr
        results[name] = r.stdout.strip()
    assert results["flag"].endswith(f"| {NEWEST} | precision bf16 (--precision; the run "
                                    "trained in fp32)"), results["flag"]
    assert results["logged"].endswith(f"| {NEWEST} | precision bf16 (the run's)")
    for name in ("flag", "logged"):
        assert float(results[name].split()[2]) == pytest.approx(reported["test_ppl"], rel=1e-2)
    assert results["back"].startswith(f"test ppl {reported['test_ppl']:.2f} | ")
    assert results["back"].endswith("| precision fp32 (--precision; the run trained in bf16)")
    # the same checkpoint in the two precisions, in this process: bf16 really ran
    corpus = ptb.load_corpus(data)
    scores = {}
    checkpoint = evaluate.Checkpoint(run, evaluate.run_checkpoints(run)[0])
    for precision in ("fp32", "bf16"):
        cfg = dict(checkpoint.cfg, precision=precision)
        model = evaluate.load_model(run, checkpoint, cfg, len(corpus.vocab))
        scores[precision] = evaluate.perplexity(model, corpus.test, 1, 20)[0]
    assert scores["fp32"] == pytest.approx(reported["test_ppl"], rel=1e-5)
    assert scores["bf16"] != scores["fp32"]
    assert scores["bf16"] == pytest.approx(scores["fp32"], rel=1e-2)


def test_perplexity_refuses_a_checkpoint_without_the_models_weights(trained, tmp_path):
    r = evaluate_copy(trained, tmp_path, {"num_layers": 3})  # a layer the checkpoint lacks
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "lacks weights of this model" in err and not r.stdout


@pytest.mark.parametrize("flags, message", [(["--batch_size", "0"], "--batch_size must be 1"),
                                            (["--num_steps", "-3"], "--num_steps must be 1"),
                                            (["--eval_steps", "0"], "--eval_steps must be 1")])
def test_perplexity_refuses_a_window_layout_of_nothing_in_one_line(trained, tmp_path, flags,
                                                                   message):
    r = evaluate_copy(trained, tmp_path, extra=flags)
    assert r.returncode == 2 and not r.stdout, r.stdout + r.stderr
    assert r.stderr.strip() == f"error: {message} or more, got {flags[1]}"


def test_generate_refuses_a_negative_length():
    with pytest.raises(evaluate.ConfigError, match="--length must be 0 or more, got -1"):
        evaluate.parse_args(["generate", "--run", "runs/x", "--length", "-1"])
    assert evaluate.parse_args(["generate", "--run", "runs/x", "--length", "0"]).length == 0


def test_the_run_keeps_its_vocabulary_and_evaluate_checks_it(trained, tmp_path):
    data, run = trained
    assert ptb.read_vocab(os.path.join(run, "vocab.txt")) == ptb.load_corpus(data).vocab
    other = str(write_corpus(tmp_path / "other", patterned_sentences(300, 5)[:-40],
                             patterned_sentences(50, 6), patterned_sentences(50, 7)))
    if ptb.load_corpus(other).vocab == ptb.load_corpus(data).vocab:  # <unk> only in `data`
        pytest.fail("the other corpus should have another vocabulary")
    r = evaluate_copy(trained, tmp_path, data=other)
    assert r.returncode == 2 and "gives another vocabulary than the run's" in r.stderr, r.stderr


def test_without_data_path_perplexity_finds_the_corpus_and_says_where_it_looked(trained,
                                                                              tmp_path):
    """The run records its corpus folder; moved away, PTB_DATA_PATH is next, then one line.
    generate and export need no corpus at all."""
    import shutil
    data, run = trained
    assert open(os.path.join(run, "data_path.txt")).read() == os.path.abspath(data) + "\n"
    copy, corpus = tmp_path / "run", tmp_path / "corpus"
    shutil.copytree(run, copy)
    shutil.copytree(data, corpus)
    (copy / "data_path.txt").write_text(f"{corpus}\n")
    env = {k: v for k, v in script_env().items() if k != "PTB_DATA_PATH"}

    def evaluate_cli(*args, **extra_env):
        return subprocess.run([sys.executable, "evaluate.py", *args, "--run", str(copy)],
                              cwd=REPO, env=dict(env, **extra_env), capture_output=True,
                              text=True, timeout=120)

    reported = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))][-1]
    r = evaluate_cli("perplexity")
    assert r.returncode == 0 and r.stdout.startswith(f"test ppl {reported['test_ppl']:.2f} | ")
    corpus.rename(tmp_path / "moved")
    for args in (["generate", "--length", "3"],
                 ["export", "--export_dir", str(tmp_path / "export")]):
        r = evaluate_cli(*args)
        assert r.returncode == 0 and r.stdout.strip(), r.stdout + r.stderr
    (tmp_path / "empty").mkdir()
    r = evaluate_cli("perplexity", PTB_DATA_PATH=str(tmp_path / "empty"))
    assert r.returncode == 2 and not r.stdout, r.stdout + r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: no PTB files in {corpus} (the run's data_path.txt), {tmp_path / 'empty'} "
        "(PTB_DATA_PATH); pass --data_path, the folder of ptb.train.txt, ptb.valid.txt, "
        "ptb.test.txt"]
    r = evaluate_cli("perplexity", PTB_DATA_PATH=str(tmp_path / "moved"))
    assert r.returncode == 0 and r.stdout.startswith(f"test ppl {reported['test_ppl']:.2f} | ")


def test_generation_is_reproducible_and_handles_unknown_words(trained):
    data, run = trained
    corpus = ptb.load_corpus(data)
    model = trained_model(run, len(corpus.vocab))
    first = evaluate.generate(model, corpus.vocab, "the cat", 25, 1.0, seed=1)
    assert first == evaluate.generate(model, corpus.vocab, "the cat", 25, 1.0, seed=1)
    assert first != evaluate.generate(model, corpus.vocab, "the cat", 25, 1.0, seed=2)
    assert first.startswith("the cat ") and len(first.split()) >= 20
    assert set(first.split()) <= set(corpus.vocab) - {"<eos>"}
    text = evaluate.generate(model, corpus.vocab, "the zebra", 5, 0.5, seed=0)
    assert text.startswith("the <unk> ")
    with pytest.raises(evaluate.ConfigError, match="temperature"):
        evaluate.generate(model, corpus.vocab, "the", 5, 0.0, seed=0)


def test_a_prompts_unknown_words_are_named_with_their_lower_case_forms():
    vocab = {"the": 0, "company": 1, "said": 2, "<unk>": 3, "<eos>": 4}
    assert evaluate.unknown_words_note(vocab, "the company said") is None
    assert evaluate.unknown_words_note(vocab, "The Company said zebra The") == (
        "note: not in the run's vocabulary, fed as <unk>: 'The', 'Company', 'zebra'; in lower "
        "case it has 'the', 'company'")
    assert evaluate.unknown_words_note(vocab, "zebra") == (
        "note: not in the run's vocabulary, fed as <unk>: 'zebra'")
    assert evaluate.unknown_words_note({"the": 0}, "zebra") is None  # generate's error instead


@pytest.mark.smoke
def test_saved_model_runs_with_plain_tensorflow_and_no_repo(trained, tmp_path):
    data, run = trained
    export_dir = str(tmp_path / "export")
    r = subprocess.run([sys.executable, "evaluate.py", "export", "--run", run, "--data_path", data,
                        "--export_dir", export_dir], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    probe = ("import json, sys, tensorflow as tf\n"
             "from importlib.util import find_spec\n"
             "assert not find_spec('utils') and not find_spec('lm_ptb'), sys.path  # no repo\n"
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
    model = trained_model(run, len(corpus.vocab))
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


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.smoke
def test_tensorboard_serves_the_runs_scalars(trained):
    """README's `tensorboard --logdir runs`, for real: the server of this venv on loopback, its
    scalar tags and one series read through its HTTP API, checked against metrics.jsonl."""
    import requests
    _, run = trained
    port = free_port()
    board = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "tensorboard"),
                              "--logdir", run, "--host", "127.0.0.1", "--port", str(port)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/data/plugin/scalars"
    try:
        deadline, tags = time.monotonic() + 90, None
        while tags is None:
            assert board.poll() is None, board.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "tensorboard did not serve within 90 s"
            try:
                tags = requests.get(f"{url}/tags", timeout=5).json()
            except requests.RequestException:
                time.sleep(0.5)
        assert set(tags["tensorboard"]) >= {"train/perplexity", "train/lr", "valid/perplexity",
                                            "test/perplexity", "epoch/time_s"}
        series = requests.get(f"{url}/scalars", params={"run": "tensorboard",
                                                         "tag": "valid/perplexity"}, timeout=10)
        logged = [e["valid_ppl"] for e in map(json.loads, open(os.path.join(run, "metrics.jsonl")))
                  if e["event"] == "epoch"]
        assert [value for _, _, value in series.json()] == pytest.approx(logged, rel=1e-6)
    finally:
        board.terminate()
        board.wait(timeout=30)


def test_perplexity_scores_the_newest_checkpoint_in_the_precision_it_was_trained_in(
        corpus, tmp_path):
    """A run whose precision changed at a resume (--change_config): evaluate.py takes bf16 from
    the checkpoint's own config, not fp32 from the run's first log line, and gives the run's
    own test perplexity. Stopped inside a later epoch, it names the step checkpoint it scores;
    a checkpoint from before checkpoints held their config is scored with the run's newest
    logged one."""
    import shutil
    from tests.helpers import pause_prefix, run_script, stop_at_pause
    run = str(tmp_path / "run")
    base = ["lm_ptb.py", "--config", TINY, "--data_path", corpus, "--output_dir", run,
            "--set", "steps_per_epoch=40", "--set", "eval_steps=5", "--set", "checkpoint_every=15"]
    assert run_script([*base, "--set", "num_epochs=1"]).returncode == 0
    r = run_script([*base, "--set", "num_epochs=2", "--set", "precision='bf16'", "--resume",
                    "--change_config"])
    assert r.returncode == 0, r.stderr

    def perplexity(run_dir):  # the timeout bounds a hang: one outgrew 120 s beside 2 busy loops
        r = subprocess.run([sys.executable, "evaluate.py", "perplexity", "--run", str(run_dir),
                            "--data_path", corpus, "--eval_steps", "5"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()
    test_ppl = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))][-1]
    assert test_ppl["event"] == "test" and test_ppl["config"]["precision"] == "bf16"
    assert json.loads(open(os.path.join(run, "metrics.jsonl")).readline())["config"][
        "precision"] == "fp32"
    out = perplexity(run)
    assert out.startswith(f"test ppl {test_ppl['test_ppl']:.2f} | ") and out.endswith(
        "| checkpoint ckpt-2, the end of epoch 2 | precision bf16 (the run's)"), out
    # an older checkpoint's run: no config in it, the newest logged one (bf16) stands in
    old = tmp_path / "old"
    shutil.copytree(run, old)
    edit_checkpoint_config(str(old / "checkpoints" / "ckpt-2"), None)
    assert perplexity(old) == out
    # stopped in epoch 3 right after its step checkpoint (tests/pause_at.py waits there for the
    # signal): that one is the newest, and scored
    pause = tmp_path / "pause"
    job = subprocess.Popen([sys.executable, *pause_prefix(pause, "save:3:15"), *base,
                            "--set", "num_epochs=3", "--set", "precision='bf16'", "--resume"],
                           cwd=REPO, text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           env=script_env())
    stderr = stop_at_pause(job, pause)[1]
    assert job.returncode == 128 + signal.SIGTERM and stderr.strip().endswith(
        f"error: stopped by SIGTERM; the newest checkpoint, {run}/checkpoints/steps/ckpt-95, "
        "is kept: rerun with --resume to continue from it"), stderr
    assert perplexity(run).endswith("| checkpoint steps/ckpt-95, epoch 3 step 15 | precision "
                                    "bf16 (the run's)")
    # newest by where the training stood, not by the files' times: a copy that left the epoch
    # ends' pointer the newer file (as a copy may) still scores the step checkpoint, and the
    # step checkpoint of epoch 2 (ckpt-70: 40 steps an epoch, 30 into the second) is older than
    # the end of epoch 2 whatever its time
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    later = time.time() + 100
    os.utime(copy / "checkpoints" / "checkpoint", (later, later))
    assert perplexity(copy).endswith("| checkpoint steps/ckpt-95, epoch 3 step 15 | precision "
                                     "bf16 (the run's)")
    from utils.checkpoints import newest_first
    names = [os.path.relpath(p, copy / "checkpoints") for p in
             newest_first(str(copy / "checkpoints"))]
    assert names == ["steps/ckpt-95", "ckpt-2", "steps/ckpt-70", "ckpt-1"], names
