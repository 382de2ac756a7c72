"""precision="bf16" on real TensorFlow: where the casts sit (hand-computed), the hand-written
backward pass against autodiff in bf16, the whole model against fp32, and checkpoints that move
between the two precisions."""
import json
import math
import os

import numpy as np
import pytest
import tensorflow as tf

from utils import config, hardware
from utils.model import COMPUTE_DTYPES, PTBModel, build_model, sequence_loss
from tests.helpers import REPO, finish, first_loss, horovodrun, list_hosts, run_script

# 1 + 2^-9 is no bfloat16 (8 significant bits: next to 1 are 1 - 2^-8 and 1 + 2^-7); rounded to
# the nearest even, it becomes 1. An fp32 product keeps it; a bf16 operand loses it.
OFF_GRID = 1 + 2 ** -9


def tiny_cfg(**overrides):
    return dict(config.load_config("tests/config_tiny.py"), **overrides)


def test_precision_is_a_checked_config_key():
    assert config.load_config("config_small")["precision"] == "fp32"
    assert config.load_config("config_small", ["precision='bf16'"])["precision"] == "bf16"
    assert config.load_config("config_small", ["precision='fp16'"])["precision"] == "fp16"
    with pytest.raises(config.ConfigError,
                       match="precision must be one of 'fp32', 'bf16', 'fp16'"):
        config.load_config("config_small", ["precision='fp8'"])


@pytest.mark.parametrize("precision, expected", [
    # operands rounded to bf16 (x and the kernel: 1 x 1), then the fp32 bias added exactly
    ("bf16", [1 + 2 ** -9, 3.0]),
    ("fp32", [OFF_GRID * OFF_GRID + 2 ** -9, 3 * OFF_GRID])])
def test_softmax_product_takes_bf16_operands_and_adds_the_bias_in_fp32(precision, expected):
    model = PTBModel(vocab_size=2, hidden_size=1, num_layers=1, keep_prob=1.0, init_scale=0.1,
                     lstm_impl="bptt", precision=precision)
    model(tf.zeros([1, 1], tf.int32), model.zero_state(1))
    model.softmax.kernel.assign([[OFF_GRID, 3.0]])
    model.softmax.bias.assign([2 ** -9, 0.0])
    logits = model._logits(tf.constant([[[OFF_GRID]]]))
    assert logits.dtype == tf.float32
    np.testing.assert_array_equal(logits.numpy().reshape(-1), np.float32(expected))


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_recurrent_product_takes_bf16_operands_and_the_gates_stay_fp32(precision):
    """One step of a 1-unit LSTM with no input: every gate's preactivation is h0 * r, which the
    bf16 product rounds to exactly 1; the gates and the cell then follow in fp32, by hand."""
    from utils.model import bptt_lstm
    lstm = tf.keras.layers.LSTM(1, return_sequences=True, return_state=True)
    lstm(tf.zeros([1, 1, 1]))
    lstm.cell.kernel.assign(tf.zeros([1, 4]))
    lstm.cell.bias.assign(tf.zeros([4]))
    lstm.cell.recurrent_kernel.assign(tf.fill([1, 4], OFF_GRID))
    c0 = 0.5
    outputs, h, c = bptt_lstm(lstm.cell, tf.zeros([1, 1, 1]), tf.constant([[OFF_GRID]]),
                              tf.constant([[c0]]), COMPUTE_DTYPES[precision])
    z = 1.0 if precision == "bf16" else OFF_GRID * OFF_GRID
    sigmoid = 1 / (1 + math.exp(-z))
    c_expected = sigmoid * c0 + sigmoid * math.tanh(z)
    h_expected = sigmoid * math.tanh(c_expected)
    assert float(c[0, 0]) == pytest.approx(c_expected, rel=1e-6)
    assert float(h[0, 0]) == pytest.approx(h_expected, rel=1e-6)
    assert outputs.dtype == h.dtype == c.dtype == tf.float32
    # the two precisions differ here by far more than the tolerance above
    other = 1.0 if precision == "fp32" else OFF_GRID * OFF_GRID
    assert abs(math.tanh(other) - math.tanh(z)) > 1e-3 * math.tanh(z)


def _layer_results(cell, run, x, h, c, weights, variables):
    with tf.GradientTape() as tape:
        tape.watch([x, h, c])
        outputs, h_out, c_out = run(x, h, c)
        loss = (tf.reduce_sum(outputs * weights) + tf.reduce_sum(h_out * 0.3)
                + tf.reduce_sum(c_out * 0.7))
    return [outputs, h_out, c_out] + tape.gradient(loss, [*variables, x, h, c])


