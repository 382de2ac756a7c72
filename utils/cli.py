"""The trainers' command line: the flags they share (parse_args), and how their main() ends
(run_main): a known error as one line and an exit status, a stop on a signal cleanly."""
import argparse
import os
import signal
import sys
import time

from data.ptb import DataError
from utils import launcher_rank, signals
from utils.config import DEFAULT_DATA_PATH
from utils.errors import ConfigError, OutputError, TrainingError
from utils.pointers import kept_text

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
    refuse_empty_paths(args, ("data_path", "output_dir", "baseline"))
    return args


def refuse_empty_paths(args, flags, required=()):
    """One line for a path flag given as "" (an unset shell variable, --output_dir "$DIR"): an
    empty path is the current folder to some calls and no file to others, so a run would write
    into the folder it was started from, or fail in a traceback."""
    for flag in flags:
        value = getattr(args, flag, None)
        if isinstance(value, str) and not value.strip():  # "" or blanks: no name anyone means
            raise ConfigError(f"--{flag} is {'empty' if not value else 'blank'}; give it a path"
                              + ("" if flag in required else " (or leave the flag out for its "
                                 "default)"))


# What the last line of a stop says and who says it, as the trainer's main tells it
# (report_stops): the run's --output_dir, whose newest checkpoint it names, and whether this
# process speaks for the job (rank 0 alone does: one line per job, not per rank).
_stops = {"output_dir": None, "speaks": True}
# Open MPI's mpirun ends every process of a job once one exits non-zero: a process that does
# not speak for the job waits this long for that at an error, since rank 0 says the same one
# where every rank makes it alike (a config refusal), and says its own after (one of its host's
# files, say). Other launchers leave the others running (horovodrun without MPI, elastic) or
# may (srun, launch/tf_config.py's workers on hosts of their own): there each rank says it.
RANK_0_FIRST_S = 30


def report_stops(speaks=None, output_dir=None):
    """What a stop's line says from here on: `output_dir`, the run's folder, whose newest
    checkpoint it names; `speaks`, whether this process prints it (is_chief in the trainers).
    Each one given replaces the one kept."""
    if speaks is not None:
        _stops["speaks"] = speaks
    if output_dir is not None:
        _stops["output_dir"] = output_dir


def ended_by_the_launcher():
    """For a process that does not speak for the job, at its error: under mpirun, wait
    RANK_0_FIRST_S for mpirun's stop signal (rank 0 said the error and ended); whether it came."""
    if "OMPI_COMM_WORLD_RANK" not in os.environ:
        return False
    deadline = time.monotonic() + RANK_0_FIRST_S
    try:
        while time.monotonic() < deadline:
            time.sleep(0.1)
    except signals.Interrupted:
        return True
    return False


def run_main(main, argv=None):
    """Run a trainer's main(); known errors become one line on stderr and a non-zero exit,
    from rank 0 alone where every rank has it (ended_by_the_launcher)."""
    signals.install()
    # this main's own, from its start: rank 0 of a launcher, or a process without one, speaks
    _stops.update(output_dir=None, speaks=launcher_rank() in (None, 0))
    try:
        main(argv)
    except (DataError, ConfigError, TrainingError, OutputError) as e:
        if _stops["speaks"] or not ended_by_the_launcher():
            error_line(e)
        return 2
    except (Exception, signals.Interrupted) as e:  # noqa: BLE001 -- stops, Horovod's shutdown
        # After a stop signal, any error is the stop: our Interrupted, or what TensorFlow made
        # of it when the signal came while its Python code ran (a TypeError, a pybind11 error).
        signum = signals.received()
        if signum is not None:
            if _stops["speaks"]:
                error_line(f"stopped by {signal.Signals(signum).name}; "
                           f"{kept_text(_stops['output_dir'])}")
            return 128 + signum
        if "Horovod has been shut down" not in str(e):
            raise
        # what to do is the failed rank's to say (a refusal it met, a disk to free): advice
        # from a rank that does not know why, beside it, could say the opposite
        advice = f"; {kept_text(_stops['output_dir'])}" if _stops["speaks"] else ""
        error_line("another rank stopped, so this one stops too (that rank's error says why"
                   f"{'' if advice else ' and what to do'}){advice}")
        return 1
    return 0


def error_line(text):
    """`error: text` on stderr in one write (print writes the newline apart): under mpirun the
    lines of ranks that fail together stay whole lines."""
    sys.stderr.write(f"error: {text}\n")
    sys.stderr.flush()
