"""Horovod on Keras 3, TensorFlow's own tf.keras since 2.16, where upstream Horovod 0.28.1 fails at
its first call (horovod issue 4290): the patched build with real ranks under mpirun, each value
computed by hand (tests/keras3_probe.py)."""
import json
import subprocess
import sys

from tests.helpers import IS_ROOT, REPO, script_env


def probe_on_two_ranks(script):
    cmd = ["mpirun", *(["--allow-run-as-root"] if IS_ROOT else []), "--oversubscribe",
           "-bind-to", "none", "-np", "2", sys.executable, script]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                       env=script_env())
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return {line["rank"]: line for line in lines}


def test_the_tape_and_the_broadcast_take_keras3_variables_on_two_ranks():
    """Patch 10. Rank r's gradient of each weight is r + 1: the shared weight's comes back as the
    mean, 1.5 on both ranks; a registered local source keeps its own, scaled by 1/size as
    Horovod does unless scale_local_gradients=False. Weights that start at 1 and 11 are rank 0's
    1 on both after the broadcast, in place or not, in the same keras.Variable objects."""
    ranks = probe_on_two_ranks("tests/keras3_probe.py")
    assert sorted(ranks) == [0, 1]
    for rank, out in ranks.items():
        assert out["keras"].startswith("3."), out
        assert out["tape"] == [1.5, (rank + 1) / 2], out
        assert out["tape_unscaled"] == [1.5, rank + 1], out
        assert out["broadcast"] == [1.0, True] and out["broadcast_inplace"] == [1.0, True], out