@pytest.mark.parametrize("batch, steps, units", [(20, 20, 200), (20, 35, 650)],
                         ids=["small", "medium"])
def test_bf16_bptt_equals_autodiff_of_the_unrolled_bf16_layer(batch, steps, units):
    """The hand-written backward pass in bf16 against TensorFlow's autodiff of the same bf16
    forward, and both against fp32. Measured here (AMD EPYC): the forwards are equal, the
    gradients differ by at most 0.8 % of their scale (bf16 keeps 8 bits: 0.4 % a rounding)."""
    from utils.model import bptt_lstm, unrolled_lstm
    tf.keras.utils.set_random_seed(7)
    uniform = tf.keras.initializers.RandomUniform
    lstm = tf.keras.layers.LSTM(units, return_sequences=True, return_state=True,
                                kernel_initializer=uniform(-0.1, 0.1, seed=1),
                                recurrent_initializer=uniform(-0.1, 0.1, seed=2),
                                bias_initializer=uniform(-0.1, 0.1, seed=3))
    x = tf.random.stateless_normal([batch, steps, units], [7, 0])
    h = tf.random.stateless_normal([batch, units], [7, 1]) * 0.5
    c = tf.random.stateless_normal([batch, units], [7, 2])
    weights = tf.random.stateless_normal([batch, steps, units], [7, 3])
    lstm(x)
    bf16 = tf.bfloat16
    runs = {"unrolled bf16": lambda x, h, c: unrolled_lstm(lstm.cell, x, h, c, bf16),
            "bptt bf16": lambda x, h, c: bptt_lstm(lstm.cell, x, h, c, bf16),
            "bptt fp32": lambda x, h, c: bptt_lstm(lstm.cell, x, h, c)}
    got = {name: [np.asarray(t) for t in _layer_results(
               lstm.cell, tf.function(run), x, h, c, weights, lstm.trainable_variables)]
           for name, run in runs.items()}
    names = ["outputs", "h", "c", "d kernel", "d recurrent kernel", "d bias", "d x", "d h", "d c"]

    def error(a, b):  # relative to the tensor's scale
        return np.abs(a - b).max() / np.abs(b).max()
    for name, ours, autodiff, fp32 in zip(names, *got.values()):
        assert ours.dtype == np.float32, name
        assert error(ours, autodiff) <= (0 if name in ("outputs", "h", "c") else 2e-2), name
        assert error(ours, fp32) <= 3e-2, name
    # bf16 really ran: the fp32 layer's outputs differ by more than fp32's own rounding
    assert error(got["bptt bf16"][0], got["bptt fp32"][0]) > 1e-3


@pytest.mark.parametrize("impl", ["bptt", "keras"])
def test_bf16_model_keeps_fp32_variables_gradients_state_and_logits(impl):
    """The whole model, the CPU path and the Keras (cuDNN on a GPU) path, against fp32 with the
    same weights: the loss within 1e-3, every gradient within 3 % of its scale (Keras' mixed
    policy also runs the gates in bf16: 1.3 % measured, the CPU path 0.8 %)."""
    cfg = tiny_cfg(hidden_size=64, keep_prob=0.5)
    x = tf.constant(np.random.RandomState(3).randint(0, 100, size=(4, 12)), tf.int32)
    seed = tf.constant([1, 2], tf.int64)
    tf.keras.utils.set_random_seed(3)
    reference = build_model(cfg, 100, lstm_impl="bptt")
    model = build_model(dict(cfg, precision="bf16"), 100, lstm_impl=impl)
    model.set_weights(reference.get_weights())
    results = []
    for m in (reference, model):
        with tf.GradientTape() as tape:
            logits, state = m(x, m.zero_state(4), training=True, noise_seed=seed)
            loss = sequence_loss(logits, x)
        results.append((float(loss), logits, state, tape.gradient(loss, m.trainable_variables)))
    (loss32, _, _, grads32), (loss16, logits16, state16, grads16) = results
    assert logits16.dtype == tf.float32
    assert all(t.dtype == tf.float32 for t in tf.nest.flatten(state16))
    # (Keras 3's LSTM layer also holds an integer seed state, no weight)
    assert all(tf.as_dtype(v.dtype) == tf.float32 for v in model.trainable_variables)
    assert loss16 == pytest.approx(loss32, rel=1e-3)
    worst = 0.0
    for g16, g32 in zip(grads16, grads32):
        g16, g32 = tf.convert_to_tensor(g16), tf.convert_to_tensor(g32)
        assert g16.dtype == tf.float32
        g16, g32 = g16.numpy(), g32.numpy()
        assert np.abs(g16 - g32).max() <= 3e-2 * np.abs(g32).max()
        worst = max(worst, np.abs(g16 - g32).max() / np.abs(g32).max())
    # and bf16 ran on this path: its gradients are bf16's, not fp32's to the last digits
    assert worst > 1e-3 and loss16 != loss32, (worst, loss16, loss32)


