"""The trainers' command line: the flags they share (parse_args), and how their main() ends
(run_main): a known error as one line and an exit status, a stop on a signal cleanly."""
import argparse
import signal
import sys

from data.ptb import DataError
from utils import signals
from utils.config import DEFAULT_DATA_PATH
from utils.errors import ConfigError, OutputError, TrainingError
from utils.logs import kept_text
from utils.signals import report_stops  # noqa: F401 -- cli.report_stops(is_chief) in the trainers

DEFAULT_SEED = 1234  # --seed's


def parse_args(argv=None, description=None):
    # the script's docstring as written: its example commands are lines of their own
    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="config_small",
                   help="config module name (config_small) or path to a .py file")
    p.add_argument("--data_path", default=DEFAULT_DATA_PATH,
                   help="folder with ptb.{train,valid,test}.txt; downloaded there if missing "
                        "(default: $PTB_DATA_PATH or data/ptb)")
    p.add_argument("--output_dir", default="runs/latest",
                   help="metrics.jsonl and checkpoints go here")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED,
                   help=f"seeds the initial weights and the dropout masks (default: "
                        f"{DEFAULT_SEED})")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key with a Python literal; repeatable")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest checkpoint in --output_dir")
    p.add_argument("--change_config", action="store_true",
                   help="with --resume: let the run go on under config values other than those "
                        "it was trained with (a resume refuses them otherwise)")
    p.add_argument("--threads", type=int, default=0,
                   help="TensorFlow threads per process (default: all cores, shared among "
                        "the workers of a host)")
    p.add_argument("--log_every", type=int, default=0,
                   help="progress line every N steps (default: about ten per epoch)")
    p.add_argument("--baseline", default=None, metavar="METRICS_JSONL",
                   help="metrics.jsonl of a single-process run, for time-per-epoch comparison")
    args = p.parse_args(argv)
    for flag in ("threads", "log_every"):
        if getattr(args, flag) < 0:
            raise ConfigError(f"--{flag} must be 0 (the default: chosen for you) or more, got "
                              f"{getattr(args, flag)}")
    return args


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
