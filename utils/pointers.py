"""A run's checkpoint folders and their pointer files (TensorFlow's `checkpoint`, which lists the
checkpoints saved beside it): what they list, what is wrong with a damaged one, one written
anew, and the newest checkpoint, which a stopped run's last line names (kept_text).

Loaded without TensorFlow, as utils/cli.py's stop lines and the watchdog's thread are: those
read a pointer by hand (newest_checkpoint); the parser of the others is TensorFlow's message,
imported when a pointer is first parsed or written (by utils/checkpoints.py and evaluate.py,
which have TensorFlow loaded already)."""
import ast
import json
import os
import re
import sys

from data import ptb
from utils.errors import first_line, os_reason

CHECKPOINTS = "checkpoints"  # a run's folder of checkpoints, in its --output_dir
IN_EPOCH = "steps"  # subfolder of the checkpoints saved inside an epoch
POINTER = "checkpoint"  # the file in a checkpoint folder that lists its checkpoints
CHECKPOINT_FILE = re.compile(r"ckpt-(\d+)\.index$")  # a checkpoint's index: ckpt-N.index


def checkpoint_folder(output_dir):
    """The folder of a run's checkpoints (its epoch ends; IN_EPOCH below it the others)."""
    return os.path.join(output_dir, CHECKPOINTS)


def newest_checkpoint(folder):
    """The newest checkpoint's path in a run's checkpoint folder, from the pointer files, the
    files and the run's log alone (no TensorFlow: the watchdog's thread calls it while the main
    thread is stuck; it never raises): of the newest checkpoint of each folder, the epoch ends'
    and the in-epoch one, the one further in training, as the resume orders them (an epoch end
    numbered by its epochs done, a save inside an epoch by the optimizer's step: the newer where
    that step is past the step count the log gives that epoch's end, _logged_epoch_end); without
    the log, or for a name other than ckpt-N, the one whose index file was written last.
    A folder's newest is the one its pointer names, or,
    where the pointer is missing, damaged, or names a file that is gone or outside its folder
    (name_problem), the highest numbered there, as the resume then takes them by their files;
    None if there is none. A checkpoint is passed over only where its index or data files are
    missing: damage inside the files takes TensorFlow to see (the resume then warns and takes
    the one before)."""
    ends, inside = _newest_in(folder), _newest_in(os.path.join(folder, IN_EPOCH))
    if ends is None or inside is None:
        return ends or inside
    ended_at = _logged_epoch_end(os.path.dirname(folder), _number(ends))
    try:
        if ended_at is not None and _number(inside) is not None:
            newer = _number(inside) > ended_at
        else:  # the log gone, another name: the files' times, both read alike
            newer = os.path.getmtime(inside + ".index") > os.path.getmtime(ends + ".index")
    except OSError:  # deleted meanwhile
        return ends
    return inside if newer else ends


def _newest_in(folder):
    """The checkpoint in `folder` (not below it) that a resume would take first of that folder's
    (newest_checkpoint), or None."""
    name = _named_by_pointer(folder)
    try:
        if name is not None and not name_problem(folder, name) and \
                _has_files(os.path.join(folder, name)):
            return os.path.join(folder, name)
    except (OSError, ValueError):  # a name no path can have (a NUL byte, a lone surrogate)
        pass
    # as listed() takes them: by their files, the highest number furthest in training
    whole = [p for p in checkpoint_files(folder) if _has_files(p)]
    return whole[-1] if whole else None


def _number(path):
    """N of a checkpoint named ckpt-N; None for another name (a pointer may name any)."""
    number = CHECKPOINT_FILE.match(os.path.basename(path) + ".index")
    return int(number.group(1)) if number else None


