"""A run's folder damaged, or given what cannot be used: every reader of a checkpoint (the resume,
the checks it makes before restoring, evaluate.py's three commands) names a damaged newest one
in a line and takes the one before it; a resume without checkpoints keeps the log of the epochs
they held; an unreadable vocab.txt, an unusable --export_dir and a baseline of another config
are one line each. One tiny run is trained; each case runs on a copy of it, damaged, and all of
them in two processes (tests/bad_input_runner.py), one per Keras; the 2-rank resume is a job."""
import json
import os
import random
import re
import shutil

import pytest

from tests.helpers import IS_ROOT, TINY, mpirun, read_only_folder, run_script
from tests.test_faults import assert_error_line, snapshot
from utils.config import load_config

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


# kind -> (how the copy's checkpoints folder is damaged, the checkpoint every reader then takes)
DAMAGE = {
    "data file overwritten": (lambda ck: overwrite(os.path.join(ck, DATA)), BEFORE_IT),
    "index overwritten": (lambda ck: overwrite(os.path.join(ck, NEWEST + ".index")), BEFORE_IT),
    "pointer names files that are gone": (remove_newest, BEFORE_IT),
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
    "pointer names files that are gone": [
        rf"checkpoint {{ck}}/{NEWEST} is damaged \(.*Failed to find any matching files.*\)"],
    "pointer empty": [],
    "pointer not text": [],
    "in-epoch pointer cut, data file overwritten": [
        rf"checkpoint {{ck}}/{NEWEST} is damaged \(.+\)"],
}
POINTER_WARNINGS = {
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
    for precision in ("fp16", "bf16"):
        cases[f"resume in {precision}"] = [*RUN_ARGS, *data, "--output_dir", str(run),
                                           "--resume", "--set", f"precision='{precision}'"]
    # no checkpoint left of the logged epochs
    folders["checkpoints deleted"] = copy_of(trained, root, "checkpoints deleted",
                                             shutil.rmtree)
    folders["checkpoints emptied"] = copy_of(trained, root, "checkpoints emptied", empty_folder)
    for kind in ("checkpoints deleted", "checkpoints emptied"):
        cases[kind] = ["--output_dir", str(folders[kind]), *resume]
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
    unchanged = ("checks", "checkpoints deleted", "checkpoints emptied", "vocab.txt a folder",
                 "vocab.txt mode 000")
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
    # every pointer reads as TensorFlow reads it, and lists what the resume saved: a pointer
    # written anew kept the checkpoints it found counted (the oldest ones removed since)
    import tensorflow as tf
    for folder, kept in (("", ["ckpt-2", "ckpt-3", "ckpt-4"]), ("steps", ["ckpt-34", "ckpt-38"])):
        state = tf.train.get_checkpoint_state(os.path.join(ck, folder))
        assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == kept, kind
    assert not os.path.exists(os.path.join(ck, "steps", "ckpt-24.index"))


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


@pytest.mark.parametrize("precision, error", [
    ("fp16", "error: --resume: the run trained in precision='fp32', and a run does not change "
             "to or from 'fp16'"),
    ("bf16", "error: --resume: the run was trained with other values of precision (precision "
             "'fp32' -> 'bf16')")])
def test_the_checks_before_a_restore_read_the_checkpoint_restored_not_a_damaged_newest(
        precision, error, keras3):
    results, folders, before, _ = keras3
    result, ck = results[f"resume in {precision}"], f"{folders['checks']}/checkpoints"
    shown = result["stdout"] + result["stderr"]
    assert result["status"] == 2 and "Traceback" not in shown, shown
    assert len(result["stderr"].splitlines()) == 2, shown  # the damaged one named, the refusal
    warning, line = result["stderr"].splitlines()
    assert re.fullmatch(rf"warning: checkpoint {re.escape(ck)}/{NEWEST} is damaged \(.+\); "
                        rf"(resuming from|reading) {re.escape(ck)}/{BEFORE_IT}( instead)?",
                        warning), warning
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


@pytest.mark.parametrize("kind", ["checkpoints deleted", "checkpoints emptied"])
def test_a_resume_with_no_checkpoint_of_the_logged_epochs_keeps_the_log(kind, keras3):
    results, folders, before, _ = keras3
    result, run = results[kind], folders[kind]
    assert_error_line(result["status"], result["stderr"],
                      f"--resume: no checkpoint in {run}/checkpoints, but {run}/metrics.jsonl "
                      "records 3 epochs of an earlier run, which a start afresh would overwrite; "
                      "restore its checkpoints to continue it, or move metrics.jsonl aside", result)
    assert snapshot(run) == before[kind]


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
