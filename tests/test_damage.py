"""A run's folder damaged, or given what cannot be used: every reader of a checkpoint (the resume,
the checks it makes before restoring, evaluate.py's three commands) names a damaged newest one
in a line and takes the one before it; a resume without checkpoints keeps the log of the epochs
they held; an unreadable vocab.txt or data_path.txt, an unusable --export_dir and a baseline of
another config are one line each; a resume stopped before it reads the checkpoints names the
newest. One tiny run is trained; each case runs on a copy of it, damaged, and all of them in two
processes (tests/bad_input_runner.py), one per Keras; the 2-rank resume is a job."""
import json
import os
import random
import re
import shutil
import signal
import time

import pytest

from tests.helpers import IS_ROOT, TINY, mpirun, read_only_folder, run_script
from tests.test_faults import assert_error_line, snapshot
from utils.config import load_config
from utils.pointers import (checkpoint_files, kept_text, newest_checkpoint, pointer_damage,
                            write_pointer)

RUN_ARGS = ["--config", TINY, "--set", "steps_per_epoch=10", "--set", "eval_steps=2",
            "--set", "checkpoint_every=4"]
# what the trained run's checkpoints are (by hand: 10 steps an epoch, a save every 4 inside one,
# numbered by the optimizer's step; the last 3 epoch ends and the last 2 saves inside kept)
NEWEST, BEFORE_IT = "ckpt-3", "steps/ckpt-28"
BEFORE_IT_WHERE = "steps/ckpt-28, epoch 3 step 8"
DATA = "ckpt-3.data-00000-of-00001"
GARBAGE = random.Random(88).randbytes(64)  # "64 random bytes", the same in every run


def overwrite(path, content=GARBAGE):
    with open(path, "wb") as f:
        f.write(content)


def cut_in_half(path):
    os.truncate(path, os.path.getsize(path) // 2)


def remove_newest(ck):
    for name in os.listdir(ck):
        if name.startswith(NEWEST + "."):
            os.remove(os.path.join(ck, name))


def empty_folder(ck):
    shutil.rmtree(ck)
    os.mkdir(ck)


def pointer_into_a_copy(ck):
    """The pointer of `ck` naming, by absolute paths, the checkpoints of a copy of `ck` beside it,
    whose files must stay as they are."""
    other = ck + "-other"
    shutil.copytree(ck, other)
    names = [os.path.join(other, f"ckpt-{n}") for n in (1, 2, 3)]
    overwrite(os.path.join(ck, "checkpoint"), "".join(
        [f'model_checkpoint_path: "{names[-1]}"\n'] +
        [f'all_model_checkpoint_paths: "{name}"\n' for name in names]).encode())


# kind -> (how the copy's checkpoints folder is damaged, the checkpoint every reader then takes)
DAMAGE = {
    "data file overwritten": (lambda ck: overwrite(os.path.join(ck, DATA)), BEFORE_IT),
    "index overwritten": (lambda ck: overwrite(os.path.join(ck, NEWEST + ".index")), BEFORE_IT),
    "pointer names files that are gone": (remove_newest, BEFORE_IT),
    # the files of ckpt-3 there, its pointer naming only a ckpt-4 that is not: once read as
    # the pointer listed it, ckpt-4 alone, damaged, and steps/ckpt-28 taken, an older state
    "pointer names only a checkpoint not there": (
        lambda ck: overwrite(os.path.join(ck, "checkpoint"),
                             b'model_checkpoint_path: "ckpt-4"\n'
                             b'all_model_checkpoint_paths: "ckpt-4"\n'), NEWEST),
    # its checkpoints named by absolute paths into a copy of the run beside it (a pointer
    # copied from another run): once resumed from that run's ckpt-3, deleting its ckpt-1
    "pointer names another run's checkpoints": (lambda ck: pointer_into_a_copy(ck), NEWEST),
    "pointer empty": (lambda ck: overwrite(os.path.join(ck, "checkpoint"), b""), NEWEST),
    "pointer not text": (lambda ck: overwrite(os.path.join(ck, "checkpoint")), NEWEST),
    "in-epoch pointer cut, data file overwritten": (
        lambda ck: (cut_in_half(os.path.join(ck, "steps", "checkpoint")),
                    overwrite(os.path.join(ck, DATA))), BEFORE_IT),
}
# the warning lines each kind gives, before the words that say what is taken instead
WARNINGS = {
    "data file overwritten": [rf"checkpoint {{ck}}/{NEWEST} is damaged \(.+\)"],
    "index overwritten": [rf"checkpoint {{ck}}/{NEWEST} is damaged \(.+\)"],
    "pointer names files that are gone": [],
    "pointer names only a checkpoint not there": [],
    "pointer names another run's checkpoints": [],
    "pointer empty": [],
    "pointer not text": [],
    "in-epoch pointer cut, data file overwritten": [
        rf"checkpoint {{ck}}/{NEWEST} is damaged \(.+\)"],
}
POINTER_WARNINGS = {
    "pointer names another run's checkpoints":
        r"warning: {ck}/checkpoint names .+-other/ckpt-1, .+-other/ckpt-2, .+-other/ckpt-3, "
        r"outside {ck}; taking the checkpoints there by their files instead: ckpt-1, ckpt-2, "
        r"ckpt-3",
    "pointer names files that are gone":
        r"warning: {ck}/checkpoint names ckpt-3, which is not there; taking the checkpoints "
        r"there by their files instead: ckpt-1, ckpt-2",
    "pointer names only a checkpoint not there":
        r"warning: {ck}/checkpoint names ckpt-4, which is not there; taking the checkpoints "
        r"there by their files instead: ckpt-1, ckpt-2, ckpt-3",
    "pointer empty": r"warning: {ck}/checkpoint is empty; taking the checkpoints there by their "
                     r"files instead: ckpt-1, ckpt-2, ckpt-3",
    "pointer not text": r"warning: {ck}/checkpoint is not text; taking the checkpoints there by "
                        r"their files instead: ckpt-1, ckpt-2, ckpt-3",
    "in-epoch pointer cut, data file overwritten":
        r"warning: {ck}/steps/checkpoint does not parse \(.+\); taking the checkpoints there by "
        r"their files instead: ckpt-24, ckpt-28",
}


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """3 epochs of 10 steps, saved at each end and every 4 steps inside."""
    run = tmp_path_factory.mktemp("damage") / "run"
    r = run_script(["lm_ptb.py", *RUN_ARGS, "--data_path", corpus, "--output_dir", str(run)])
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(os.listdir(run / "checkpoints" / "steps")) == [
        "checkpoint", *(f"ckpt-{n}.{ext}" for n in (24, 28)
                        for ext in ("data-00000-of-00001", "index"))]
    return run


def spoil_a_progress_line(log):
    """A byte that is not UTF-8 (0xff) in place of a space of the log's first progress line."""
    lines = log.read_bytes().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if b'"event": "progress"' in line)
    lines[first] = lines[first].replace(b" ", b"\xff", 1)
    log.write_bytes(b"".join(lines))


