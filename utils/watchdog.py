"""A step watchdog: a rank whose step cannot finish (a peer rank stopped or hung) ends itself.

A rank blocked in a collective waits for ever: nothing in the main thread can run, and an
allreduce has no timeout. A thread beside it watches a deadline that each finished step moves
forward; when the deadline passes it prints one line and ends the process, so that the
launcher (mpirun, horovodrun, srun) ends the job and the allocation is not held by a hang.
Checkpoints are written whole or not at all, so the newest complete one survives.
"""
import os
import subprocess
import sys
import threading
import time

from utils.pointers import kept_text

EXIT_STATUS = 124  # what timeout(1) returns
TICK_S = 1.0  # the watchdog looks at the deadline once a second
PAUSED_S = 2.0  # a tick this late means this process was not running
WARM_UP_S = 120  # the first step of each kind also traces and compiles it: this much more
# The start-up reads the corpus, builds the model and traces the broadcast before any step:
# one-off work held to step_timeout_s would end a run whose steps fit a short timeout (PTB's
# start-up took 6 s with 2 ranks on an AMD EPYC with AVX2 only beside other work, 1.7-2.1 s
# alone: results/stack/ci/startup-phases-avx2.log).
START_UP_S = 30


class Watchdog:
    """`expect(what)` before each step gives it step_timeout_s seconds (WARM_UP_S more the first
    time `what` is seen); `expect(what, extra_s=...)` allows more for a known wait."""

    def __init__(self, step_timeout_s, rank, size, output_dir, role="rank"):
        self.timeout_s = step_timeout_s
        self.role = role  # what the launcher calls a process: Horovod's rank, tf.distribute's worker
        self.where = f"{role} {rank} of {size}"
        self.output_dir = output_dir
        self._seen = set()
        self._deadline = None
        self._what = None
        self._allowed_s = None
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, name="step-watchdog", daemon=True).start()

    def expect(self, what, extra_s=0.0, warm_up=True):
        """warm_up=False: no compile time to allow for, even the first time."""
        first = warm_up and what not in self._seen
        allowed = self.timeout_s + (WARM_UP_S if first else 0) + extra_s
        self._seen.add(what)
        with self._lock:
            self._deadline = time.monotonic() + allowed
            self._what, self._allowed_s = what, allowed

    def stop(self):
        with self._lock:
            self._deadline = None

    def _watch(self):
        last_tick = time.monotonic()
        while True:
            time.sleep(TICK_S)
            with self._lock:
                now = time.monotonic()
                paused_s, last_tick = now - last_tick - TICK_S, now
                if self._deadline is None:
                    continue
                if paused_s > PAUSED_S:
                    # This process itself was not running (SIGSTOP, a suspended VM): that time
                    # is not the peers' fault, so it does not count against the step.
                    self._deadline += paused_s
                if now > self._deadline:
                    sys.stderr.write(self.message() + "\n")
                    sys.stderr.flush()
                    os._exit(EXIT_STATUS)  # the main thread is stuck in C++; nothing else ends it

    def message(self):
        return (f"error: {self.where}: {self._what} did not finish in {self._allowed_s:.0f} s, so "
                f"a peer {self.role} is probably stopped or hung (or this host is that slow); "
                f"{kept_text(self.output_dir)} (and --set step_timeout_s=N if the steps are "
                "really that slow)")


def chief_work_allowance(step_s, train_window, eval_windows):
    """Seconds the other ranks allow rank 0, beyond step_timeout_s, for an evaluation they wait
    for: eval_windows = (windows, rows, num_steps), judged by this rank's mean training step
    time step_s on its train_window = (rows, num_steps). A forward pass costs about a third of a
    training step of the same tokens, so twice the training time of those tokens is ample; a
    window of fewer tokens than a training step counts as a whole step (at batch 1 a window is
    sequential work, not proportionally cheaper)."""
    windows, rows, num_steps = eval_windows
    tokens_ratio = rows * num_steps / (train_window[0] * train_window[1])
    return 2.0 * windows * step_s * max(1.0, tokens_ratio)


def chief_wait_s(stats, train_window, eval_windows):
    """chief_work_allowance for the epoch of `stats` (train_epoch's, or RunLog.resume's for an
    epoch rank 0 validates at a resume); 0 without stats (nothing to evaluate)."""
    if not stats:
        return 0.0
    step_s = stats["epoch_time_s"] / (stats.get("steps_run") or stats["steps"])
    return chief_work_allowance(step_s, train_window, eval_windows)


# The guard's child: unless its stdin ends (the call returned, or this process is gone) within
# the time, it prints the line and kills the process, whose own threads cannot run meanwhile.
_GUARD = """import os, select, signal, sys
pid, timeout_s, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
if not select.select([sys.stdin], [], [], timeout_s)[0]:
    sys.stderr.write(message + "\\n")
    sys.stderr.flush()
    os.kill(pid, signal.SIGKILL)
"""


def guard_blocking_call(timeout_s, message):
    """For a call into TensorFlow that waits without releasing Python's lock (the strategy's
    wait for its cluster), where the watchdog thread cannot run: a small child process ends
    this one with `message` after timeout_s. Returns the function to call once it returned."""
    guard = subprocess.Popen([sys.executable, "-c", _GUARD, str(os.getpid()), str(timeout_s),
                              message], stdin=subprocess.PIPE)

    def returned():
        guard.stdin.close()
        guard.wait()
    return returned
