"""Which error class a tf.distribute worker's collective raises when its peer is SIGKILLed (a
lost host) or SIGSTOPped (a frozen one): the class that the trainer's last line names, N tries
of each. Run from the repository's root:

    .venv/bin/python scripts/probes/tf_distribute_peer_errors.py 5 kill stop
"""
import argparse
import os
import pathlib
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
from tests.helpers import TINY, patterned_sentences, write_corpus  # noqa: E402
from tests.test_tf_distribute import worker  # noqa: E402


def one_try(kind, i, corpus, tmp):
    """2 workers until their first step checkpoint, then the signal to worker 1: (seconds until
    worker 0 ended, its last line)."""
    run = tmp / f"{kind}{i}"
    args = ["--config", TINY, "--data_path", corpus, "--output_dir", str(run), "--set",
            "num_epochs=50", "--set", "checkpoint_every=20", "--log_every", "10",
            "--set", "step_timeout_s=120"]
    base = 24950 + 2 * i + (40 if kind == "stop" else 0)
    workers = [worker(j, [base, base + 1], args) for j in range(2)]
    deadline = time.monotonic() + 120
    while not (run / "checkpoints" / "steps" / "checkpoint").exists():
        assert time.monotonic() < deadline and workers[0].poll() is None, "no checkpoint"
        time.sleep(0.2)
    os.killpg(workers[1].pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    started = time.monotonic()
    _, err = workers[0].communicate(timeout=150)
    if kind == "stop":
        os.killpg(workers[1].pid, signal.SIGKILL)
    workers[1].wait()
    return time.monotonic() - started, err.strip().splitlines()[-1]


def main():
    p = argparse.ArgumentParser(description="The error class a tf.distribute worker's "
                                "collective raises when its peer is killed or frozen.")
    p.add_argument("tries", type=int, help="tries of each kind")
    p.add_argument("kinds", nargs="+", choices=("kill", "stop"),
                   help="kill: the peer SIGKILLed (a lost host); stop: SIGSTOPped (a frozen one)")
    args = p.parse_args()
    tries, kinds = args.tries, args.kinds
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="peer-errors-"))
    corpus = str(write_corpus(tmp / "corpus", patterned_sentences(2400, 0),
                              patterned_sentences(200, 1), patterned_sentences(200, 2)))
    for kind in kinds:
        for i in range(tries):
            seconds, line = one_try(kind, i, corpus, tmp)
            print(f"{kind} {i}: {seconds:.1f} s: {line[:200]}", flush=True)


if __name__ == "__main__":
    main()