def copy_of(trained, root, name, damage=None):
    run = root / re.sub(r"\W+", "-", name)
    shutil.copytree(trained, run)
    if damage:
        damage(str(run / "checkpoints"))
    return run


def evaluate(*argv):
    return {"script": "evaluate", "argv": list(argv)}


def run_cases(cases, root, env=None):
    (root / "cases.json").write_text(json.dumps(cases))
    r = run_script(["tests/bad_input_runner.py", str(root / "cases.json"),
                    str(root / "results.json")], timeout=400, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads((root / "results.json").read_text())


@pytest.fixture(scope="module")
def keras3(trained, corpus, tmp_path_factory):
    """Every Keras 3 case, run in one process: {case: its result}, the folders, and each
    folder's files before the cases that must write nothing."""
    root = tmp_path_factory.mktemp("damaged")
    data = ["--data_path", corpus]
    resume = [*RUN_ARGS, *data, "--resume", "--set", "num_epochs=4"]
    cases, folders = {}, {}
    for kind, (damage, _) in DAMAGE.items():
        run = folders[kind] = copy_of(trained, root, kind, damage)
        # evaluate.py first: it only reads, and the resume writes the pointers anew
        cases[f"{kind}: perplexity"] = evaluate("perplexity", "--run", str(run), *data,
                                                "--eval_steps", "2")
        if kind in ("data file overwritten", "pointer empty"):
            cases[f"{kind}: generate"] = evaluate("generate", "--run", str(run), "--length", "3")
            cases[f"{kind}: export"] = evaluate("export", "--run", str(run), "--export_dir",
                                                str(root / f"{run.name}-exported"))
        cases[f"{kind}: resume"] = ["--output_dir", str(run), *resume]
    # the checks made before a restore, on the one restored: none writes anything
    run = folders["checks"] = copy_of(trained, root, "checks", DAMAGE["data file overwritten"][0])
    for change in ("precision='fp16'", "precision='bf16'", "num_epochs=2"):
        cases[f"resume with {change}"] = [*RUN_ARGS, *data, "--output_dir", str(run), "--resume",
                                          "--set", change]
    # no checkpoint left of the logged epochs
    folders["checkpoints deleted"] = copy_of(trained, root, "checkpoints deleted",
                                             shutil.rmtree)
    folders["checkpoints emptied"] = copy_of(trained, root, "checkpoints emptied", empty_folder)
    for kind in ("checkpoints deleted", "checkpoints emptied"):
        cases[kind] = ["--output_dir", str(folders[kind]), *resume]
    # a byte that is not UTF-8 in a line of the log, with its checkpoints or without them
    for kind, damage in (("log not UTF-8", None), ("log not UTF-8, checkpoints deleted",
                                                   shutil.rmtree)):
        run = folders[kind] = copy_of(trained, root, kind, damage)
        spoil_a_progress_line(run / "metrics.jsonl")
        cases[kind] = ["--output_dir", str(run), *resume]
    # the newest checkpoints deleted, a resume to the epoch of the one left: its own test
    run = folders["only ckpt-2 left"] = copy_of(trained, root, "only ckpt-2 left", lambda ck: (
        remove_newest(ck), shutil.rmtree(os.path.join(ck, "steps"))))
    cases["only ckpt-2 left"] = [*RUN_ARGS, *data, "--output_dir", str(run), "--resume",
                                 "--set", "num_epochs=2"]
    # a new run's folder with damaged pointers and no checkpoint: it starts afresh and saves
    fresh = folders["pointers empty, no checkpoint"] = root / "pointers-empty-no-checkpoint"
    for folder in (fresh / "checkpoints", fresh / "checkpoints" / "steps"):
        folder.mkdir(parents=True)
        (folder / "checkpoint").write_bytes(b"")
    cases["pointers empty, no checkpoint"] = [*RUN_ARGS, *data, "--output_dir", str(fresh),
                                              "--resume", "--set", "num_epochs=1"]
    # a stop before the resume reads the checkpoints (in the model's build)
    run = folders["stopped"] = copy_of(trained, root, "stopped")
    cases["stopped before the checkpoints are read"] = [
        "--output_dir", str(run), *resume, "--set", "model='tests.stop_model:build_terminated'"]
    # vocab.txt unreadable: a folder in its place (what stops root too), or mode 000
    for kind in ("vocab.txt a folder", "vocab.txt mode 000")[:1 if IS_ROOT else 2]:
        run = folders[kind] = copy_of(trained, root, kind)
        vocab = run / "vocab.txt"
        if kind == "vocab.txt a folder":
            vocab.unlink()
            vocab.mkdir()
        else:
            vocab.chmod(0)
        cases[f"{kind}: resume"] = ["--output_dir", str(run), *resume]
        cases[f"{kind}: perplexity"] = evaluate("perplexity", "--run", str(run), *data)
        cases[f"{kind}: generate"] = evaluate("generate", "--run", str(run))
    # data_path.txt unreadable, where perplexity looks for the corpus without --data_path
    for kind in ("data_path.txt a folder", "data_path.txt not UTF-8"):
        run = folders[kind] = copy_of(trained, root, kind)
        recorded = run / "data_path.txt"
        recorded.unlink()
        recorded.mkdir() if kind == "data_path.txt a folder" else recorded.write_bytes(b"\xff\n")
        cases[f"{kind}: perplexity"] = evaluate("perplexity", "--run", str(run))
    # evaluate.py's --data_path: a file, or a folder short of a file (it reads, never fetches)
    (root / "short").mkdir()
    shutil.copy(os.path.join(corpus, "ptb.train.txt"), root / "short")
    for kind, path in (("a file", root / "short" / "ptb.train.txt"), ("short", root / "short")):
        cases[f"perplexity --data_path {kind}"] = evaluate("perplexity", "--run", str(trained),
                                                           "--data_path", str(path))
    # --export_dir: a file, or in a folder that refuses writes
    (root / "a_file").write_text("not a folder")
    cases["export_dir a file"] = evaluate("export", "--run", str(trained), "--export_dir",
                                          str(root / "a_file"))
    # --baseline: a log of config_medium, of 2 workers, and of this config
    medium = {"name": "config_medium", **load_config("config_medium")}
    tiny = json.loads((trained / "metrics.jsonl").read_text().splitlines()[0])["config"]
    for name, config, workers in (("medium", medium, 1), ("2 workers", tiny, 2)):
        (root / f"{name}.jsonl").write_text(json.dumps(
            {"event": "epoch", "epoch": 1, "epoch_time_s": 100.0, "world_size": workers,
             "config": config}) + "\n")
        cases[f"baseline of {name}"] = [*RUN_ARGS, *data, "--output_dir", str(root / name),
                                        "--baseline", str(root / f"{name}.jsonl")]
    cases["baseline of this config"] = [*RUN_ARGS, *data, "--set", "num_epochs=1",
                                        "--output_dir", str(root / "against"),
                                        "--baseline", str(trained / "metrics.jsonl")]
    unchanged = ("checks", "checkpoints deleted", "checkpoints emptied", "stopped",
                 "log not UTF-8, checkpoints deleted",
                 "vocab.txt a folder", "vocab.txt mode 000", "data_path.txt a folder",
                 "data_path.txt not UTF-8")
    before = {kind: snapshot(folders[kind]) for kind in unchanged if kind in folders}
    with read_only_folder(root / "read-only") as read_only:
        cases["export_dir read-only"] = evaluate("export", "--run", str(trained),
                                                 "--export_dir", str(read_only / "exported"))
        results = run_cases(cases, root)
        assert os.listdir(read_only) == []
    assert results.pop("(import)") == {"stdout": "", "stderr": ""}
    return results, folders, before, root


@pytest.fixture(scope="module")
def keras2(trained, corpus, tmp_path_factory):
    """Under tf-keras, the run of Keras 3 with its newest checkpoint's index damaged."""
    root = tmp_path_factory.mktemp("damaged-keras2")
    run = copy_of(trained, root, "run", DAMAGE["index overwritten"][0])
    before = snapshot(run)
    results = run_cases({"resume": [*RUN_ARGS, "--data_path", corpus, "--output_dir", str(run),
                                    "--resume"],
                         "perplexity": evaluate("perplexity", "--run", str(run))}, root,
                        env={"PTB_KERAS": "2"})
    return results, run, before


def lines(text, start):
    return [line for line in text.splitlines() if line.startswith(start)]


def expected_warnings(kind, ck, instead):
    """The warning lines of `kind`, as patterns, `instead` closing each damaged checkpoint's."""
    pointer = [POINTER_WARNINGS[kind].format(ck=ck)] if kind in POINTER_WARNINGS else []
    return pointer + [f"warning: {w.format(ck=ck)}; {instead}" for w in WARNINGS[kind]]


def assert_lines_match(got, patterns, shown):
    assert len(got) == len(patterns), shown
    for line, pattern in zip(got, patterns):
        assert re.fullmatch(pattern, line), (line, pattern)


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_named_and_the_resume_takes_the_one_before_it(kind,
                                                                                      keras3):
    results, folders, _, _ = keras3
    result, run = results[f"{kind}: resume"], folders[kind]
    ck, taken = f"{run}/checkpoints", DAMAGE[kind][1]
    shown = result["stdout"][-2000:] + result["stderr"]
    assert result["status"] == 0 and "Traceback" not in result["stderr"], shown
    assert_lines_match(lines(result["stderr"], "warning: "),
                       expected_warnings(kind, re.escape(ck), f"resuming from {ck}/{taken}"),
                       shown)
    where = "epoch 3 step 8" if taken == BEFORE_IT else "the end of epoch 3"
    assert f"--resume: continuing from {ck}/{taken} ({where})" in result["stdout"], shown
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == [1, 2, 3, 4]
    # from inside epoch 3, its line is written again: the log as it was is kept beside it
    kept = run / "metrics.jsonl.before-resume"
    if taken == BEFORE_IT:
        assert (f"[ptb] --resume: the checkpoint comes before the end of epoch 3, so epoch 3 "
                f"trains again and its lines are rewritten; the log as it was is kept in {kept}"
                ) in result["stdout"], shown
        assert [json.loads(line)["epoch"] for line in kept.read_text().splitlines()
                if '"event": "epoch"' in line] == [1, 2, 3]
    else:
        assert not kept.exists()
    # every pointer reads as TensorFlow reads it, and lists what the resume saved: a pointer
    # written anew kept the checkpoints it found counted (the oldest ones removed since)
    import tensorflow as tf
    for folder, kept in (("", ["ckpt-2", "ckpt-3", "ckpt-4"]), ("steps", ["ckpt-34", "ckpt-38"])):
        state = tf.train.get_checkpoint_state(os.path.join(ck, folder))
        assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == kept, kind
    assert not os.path.exists(os.path.join(ck, "steps", "ckpt-24.index"))
    if os.path.exists(ck + "-other"):  # the other run's files as they were
        assert sorted(n for n in os.listdir(ck + "-other") if n.endswith(".index")) == [
            "ckpt-1.index", "ckpt-2.index", "ckpt-3.index"]


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_evaluate_names_a_damaged_newest_checkpoint_and_takes_the_one_the_resume_takes(kind,
                                                                                      keras3):
    results, folders, _, root = keras3
    ck, taken = f"{folders[kind]}/checkpoints", DAMAGE[kind][1]
    where = BEFORE_IT_WHERE if taken == BEFORE_IT else "ckpt-3, the end of epoch 3"
    warnings = expected_warnings(kind, re.escape(ck), re.escape(f"scoring {where}"))
    for command in ("perplexity", "generate", "export"):
        result = results.get(f"{kind}: {command}")
        if result is None:
            continue
        shown = result["stdout"] + result["stderr"]
        assert result["status"] == 0 and "Traceback" not in shown, shown
        stderr = [line for line in result["stderr"].splitlines()
                  if not line.startswith("checkpoint ")]  # generate's line of what it loaded
        assert_lines_match(stderr, warnings, shown)
        assert f"checkpoint {where} | precision fp32 (the run's)" in shown, shown
    exported = root / f"{folders[kind].name}-exported"
    assert exported.exists() == (f"{kind}: export" in results)


@pytest.mark.parametrize("change, error", [
    ("precision='fp16'", "error: --resume: the run trained in precision='fp32', and a run does "
                         "not change to or from 'fp16'"),
    ("precision='bf16'", "error: --resume: the run was trained with other values of precision "
                         "(precision 'fp32' -> 'bf16')"),
    ("num_epochs=2", "error: --resume: the run has trained 2 epochs and 8 steps, more than "
                     "num_epochs=2")])
def test_the_checks_of_a_resume_read_the_checkpoint_restored_not_a_damaged_newest(
        change, error, keras3):
    """fp16's check before the restore, the config's and the schedule's after it: each refusal
    comes after the line that names the damaged newest and the one read instead, never after
    one that says the resume goes on from it."""
    results, folders, before, _ = keras3
    result, ck = results[f"resume with {change}"], f"{folders['checks']}/checkpoints"
    shown = result["stdout"] + result["stderr"]
    assert result["status"] == 2 and "Traceback" not in shown, shown
    assert len(result["stderr"].splitlines()) == 2, shown  # the damaged one named, the refusal
    warning, line = result["stderr"].splitlines()
    assert re.fullmatch(rf"warning: checkpoint {re.escape(ck)}/{NEWEST} is damaged \(.+\); "
                        rf"reading {re.escape(ck)}/{BEFORE_IT} instead", warning), warning
    assert line.startswith(error), line
    assert snapshot(folders["checks"]) == before["checks"]


def test_under_the_other_keras_a_damaged_newest_is_named_then_the_one_before_it_refused(keras2):
    results, run, before = keras2
    ck = f"{run}/checkpoints"
    for name in ("resume", "perplexity"):
        result = results[name]
        assert len(result["stderr"].splitlines()) == 2, result  # the damaged one, the refusal
        warning, line = result["stderr"].splitlines()
        assert re.fullmatch(rf"warning: checkpoint {re.escape(ck)}/{NEWEST} is damaged \(.+\); "
                            rf"reading {re.escape(ck)}/{BEFORE_IT} instead", warning), warning
        assert_error_line(result["status"], line,
                          f"checkpoint {ck}/{BEFORE_IT} was written by code on Keras 3, and this "
                          "process runs tf-keras", result)
    assert snapshot(run) == before


@pytest.mark.parametrize("kind", ["checkpoints deleted", "checkpoints emptied",
                                  "log not UTF-8, checkpoints deleted"])
def test_a_resume_with_no_checkpoint_of_the_logged_epochs_keeps_the_log(kind, keras3):
    results, folders, before, _ = keras3
    result, run = results[kind], folders[kind]
    assert_error_line(result["status"], result["stderr"],
                      f"--resume: no checkpoint in {run}/checkpoints, but {run}/metrics.jsonl "
                      "records 3 epochs of an earlier run, which a start afresh would overwrite; "
                      "restore its checkpoints to continue it, or move metrics.jsonl aside", result)
    assert snapshot(run) == before[kind]


def test_a_log_line_that_is_not_utf8_is_skipped_as_a_damaged_line(keras3):
    """A byte that is not UTF-8 in one line of metrics.jsonl: the resume read the log as text
    and took the UnicodeDecodeError for a checkpoint that "does not fit this config", and
    without checkpoints it ended in the UnicodeDecodeError's traceback. The line is skipped as a
    line cut short is: the resume goes on to epoch 4, and without checkpoints the log of its 3
    epochs is kept by the refusal (test_a_resume_with_no_checkpoint_..., its third case)."""
    results, folders, _, _ = keras3
    result, run = results["log not UTF-8"], folders["log not UTF-8"]
    assert result["status"] == 0, result
    epochs = [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text(
        "utf-8").splitlines() if '"event": "epoch"' in line]
    assert epochs == [1, 2, 3, 4], epochs


def test_a_resume_to_an_older_checkpoints_epoch_tests_that_model(keras3):
    """3 epochs tested, ckpt-3 and the in-epoch ones deleted, --resume with num_epochs=2: it
    said the run "is finished" with epoch 3's test perplexity, and never tested the model of
    ckpt-2. Now it tests it (the log as it was kept beside)."""
    results, folders, _, _ = keras3
    result, run = results["only ckpt-2 left"], folders["only ckpt-2 left"]
    assert result["status"] == 0 and "is finished" not in result["stdout"], result
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(e["event"], e["epoch"]) for e in events if e["event"] in ("epoch", "test")] == [
        ("epoch", 1), ("epoch", 2), ("test", 2)], events
    assert (run / "metrics.jsonl.before-resume").exists()


