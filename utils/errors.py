"""The errors a trainer reports as one line and a non-zero exit (utils/cli.py): each message
says what is wrong and how to fix it. data.ptb.DataError is the fourth (data/ imports no utils).
And the words of the errors they wrap: an error's first line, the OS's reason for a failed write."""
import re


class ConfigError(Exception):
    """Bad flags or config, or a run folder that does not fit them."""


class OutputError(Exception):
    """Writing the run's output failed (a full disk, say); the message names the file, the OS
    error, what is kept and what to do."""


class TrainingError(Exception):
    """Training cannot go on (NaN loss, say); the message names where and what to do."""


def first_line(error, limit=200):
    """An error's first line, cut to `limit` characters: enough for a one-line message."""
    return str(error).strip().splitlines()[0][:limit]


def os_reason(error):
    """The OS's words for a failed write and its path, from an OSError or a TensorFlow op
    error, whose message wraps them in the op's names: "{{function_node __wrapped__SaveV2...}}
    PATH; No space left on device [Op:SaveV2]" gives "PATH; No space left on device"."""
    if isinstance(error, OSError):
        return f"{error.strerror or error}: {error.filename}" if error.filename else str(error)
    message = re.sub(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\]", "",
                     str(getattr(error, "message", error)))
    return first_line(message, 300)
