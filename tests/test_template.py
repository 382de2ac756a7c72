"""The template's promises: every line the distributed script adds to lm_ptb.py is a tagged
Horovod step, and docs/template.md's diff of the required steps alone applies to lm_ptb.py and
trains on 2 ranks the model one process trains."""
import difflib
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import REPO, TINY, checkpoint_weights, events, run_job, run_script, script_env
from tests.test_distributed import EQUIV_SET
from tests.test_faults import assert_error_line


def code_lines(path):
    """The file's lines past its module docstring."""
    with open(os.path.join(REPO, path)) as f:
        text = f.read()
    return text[text.index('"""', 3) + 3:].splitlines()


def test_every_line_the_distributed_script_adds_is_a_tagged_horovod_step():
    added = [line for line in difflib.ndiff(code_lines("lm_ptb.py"),
                                            code_lines("lm_ptb_distributed.py"))
             if line.startswith("+ ")]
    assert len(added) > 20
    untagged = [line for line in added if not re.search(r"# Horovod \d", line)]
    assert not untagged, untagged
    # and the scripts import their Horovod helpers from horovod_steps.py, not each other
    for script in ("lm_ptb_distributed.py", "lm_ptb_elastic.py"):
        assert not any("from lm_ptb" in line or "import lm_ptb" in line
                       for line in code_lines(script)), script


def test_the_required_steps_alone_apply_to_lm_ptb_and_train_two_ranks_as_one_process(
        ptb_path, tmp_path):
    """docs/template.md's own commands: copy lm_ptb.py, patch it with the doc's diff."""
    shutil.copy(os.path.join(REPO, "lm_ptb.py"), tmp_path / "my_trainer.py")
    doc = os.path.join(REPO, "docs", "template.md")
    r = subprocess.run(f"sed -n '/^```diff$/,/^```$/p' {doc} | sed '1d;$d' | patch my_trainer.py",
                       shell=True, cwd=tmp_path, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    minimal = tmp_path / "my_trainer.py"
    # the required steps are all there, the hardening is not
    text = minimal.read_text()
    for call in ("hvd.init()", "hvd.local_rank()", "hvd.DistributedOptimizer(",
                 "hvd.broadcast_variables(", "ptb.shard(", "hvd.rank() == 0"):
        assert call in text, call
    assert "horovod_steps" not in text and "watchdog" not in text.lower()
    common = ["--config", TINY, "--data_path", ptb_path, *EQUIV_SET]
    single, dist = tmp_path / "single", tmp_path / "dist"
    r = run_script(["lm_ptb.py", *common, "--output_dir", str(single)], timeout=180)
    assert r.returncode == 0, r.stderr
    cmd = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--oversubscribe",
           "-bind-to", "none", "-np", "2", sys.executable, str(minimal), *common,
           "--output_dir", str(dist)]
    r = run_job(cmd, 180, cwd=REPO, env=dict(script_env(), PYTHONPATH=REPO))
    assert r.returncode == 0, r.stdout + r.stderr
    # rank 0 logs its own rows' loss (the average over ranks is beyond the minimum), so the
    # training is compared by what it made: the weights, and the valid perplexity of each epoch
    assert {e["world_size"] for e in events(dist, "epoch")} == {2}
    a, b = checkpoint_weights(single), checkpoint_weights(dist)
    assert a.keys() == b.keys() and len(a) >= 8
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5, err_msg=name)
    valid = [[e["valid_ppl"] for e in events(path, "epoch")] for path in (single, dist)]
    assert len(valid[0]) == 2 and np.allclose(valid[1], valid[0], rtol=1e-4)


@pytest.mark.parametrize("keras", ["3", "2"])
def test_a_copy_without_create_slots_stops_at_the_broadcast_in_one_line(keras, corpus, tmp_path):
    """The broadcast sends only the optimizer state that exists, and Keras makes it at the first
    step: a copy of the trainer without lm_ptb.py's create_slots line (one that swaps in its
    own checkpointing, say) stops there in one line instead of leaving the step counter and
    the slots out. One process: Horovod's broadcast runs on one rank too."""
    with open(os.path.join(REPO, "lm_ptb_distributed.py")) as f:
        source = f.read()
    call = "    create_slots(optimizer, model.trainable_variables)\n"
    assert source.count(call) == 1
    copy = tmp_path / "my_trainer.py"
    copy.write_text(source.replace(call, ""))
    r = subprocess.run([sys.executable, str(copy), "--config", TINY, "--data_path", corpus,
                        "--output_dir", str(tmp_path / "run")], cwd=tmp_path, capture_output=True,
                       text=True, timeout=180,
                       env=dict(script_env({"PTB_KERAS": keras}), PYTHONPATH=REPO))
    assert_error_line(r.returncode, r.stderr,
                      "the optimizer's state (its step counter and slots) is not made yet, so "
                      "the broadcast from rank 0 would leave it out and the ranks would train "
                      "apart; call create_slots(optimizer, model.trainable_variables) before it",
                      r.stdout + r.stderr)
    assert not (tmp_path / "run" / "checkpoints").exists()