def test_damaged_pointers_beside_no_checkpoint_start_afresh_and_save(keras3):
    """Both pointer files empty and no checkpoint (a new run's folder): the resume says so,
    starts afresh and saves its epoch (its first save ended in a traceback, the epoch lost)."""
    results, folders, _, _ = keras3
    kind = "pointers empty, no checkpoint"
    result, ck = results[kind], folders[kind] / "checkpoints"
    assert result["status"] == 0, result
    assert "so this run starts afresh" in result["stdout"] + result["stderr"], result
    assert {"ckpt-1.index", "checkpoint"} <= set(os.listdir(ck)), os.listdir(ck)
    assert "ckpt-8.index" in os.listdir(ck / "steps"), os.listdir(ck / "steps")


def test_a_stop_before_the_checkpoints_are_read_names_the_newest_one(keras3):
    """The trainer gives its --output_dir to the stop line first thing (cli.report_stops), not
    as its checkpoints are made: a resume stopped before that names what is kept all the same."""
    results, folders, before, _ = keras3
    result, run = results["stopped before the checkpoints are read"], folders["stopped"]
    assert result["status"] == 128 + signal.SIGTERM, result
    assert result["stderr"].strip() == (
        f"error: stopped by SIGTERM; the newest checkpoint, {run}/checkpoints/{NEWEST}, is kept: "
        "rerun with --resume to continue from it"), result
    assert snapshot(run) == before["stopped"]


