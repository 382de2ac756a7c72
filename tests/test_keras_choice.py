"""Which Keras the trainers run on: Keras 3 (TensorFlow's own tf.keras) by default, tf-keras
with PTB_KERAS=2; a checkpoint of the one is refused by the other in one line."""
import os

import numpy as np

from tests.helpers import TINY, checkpoint_weights, events, mpirun, run_script
from tests.test_distributed import EQUIV_SET

TF_KERAS = {"PTB_KERAS": "2"}
BOUNDED = ["--config", TINY, "--set", "num_epochs=1", "--set", "steps_per_epoch=10",
           "--set", "eval_steps=3"]


def step_key(run_dir):
    """The key of the optimizer's step counter: each Keras names it apart."""
    import tensorflow as tf
    names = [n for n, _ in tf.train.list_variables(os.path.join(run_dir, "checkpoints"))]
    return [n for n in names if n.startswith("optimizer/") and "iter" in n]


def test_on_tf_keras_two_ranks_still_equal_one_process(ptb_path, tmp_path):
    """PTB_KERAS=2: legacy Keras 2 with Horovod's old hooks, as before Keras 3 was the default;
    the same strictness as the Keras 3 test in test_distributed.py (clipping acts there)."""
    single, dist = tmp_path / "single", tmp_path / "dist"
    common = ["--config", TINY, "--data_path", ptb_path, *EQUIV_SET]
    r = run_script(["lm_ptb.py", *common, "--output_dir", str(single)], timeout=180,
                   env=TF_KERAS)
    assert r.returncode == 0, r.stderr
    r = mpirun((2, [*common, "--output_dir", str(dist)]), env=TF_KERAS)
    assert r.returncode == 0, r.stdout + r.stderr
    one, two = (np.array([e["loss"] for e in events(run, "progress")]) for run in (single, dist))
    assert len(one) == len(two) == 60
    assert (np.abs(one - two) / one).max() < 1e-4
    a, b = checkpoint_weights(single), checkpoint_weights(dist)
    assert a.keys() == b.keys() and len(a) >= 8
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5, err_msg=name)
    assert step_key(single) == step_key(dist) == ["optimizer/iter/.ATTRIBUTES/VARIABLE_VALUE"]


def test_a_checkpoint_of_the_other_keras_is_refused_in_one_line(ptb_path, tmp_path):
    runs = {"2": tmp_path / "tf-keras", "3": tmp_path / "keras3"}
    for keras, run in runs.items():
        r = run_script(["lm_ptb.py", *BOUNDED, "--data_path", ptb_path, "--output_dir",
                        str(run)], env={"PTB_KERAS": keras})
        assert r.returncode == 0, r.stderr
    assert step_key(runs["3"]) == ["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"]
    resume = [*BOUNDED, "--set", "num_epochs=2", "--data_path", ptb_path, "--resume"]
    for keras, other in (("2", "3"), ("3", "2")):
        commands = (["lm_ptb.py", *resume, "--output_dir", str(runs[other])],
                    ["evaluate.py", "perplexity", "--run", str(runs[other])])
        for command in commands:
            r = run_script(command, env={"PTB_KERAS": keras})
            assert r.returncode == 2, r.stdout + r.stderr
            line, = r.stderr.strip().splitlines()
            assert line.startswith(f"error: checkpoint {runs[other]}/checkpoints/ckpt-1 was "
                                   "written by code on "), line
            assert line.endswith(f"run with PTB_KERAS={other} to resume or evaluate it "
                                 "(docs/keras3.md)"), line
    # under its own Keras each goes on
    for keras, run in runs.items():
        r = run_script(["lm_ptb.py", *resume, "--output_dir", str(run)],
                       env={"PTB_KERAS": keras})
        assert r.returncode == 0, r.stderr
        assert len(events(run, "epoch")) == 2


def test_an_unknown_keras_is_one_line():
    r = run_script(["lm_ptb.py", "--config", "config_small"], env={"PTB_KERAS": "4"})
    assert r.returncode == 2
    assert r.stderr.strip() == ("error: PTB_KERAS='4' is not a Keras this repository runs; set "
                                "PTB_KERAS=3 (Keras 3) or PTB_KERAS=2 (tf-keras), or unset it")
