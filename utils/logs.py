"""One greppable log format for both trainers, metrics.jsonl, and the error exit."""
import json
import os
import re
import resource
import statistics
import time

from utils import schedule
from utils.errors import ConfigError, OutputError

PREFIX = "[ptb]"
IN_EPOCH = "steps"  # subfolder of the checkpoints saved inside an epoch


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


def format_duration(seconds):
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def whole_epoch_s(epoch):
    """An epoch's seconds (its event, or the stats of train_epoch); for one resumed inside it
    from a step checkpoint, whose time is that of the steps run since, scaled to all its steps."""
    ran = epoch.get("steps_run")
    return epoch["epoch_time_s"] * epoch["steps"] / ran if ran else epoch["epoch_time_s"]


# The config keys that set a training epoch's work: its steps, the size and cost of each. A
# baseline under other values timed another model's epochs; the others (Horovod's options, the
# schedule, the checkpoints' cadence) are what a comparison is about, or leave the work as it is.
EPOCH_WORK = ("model", "hidden_size", "num_layers", "num_steps", "batch_size", "steps_per_epoch",
              "backward_passes_per_step", "keep_prob", "precision")


def load_baseline(path, cfg=None):
    """epoch -> seconds of the whole epoch, from a single-process run's metrics.jsonl; with the
    run's config `cfg`, refused where the baseline's epochs are another config's or are not of
    one process (check_baseline)."""
    try:
        with open(path) as f:
            events = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise ConfigError(f"--baseline {path}: cannot read it ({e}); pass the metrics.jsonl "
                          "of an lm_ptb.py run") from None
    epochs = [e for e in events if e.get("event") == "epoch"]
    if not epochs:
        raise ConfigError(f"--baseline {path} has no epoch events; let the lm_ptb.py run "
                          "finish at least one epoch")
    if cfg is not None:
        check_baseline(path, epochs, cfg)
    return {e["epoch"]: whole_epoch_s(e) for e in epochs}


def check_baseline(path, epochs, cfg):
    """One line refusing a baseline whose epochs ran on more than one worker, or under other
    values of EPOCH_WORK than the run's config `cfg` (a key a logged config lacks counts at its
    default)."""
    from utils.config import DEFAULTS
    workers = sorted({e.get("world_size", 1) for e in epochs} - {1})
    if workers:
        raise ConfigError(f"--baseline {path} is a run of {workers[0]} workers; pass the "
                          "metrics.jsonl of a single-process run (lm_ptb.py) of this config")
    ours = {**DEFAULTS, **cfg}
    for event in (e for e in epochs if "config" in e):  # every line since configs were logged
        theirs = {**DEFAULTS, **event["config"]}
        differ = [k for k in EPOCH_WORK if theirs.get(k) != ours.get(k)]
        if differ:
            name = theirs.get("name", "a config")
            raise ConfigError(
                f"--baseline {path} is a run of {name}, whose "
                + ", ".join(f"{k} {theirs.get(k)!r}" for k in differ)
                + f" differ from this run's {cfg.get('name', 'config')} ("
                + ", ".join(f"{k} {ours.get(k)!r}" for k in differ)
                + "): its epochs are another model's work; pass the metrics.jsonl of an "
                "lm_ptb.py run of this config")