@pytest.mark.parametrize("kind", ["vocab.txt a folder", "vocab.txt mode 000"])
def test_an_unreadable_vocab_txt_is_one_line(kind, keras3):
    if IS_ROOT and kind == "vocab.txt mode 000":
        pytest.skip("root reads a file of mode 000; the folder in its place stops it instead")
    results, folders, before, _ = keras3
    run = folders[kind]
    reason = "Is a directory" if kind == "vocab.txt a folder" else "Permission denied"
    for command in ("resume", "perplexity", "generate"):
        result = results[f"{kind}: {command}"]
        assert_error_line(result["status"], result["stderr"],
                          f"cannot read the run's vocabulary {run}/vocab.txt ({reason}); make it "
                          "readable, or move it away", result)
    assert snapshot(run) == before[kind]


@pytest.mark.parametrize("kind, reason", [("data_path.txt a folder", "Is a directory"),
                                          ("data_path.txt not UTF-8",
                                           "not UTF-8 text, bad byte at offset 0")])
def test_an_unreadable_data_path_txt_is_one_line(kind, reason, keras3):
    results, folders, before, _ = keras3
    run = folders[kind]
    result = results[f"{kind}: perplexity"]
    assert_error_line(result["status"], result["stderr"],
                      f"cannot read {run}/data_path.txt, the run's record of its data folder "
                      f"({reason}); make it readable, or pass --data_path", result)
    assert snapshot(run) == before[kind]