def _logged_epoch_end(output_dir, epoch):
    """The step count at the end of `epoch`, from the run's log (the last line of that epoch;
    for an epoch not logged yet, stopped in its validation, the newest logged epoch's length
    on from there); None where the log has no epoch line or cannot be read. It counts batches,
    and an in-epoch checkpoint is numbered by the optimizer's step, which fp16's skipped steps
    hold back: an in-epoch save within that many steps of an epoch's start is taken as older
    than the epoch's end."""
    log = os.path.join(output_dir, "metrics.jsonl")
    ends = {}
    try:
        if epoch is None or not os.path.isfile(log):  # none, or a folder, a pipe: never read
            return None
        with open(log, "rb") as f:
            for line in f:
                if b'"event": "epoch"' in line:
                    event = json.loads(line)
                    ends[int(event["epoch"])] = int(event["step"])
    except (OSError, ValueError, KeyError, TypeError, MemoryError):
        return None
    if epoch in ends:
        return ends[epoch]
    logged = max((e for e in ends if e < epoch), default=None)
    if logged is None:
        return None
    length = ends[logged] - ends.get(logged - 1, 0) if logged - 1 in ends or logged == 1 \
        else ends[logged] // logged
    return ends[logged] + (epoch - logged) * length


POINTER_LINE = re.compile(r"\s*(model_checkpoint_path|all_model_checkpoint_paths|"
                          r"all_model_checkpoint_timestamps|last_preserved_timestamp)"
                          r"\s*:\s*(.+?)\s*")


def _named_by_pointer(folder):
    """The name the pointer of `folder` gives its newest checkpoint, read by hand as TensorFlow
    writes it; None where there is no pointer or it does not read as one (the resume then takes
    the files too)."""
    pointer = os.path.join(folder, POINTER)
    try:
        if not os.path.isfile(pointer):  # none, or a folder, a pipe, a device: never read
            return None
        with open(pointer, "rb") as f:
            text = f.read(1 << 20).decode("utf-8")
        names = []
        for line in filter(str.strip, text.splitlines()):
            key, value = POINTER_LINE.fullmatch(line).groups()
            if key == "model_checkpoint_path":
                names.append(ast.literal_eval(value))
        return names[-1] if names and isinstance(names[-1], str) and names[-1] else None
    except (OSError, ValueError, IndexError, AttributeError, SyntaxError, MemoryError):
        return None  # unreadable, not UTF-8, a line not the pointer's, no name


def _has_files(path):
    """Whether the checkpoint `path` has its index and a data file."""
    folder, base = os.path.split(path)
    try:
        return os.path.isfile(path + ".index") and any(
            n.startswith(base + ".data-") for n in os.listdir(folder))
    except OSError:
        return False


def kept_text(output_dir):
    """What a stopped run leaves on disk, for its last line: the newest checkpoint in the run's
    --output_dir by name, or that there is none; either way, the same command with --resume
    goes on (with no checkpoint it starts afresh; without --resume it would refuse a folder
    that holds the stopped run's log). output_dir None: a process that writes no run
    (evaluate.py), or one stopped before it knew its run: the same command again."""
    if not output_dir:
        return "nothing was written: rerun the same command"
    folder = checkpoint_folder(output_dir)
    newest = newest_checkpoint(folder)
    if newest:
        return f"the newest checkpoint, {newest}, is kept: rerun with --resume to continue from it"
    return (f"no checkpoint was saved yet in {folder}: rerun the same command with --resume to "
            "start afresh")


def _pointer_format():
    """(protobuf's text_format, TensorFlow's CheckpointState): how TensorFlow's CheckpointManager
    parses and writes a pointer file (it has no public parser that says why a file does not
    parse); imported here, as the module of the message loads all of TensorFlow."""
    from google.protobuf import text_format
    from tensorflow.python.training.checkpoint_state_pb2 import CheckpointState
    return text_format, CheckpointState


