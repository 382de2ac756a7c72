"""Process entry for every script: one-line errors with an exit status, clean stops on signals."""
import signal
import sys

from data.ptb import DataError
from utils import signals
from utils.errors import ConfigError, OutputError, TrainingError
from utils.logs import kept_text
from utils.signals import report_stops  # noqa: F401 -- cli.report_stops(is_chief) in the trainers


def run_main(main, argv=None):
    """Run a trainer's main(); known errors become one line on stderr and a non-zero exit."""
    signals.install()
    try:
        main(argv)
    except (DataError, ConfigError, TrainingError, OutputError) as e:
        error_line(e)
        return 2
    except Exception as e:  # noqa: BLE001 -- only stops and Horovod's shutdown are ours
        # After a stop signal, any error is the stop: our Interrupted, or what TensorFlow made
        # of it when the signal came while its Python code ran (a TypeError, a pybind11 error).
        signum = signals.received()
        if signum is not None:
            if signals.reports_stops():
                error_line(f"stopped by {signal.Signals(signum).name}; {kept_text()}")
            return 128 + signum
        if "Horovod has been shut down" not in str(e):
            raise
        error_line("another rank stopped, so this one stops too (that rank's error says why); "
                   f"{kept_text()}")
        return 1
    return 0


def error_line(text):
    """`error: text` on stderr in one write (print writes the newline apart): under mpirun the
    lines of ranks that fail together stay whole lines."""
    sys.stderr.write(f"error: {text}\n")
    sys.stderr.flush()