def test_evaluates_data_path_a_file_or_short_of_a_file_is_one_line_naming_it(keras3):
    """It was "cannot read .../ptb.train.txt/ptb.train.txt: Not a directory", with no fix."""
    results, _, _, root = keras3
    for kind, what in (("a file", "a file, not a folder"),
                       ("short", "a folder without ptb.valid.txt, ptb.test.txt")):
        path = root / "short" / ("ptb.train.txt" if kind == "a file" else "")
        result = results[f"perplexity --data_path {kind}"]
        assert_error_line(result["status"], result["stderr"],
                          f"--data_path {str(path).rstrip('/')} is {what}; pass the folder of "
                          "ptb.train.txt, ptb.valid.txt, ptb.test.txt the run trained on", result)


def test_an_unusable_export_dir_is_one_line(keras3):
    results, _, _, root = keras3
    for kind, probe in (("export_dir a file", root / "a_file"),
                        ("export_dir read-only", root / "read-only")):
        result = results[kind]
        assert_error_line(result["status"], result["stderr"],
                          f"is not writable ({probe} is not a writable folder); choose another "
                          "--export_dir", result)
    assert (root / "a_file").read_text() == "not a folder"


def test_a_baseline_of_another_config_or_of_two_workers_is_refused_in_one_line(keras3):
    results, _, _, root = keras3
    result = results["baseline of medium"]
    assert_error_line(result["status"], result["stderr"],
                      f"--baseline {root}/medium.jsonl is a run of config_medium, whose "
                      "hidden_size 650, num_steps 35, steps_per_epoch None, keep_prob 0.5 differ "
                      f"from this run's {TINY} (hidden_size 32, num_steps 10, steps_per_epoch 10, "
                      "keep_prob 1.0): its epochs are another model's work", result)
    result = results["baseline of 2 workers"]
    assert_error_line(result["status"], result["stderr"],
                      f"--baseline {root}/2 workers.jsonl is a run of 2 workers; pass the "
                      "metrics.jsonl of a single-process run", result)
    for name in ("medium", "2 workers"):
        assert not (root / name).exists()
    result = results["baseline of this config"]
    assert result["status"] == 0, result
    assert re.search(r"epoch 1/1 done .* \(single-process \d+\.\d s, speedup \d+\.\d\d×\)",
                     result["stdout"]), result["stdout"]


