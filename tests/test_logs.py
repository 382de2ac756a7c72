"""utils/logs.py RunLog.resume on hand-written metrics.jsonl files: what it keeps and rebuilds; and
TensorFlow's start-up notes kept out of stderr (utils.import_tensorflow), oneDNN on by default,
Keras' import of matplotlib left out."""
import json
import os
import platform
import select
import signal
import subprocess
import sys

import pytest

from utils.checkpoints import Position
from utils.errors import ConfigError
from utils.logs import RunLog, load_baseline
from tests.helpers import REPO, script_env

CFG = {"num_epochs": 3, "batch_size": 20, "num_steps": 35}


def progress(epoch, step, world_size, wps=700.0):
    return {"event": "progress", "epoch": epoch, "step": step, "lr": 1.0, "train_ppl": 100.0 + step,
            "wps": wps, "world_size": world_size}


def write_log(folder, events):
    with open(folder / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in events)


def read_log(folder):
    return [json.loads(line) for line in open(folder / "metrics.jsonl")]


def test_a_stop_in_validation_returns_the_epoch_rebuilt_from_its_last_progress_line(tmp_path):
    # epoch 1 trained at 2 workers, then 1, then 2 again; its validation was cut, so no epoch line
    events = [progress(1, 10, 2), progress(1, 20, 1), progress(1, 30, 1), progress(1, 40, 2),
              progress(2, 10, 2)]
    write_log(tmp_path, events)
    stats = RunLog(str(tmp_path), "config_tiny", CFG, 2).resume(Position(1), world_sizes=True)
    # 40 steps of 20 x 35 words at 700 words/sec: 40 s
    assert stats == {"train_ppl": 140.0, "wps": 700.0, "lr": 1.0, "epoch_time_s": 40.0,
                     "compute_share": None, "steps": 40, "world_sizes": [2, 1, 2]}
    assert read_log(tmp_path) == events[:4]  # epoch 2's line is past the checkpoint


def test_world_sizes_only_when_asked_and_nothing_to_rebuild_once_the_epoch_has_its_line(tmp_path):
    events = [progress(1, 10, 2), progress(1, 20, 2)]
    write_log(tmp_path, events)
    assert "world_sizes" not in RunLog(str(tmp_path), "config_tiny", CFG, 2).resume(Position(1))
    write_log(tmp_path, events + [{"event": "epoch", "epoch": 1, "step": 20, "world_size": 2},
                                  {"event": "test", "epoch": 3, "world_size": 2}])
    assert RunLog(str(tmp_path), "config_tiny", CFG, 2).resume(Position(1), world_sizes=True) is None
    assert [e["event"] for e in read_log(tmp_path)] == ["progress", "progress", "epoch"]


def test_a_tensorflow_write_error_is_told_without_the_ops_names(tmp_path):
    """(Under tmp_path: a folder in / would fail for other users with "Permission denied".)"""
    import tensorflow as tf
    from utils.errors import os_reason
    missing = tmp_path / "missing"
    with pytest.raises(tf.errors.OpError) as e:
        tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[str(missing / "a")],
                                      destination_prefix=str(missing / "b"))
    error = e.value
    assert "{{function_node" in error.message and "[Op:MergeV2Checkpoints]" in error.message
    reason = os_reason(error)
    assert f"{missing / 'a'} not found" in reason and reason.endswith("not found"), reason
    assert "{{" not in reason and "function_node" not in reason and "[Op:" not in reason


IMPORTER = "from utils import import_tensorflow; print(import_tensorflow().__name__)"


def import_with_fake_tensorflow(tmp_path, body):
    """Run import_tensorflow() against a `tensorflow` package of `body` that is found first: the
    real one prints the two notes only where oneDNN is on (not with TF_ENABLE_ONEDNN_OPTS=0)."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(body)
    env = script_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    return subprocess.run([sys.executable, "-c", IMPORTER], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


NOTES_AND_A_REAL_LINE = """import os, types
os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\\n")
os.write(2, b"I0000 00:00:1.1 1 port.cc:153] oneDNN custom operations are on. You may see...\\n")
os.write(2, b"E0000 something TensorFlow really reports\\n")
config = types.SimpleNamespace(list_physical_devices=lambda device_type=None: [])
"""


def test_tensorflow_start_up_notes_are_dropped_and_every_other_line_kept(tmp_path):
    r = import_with_fake_tensorflow(tmp_path, NOTES_AND_A_REAL_LINE)
    assert r.returncode == 0 and r.stdout == "tensorflow\n", r.stderr
    assert r.stderr == "E0000 something TensorFlow really reports\n"


# A GPU build's first look at its devices with CUDA_VISIBLE_DEVICES empty (TensorFlow 2.x)
HIDDEN_GPUS = """import os, types
def list_physical_devices(device_type=None):
    os.write(2, b"E0000 00:00:1.1 1 cuda_executor.cc:1228] failed call to cuInit: "
                b"CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected\\n")
    os.write(2, b"E0000 something TensorFlow really reports\\n")
    return []
