"""A tiny config trained end to end by lm_ptb.main(), plus the CLI's one-line errors."""
import collections
import json
import math
import os
import socket

import pytest

import lm_ptb
from tests.helpers import TINY, patterned_sentences, run_script, write_corpus
from data import ptb


def unigram_perplexity(train_ids, eval_ids):
    counts = collections.Counter(train_ids.tolist())
    total = sum(counts.values())
    nll = -sum(math.log(counts[i] / total) for i in eval_ids.tolist()) / len(eval_ids)
    return math.exp(nll)


@pytest.mark.smoke
def test_tiny_config_learns_and_logs_every_field(tmp_path, capsys):
    data = write_corpus(tmp_path / "data", patterned_sentences(2400, 0),
                        patterned_sentences(200, 1), patterned_sentences(200, 2))
    out = tmp_path / "run"
    lm_ptb.main(["--config", TINY, "--data_path", str(data), "--output_dir", str(out)])

    events = [json.loads(line) for line in open(out / "metrics.jsonl")]
    by_kind = collections.defaultdict(list)
    for e in events:
        by_kind[e["event"]].append(e)
    assert len(by_kind["epoch"]) == 3 and len(by_kind["test"]) == 1
    assert 25 <= len(by_kind["progress"]) <= 40  # about ten per epoch
    common = {"event", "epoch", "step", "lr", "train_ppl", "wps", "world_size", "config"}
    for e in events:
        assert common <= set(e), e
        assert e["world_size"] == 1 and e["config"]["hidden_size"] == 32
    assert {"valid_ppl", "epoch_time_s"} <= set(by_kind["epoch"][0])
    assert [e["lr"] for e in by_kind["epoch"]] == [1.0, 1.0, 0.5]

    corpus = ptb.load_corpus(str(data))
    unigram = unigram_perplexity(corpus.train, corpus.valid)
    valid = [e["valid_ppl"] for e in by_kind["epoch"]]
    assert valid[-1] < unigram / 3, (valid, unigram)
    assert by_kind["test"][0]["test_ppl"] < unigram / 3
    assert valid[-1] < valid[0]

    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("[ptb] epoch 3/3 done | lr 0.5 | train ppl") for line in lines)
    assert any("wps | eta" in line for line in lines)
    assert any("computing" in line for line in lines)
    assert os.path.exists(out / "checkpoints" / "checkpoint")


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/simple-examples.tgz"


@pytest.mark.parametrize("args, message", [
    (["--config", "config_nope"], "error: unknown config 'config_nope'; use one of"),
    (["--set", "num_epochs=one"], "error: --set num_epochs: cannot parse 'one'"),
    (["--set", "hidden=3"], "error: --set: unknown key 'hidden'; valid keys:"),
    (["--data_path", "{tmp}/empty"], "error: download of http://127.0.0.1:"),
])
def test_cli_errors_are_one_line(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    result = run_script(["lm_ptb.py", *args, "--output_dir", str(tmp_path / "out")],
                        env={"PTB_URL": closed_port_url()})
    assert result.returncode == 2
    assert result.stderr.strip().startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_another_keras_than_utils_selects_is_refused_in_one_line():
    """A script of the user's that imports Horovod (which imports TensorFlow and its Keras)
    before utils gets Keras 3 whatever PTB_KERAS=2 asked for: its steps would not be the ones
    the trainers were written and tested for."""
    code = ("import horovod.tensorflow\n"
            "from utils import config, optimizers\n"
            "optimizers.make_optimizer(config.load_config('config_small'))\n")
    r = run_script(["-c", code], timeout=120, env={"PTB_KERAS": "2"})
    assert r.returncode == 1
    assert ("TrainingError: tf.keras is Keras 3, not the tf-keras that PTB_KERAS=2 selects: "
            "TensorFlow was imported before utils") in r.stderr