def listed(folder):
    """The checkpoints the pointer file in `folder` lists, oldest first ([] without one). Where
    the pointer is damaged, or missing beside checkpoints, a warning line names it and the
    checkpoints are taken by their files (each is read whole or skipped as damaged after)."""
    damage = pointer_damage(folder)
    if damage:
        found = checkpoint_files(folder)
        print(f"warning: {os.path.join(folder, POINTER)} {damage}; taking the checkpoints there "
              f"by their files instead: {', '.join(map(os.path.basename, found)) or 'none'}",
              file=sys.stderr, flush=True)
        return found
    state = read_pointer(folder)
    if state is None:
        return []
    names = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    return [os.path.join(folder, name) for name in names]  # as TensorFlow reads them


def read_pointer(folder):
    """The pointer file of `folder` parsed as TensorFlow does (a CheckpointState); None without
    one. Raises ValueError (or OSError) saying what is wrong with a damaged one."""
    text_format, checkpoint_state = _pointer_format()
    try:
        with open(os.path.join(folder, POINTER), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if not raw.strip():
        raise ValueError("is empty")
    try:
        state = text_format.Merge(raw.decode("utf-8"), checkpoint_state())
    except UnicodeDecodeError:
        raise ValueError("is not text") from None
    except text_format.ParseError as e:
        raise ValueError(f"does not parse ({first_line(e)})") from None
    if not state.model_checkpoint_path:
        raise ValueError("names no checkpoint")
    return state


def pointer_damage(folder):
    """What is wrong with the pointer file of `folder`, for a line ("is empty", say); None if it
    reads and every checkpoint it names is there, or if there is neither a pointer nor a
    checkpoint there."""
    try:
        state = read_pointer(folder)
        if state is None:
            return "is missing beside checkpoints" if checkpoint_files(folder) else None
    except ValueError as e:
        return str(e)
    except OSError as e:
        return f"cannot be read ({os_reason(e)})"
    # a checkpoint deleted by hand, or by TensorFlow's manager in a save a kill cut short (it
    # deletes the oldest before it rewrites the pointer): the others it lists may be older than
    # ones there that it does not list
    names = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
    problems = {n: name_problem(folder, n) for n in names}
    elsewhere = [n for n in names if problems[n] == "outside"]
    if elsewhere:
        return f"names {', '.join(elsewhere)}, outside {folder}"
    gone = [n for n in names if problems[n] == "gone"]
    if gone:
        return f"names {', '.join(gone)}, which {'is' if len(gone) == 1 else 'are'} not there"
    return None


def name_problem(folder, name):
    """Why the checkpoint a pointer in `folder` names by `name` is not one of that folder's:
    "outside" (an absolute path or a pointer copied from another run: TensorFlow would resume
    from that run's checkpoint and delete its old ones as this run saves), "gone" (its index
    file is not there); None where it is."""
    path = os.path.join(folder, name)
    try:
        if os.path.realpath(os.path.dirname(path)) != os.path.realpath(folder):
            return "outside"
    except (ValueError, UnicodeError):  # a name no path can have (a NUL byte, a lone surrogate)
        return "gone"
    return None if os.path.exists(path + ".index") else "gone"


def checkpoint_files(folder):
    """The checkpoints in `folder` by their index files, oldest (lowest number) first."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    numbers = sorted(int(m.group(1)) for m in map(CHECKPOINT_FILE.match, names) if m)
    return [os.path.join(folder, f"ckpt-{n}") for n in numbers]


def write_pointer(folder, paths):
    """The pointer file of `folder` listing the checkpoints `paths` (oldest first) as
    TensorFlow's manager writes it: their names, each with its index file's time, all after the
    last preserved time, so that the manager keeps counting them; without any, no pointer."""
    text_format, checkpoint_state = _pointer_format()
    target = os.path.join(folder, POINTER)
    if not paths:
        os.remove(target)
        return
    times = [os.path.getmtime(p + ".index") for p in paths]
    names = [os.path.basename(p) for p in paths]
    state = checkpoint_state(model_checkpoint_path=names[-1], all_model_checkpoint_paths=names,
                             all_model_checkpoint_timestamps=times,
                             last_preserved_timestamp=min(times) - 1)
    ptb.write_whole(target, text_format.MessageToString(state))
