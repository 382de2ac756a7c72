"""A run's log, one greppable format for every trainer: its lines on stdout (PREFIX) and its
events in metrics.jsonl (RunLog), read back for a resume and for --baseline. The checkpoints
and their pointer files are utils/checkpoints.py's and utils/pointers.py's."""
import json
import math
import os
import resource
import shutil
import statistics
import time

from utils import schedule
from utils.errors import ConfigError, OutputError, os_reason

PREFIX = "[ptb]"


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
    epochs = [e for e in baseline_events(path) if e.get("event") == "epoch"]
    if not epochs:
        raise ConfigError(f"--baseline {path} has no epoch events; let the lm_ptb.py run "
                          "finish at least one epoch")
    for event in epochs:
        check_baseline_epoch(path, event)
    if cfg is not None:
        check_baseline(path, epochs, cfg)
    return {e["epoch"]: whole_epoch_s(e) for e in epochs}


def baseline_events(path):
    """The events of a --baseline file, each a JSON object; a last line cut short (a run
    stopped while it wrote it) is left out, any other line that is not an event refused."""
    fix = "pass the metrics.jsonl of an lm_ptb.py run"
    try:
        with open(path, encoding="utf-8") as f:
            lines = [(number, line) for number, line in enumerate(f, 1) if line.strip()]
    except (OSError, ValueError) as e:
        raise ConfigError(f"--baseline {path}: cannot read it ({e}); {fix}") from None
    events = []
    for i, (number, line) in enumerate(lines):
        event = parse_line(line)
        if event is None and i == len(lines) - 1 and not line.endswith("\n"):
            break  # cut short while being written
        if not isinstance(event, dict):
            raise ConfigError(f"--baseline {path}: line {number} is not an event of a run's log "
                              f"({line.strip()[:40]!r}); {fix}")
        events.append(event)
    return events


def check_baseline_epoch(path, event):
    """One line refusing an epoch event of a --baseline without the numbers it is read for:
    positive and finite (a time of 0 would print a speed-up of 0.00x), whole where counted."""
    def positive(value, whole):
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and math.isfinite(value) and value > 0 and (not whole or value == int(value)))
    needed = [("epoch", True), ("epoch_time_s", False)]
    if event.get("steps_run") is not None:  # resumed inside it: scaled to its whole
        needed += [("steps_run", True), ("steps", True)]
    if "world_size" in event:
        needed.append(("world_size", True))
    wrong = [key for key, whole in needed if not positive(event.get(key), whole)]
    if wrong:
        raise ConfigError(
            f"--baseline {path}: an epoch event whose "
            + ", ".join(f"{key} ({event.get(key, 'missing')!r})" for key in wrong)
            + f" {'is not a positive number' if len(wrong) == 1 else 'are not positive numbers'}"
            "; pass the metrics.jsonl of an lm_ptb.py run, as that run wrote it")
    if "config" in event and not isinstance(event["config"], dict):
        raise ConfigError(f"--baseline {path}: an epoch event whose config is not a mapping "
                          f"({event['config']!r:.40}); pass the metrics.jsonl of an lm_ptb.py "
                          "run, as that run wrote it")
    event["epoch"] = int(event["epoch"])


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
    """One event of metrics.jsonl, or None for a blank line, one cut short by a crash of a
    version that wrote lines in pieces, or one damaged otherwise (not an event object)."""
    try:
        event = json.loads(line) if line.strip() else None
    except ValueError:
        return None
    return event if isinstance(event, dict) and "event" in event else None


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

    def _keep_the_epochs_dropped(self, events, epochs_done):
        """A resume from a checkpoint older than the log's last epoch (the newer ones damaged or
        deleted) trains those epochs again and rewrites their lines: the log as it was is first
        copied beside it (metrics.jsonl.before-resume, numbered if taken), and a line says so."""
        later = sorted({e["epoch"] for e in events if e["event"] == "epoch" and
                        e["epoch"] > epochs_done})
        if not later:
            return
        copy, n = self.path + ".before-resume", 1
        while os.path.exists(copy):
            n += 1
            copy = f"{self.path}.before-resume-{n}"
        try:
            shutil.copyfile(self.path, copy)
        except OSError as e:
            raise OutputError(f"cannot keep {self.path} as {copy} before the resume rewrites it "
                              f"({os_reason(e)}); it is unchanged; free space, then rerun with "
                              "--resume") from None
        again = (f"epoch {later[0]} trains again and its lines are" if len(later) == 1 else
                 f"epochs {later[0]}-{later[-1]} train again and their lines are")
        print(f"{PREFIX} --resume: the checkpoint comes before the end of epoch {later[0]}, so "
              f"{again} rewritten; the log as it was is kept in {copy}", flush=True)

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
        with open(self.path, encoding="utf-8", errors="replace") as f:  # as Checkpoints reads it
            events = [e for e in map(parse_line, f) if e]
        kept = [e for e in events if e["event"] == "reset" or e["event"] != "test" and (
            e["epoch"] <= epochs_done or
            e["epoch"] == epochs_done + 1 and e["event"] == "progress" and e["step"] <= step)]
        self._keep_the_epochs_dropped(events, epochs_done)
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
