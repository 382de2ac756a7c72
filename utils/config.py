"""Configs: the config modules, their keys and checks, `--set` overrides, what a resume may
change; and where the data is by default."""
import ast
import difflib
import hashlib
import importlib.util
import json
import os
import sys

from utils.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# PTB_DATA_PATH set empty or blank (PTB_DATA_PATH= make train) counts as unset
_GIVEN_DATA_PATH = os.environ.get("PTB_DATA_PATH", "")
DEFAULT_DATA_PATH = (_GIVEN_DATA_PATH if _GIVEN_DATA_PATH.strip()
                     else os.path.join(REPO, "data", "ptb"))

# key -> (accepted types, may be None)
SCHEMA = {
    "init_scale": ((float, int), False),
    "learning_rate": ((float, int), False),
    "max_grad_norm": ((float, int), False),
    "num_layers": ((int,), False),
    "num_steps": ((int,), False),
    "hidden_size": ((int,), False),
    "max_epoch": ((int,), False),
    "num_epochs": ((int,), False),
    "keep_prob": ((float, int), False),
    "lr_decay": ((float, int), False),
    "batch_size": ((int,), False),
    "steps_per_epoch": ((int,), True),
    "eval_steps": ((int,), True),
    "eval_batch_size": ((int,), False),
    "eval_num_steps": ((int,), False),
    "valid_batch_size": ((int,), True),
    "valid_num_steps": ((int,), True),
    "scale_lr": ((bool,), False),
    "fp16_allreduce": ((bool,), False),
    "sparse_as_dense": ((bool,), False),
    "timeline": ((bool,), False),
    "reduce_type": ((str,), False),
    "param_sync_steps": ((int,), False),
    "backward_passes_per_step": ((int,), False),
    "model": ((str,), False),
    "step_timeout_s": ((float, int), False),
    "checkpoint_every": ((int,), True),
    "precision": ((str,), False),
}
FLAGS = {"scale_lr", "fp16_allreduce", "sparse_as_dense", "timeline"}
# Horovod options (lm_ptb_distributed.py; one process ignores them: docs/network.md's
# "Communication options"), and the layout of the per-epoch validation (None: the training
# layout, batch_size x num_steps). A config file may set them; otherwise these defaults hold.
DEFAULTS = {"scale_lr": False, "fp16_allreduce": False, "sparse_as_dense": False,
            "reduce_type": "grad", "param_sync_steps": 10, "timeline": False,
            "valid_batch_size": None, "valid_num_steps": None,
            "model": "utils.model:build_model",  # "module:function" that builds the model
            # A rank ends the job when a step has not finished after this long (a peer stopped
            # or hung); 10 minutes, as NCCL's default in PyTorch: far above any step here.
            "step_timeout_s": 600,
            # Also save a checkpoint every N training steps inside an epoch (None: at epoch
            # ends only); a resume from one continues exactly where it was.
            "checkpoint_every": None,
            # "bf16": the matmuls on bfloat16 operands, all else fp32; "fp16": on float16
            # operands, the loss scaled (docs/precision.md)
            "precision": "fp32"}
POSITIVE = {"init_scale", "learning_rate", "max_grad_norm", "num_layers", "num_steps",
            "hidden_size", "max_epoch", "num_epochs", "keep_prob", "lr_decay", "batch_size",
            "steps_per_epoch", "eval_steps", "eval_batch_size", "eval_num_steps",
            "valid_batch_size", "valid_num_steps",
            "param_sync_steps", "backward_passes_per_step", "step_timeout_s",
            "checkpoint_every"}
CHOICES = {"reduce_type": ("grad", "param"), "precision": ("fp32", "bf16", "fp16")}
# The keys a resume may change and still be the same run: how long its schedule is, and how it
# is saved and watched. Any other change (dropout, learning rate, precision...) makes the rest
# of the run another experiment under the same name, so a resume refuses it unless asked.
RESUME_MAY_CHANGE = {"num_epochs", "checkpoint_every", "step_timeout_s", "timeline"}
def load_config(name_or_path, overrides=()):
    """The config as a dict, validated, with `--set KEY=VALUE` overrides applied."""
    module = _import_config(name_or_path)
    cfg = {k: v for k, v in vars(module).items()
           if not k.startswith("_") and not callable(v) and not isinstance(v, type(sys))}
    unknown = sorted(set(cfg) - set(SCHEMA))
    missing = sorted(set(SCHEMA) - set(cfg) - set(DEFAULTS))
    if unknown:
        raise ConfigError(f"config {name_or_path} has unknown key(s) {_named(unknown, SCHEMA)}; "
                          f"valid keys: {', '.join(SCHEMA)}")
    if missing:
        raise ConfigError(f"config {name_or_path} lacks key(s) {', '.join(missing)}; "
                          "copy them from config_small.py")
    for key, value in cfg.items():
        _check_value(key, value, f"config {name_or_path}")
    cfg = {**DEFAULTS, **cfg}
    for item in overrides:
        key, value = _parse_override(item)
        cfg[key] = value
    check_together(cfg)
    return cfg


# Keys only Horovod's trainers act on (its allreduce and timeline): lm_ptb_tf_distribute.py refuses
# them set to anything but their defaults rather than log them as if they had acted.
HOROVOD_ONLY = ("reduce_type", "param_sync_steps", "fp16_allreduce", "sparse_as_dense",
                "timeline")


def refuse_horovod_only(cfg, trainer):
    """One line naming the HOROVOD_ONLY keys set away from their defaults, for a `trainer` that
    has no such option."""
    changed = [f"{key}={cfg[key]!r}" for key in HOROVOD_ONLY if cfg[key] != DEFAULTS[key]]
    if changed:
        them = "it" if len(changed) == 1 else "them"
        raise ConfigError(f"{', '.join(changed)}: Horovod's option{'s' * (len(changed) > 1)}, "
                          f"which {trainer} has no counterpart of; leave {them} at the default "
                          f"(drop the --set), or train with lm_ptb_distributed.py")


