"""Process entry for both trainers: one-line errors with an exit status, clean stops on signals."""
import contextlib
import signal
import sys


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived; raised in the main thread at a safe point."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_defer = {"active": False, "pending": None}
_reports = {"stops": True}  # False on the ranks other than 0: one line per job, not per rank


def report_stops(yes):
    """Whether this process prints the line of a stop by signal (rank 0 alone, as every line)."""
    _reports["stops"] = yes


_received = {"signum": None}  # the stop signal that arrived, if any


def _on_signal(signum, frame):
    _received["signum"] = signum
    if _defer["active"]:
        _defer["pending"] = signum
    else:
        raise Interrupted(signum)


@contextlib.contextmanager
def signals_deferred():
    """Hold SIGINT/SIGTERM until the block ends: a checkpoint is never half written by us, and a
    training step is never cut inside TensorFlow's Python code, which would turn the stop into
    an error of its own (and a traceback)."""
    _defer["active"] = True
    try:
        yield
    finally:
        _defer["active"] = False
        pending, _defer["pending"] = _defer["pending"], None
        if pending is not None:
            raise Interrupted(pending)


def run_main(main, argv=None):
    """Run a trainer's main(); known errors become one line on stderr and a non-zero exit."""
    from data.ptb import DataError
    from utils.config import ConfigError
    from utils.logs import OutputError
    from utils.training import TrainingError
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _on_signal)
    try:
        main(argv)
    except (DataError, ConfigError, TrainingError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    except Exception as e:  # noqa: BLE001 -- only stops and Horovod's shutdown are ours
        # After a stop signal, any error is the stop: our Interrupted, or what TensorFlow made
        # of it when the signal came while its Python code ran (a TypeError, a pybind11 error).
        from utils.logs import kept_text
        if _received["signum"] is not None:
            if _reports["stops"]:
                print(f"error: stopped by {signal.Signals(_received['signum']).name}; "
                      f"{kept_text()}", file=sys.stderr, flush=True)
            return 128 + _received["signum"]
        if "Horovod has been shut down" not in str(e):
            raise
        print("error: another rank stopped, so this one stops too (that rank's error says "
              f"why); {kept_text()}", file=sys.stderr, flush=True)
        return 1
    return 0