def copied_file_by_file(run):
    """`run`'s files given the times a copy that keeps none gives them (cp -r, scp -r: each
    file's time its copy's, in the order of their paths), a second apart: steps/ after the
    epoch ends, whose checkpoint (ckpt-3, the end of epoch 3) is the newer in training."""
    paths = sorted(os.path.join(d, n) for d, _, names in os.walk(run) for n in names)
    for i, path in enumerate(paths):
        os.utime(path, (time.time() + i, time.time() + i))


def without_data(ck):
    for name in os.listdir(ck):
        if name.startswith(NEWEST + ".data-"):
            os.remove(os.path.join(ck, name))


def test_a_stop_line_names_the_checkpoint_the_resume_takes(trained, tmp_path):
    """The stop line's reader of the pointers (pointers.newest_checkpoint, without TensorFlow)
    names the checkpoint the resume takes (DAMAGE's, by hand) wherever the damage shows without
    reading the files' contents. It named: steps/ckpt-24 after a resume rewrote a steps/
    pointer naming files that are gone (the rewritten pointer the newest file); a ckpt-4 that
    is not there; another run's ckpt-3 named by absolute paths; steps/ckpt-28 where the epoch
    ends' pointer was missing, empty or not text (that folder was passed over), or where the
    run was copied without the files' times (and, a review found, after such a copy where one
    pointer was rewritten by a resume: the two folders timed apart); ckpt-3 with its data file
    gone; and a NUL byte in a name raised. The two folders are now compared by their places in
    training, the log's steps an epoch. A damage inside a file (overwritten) takes TensorFlow
    to see: named, then the resume warns."""
    runs = {kind: (copy_of(trained, tmp_path, kind, damage), takes)
            for kind, (damage, takes) in DAMAGE.items() if "overwritten" not in kind}
    gone = copy_of(trained, tmp_path, "steps ckpt-28 gone")
    steps = gone / "checkpoints" / "steps"
    for name in os.listdir(steps):
        if name.startswith("ckpt-28."):
            os.remove(steps / name)
    time.sleep(0.01)  # the rewritten pointer's time after every checkpoint's
    write_pointer(str(steps), checkpoint_files(str(steps)))  # as the resume rewrites it
    runs["steps ckpt-28 gone, its pointer rewritten"] = gone, NEWEST
    runs["pointer missing"] = copy_of(trained, tmp_path, "pointer missing",
                                      lambda ck: os.remove(os.path.join(ck, "checkpoint"))), NEWEST
    runs["ckpt-3's data file gone"] = copy_of(trained, tmp_path, "no data", without_data), BEFORE_IT
    copied = copy_of(trained, tmp_path, "copied file by file")
    copied_file_by_file(copied)
    runs["copied file by file"] = copied, NEWEST
    # and then steps/ckpt-24 deleted, its pointer rewritten by the resume (with the copy's
    # times): one folder timed by its pointer, the other by its files named steps/ckpt-28
    rewritten = copy_of(trained, tmp_path, "copied, steps pointer rewritten")
    copied_file_by_file(rewritten)
    steps = rewritten / "checkpoints" / "steps"
    for name in os.listdir(steps):
        if name.startswith("ckpt-24."):
            os.remove(steps / name)
    write_pointer(str(steps), checkpoint_files(str(steps)))
    runs["copied, steps pointer rewritten"] = rewritten, NEWEST
    # a name no path can have (TensorFlow parses the escape): it raised out of the stop line,
    # the watchdog's thread and the resume's reading of the pointer
    nul = copy_of(trained, tmp_path, "a NUL byte in the name", lambda ck: overwrite(
        os.path.join(ck, "checkpoint"), b'model_checkpoint_path: "x\\000/ckpt-3"\n'))
    runs["a NUL byte in the name"] = nul, NEWEST
    assert "which is not there" in pointer_damage(str(nul / "checkpoints"))
    # a log that is a pipe (it blocked the stop line), and a steps/ pointer naming a checkpoint
    # not called ckpt-N (it raised): the epoch end, by the files' times (the trained run's)
    piped = copy_of(trained, tmp_path, "the log a pipe")
    os.remove(piped / "metrics.jsonl")
    os.mkfifo(piped / "metrics.jsonl")
    runs["the log a pipe"] = piped, NEWEST
    named = copy_of(trained, tmp_path, "steps pointer naming best")
    for name in os.listdir(named / "checkpoints" / "steps"):
        if name.startswith("ckpt-24."):
            os.rename(named / "checkpoints" / "steps" / name,
                      named / "checkpoints" / "steps" / name.replace("ckpt-24", "best"))
    overwrite(str(named / "checkpoints" / "steps" / "checkpoint"),
              b'model_checkpoint_path: "best"\n')
    runs["steps pointer naming best"] = named, NEWEST
    # a first epoch of 15 steps, then 10 a epoch (--change_config): steps/ckpt-28 is 8 steps into
    # epoch 3, past ckpt-3 gone, though 28 steps are 1 epoch and 13 steps at the first's length
    changed = copy_of(trained, tmp_path, "steps an epoch changed", remove_newest)
    lines = (changed / "metrics.jsonl").read_text().splitlines(keepends=True)
    first = next(i for i, line in enumerate(lines) if '"event": "epoch"' in line)
    lines[first] = lines[first].replace('"step": 10,', '"step": 15,')
    (changed / "metrics.jsonl").write_text("".join(lines))
    runs["steps an epoch changed"] = changed, BEFORE_IT
    for kind, (run, takes) in runs.items():
        assert newest_checkpoint(str(run / "checkpoints")) == str(run / "checkpoints" / takes), \
            kind
        assert kept_text(str(run)) == (f"the newest checkpoint, {run}/checkpoints/{takes}, is "
                                       "kept: rerun with --resume to continue from it"), kind


def test_two_ranks_resume_past_a_damaged_pointer_and_a_damaged_newest_checkpoint(trained,
                                                                                 corpus,
                                                                                 tmp_path):
    """Every rank reads the checkpoint folder as it starts (rank 1 too, which saves nothing)."""
    run = copy_of(trained, tmp_path, "run", lambda ck: (
        overwrite(os.path.join(ck, "checkpoint"), b""), overwrite(os.path.join(ck, DATA))))
    r = mpirun((2, [*RUN_ARGS, "--data_path", corpus, "--output_dir", str(run), "--resume",
                    "--set", "num_epochs=4"]))
    ck = f"{run}/checkpoints"
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert_lines_match(lines(r.stderr, "warning: "), [
        POINTER_WARNINGS["pointer empty"].format(ck=re.escape(ck)),
        rf"warning: checkpoint {re.escape(ck)}/{NEWEST} is damaged \(.+\); resuming from "
        rf"{re.escape(ck)}/{BEFORE_IT}"], r.stderr)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(e["epoch"], e["world_size"]) for e in events if e["event"] == "epoch"] == [
        (1, 1), (2, 1), (3, 2), (4, 2)]
