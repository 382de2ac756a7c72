"""scripts/steptime.py: variants timed in turns by long-lived real TensorFlow workers."""
import json
import subprocess
import sys

from tests.helpers import REPO, TINY, patterned_sentences, script_env, write_corpus

STEPTIME = [sys.executable, "scripts/steptime.py", "--config", TINY, "--threads", "1"]


def run(*args):
    return subprocess.run([*STEPTIME, *args], cwd=REPO, env=script_env(), capture_output=True,
                          text=True, timeout=300)


def test_two_variants_timed_in_turns_with_their_own_environment(tmp_path):
    out = tmp_path / "steptime.json"
    r = run("--variant", f"plain={sys.executable}",
            "--variant", f"no oneDNN={sys.executable}:TF_ENABLE_ONEDNN_OPTS=0",
            "--rounds", "3", "--steps", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())["variants"]
    assert list(result) == ["plain", "no oneDNN"]
    assert result["no oneDNN"]["env"] == {"TF_ENABLE_ONEDNN_OPTS": "0"}
    for label, v in result.items():
        # bursts of 2 real steps of the tiny model: more than a tenth of a millisecond (no step
        # skipped), less than a minute
        assert len(v["bursts_ms"]) == 3 and 0.1 < min(v["bursts_ms"]) <= max(v["bursts_ms"]) \
            < 60000, label
        assert v["stack"].startswith("TensorFlow 2."), v["stack"]
    assert result["plain"]["vs_first"] == 1.0
    assert "plain" in r.stdout and "no oneDNN" in r.stdout and "TF_ENABLE_ONEDNN_OPTS=0" in r.stdout


def test_a_variants_environment_reaches_its_worker_and_a_failed_start_is_one_line():
    r = run("--variant", f"plain={sys.executable}",
            "--variant", f"broken={sys.executable}:PYTHONHOME=/nonexistent", "--rounds", "1")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("error: variant 'broken'"), r.stderr


def test_a_set_reaches_every_worker_and_a_bad_one_is_refused_before_any(tmp_path):
    out = tmp_path / "steptime.json"
    r = run("--variant", f"a={sys.executable}", "--variant", f"b={sys.executable}",
            "--set", "precision='bf16'", "--rounds", "1", "--steps", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["set"] == ["precision='bf16'"]
    assert "--set precision='bf16'" in r.stdout
    # a model that cannot be loaded passes the config's checks and fails in the worker: the set
    # reached it
    r = run("--variant", f"a={sys.executable}", "--variant", f"b={sys.executable}",
            "--set", "model='no_such_module:build'", "--rounds", "1")
    assert r.returncode != 0
    assert r.stderr.strip().splitlines()[-1].startswith("error: variant 'a'"), r.stderr
    r = run("--variant", f"a={sys.executable}", "--variant", f"b={sys.executable}",
            "--set", "no_such_key=1")
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "no_such_key" in lines[0], r.stderr


def test_bad_variants_are_refused_in_one_line():
    for args in (["--variant", "no-python-given"], ["--variant", f"only={sys.executable}"],
                 ["--variant", f"a={sys.executable}", "--variant", "b=/nonexistent/python"],
                 ["--variant", f"a={sys.executable}", "--variant", f"b={sys.executable}:NOEQUALS"]):
        r = run(*args)
        assert r.returncode != 0, args
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), (args, r.stderr)


def test_loop_times_the_trainers_epoch_loop_over_real_windows(tmp_path):
    data = write_corpus(tmp_path / "ptb", patterned_sentences(600), patterned_sentences(50, 1),
                        patterned_sentences(50, 2))
    out = tmp_path / "loop.json"
    r = run("--variant", f"a={sys.executable}", "--variant", f"b={sys.executable}", "--loop",
            "--data_path", str(data), "--rounds", "12", "--steps", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    result = json.loads(out.read_text())
    assert result["what"].startswith("train_epoch loop")
    # 12 bursts of 2 windows pass the end of the 21 windows and start over: none fails
    assert all(len(v["bursts_ms"]) == 12 for v in result["variants"].values())
    assert "train_epoch loop" in r.stdout


def test_loop_without_the_corpus_is_refused_in_one_line(tmp_path):
    r = run("--variant", f"a={sys.executable}", "--variant", f"b={sys.executable}", "--loop",
            "--data_path", str(tmp_path))
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and "no PTB files" in lines[0], r.stderr
