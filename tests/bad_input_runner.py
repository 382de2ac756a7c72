"""Runs lm_ptb.py's main on each of several bad command lines in this one process, as its
`__main__` does (cli.run_main), and writes what each did as JSON: the exit status, what it
wrote on file descriptors 1 and 2 (TensorFlow's C++ lines included), and its seconds; and what
importing the trainer wrote. TensorFlow is imported once for all of them instead of once each
(tests/test_faults.py). A case given as {"script": "evaluate", "argv": [...]} runs that
script's main instead (tests/test_damage.py); the cases run in their order.

    python tests/bad_input_runner.py CASES.json RESULTS.json    # CASES: {name: [arg, ...]}
"""
import importlib
import json
import os
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from utils import cli  # noqa: E402


def run_captured(run):
    """run() with fds 1 and 2 going to files: (its return value, out, err)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            value = run()
        except SystemExit as e:  # argparse's own refusals
            value = e.code
        except Exception:  # as it ends a process of its own: a traceback and status 1, so that
            traceback.print_exc()  # the cases after it still run, and its test alone fails
            value = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
        out.seek(0)
        err.seek(0)
        return value, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def main(cases_path, results_path):
    with open(cases_path) as f:
        cases = json.load(f)
    # the import first, on its own: whatever TensorFlow prints as it loads is a line of its own
    # in every real run, so it is kept and shown apart
    trainer, out, err = run_captured(lambda: importlib.import_module("lm_ptb"))
    results = {"(import)": {"stdout": out, "stderr": err}}
    for name, argv in cases.items():
        script = trainer
        if isinstance(argv, dict):
            script, argv = importlib.import_module(argv["script"]), argv["argv"]
        started = time.monotonic()
        status, out, err = run_captured(
            lambda argv=argv, script=script: cli.run_main(script.main, argv))
        results[name] = {"status": status, "stdout": out, "stderr": err,
                         "seconds": time.monotonic() - started}
    with open(results_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
