"""Horovod's Keras callbacks on the patched build (scripts/patches/horovod-0.28.1/
06-keras-backend.patch): model.fit with the Horovod steps, 2 real ranks under mpirun."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import IS_ROOT, REPO, run_job, script_env


def test_model_fit_with_horovods_callbacks_on_two_ranks(tmp_path):
    cmd = ["mpirun", *(["--allow-run-as-root"] if IS_ROOT else []), "--oversubscribe",
           "-bind-to", "none", "-np", "2", sys.executable, "tests/keras_fit.py", str(tmp_path)]
    r = run_job(cmd, 180, cwd=REPO, env=script_env())
    assert r.returncode == 0, r.stdout + r.stderr
    ranks = [json.loads((tmp_path / f"rank{n}.json").read_text()) for n in (0, 1)]
    # the warm-up's promise, by hand: at batch b of epoch e (4 batches an epoch, 2 warm-up
    # epochs, 2 ranks), 0.05 / 2 * (1 + (e + (b + 1) / 4) / 2), from 0.028125 up to 0.05 at the
    # end of epoch 2; epochs 3 to 6 keep 0.05
    expected = [0.05 / 2 * (1 + (e + (b + 1) / 4) / 2) for e in range(2) for b in range(4)]
    expected += [0.05] * 4 * 4
    assert expected[0] == pytest.approx(0.028125) and expected[7] == pytest.approx(0.05)
    for rank in ranks:
        assert rank["rates"] == pytest.approx(expected, rel=1e-6)
    # ranks that started from other weights end with the same ones (broadcast, then averaged
    # gradients), and log the same averaged loss, which went down
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"]):
        np.testing.assert_allclose(np.array(b), np.array(a), rtol=1e-6, atol=1e-7)
    assert ranks[0]["loss"] == pytest.approx(ranks[1]["loss"], rel=1e-6)
    assert ranks[0]["loss"][-1] < 0.5 * ranks[0]["loss"][0]
    assert sorted(p for p in os.listdir(tmp_path) if p.endswith(".h5")) == \
        [f"weights-{epoch}.weights.h5" for epoch in range(1, 7)]
