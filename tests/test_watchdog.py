"""The step watchdog on its own: its allowance by hand, and a real process it ends (or not)."""
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO
from utils.watchdog import EXIT_STATUS, chief_work_allowance


def test_chief_work_allowance_by_hand():
    # medium on 2 ranks: 0.45 s steps of 10 x 35; validation of 70 windows of 20 x 35
    # (2x the tokens of a step): 2 * 70 * 0.45 * 2 = 126 s
    assert chief_work_allowance(0.45, (10, 35), (70, 20, 35)) == pytest.approx(126.0)
    # the batch-1 test, 2,351 windows of 1 x 35, each counted as a whole step: 2 * 2351 * 0.45
    assert chief_work_allowance(0.45, (10, 35), (2351, 1, 35)) == pytest.approx(2115.9)


def watched(step_s):
    """A process that runs steps of step_s[k] seconds under a 1 s watchdog, then idles."""
    code = ("import time; from utils.watchdog import Watchdog\n"
            "w = Watchdog(1, 3, 4, 'runs/x')\n"
            f"for s in {step_s!r}:\n"
            "    w.expect('a training step'); time.sleep(s)\n"
            "w.stop(); time.sleep(2.5)\n")
    started = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    return r, time.monotonic() - started


def test_steps_in_time_are_not_stopped_and_a_stuck_one_is():
    # the first step is allowed 1 + 120 s (it compiles), the others 1 s; then stopped, it idles
    r, _ = watched([3.0, 0.5, 0.5, 0.5, 0.5])
    assert r.returncode == 0 and r.stderr == "", r.stderr
    r, elapsed = watched([0.5, 10])  # the second step is stuck
    assert r.returncode == EXIT_STATUS and elapsed < 0.5 + 1 + 2, (r.returncode, elapsed)
    assert r.stderr.splitlines() == [
        "error: rank 3 of 4: a training step did not finish in 1 s, so a peer rank is probably "
        "stopped or hung (or this host is that slow); no checkpoint was saved yet in "
        "runs/x/checkpoints: rerun the same command with --resume to start afresh (and "
        "--set step_timeout_s=N if the steps are really that slow)"]