config = types.SimpleNamespace(list_physical_devices=list_physical_devices)
"""


@pytest.mark.parametrize("visible, dropped", [("", True), ("-1", True), ("0", False),
                                              (None, False)])
def test_a_failed_cuinit_is_dropped_only_where_the_gpus_are_hidden(tmp_path, visible, dropped):
    """Hidden GPUs (the suite's, and the trainers' fix for more ranks than GPUs) make a GPU
    build log its failed cuInit as an error; where they are not hidden, it is a real fault."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(HIDDEN_GPUS)
    env = script_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    r = subprocess.run([sys.executable, "-c", IMPORTER], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == "tensorflow\n", r.stderr
    assert ("CUDA_ERROR_NO_DEVICE" not in r.stderr) == dropped, r.stderr
    assert "E0000 something TensorFlow really reports\n" in r.stderr


def test_a_failing_tensorflow_import_shows_what_it_printed_and_why(tmp_path):
    r = import_with_fake_tensorflow(tmp_path, NOTES_AND_A_REAL_LINE + "raise ImportError('no libcudart')\n")
    assert r.returncode == 1
    assert r.stderr.startswith("E0000 something TensorFlow really reports\nTraceback")
    assert "ImportError: no libcudart" in r.stderr and "oneDNN" not in r.stderr


def test_a_tensorflow_import_that_aborts_natively_keeps_what_it_printed(tmp_path):
    """A native abort inside the import (a missing instruction set, a broken CUDA library)
    kills the process at once, with no Python left to pass on what the import printed: the
    filter process does, and the notes are still dropped."""
    r = import_with_fake_tensorflow(tmp_path, NOTES_AND_A_REAL_LINE + "os.abort()\n")
    assert r.returncode == -signal.SIGABRT and not r.stdout, r.stdout
    assert r.stderr == "E0000 something TensorFlow really reports\n"


def test_a_tensorflow_import_that_hangs_shows_its_lines_while_it_hangs(tmp_path):
    """Its lines come as they are written, not when the import returns: a hang shows them."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text(
        NOTES_AND_A_REAL_LINE + "import time\ntime.sleep(120)\n")
    env = script_env({"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"})
    job = subprocess.Popen([sys.executable, "-c", IMPORTER], env=env, cwd=REPO,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = select.select([job.stderr], [], [], 60)[0]
        assert ready, "no line of the hanging import within 60 s"
        assert job.stderr.readline() == "E0000 something TensorFlow really reports\n"
        assert job.poll() is None  # still importing
    finally:
        job.kill()
        job.communicate()


ONEDNN = ("from utils import import_tensorflow; import_tensorflow(); "
          "from tensorflow.python.util import _pywrap_util_port as port; "
          "print(port.IsMklEnabled())")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="utils turns oneDNN on on x86 only")
def test_onednn_is_on_without_a_setting_off_when_asked_and_its_start_up_notes_are_dropped():
    # TensorFlow's own default leaves it off on CPUs without AVX-512 VNNI (this AVX2-only EPYC)
    env = script_env()
    env.pop("TF_ENABLE_ONEDNN_OPTS", None)  # conftest's set_tensorflow_defaults() set it here
    on, off = (subprocess.run([sys.executable, "-c", ONEDNN], env=e, cwd=REPO, capture_output=True,
                              text=True, timeout=120)
               for e in (env, dict(env, TF_ENABLE_ONEDNN_OPTS="0")))
    assert (on.returncode, on.stdout) == (0, "True\n"), on.stderr
    assert (off.returncode, off.stdout) == (0, "False\n"), off.stderr
    assert "oneDNN custom operations" not in on.stderr and "absl::InitializeLog" not in on.stderr


MATPLOTLIB_AFTER = ("import sys; from utils import import_tensorflow; tf = import_tensorflow(); "
                    "keras = sys.modules.get('keras'); "
                    "print(keras is not None, 'matplotlib' in sys.modules); "
                    "import matplotlib.pyplot; print(matplotlib.pyplot.__name__)")


def test_tensorflow_comes_without_the_matplotlib_keras_would_import_and_it_imports_later():
    """Keras 3 imports matplotlib.pyplot with TensorFlow where it is installed (it is: make
    results plots with it); import_tensorflow leaves it out, and a later import finds it."""
    r = subprocess.run([sys.executable, "-c", MATPLOTLIB_AFTER], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=script_env({"PTB_KERAS": "3"}))
    assert (r.returncode, r.stdout) == (0, "True False\nmatplotlib.pyplot\n"), r.stderr


def test_a_baseline_epoch_resumed_inside_it_counts_as_its_whole_epoch(tmp_path):
    # 30 s for the last 250 of 1,000 steps is a 120 s epoch; a whole epoch counts as it is
    write_log(tmp_path, [{"event": "epoch", "epoch": 1, "epoch_time_s": 100.0},
                         {"event": "epoch", "epoch": 2, "epoch_time_s": 30.0, "steps_run": 250,
                          "steps": 1000}])
    assert load_baseline(str(tmp_path / "metrics.jsonl")) == {1: 100.0, 2: 120.0}


def test_the_speedup_of_an_epoch_resumed_inside_it_is_that_of_the_whole_epoch(tmp_path, capsys):
    # the single process took 120 s for epoch 1; this run 15 s for the last 250 of its 1,000
    # steps, so 60 s for the whole epoch: 2.00x, not 8.00x
    write_log(tmp_path, [{"event": "epoch", "epoch": 1, "epoch_time_s": 120.0}])
    log = RunLog(str(tmp_path / "run"), "config_small", CFG, 2,
                 baseline=str(tmp_path / "metrics.jsonl"))
    log.epoch(0, 1000, 1.0, {"train_ppl": 100.0, "wps": 700.0, "compute_share": 0.9,
                             "epoch_time_s": 15.0, "steps": 1000, "steps_run": 250}, 90.0)
    assert "time 15.0 s for its last 250 of 1000 steps (single-process 120.0 s, speedup 2.00×)" \
        in capsys.readouterr().out
    event = read_log(tmp_path / "run")[-1]
    assert (event["steps_run"], event["steps"]) == (250, 1000)


@pytest.mark.parametrize("lines, named", [
    ([{"event": "epoch", "epoch": 1}], "an epoch event whose epoch_time_s ('missing') is not a "
                                       "positive number"),
    ([{"event": "epoch", "epoch": 1, "epoch_time_s": "x"}],
     "an epoch event whose epoch_time_s ('x') is not a positive number"),
    ([{"event": "epoch", "epoch": 1, "epoch_time_s": 0}],
     "an epoch event whose epoch_time_s (0) is not a positive number"),
    ([{"event": "epoch", "epoch": 1, "epoch_time_s": float("inf")}],
     "an epoch event whose epoch_time_s (inf) is not a positive number"),
    ([{"event": "epoch", "epoch": "1", "epoch_time_s": 9.0}],
     "an epoch event whose epoch ('1') is not a positive number"),
    ([{"event": "epoch", "epoch": 1, "epoch_time_s": 9.0, "steps_run": 5}],
     "an epoch event whose steps ('missing') is not a positive number"),
    ([{"event": "epoch", "epoch": 1, "epoch_time_s": 9.0, "steps_run": 0, "steps": 0}],
     "an epoch event whose steps_run (0), steps (0) are not positive numbers"),
    ([{"event": "epoch", "epoch": 1, "epoch_time_s": 9.0, "world_size": [1]}],
     "an epoch event whose world_size ([1]) is not a positive number"),
    ([{"event": "epoch", "epoch": 1, "epoch_time_s": 9.0, "config": "small"}],
     "an epoch event whose config is not a mapping ('small')"),
    ([[1, 2]], "line 1 is not an event of a run's log ('[1, 2]')"),
    (["{\"event\": \"epoch\"", {"event": "epoch", "epoch": 1, "epoch_time_s": 9.0}],
     "line 1 is not an event of a run's log ('{\"event\": \"epoch\"')")],
    ids=["no time", "a time not a number", "a time of 0", "an infinite time",
         "an epoch not a number", "steps_run without steps", "steps of 0", "world_size a list",
         "config a string", "a list", "a line cut in the middle"])
def test_a_baseline_without_its_numbers_is_refused_in_one_line(tmp_path, lines, named):
    """Each was read on (a KeyError, AttributeError or TypeError at the start, a TypeError after
    the first epoch with its line lost, or a speed-up of 0.00x or inf): now refused before
    training, naming the line or the key."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    with pytest.raises(ConfigError) as refused:
        load_baseline(str(path), CFG)
    assert str(refused.value) == f"--baseline {path}: {named}; pass the metrics.jsonl of an " \
        "lm_ptb.py run" + (", as that run wrote it" if "epoch event" in named else ""), \
        str(refused.value)


def test_a_baseline_whose_last_line_was_cut_while_written_is_read_without_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"event": "epoch", "epoch": 1, "epoch_time_s": 9.0}) + "\n"
                    + '{"event": "epoch", "epo')
    assert load_baseline(str(path)) == {1: 9.0}


def test_a_baseline_epoch_of_a_whole_float_is_read_as_its_number(tmp_path):
    write_log(tmp_path, [{"event": "epoch", "epoch": 1.0, "epoch_time_s": 9}])
    assert load_baseline(str(tmp_path / "metrics.jsonl")) == {1: 9}