def peak_rss_mb():
    """Peak resident memory of this process so far. VmHWM, not getrusage's ru_maxrss, which
    on Linux keeps the peak of the parent's image from before exec (a benchmark's, say)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def parse_line(line):
    """One event of metrics.jsonl, or None for a blank line or one cut short by a crash of a
    version that wrote lines in pieces."""
    try:
        return json.loads(line) if line.strip() else None
    except ValueError:
        return None


def append_whole_line(path, line):
    """Append one line with a single write; if the disk takes only part of it, cut the file
    back, so that every line of the file is whole."""
    data = line.encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            if os.write(fd, data) != len(data):
                raise OSError(28, "No space left on device (short write)", path)
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def check_writable(folder, flag="--output_dir"):
    """Fail early if `folder` (given as `flag`) cannot be created or written, without creating
    anything yet."""
    probe = os.path.abspath(folder)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {folder} is not writable ({probe} is not a writable "
                          f"folder); choose another {flag}")


RUN = {"checkpoints": None}  # the checkpoint folder of this process's run (utils/checkpoints.py)


def newest_checkpoint(folder):
    """The newest checkpoint's path in a run's checkpoint folder, from the pointer files alone
    (no TensorFlow: the watchdog's thread calls it while the main thread is stuck): the epoch
    ends' pointer or the in-epoch one, whichever was written last; None if neither exists."""
    newest, newest_time = None, None
    for pointer in (os.path.join(folder, "checkpoint"),
                    os.path.join(folder, IN_EPOCH, "checkpoint")):
        try:
            with open(pointer) as f:
                name = f.readline().split('"')[1]
            written = os.path.getmtime(pointer)
        except (OSError, IndexError, ValueError):  # none, or damaged: not text, no name
            continue
        if newest_time is None or written > newest_time:
            newest, newest_time = os.path.join(os.path.dirname(pointer), name), written
    return newest


def kept_text(output_dir=None):
    """What a stopped run leaves on disk, for its last line: the newest checkpoint by name, or
    that there is none; either way, the same command with --resume goes on. output_dir: the
    run's folder, where this process has no Checkpoints (yet)."""
    folder = RUN["checkpoints"] or (output_dir and os.path.join(output_dir, "checkpoints"))
    newest = newest_checkpoint(folder) if folder else None
    if newest:
        return f"the newest checkpoint, {newest}, is kept: rerun with --resume to continue from it"
    where = f" in {folder}" if folder else ""
    return (f"no checkpoint was saved yet{where}: rerun the same command (--resume or not) to "
            "start afresh")


def workers_text(steps, workers):
    return f"{steps} steps of {workers} worker{'s' * (workers != 1)}"


class RunLog:
    """Progress lines on stdout and events in <output_dir>/metrics.jsonl (chief only)."""

    def __init__(self, output_dir, config_name, cfg, world_size, enabled=True, baseline=None):
        self.enabled = enabled
        self.world_size = world_size
        self.config = dict(cfg, name=config_name)
        self.num_epochs = cfg["num_epochs"]
        self.baseline = load_baseline(baseline, self.config) if baseline else None
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self._summaries = None
        if enabled:
            check_writable(output_dir)

    def _write(self, line, **event):
        if not self.enabled:
            return
        print(f"{PREFIX} {line}", flush=True)
        event.update(world_size=self.world_size, config=self.config, time=time.time())
        try:
            os.makedirs(self.output_dir, exist_ok=True)
            append_whole_line(self.path, json.dumps(event) + "\n")
        except OSError as e:
            raise OutputError(f"cannot write {self.path} ({os_reason(e)}); the lines before "
                              "this one are whole and the checkpoints are kept; free space, "
                              "then rerun with --resume") from None

    def _scalars(self, step, values):
        """TensorBoard scalars in <output_dir>/tensorboard (`tensorboard --logdir runs`)."""
        if not self.enabled:
            return
        import tensorflow as tf
        try:
            if self._summaries is None:
                self._summaries = tf.summary.create_file_writer(
                    os.path.join(self.output_dir, "tensorboard"))
            with self._summaries.as_default(step=step):
                for tag, value in values.items():
                    tf.summary.scalar(tag, value)
            self._summaries.flush()
        except (OSError, tf.errors.OpError) as e:
            raise OutputError(f"cannot write TensorBoard events in {self.output_dir}/tensorboard "
                              f"({os_reason(e)}); metrics.jsonl and the checkpoints are kept; "
                              "free space, then rerun with --resume") from None

    def resume(self, position, world_sizes=False):
        """--resume from a checkpoints.Position: drop the events after it (the interrupted
        epoch's progress past the checkpoint) and the test result, which the resumed run writes
        again, so that every epoch has one line. The checkpoint is saved before validation, so
        a stop during validation leaves that epoch without its line: then its stats, rebuilt
        from its last progress event, are returned for the line to be written; else None.
        world_sizes: the stats also list the worker counts of the epoch's progress events, in
        order, as lm_ptb_elastic.py's epoch lines do."""
        epochs_done, step = position.epochs_done, position.step
        if not self.enabled or not os.path.exists(self.path):
            return None
        with open(self.path) as f:
            events = [e for e in map(parse_line, f) if e]
        kept = [e for e in events if e["event"] == "reset" or e["event"] != "test" and (
            e["epoch"] <= epochs_done or
            e["epoch"] == epochs_done + 1 and e["event"] == "progress" and e["step"] <= step)]
        try:
            with open(self.path + ".tmp", "w") as f:
                f.writelines(json.dumps(e) + "\n" for e in kept)
            os.replace(self.path + ".tmp", self.path)  # whole, or not at all
        except OSError as e:
            raise OutputError(f"cannot rewrite {self.path} for the resume ({os_reason(e)}); it "
                              "is unchanged; free space, then rerun with --resume") from None
        mine = [e for e in kept if e["epoch"] == epochs_done and e["event"] != "reset"]
        if step or not mine or any(e["event"] == "epoch" for e in mine):
            return None
        last = mine[-1]
        words_per_step = self.config["batch_size"] * self.config["num_steps"]
        stats = {"train_ppl": last["train_ppl"], "wps": last["wps"], "lr": last["lr"],
                 "epoch_time_s": last["step"] * words_per_step / last["wps"],
                 "compute_share": None, "steps": last["step"]}
        if world_sizes:
            sizes = [e["world_size"] for e in mine]
            stats["world_sizes"] = [n for i, n in enumerate(sizes) if i == 0 or sizes[i - 1] != n]
        return stats

    def info(self, line):
        """A line on stdout from the chief; None writes nothing."""
        if self.enabled and line:
            print(f"{PREFIX} {line}", flush=True)

    def progress(self, epoch, step, steps, lr, train_ppl, wps, eta_s, loss):
        """`loss`: mean per-token loss of the steps since the previous progress line."""
        self._write(f"epoch {epoch + 1}/{self.num_epochs} | step {step}/{steps} | lr {lr:.4g} | "
                    f"train ppl {train_ppl:.2f} | {wps:.0f} wps | eta {format_duration(eta_s)}",
                    event="progress", epoch=epoch + 1, step=step, lr=lr, train_ppl=train_ppl,
                    wps=wps, loss=loss, eta_s=eta_s)
        self._scalars(epoch * steps + step, {"train/perplexity": train_ppl, "train/lr": lr,
                                             "train/words_per_sec": wps})

    def epoch(self, epoch, step, lr, stats, valid_ppl):
        t = stats["epoch_time_s"]
        # resumed inside the epoch: its time is that of the steps run since (whole_epoch_s)
        ran, steps = stats.get("steps_run"), stats.get("steps")
        inside = ran is not None and ran < steps
        timing = f"time {t:.1f} s" + (f" for its last {ran} of {steps} steps" if inside else "")
        if self.baseline:
            base = self.baseline.get(epoch + 1, statistics.median(self.baseline.values()))
            speedup = base / whole_epoch_s(stats)
            timing += f" (single-process {base:.1f} s, speedup {speedup:.2f}×)"
        share = stats["compute_share"]  # None for an epoch whose line a resume writes
        sizes = stats.get("world_sizes")  # lm_ptb_elastic.py: the worker counts it ran at
        rolled = stats.get("rolled_back") or []  # the work resets discarded: (workers, steps)
        rolled_text = ", ".join(workers_text(steps, n) for n, steps in rolled)
        self._write(f"epoch {epoch + 1}/{self.num_epochs} done | lr {lr:.4g} | "
                    f"train ppl {stats['train_ppl']:.2f} | valid ppl {valid_ppl:.2f} | {timing} | "
                    f"{stats['wps']:.0f} wps" + (f" | computing {100 * share:.0f}%" if share else "")
                    + (f" | workers {' then '.join(map(str, sizes))}" if sizes else "")
                    + (f" | rolled back by resets: {rolled_text}" if rolled else ""),
                    event="epoch", epoch=epoch + 1, step=step, lr=lr,
                    train_ppl=stats["train_ppl"], wps=stats["wps"], valid_ppl=valid_ppl,
                    epoch_time_s=t, compute_share=stats["compute_share"], peak_rss_mb=peak_rss_mb(),
                    **({"world_sizes": list(sizes)} if sizes else {}),
                    **({"steps_run": ran, "steps": steps} if inside else {}),
                    **({"rolled_back": [{"workers": n, "steps": s} for n, s in rolled]}
                       if rolled else {}))
        self._scalars(step, {"valid/perplexity": valid_ppl,
                             "epoch/train_perplexity": stats["train_ppl"],
                             "epoch/time_s": t, "epoch/words_per_sec": stats["wps"]})

    def reset(self, change):
        """lm_ptb_elastic.py, after a lost or added worker: an elastic_membership.Membership.start()."""
        hosts = [f"{what} {', '.join(change[what])}" for what in ("lost", "added") if change[what]]
        rolled = change["rolled_back_steps"]
        self._write(" | ".join(
            [f"reset | workers {change['workers_before']} → {change['workers_after']}", *hosts]
            + ([f"{workers_text(rolled, change['workers_before'])} rolled back"] if rolled else [])
            + [f"again from epoch {change['epoch']} step {change['step']}"]),
            event="reset", **change)

    def test(self, step, stats, test_ppl):
        """The test perplexity after the last epoch; stats: that epoch's (None when the run
        resumed after it, for the test alone)."""
        epochs = self.num_epochs
        lr = schedule.learning_rate(self.config, epochs - 1, self.world_size)
        self._write(f"test ppl {test_ppl:.2f} | after {epochs} epoch{'s' if epochs > 1 else ''}",
                    event="test", epoch=epochs, step=step, lr=lr,
                    train_ppl=stats and stats["train_ppl"], wps=stats and stats["wps"],
                    test_ppl=test_ppl)
        self._scalars(step, {"test/perplexity": test_ppl})
