"""Configs, --set parsing, the learning-rate schedule, and the scripts' --help."""
import ast
import os

import pytest

from tests.helpers import REPO, run_script
from utils import cli, config
from utils.loop import learning_rate

PAPER = {  # Zaremba et al. 2014 / the TF tutorial's table
    "config_small": dict(init_scale=0.1, max_grad_norm=5, num_steps=20, hidden_size=200,
                         max_epoch=4, num_epochs=13, keep_prob=1.0, lr_decay=0.5),
    "config_medium": dict(init_scale=0.05, max_grad_norm=5, num_steps=35, hidden_size=650,
                          max_epoch=6, num_epochs=39, keep_prob=0.5, lr_decay=0.8),
    "config_large": dict(init_scale=0.04, max_grad_norm=10, num_steps=35, hidden_size=1500,
                         max_epoch=14, num_epochs=55, keep_prob=0.35, lr_decay=1 / 1.15),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_configs_match_the_paper(name):
    cfg = config.load_config(name)
    assert {k: cfg[k] for k in PAPER[name]} == PAPER[name]
    assert (cfg["learning_rate"], cfg["num_layers"], cfg["batch_size"]) == (1.0, 2, 20)
    assert cfg["steps_per_epoch"] is None and cfg["eval_steps"] is None


@pytest.mark.parametrize("name, expected", [
    # lr = 1.0 * decay ** max(epoch + 1 - max_epoch, 0), epoch counted from 0
    ("config_small", [1.0, 1.0, 1.0, 1.0, 0.5, 0.25] + [None] * 6 + [0.5 ** 9]),
    ("config_medium", [1.0] * 6 + [0.8, 0.64]),
    ("config_large", [1.0] * 14 + [1 / 1.15, 1 / 1.15 ** 2]),
])
def test_learning_rate_schedule(name, expected):
    cfg = config.load_config(name)
    for epoch, lr in enumerate(expected):
        if lr is not None:
            assert learning_rate(cfg, epoch) == pytest.approx(lr, rel=1e-12), epoch


def test_set_overrides_with_python_literals():
    cfg = config.load_config("config_small", ["num_epochs=1", "steps_per_epoch=None",
                                              "learning_rate=0.5", "eval_steps = 3"])
    assert (cfg["num_epochs"], cfg["steps_per_epoch"], cfg["learning_rate"], cfg["eval_steps"]) \
        == (1, None, 0.5, 3)
    assert config.load_config("config_small", ["learning_rate=2"])["learning_rate"] == 2


@pytest.mark.parametrize("item, message", [
    ("nope=1", "unknown key 'nope'; valid keys: init_scale"),
    ("num_epoch=1", "unknown key 'num_epoch' \\(did you mean num_epochs\\?\\); valid keys: "),
    ("lr=1", "unknown key 'lr'; valid keys: "),  # nothing near enough to name
    ("num_epochs=1.5", "num_epochs must be int, got 1.5"),
    ("num_epochs=True", "num_epochs must be int"),
    ("num_epochs=[1", "cannot parse '\\[1' as a Python literal"),
    ("num_epochs", "is not KEY=VALUE"),
    ("batch_size=0", "batch_size must be > 0"),
    ("keep_prob=1.5", "keep_prob must be in \\(0, 1\\]"),
    ("hidden_size=None", "hidden_size must be int, got None"),
])
def test_bad_set_is_a_clear_error(item, message):
    with pytest.raises(config.ConfigError, match=message):
        config.load_config("config_small", [item])


def test_config_files_unknown_missing_and_paths(tmp_path):
    with pytest.raises(config.ConfigError, match="unknown config 'config_tiny'; use one of "
                                                 "config_large, config_medium, config_small"):
        config.load_config("config_tiny")
    with pytest.raises(config.ConfigError, match="unknown config 'config_smal' \\(did you mean "
                                                 "config_small\\?\\); use one of"):
        config.load_config("config_smal")
    base = open(config.REPO + "/config_small.py").read()
    good = tmp_path / "mine.py"
    good.write_text(base.replace("hidden_size = 200", "hidden_size = 8"))
    assert config.load_config(str(good))["hidden_size"] == 8
    extra = tmp_path / "extra.py"
    extra.write_text(base + "\nhiden_size = 3\n")
    with pytest.raises(config.ConfigError, match="unknown key\\(s\\) hiden_size \\(did you mean "
                                                 "hidden_size\\?\\); valid keys"):
        config.load_config(str(extra))
    lacking = tmp_path / "lacking.py"
    lacking.write_text(base.replace("lr_decay = 0.5\n", ""))
    with pytest.raises(config.ConfigError, match="lacks key\\(s\\) lr_decay"):
        config.load_config(str(lacking))


def test_config_hash_tracks_values():
    a = config.load_config("config_small")
    assert config.config_hash(a) == config.config_hash(config.load_config("config_small"))
    assert config.config_hash(a) != config.config_hash(dict(a, num_epochs=2))


def test_horovod_options_default_when_a_config_omits_them(tmp_path):
    # a config of the paper's keys alone (config_small without its precision line) gets these,
    # written out here by hand rather than read back from utils/config.py
    text = open(config.REPO + "/config_small.py").read()
    bare = tmp_path / "bare.py"
    bare.write_text(text.replace('precision = "fp32"\n', ""))
    cfg = config.load_config(str(bare))
    assert {k: cfg[k] for k in ("scale_lr", "fp16_allreduce", "sparse_as_dense", "reduce_type",
                                "param_sync_steps", "timeline", "valid_batch_size",
                                "valid_num_steps", "model", "step_timeout_s",
                                "checkpoint_every", "precision")} == {
        "scale_lr": False, "fp16_allreduce": False, "sparse_as_dense": False,
        "reduce_type": "grad", "param_sync_steps": 10, "timeline": False,
        "valid_batch_size": None, "valid_num_steps": None, "model": "utils.model:build_model",
        "step_timeout_s": 600, "checkpoint_every": None, "precision": "fp32"}
    assert config.load_config("config_small", ["reduce_type='param'"])["reduce_type"] == "param"


def test_help_keeps_the_scripts_example_commands_on_lines_of_their_own(capsys):
    doc = "Train it.\n\nOne process:\n    python lm_ptb.py --config config_small\n"
    with pytest.raises(SystemExit) as stop:
        cli.parse_args(["--help"], doc)
    out = capsys.readouterr().out
    assert stop.value.code == 0
    assert "\n    python lm_ptb.py --config config_small\n" in out, out
    assert "--seed SEED           seeds the initial weights" in out, out


def test_every_scripts_docstring_keeps_its_line_breaks():
    # a "\" ending a command's line in a plain docstring joins the lines: --help showed the
    # two-host mpirun command as one line with the next line's indentation inside it
    scripts = [os.path.join(folder, name) for folder in (REPO, *(os.path.join(REPO, d)
               for d in ("scripts", "launch", "utils", "data", ".ci")))
               if os.path.isdir(folder) for name in sorted(os.listdir(folder))
               if name.endswith(".py")]
    joined = []
    for path in scripts:
        source = open(path).read()
        body = ast.parse(source).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            doc = body[0].value
            if doc.value.count("\n") != ast.get_source_segment(source, doc).count("\n"):
                joined.append(os.path.relpath(path, REPO))
    assert len(scripts) > 20 and not joined, f"make these docstrings raw (r\"\"\"): {joined}"


@pytest.mark.parametrize("flag", ["--output_dir", "--data_path", "--baseline"])
@pytest.mark.parametrize("value, said", [("", "empty"), (" ", "blank")])
def test_an_empty_path_flag_is_refused_in_one_line(flag, value, said):
    """--output_dir "" wrote nothing where it was started and ended in a FileNotFoundError
    traceback at its first save (an unset shell variable in a script, say); " " trained into a
    folder named by a blank."""
    with pytest.raises(cli.ConfigError) as refused:
        cli.parse_args([flag, value])
    assert str(refused.value) == f"{flag} is {said}; give it a path (or leave the flag out " \
        "for its default)"


def test_evaluates_empty_paths_are_refused_in_one_line_and_an_empty_ptb_data_path_is_unset(
        tmp_path):
    """evaluate.py export --export_dir "" wrote the SavedModel into the folder it was started
    from; PTB_DATA_PATH= (set empty) named an empty folder instead of the default."""
    for argv, said in ((["export", "--run", str(tmp_path), "--export_dir", ""], "--export_dir is "
                        "empty; give it a path"),
                       (["perplexity", "--run", "  "], "--run is blank; give it a path"),
                       (["perplexity", "--run", str(tmp_path), "--data_path", ""],
                        "--data_path is empty; give it a path (or leave the flag out for its "
                        "default)")):
        r = run_script(["evaluate.py", *argv])
        assert (r.returncode, r.stderr) == (2, f"error: {said}\n"), r.stderr
    for value in ("", "  "):
        r = run_script(["-c", "from utils.config import DEFAULT_DATA_PATH as d; print(repr(d))"],
                       env={"PTB_DATA_PATH": value})
        assert r.stdout.strip() == repr(os.path.join(REPO, "data", "ptb")), r