def test_checkpoints_move_between_precisions_and_paths(tmp_path):
    """One set of fp32 variables: a bf16 model (either path) restores an fp32 model's
    checkpoint and the other way round, weight for weight."""
    cfg = tiny_cfg()
    tf.keras.utils.set_random_seed(4)
    fp32 = build_model(cfg, 30, lstm_impl="bptt")
    path = tf.train.Checkpoint(model=fp32).save(str(tmp_path / "fp32"))
    for impl in ("bptt", "keras"):
        bf16 = build_model(dict(cfg, precision="bf16"), 30, lstm_impl=impl)
        tf.train.Checkpoint(model=bf16).restore(path).assert_existing_objects_matched()
        for a, b in zip(fp32.get_weights(), bf16.get_weights()):
            np.testing.assert_array_equal(a, b)
        back = tf.train.Checkpoint(model=bf16).save(str(tmp_path / f"bf16-{impl}"))
        again = build_model(cfg, 30, lstm_impl="bptt")
        tf.train.Checkpoint(model=again).restore(back).assert_existing_objects_matched()
        for a, b in zip(fp32.get_weights(), again.get_weights()):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("flags, emulated", [
    ("fpu sse avx2 avx512f avx512_vnni avx512_bf16", False),  # AMD EPYC (Zen 4) seen here
    ("avx512_bf16 amx_bf16 amx_tile amx_int8", False),  # Intel Xeon (Sapphire Rapids) seen here
    ("fpu sse avx2 fma", True)])  # AMD EPYC without AVX-512
def test_bf16_units_read_from_cpuinfo(flags, emulated):
    cpuinfo = f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\nflags\t\t: {flags}\n"
    assert (hardware.bf16_units(cpuinfo) == []) == emulated
    cfg = dict(config.load_config("config_small"), precision="bf16")
    note = hardware.precision_note(cfg, cpuinfo=cpuinfo, gpus=[])
    assert (note is not None) == emulated
    if emulated:
        assert "emulates bfloat16" in note and "precision='fp32'" in note
    assert hardware.precision_note(dict(cfg, precision="fp32"), cpuinfo=cpuinfo, gpus=[]) is None
    assert hardware.precision_note(cfg, cpuinfo=cpuinfo, gpus=["/device:GPU:0"]) is None


# init_scale 1: large enough weights that bf16's rounding moves the first step's loss (3e-5 of
# it), where at the tiny config's 0.1 the two precisions give the same first loss
SHORT_SETS = ["steps_per_epoch=8", "num_epochs=2", "max_epoch=1", "eval_steps=4",
              "init_scale=1.0"]
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16"}


def short(precision):
    """The trainer's arguments of a 2-epoch run of the tiny config in `precision`."""
    sets = [*SHORT_SETS, f"precision={precision!r}"]
    return ["--config", os.path.join(REPO, "tests", "config_tiny.py"),
            *[w for item in sets for w in ("--set", item)], "--log_every", "1"]


def _says(precision, stdout, run_dir, data_path):
    """The precision ran: the first step's loss is the one computed here in it from the run's
    first weights and rows, not fp32's; the run's start line names the precision, the emulation
    note comes exactly where this machine's CPU lacks units of it, and every event logs it."""
    lines = stdout.splitlines()
    assert any(line.startswith("[ptb] vocab ") and line.endswith(f"| precision {precision}")
               for line in lines), stdout
    notes = [line for line in lines if f"emulates {DTYPE_NAMES[precision]} " in line]
    assert len(notes) == (0 if hardware.units(precision) else 1), notes
    logged = [e for e in map(json.loads, open(os.path.join(run_dir, "metrics.jsonl")))]
    first = next(e["loss"] for e in logged if e["event"] == "progress")
    sets = [*SHORT_SETS, f"precision={precision!r}"]
    ours, fp32 = (first_loss(data_path, os.path.join(REPO, "tests", "config_tiny.py"), sets,
                             1234, p) for p in (precision, "fp32"))
    assert first == pytest.approx(ours, rel=1e-6) and abs(fp32 - ours) > 1e-6 * ours, \
        (first, ours, fp32)
    assert {e["config"]["precision"] for e in logged} == {precision}
    assert [e["epoch"] for e in logged if e["event"] == "epoch"] == [1, 2]
    assert math.isfinite(logged[-1]["test_ppl"])


@pytest.mark.parametrize("script, precision", [("lm_ptb.py", "bf16"),
                                               ("lm_ptb_tf_distribute.py", "bf16"),
                                               ("lm_ptb.py", "fp16")])
