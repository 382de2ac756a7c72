"""The errors a trainer reports as one line and a non-zero exit (utils/cli.py): each message
says what is wrong and how to fix it. data.ptb.DataError is the fourth (data/ imports no utils)."""


class ConfigError(Exception):
    """Bad flags or config, or a run folder that does not fit them."""


class OutputError(Exception):
    """Writing the run's output failed (a full disk, say); the message names the file, the OS
    error, what is kept and what to do."""


class TrainingError(Exception):
    """Training cannot go on (NaN loss, say); the message names where and what to do."""