def check_together(cfg):
    """Values that are valid alone but not together."""
    if cfg["reduce_type"] == "param" and cfg["checkpoint_every"]:
        raise ConfigError(
            f"reduce_type='param' cannot save inside an epoch (checkpoint_every="
            f"{cfg['checkpoint_every']}; lm_ptb_elastic.py's commits are such saves): between two "
            "averagings the ranks' weights differ and their optimizer slots are never averaged, "
            "so a resume would not continue the run; drop checkpoint_every (epoch ends are "
            "saved after the averaging), or train with reduce_type='grad'")


def _import_config(name_or_path):
    if name_or_path.endswith(".py") or os.sep in name_or_path:
        path = os.path.abspath(name_or_path)
    else:
        path = os.path.join(REPO, name_or_path + ".py")
    if not os.path.isfile(path):
        choices = sorted(f[:-3] for f in os.listdir(REPO) if f.startswith("config_"))
        raise ConfigError(f"unknown config {_named([name_or_path], choices, repr)}; use one of "
                          f"{', '.join(choices)} "
                          "or a path to a .py file")
    if not path.endswith(".py"):
        raise ConfigError(f"config {name_or_path} is not a Python file; a config is a .py module "
                          "of constants like config_small.py: copy it and change the values")
    spec = importlib.util.spec_from_file_location("_ptb_config", path)
    module = importlib.util.module_from_spec(spec)
    # No __pycache__ beside a user's config: a run writes only in its --output_dir
    dont_write, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a user's config file: report any failure in one line
        raise ConfigError(f"config {path} fails to load ({type(e).__name__}: {e}); fix the file") \
            from None
    finally:
        sys.dont_write_bytecode = dont_write
    return module


def _named(names, choices, show=str):
    """Unknown names for an error line, each with the closest valid one, if any is close: a
    typo's fix is then in the line, not in a list of 28 keys."""
    def one(name):
        # a typo's near twin only: at difflib's default 0.6, config_tiny got config_medium
        close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.8)
        return show(name) + (f" (did you mean {close[0]}?)" if close else "")
    return ", ".join(map(one, names))


def _parse_override(item):
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"--set {item!r} is not KEY=VALUE; e.g. --set num_epochs=1")
    if key not in SCHEMA:
        raise ConfigError(f"--set: unknown key {_named([key], SCHEMA, repr)}; valid keys: "
                          f"{', '.join(SCHEMA)}")
    try:
        value = ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        raise ConfigError(f"--set {key}: cannot parse {text!r} as a Python literal; "
                          f"e.g. --set {key}=1 (strings need quotes)") from None
    _check_value(key, value, "--set")
    return key, value


def _check_value(key, value, where):
    types, nullable = SCHEMA[key]
    names = " or ".join(t.__name__ for t in types) + (" or None" if nullable else "")
    if value is None and nullable:
        return
    if isinstance(value, bool) != (key in FLAGS) or not isinstance(value, types):
        raise ConfigError(f"{where}: {key} must be {names}, got {value!r}; "
                          f"valid keys: {', '.join(SCHEMA)}")
    if key in POSITIVE and value <= 0:
        raise ConfigError(f"{where}: {key} must be > 0, got {value!r}")
    if key in CHOICES and value not in CHOICES[key]:
        raise ConfigError(f"{where}: {key} must be one of {', '.join(map(repr, CHOICES[key]))}, "
                          f"got {value!r}")
    if key == "keep_prob" and value > 1:
        raise ConfigError(f"{where}: keep_prob must be in (0, 1], got {value!r}")


def config_hash(cfg):
    """Stable digest of the resolved config, to check that all ranks agree."""
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def changes(before, now):
    """[(key, value before, value now)] of the keys whose values differ (the config's name
    aside), in SCHEMA order, then the seed where both record one; a key one of them lacks counts
    at its default."""
    keys = [k for k in SCHEMA if k in before or k in now]
    keys += ["seed"] if "seed" in before and "seed" in now else []
    old, new = {**DEFAULTS, **before}, {**DEFAULTS, **now}
    return [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]


def check_loss_scaling_kept(before, now):
    """fp16's optimizer holds a loss scale (Keras 3's LossScaleOptimizer) that the others lack,
    so a run's checkpoint does not fit an optimizer with or without one where it had not: a
    resume refuses the change to or from fp16 first, --change_config or not, in one line."""
    trained = before.get("precision", "fp32")
    if (trained == "fp16") != (now["precision"] == "fp16"):
        raise ConfigError(f"--resume: the run trained in precision={trained!r}, and a run does "
                          f"not change to or from 'fp16' (its optimizer holds a loss scale the "
                          f"others lack); resume with precision={trained!r}, or start a new "
                          "run in another --output_dir")


def check_resume(before, now, allow_any):
    """The line a resume prints about the config changed since the run's checkpoint (None if
    nothing changed); raises ConfigError for changes other than RESUME_MAY_CHANGE's unless
    allow_any (--change_config)."""
    changed = changes(before, now)
    if not changed:
        return None
    text = ", ".join(f"{k} {old!r} -> {new!r}" for k, old, new in changed)
    refused = [k for k, _, _ in changed if k not in RESUME_MAY_CHANGE]
    if refused and not allow_any:
        raise ConfigError(f"--resume: the run was trained with other values of {', '.join(refused)}"
                          f" ({text}); resume with the config and --set it was trained with, or "
                          "pass --change_config to go on with the new values in this run, or "
                          "choose another --output_dir for a new run")
    return f"--resume: config changed since the checkpoint: {text}"