def test_the_one_process_trainers_train_in_reduced_precision_and_say_so(script, precision,
                                                                        corpus, tmp_path):
    out = str(tmp_path / "run")
    r = run_script([script, *short(precision), "--data_path", corpus, "--output_dir", out],
                   timeout=180)
    assert r.returncode == 0, r.stderr
    _says(precision, r.stdout, out, corpus)
    # TensorFlow's own raw line for it (on a CPU without AVX-512) folded into the note
    assert hardware.ONEDNN_NOTES[precision] not in r.stderr, r.stderr


def test_fp16_is_refused_in_one_line_where_its_loss_scaling_is_not_built(corpus, tmp_path):
    """tf.distribute's sum before the clip and a LossScaleOptimizer do not combine yet; tf-keras
    has no Keras 3 LossScaleOptimizer: each says so, and what to train with instead."""
    args = [*short("fp16"), "--data_path", corpus, "--output_dir", str(tmp_path / "run")]
    r = run_script(["lm_ptb_tf_distribute.py", *args])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(
        "error: precision='fp16' is not trained by lm_ptb_tf_distribute.py"), r.stderr
    r = run_script(["lm_ptb.py", *args], env={"PTB_KERAS": "2"})
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and r.stderr.startswith(
        "error: precision='fp16' scales the loss with Keras 3's LossScaleOptimizer"), r.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_elastic_trainer_trains_in_reduced_precision_and_says_so(precision, corpus,
                                                                      tmp_path):
    hosts = tmp_path / "hosts.txt"
    list_hosts(hosts, "localhost:1", "127.0.0.1:1")
    out = str(tmp_path / "run")
    returncode, stdout, _ = finish(horovodrun(hosts, [*short(precision), "--data_path", corpus,
                                                      "--output_dir", out]))
    assert returncode == 0, stdout[-3000:]
    # horovodrun prefixes each worker's lines with its rank
    _says(precision, "\n".join(line.split("]<stdout>:", 1)[-1]
                               for line in stdout.splitlines()), out, corpus)
    logged = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert {e["world_size"] for e in logged} == {2}
    # the config as the elastic trainer used it: commits every 100 steps where none was set
    assert {e["config"]["checkpoint_every"] for e in logged} == {100}


@pytest.mark.parametrize("flags, emulated", [
    ("fpu sse avx2 avx512f avx512_fp16 avx512_bf16", False),  # Intel Xeon (Sapphire Rapids)
    ("avx512_bf16 amx_bf16 amx_fp16", False),  # Intel Xeon (Granite Rapids)
    ("fpu sse avx2 avx512f avx512_vnni avx512_bf16", True),  # AMD EPYC (Zen 4): bf16 only
    ("fpu sse avx2 fma", True)])  # AMD EPYC without AVX-512
def test_fp16_units_read_from_cpuinfo(flags, emulated):
    cpuinfo = f"processor\t: 0\nflags\t\t: {flags}\n"
    assert (hardware.units("fp16", cpuinfo) == []) == emulated
    cfg = dict(config.load_config("config_small"), precision="fp16")
    note = hardware.precision_note(cfg, cpuinfo=cpuinfo, gpus=[])
    assert (note is not None) == emulated
    if emulated:
        assert "emulates float16" in note and "fp16 is for GPUs without bf16 units" in note
    assert hardware.precision_note(cfg, cpuinfo=cpuinfo, gpus=["/device:GPU:0"]) is None


def test_a_resume_to_or_from_fp16_is_refused_in_one_line(corpus, tmp_path):
    """fp16's checkpoints hold a loss scale the others lack: --change_config cannot make one fit
    the other, so the change is named before any restore."""
    args = ["lm_ptb.py", "--config", os.path.join(REPO, "tests", "config_tiny.py"),
            "--data_path", corpus, "--set", "steps_per_epoch=5", "--set", "eval_steps=2"]
    for trained, then in (("fp32", "fp16"), ("fp16", "bf16")):
        out = str(tmp_path / trained)
        r = run_script([*args, "--output_dir", out, "--set", "num_epochs=1",
                        "--set", f"precision={trained!r}"])
        assert r.returncode == 0, r.stderr
        r = run_script([*args, "--output_dir", out, "--set", "num_epochs=2",
                        "--set", f"precision={then!r}", "--resume", "--change_config"])
        assert r.returncode == 2 and r.stderr == (
            f"error: --resume: the run trained in precision={trained!r}, and a run does not "
            "change to or from 'fp16' (its optimizer holds a loss scale the others lack); "
            f"resume with precision={trained!r}, or start a new run in another --output_dir\n"
        ), r.stderr
