"""utils/logs.py RunLog.resume on hand-written metrics.jsonl files: what it keeps and rebuilds."""
import json

import pytest

from utils.checkpoints import Position
from utils.logs import RunLog

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
    from utils.logs import os_reason
    missing = tmp_path / "missing"
    with pytest.raises(tf.errors.OpError) as e:
        tf.raw_ops.MergeV2Checkpoints(checkpoint_prefixes=[str(missing / "a")],
                                      destination_prefix=str(missing / "b"))
    error = e.value
    assert "{{function_node" in error.message and "[Op:MergeV2Checkpoints]" in error.message
    reason = os_reason(error)
    assert f"{missing / 'a'} not found" in reason and reason.endswith("not found"), reason
    assert "{{" not in reason and "function_node" not in reason and "[Op:" not in reason
