"""A run's checkpoint folders and their pointer files (TensorFlow's `checkpoint`, which lists the
checkpoints saved beside it): what they list, what is wrong with a damaged one, one written
anew, and the newest checkpoint, which a stopped run's last line names (kept_text).

Loaded without TensorFlow, as utils/cli.py's stop lines and the watchdog's thread are: those
read a pointer by hand (newest_checkpoint); the parser of the others is TensorFlow's message,
imported when a pointer is first parsed or written (by utils/checkpoints.py and evaluate.py,
which have TensorFlow loaded already)."""
import ast
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
    """The newest checkpoint's path in a run's checkpoint folder, from the pointer files and the
    files alone (no TensorFlow: the watchdog's thread calls it while the main thread is stuck;
    it never raises): of the checkpoint each folder's pointer names, the epoch ends' or the
    in-epoch one, the one saved last by the time its pointer records (a copy of the run folder
    changes the files' times, not those), else its index file's; where a pointer is missing,
    damaged, or names a file that is gone or outside its folder (name_problem), the highest
    numbered checkpoint of its folder, as the resume takes them by their files; None if there is
    none. A checkpoint is passed over only where its index or data files are missing: damage
    inside the files takes TensorFlow to see (the resume then warns and takes the one before)."""
    found = [c for c in map(_newest_in, (folder, os.path.join(folder, IN_EPOCH))) if c]
    return max(found, key=lambda found: found[1])[0] if found else None


def _newest_in(folder):
    """(path, save time) of the checkpoint in `folder` (not below it) that a resume would take
    first (newest_checkpoint), or None."""
    name, saved = _named_by_pointer(folder)
    if name is not None and not name_problem(folder, name) and \
            _has_files(os.path.join(folder, name)):
        path = os.path.join(folder, name)
    else:  # as listed() takes them: by their files, the highest number furthest in training
        whole = [p for p in checkpoint_files(folder) if _has_files(p)]
        if not whole:
            return None
        path, saved = whole[-1], None
    try:
        return path, saved if saved is not None else os.path.getmtime(path + ".index")
    except OSError:  # deleted meanwhile
        return None


POINTER_LINE = re.compile(r"\s*(model_checkpoint_path|all_model_checkpoint_paths|"
                          r"all_model_checkpoint_timestamps|last_preserved_timestamp)"
                          r"\s*:\s*(.+?)\s*")


def _named_by_pointer(folder):
    """(the name the pointer of `folder` gives its newest checkpoint, the save time it records
    for it or None), read by hand as TensorFlow writes it; (None, None) where there is no
    pointer or it does not read as one (the resume then takes the files too)."""
    pointer = os.path.join(folder, POINTER)
    try:
        if not os.path.isfile(pointer):  # none, or a folder, a pipe, a device: never read
            return None, None
        with open(pointer, "rb") as f:
            text = f.read(1 << 20).decode("utf-8")
        fields = {}
        for line in filter(str.strip, text.splitlines()):
            key, value = POINTER_LINE.fullmatch(line).groups()
            fields.setdefault(key, []).append(
                ast.literal_eval(value) if key.endswith(("path", "paths")) else float(value))
        name = fields["model_checkpoint_path"][-1]
        paths = fields.get("all_model_checkpoint_paths", [])
        times = fields.get("all_model_checkpoint_timestamps", [])
        saved = times[paths.index(name)] if name in paths and len(times) == len(paths) else None
        return (name, saved) if isinstance(name, str) and name else (None, None)
    except (OSError, ValueError, KeyError, AttributeError, SyntaxError, MemoryError):
        return None, None  # unreadable, not UTF-8, a line not the pointer's, no name


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
    that holds the stopped run's log). output_dir None: a process stopped before it knew its
    run."""
    folder = checkpoint_folder(output_dir) if output_dir else None
    newest = newest_checkpoint(folder) if folder else None
    if newest:
        return f"the newest checkpoint, {newest}, is kept: rerun with --resume to continue from it"
    where = f" in {folder}" if folder else ""
    return (f"no checkpoint was saved yet{where}: rerun the same command with --resume to "
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
    if os.path.realpath(os.path.dirname(path)) != os.path.realpath(folder):
        return "outside"
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
