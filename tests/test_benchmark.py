"""The benchmark (scripts/bench/): its arithmetic and its report against hand computation and a
kept result's table; then every mode run on the tiny config, a few steps a run, as its make
target gives it."""
import json
import os
import shlex
import subprocess
import sys

import pytest

import utils
from scripts.bench import against, common, floor, full, tune
from tests.helpers import REPO, TINY, script_env

KEPT = [os.path.join(REPO, "results", "bench", name)
        for name in ("bench-full-bf16-0946", "bench-full-bf16-0334")]


@pytest.mark.parametrize("kept", KEPT, ids=os.path.basename)
def test_the_report_of_a_kept_result_is_the_table_its_run_printed(kept):
    """make bench of 2026-11-25 09:46 (AMD EPYC) and of 2026-12-02 03:34 (Intel Xeon with AMX;
    every row: peer, bf16, 3 rounds) kept their JSON and output: the rows made from the JSON
    alone are the lines each printed, in order."""
    with open(kept + ".json") as f:
        result = json.load(f)
    with open(kept + ".log") as f:
        log = f.read().splitlines()
    start = next(i for i, line in enumerate(log) if line.startswith("benchmark (full, "))
    end = next(i for i, line in enumerate(log) if line.startswith("  written to "))
    rows = full.report_rows(result, common.SIZES)
    assert common.table_lines(rows) == log[start + 1:end]


def test_a_table_keeps_two_spaces_between_its_longest_label_and_a_wide_value():
    """make bench-tune's table once ran its bound's label (71 characters, in a column of 70)
    into its words/sec when they grew to 5 digits (CI at e97a168): every table pads to its
    longest label. Ratios by hand: 14,608 / 7,304 = 2.00, 14,608 / 29,216 = 0.50."""
    assert common.table_lines([("ab", "9"), ("abcd", "14,608 wps")]) == [
        "  ab    9", "  abcd  14,608 wps"]
    default, single = "tiny, 2 ranks, default", "tiny, single process (reference)"
    bound = "tiny, 2 processes x 1 thread, half batch each, no allreduce (the bound)"
    wps = {default: 7304, bound: 14608, single: 29216}
    rounds = [{name: {"wps": w} for name, w in wps.items()}]
    lines = tune.report_lines(rounds, {n: {"wps": w} for n, w in wps.items()}, default, single)
    pad = " " * (len(bound) - len(default))
    assert lines[0] == f"  {default}{pad}   7,304 wps  1.00x the default  0.25x the single process"
    assert lines[1] == f"  {bound}  14,608 wps  2.00x the default  0.50x the single process"
    assert [line.split("  ")[1].strip() for line in lines] == list(wps)


def test_flops_per_word_counts_the_lstm_and_softmax_products_forward_and_backward():
    # small: 2 layers of h=200; per word forward, each layer's gates are a (2h x 4h) product
    # (2 * 400 * 800 = 640,000 FLOPs) and the softmax a (h x 10,000) one (4,000,000 FLOPs);
    # the backward pass is twice the forward: 3 x (2 x 640,000 + 4,000,000)
    assert floor.flops_per_word({"hidden_size": 200, "num_layers": 2}) == 15_840_000
    # large: 2 x 2 x 3000 x 6000 + 2 x 1500 x 10,000 = 102,000,000, x 3
    assert floor.flops_per_word({"hidden_size": 1500, "num_layers": 2}) == 306_000_000


def test_a_floor_row_is_the_rate_a_step_of_just_its_matmuls_would_reach():
    # a step of 20 x 35 words at 15.84 MFLOP each is 11.088 GFLOP; in 22.176 ms that is
    # 500 GFLOP/s, half of a 1,000 GFLOP/s ceiling
    cfg = {"hidden_size": 200, "num_layers": 2, "batch_size": 20, "num_steps": 35}
    assert floor.floor_row("small", {"step floor": 22.176}, 1000.0, cfg) == (
        "small, a train step's matmuls alone (the floor)",
        "22.2 ms = 500 GFLOP/s: at most 50 % of ceiling")


def test_against_a_checkout_runs_its_own_trainers_with_its_own_venv(tmp_path):
    other = tmp_path / "other"
    (other / ".venv" / "bin").mkdir(parents=True)
    python = other / ".venv" / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    runs = {"small_single_all_cores": ([sys.executable, "lm_ptb.py"], "config_small", 10, (), 1),
            "small_2ranks_1thread": (["mpirun", "-np", "2", sys.executable,
                                      "lm_ptb_distributed.py"], "config_small", 5, (), 1),
            "small_1rank_1thread": (["mpirun"], "config_small", 5, (), 1)}
    out = against.with_runs_against(runs, str(other), "S")
    assert list(out) == ["small_single_all_cores", "small_single_all_cores (S)",
                         "small_2ranks_1thread", "small_2ranks_1thread (S)", "small_1rank_1thread"]
    assert out["small_single_all_cores (S)"][0] == [str(python), str(other / "lm_ptb.py")]
    assert out["small_2ranks_1thread (S)"][0] == ["mpirun", "-np", "2", str(python),
                                                  str(other / "lm_ptb_distributed.py")]
    # an interpreter alone runs this checkout's trainers
    alone = against.with_runs_against(runs, "/other/python", "S")
    assert alone["small_single_all_cores (S)"][0] == ["/other/python",
                                                      os.path.join(REPO, "lm_ptb.py")]


def test_the_against_rows_are_each_rounds_ratio_and_their_median():
    # ours 100, 90, 120 wps against 100, 100, 100: ratios 1.00, 0.90, 1.20, median 1.00
    ours, theirs = [100.0, 90.0, 120.0], [100.0, 100.0, 100.0]
    rounds = [{"a": {"wps": o}, "a (S)": {"wps": t}} for o, t in zip(ours, theirs)]
    result = {"a": {"wps": 100.0, "wps_per_round": ours},
              "a (S)": {"wps": 100.0, "wps_per_round": theirs},
              "against": {"stack": "S", "ours": "O", "ratios": {
                  "a": common.median_ratio(rounds, "a", "a (S)")}}}
    assert against.against_rows(result) == [
        ("ours / against", "O / S"),
        ("a, ours / against", "100 / 100 wps: 1.00x (rounds: 1.00, 0.90, 1.20)")]


def test_against_without_against_or_with_a_bare_directory_is_one_line(tmp_path):
    for args, says in (([], "the comparison needs --against"),
                       (["--against", str(tmp_path)], "is a directory without .venv/bin/python")):
        r = subprocess.run([sys.executable, "scripts/bench/against.py", *args], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and r.stdout == "", r.stdout
        errors = r.stderr.strip().splitlines()
        assert errors[-1].startswith("error: ") and says in errors[-1], r.stderr
        assert "Traceback" not in r.stderr


# The benchmark's whole path, each make target as `make -n` gives its command, on the tiny
# config: a few steps a run, one round. Its rows' labels written out by hand. The bound's 2
# copies run half the steps and must run together for a second: 150 tiny steps of one thread
# (run again with twice the steps where they did not: a start-up a second late once ended it).
TINY_BENCH = f"--configs {TINY} --steps 300 --rounds 1"
PEER = os.path.join(REPO, ".venv-peer", "bin", "python")


def bench_command(target, *variables, bench_args=TINY_BENCH):
    """The benchmark's command line of `make TARGET` (its last recipe line, from make -n)."""
    r = subprocess.run(["make", "-n", target, f"BENCH_ARGS={bench_args}", *variables], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.replace("\\\n", " ").splitlines()
    return shlex.split(next(line for line in reversed(lines) if "scripts/bench/" in line))


def run_bench(command, out, timeout=1800):
    """The command's output (it ran) and the JSON it wrote to `out`. It runs as from a user's
    shell, without the TensorFlow variables the tests set: TensorFlow, started in it as the
    trainers start it (utils.import_tensorflow), prints none of its start-up notes."""
    env = {k: v for k, v in script_env().items() if not k.startswith("TF_")}
    r = subprocess.run([*command, "--out", str(out)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr
    assert not any(note in r.stderr for note in utils.STARTUP_NOTES), r.stderr
    with open(out) as f:
        return r.stdout, json.load(f)


def table(stdout, header):
    """The (label, value) lines of the table printed after the line starting with `header`."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    end = next(i for i, line in enumerate(lines) if line.startswith("  written to "))
    return lines[start + 1:end]


def has_torch(python):
    return os.access(python, os.X_OK) and subprocess.run(
        [python, "-c", "import torch"], capture_output=True, timeout=120).returncode == 0


TINY_ROWS = [
    "fp32 matmul ceiling (best of 6 shapes, all cores)",
    "bf16 matmul ceiling (best of 6 shapes, all cores)",
    "bf16 units of this CPU (/proc/cpuinfo)",
    "tiny: FLOPs per word (fwd + bwd)",
    "tiny: words/sec at that ceiling",
    "tiny, single process, all cores",
    "tiny, a train step's matmuls alone (the floor)",
    "tiny, 2 ranks x 1 thread",
    "tiny, 2 ranks x 1 thread / single process",
    "tiny, 2 processes x 1 thread, half batch, no allreduce",
    "tiny, 2 ranks x 1 thread / that bound",
    "tiny, single process, bf16",
    "tiny, bf16 / fp32 (single process)",
    "tiny, fp32 floor / bf16 floor (the most bf16 could gain on matmuls alone)",
    "tiny, bf16, a train step's matmuls alone (the floor)",
    "tiny, bf16 / PyTorch's autocast bf16",
    "tiny, 1 rank x 1 thread",
    "tiny, 2 ranks x 1 thread / 1 rank x 1 thread",
    "tiny, 1 rank x 1 thread, half batch",
    "peak RSS, tiny single / rank 0 of 2",
    "tiny, PyTorch (same model, all cores)",
    "tiny, single process / PyTorch",
    "one tiny LSTM layer fwd+bwd, ours / PyTorch's",
    "tiny: valid evaluation / training epoch",
    "ours / against",
    "tiny_single_all_cores, ours / against",
    "tiny_single_bf16, ours / against",
    "tiny_2ranks_1thread, ours / against",
    "tiny step profile: whole train step",
    "tiny step profile: softmax projection + loss, fwd+bwd",
    "tiny step profile: one LSTM layer, fwd+bwd",
    "fwd+bwd loss: sparse_softmax_cross_entropy",
    "fwd+bwd loss: logsumexp - target logit",
    "fwd+bwd LSTM layer tiny: tf.keras.layers.LSTM",
    "fwd+bwd LSTM layer tiny: unrolled, autodiff",
    "fwd+bwd LSTM layer tiny: bptt (ours)",
]
TINY_RUNS = ["tiny_1rank_1thread", "tiny_1rank_1thread_half_batch", "tiny_single_all_cores",
             "tiny_2ranks_1thread", "tiny_2procs_half_batch_no_allreduce", "tiny_single_bf16"]


def test_make_bench_runs_every_row_on_the_tiny_config(ptb_path, tmp_path):
    """`make bench` with AGAINST (this interpreter: its rows run twice) and the PyTorch peer
    where .venv-peer has it: every row in the table, each run's words/sec in the JSON, and the
    table the very rows the JSON gives (a kept result's table is rebuilt from it)."""
    command = bench_command("bench", f"AGAINST={sys.executable}", f"PTB_DATA_PATH={ptb_path}")
    assert command[1] == "scripts/bench/full.py" and "--quick" not in command
    stdout, result = run_bench(command, tmp_path / "bench.json")
    peer = has_torch(PEER)
    expected = [row for row in TINY_ROWS if peer or "PyTorch" not in row]
    lines = table(stdout, "benchmark (full, ")
    assert [line.split("  ")[1].strip() for line in lines] == expected, "\n".join(lines)
    assert lines == common.table_lines(full.report_rows(result, ["tiny"]))
    runs = TINY_RUNS + (["tiny_pytorch", "tiny_pytorch_bf16"] if peer else [])
    stack = result["against"]["stack"]
    runs += [f"{name} ({stack})" for name in ("tiny_single_all_cores", "tiny_single_bf16",
                                              "tiny_2ranks_1thread")]
    assert all(result[name]["wps"] > 0 and len(result[name]["wps_per_round"]) == 1
               for name in runs), {name: result.get(name) for name in runs}
    assert result["rounds"] == 1 and list(result["valid_eval_cost"]) == [TINY]
    if not peer:
        assert f"  peer: no PyTorch at {PEER}" in stdout


def test_make_bench_quick_is_make_bench_with_fewer_steps_one_round_and_no_large_rows():
    """`make bench-quick` is make bench's command with --quick (whose whole path, on the tiny
    config, the test above runs), planning what --help says: small and medium, 300 and 60
    steps, one round, fewer timing repetitions; the ceiling's shapes and the validation's cost
    still the three configs' and medium's and large's. make bench plans every config, 3 rounds."""
    bench, quick = (bench_command(target, bench_args="") for target in ("bench", "bench-quick"))
    assert quick == [*bench[:2], "--quick", *bench[2:]]
    sizes = {size: f"config_{size}" for size in ("small", "medium", "large")}
    planned = full.plan(full.arguments().parse_args(quick[2:]))
    assert planned == full.Plan(
        configs={"small": "config_small", "medium": "config_medium"},
        steps={"small": 300, "medium": 60}, rounds=1, reps=9, eval_windows=(4, 100),
        shape_configs=list(sizes.values()), eval_configs=["config_medium", "config_large"])
    planned = full.plan(full.arguments().parse_args(bench[2:]))
    assert planned == full.Plan(
        configs=sizes, steps={"small": 600, "medium": 100, "large": 60}, rounds=3, reps=15,
        eval_windows=(8, 300), shape_configs=list(sizes.values()),
        eval_configs=["config_medium", "config_large"])


def test_make_bench_against_runs_its_rows_on_both_stacks(ptb_path, tmp_path):
    """`make bench-against` with this interpreter as the other stack: its rows, run on both."""
    stdout, result = run_bench(bench_command("bench-against", f"AGAINST={sys.executable}",
                                             f"PTB_DATA_PATH={ptb_path}",
                                             bench_args=f"--configs {TINY} --steps 30 --rounds 1"),
                               tmp_path / "against.json")
    rows = ["tiny_single_all_cores", "tiny_single_bf16", "tiny_2ranks_1thread"]
    lines = table(stdout, "ours against ")
    assert [line.split("  ")[1].strip() for line in lines] == [
        "ours / against", *(f"{row}, ours / against" for row in rows)]
    stack = result["against"]["stack"]
    assert list(result["against"]["ratios"]) == rows
    assert all(result[name]["wps"] > 0 and result[f"{name} ({stack})"]["wps"] > 0
               for name in rows)


def test_make_bench_tune_times_each_variant_on_the_tiny_config(ptb_path, tmp_path):
    """`make bench-tune CONFIG=tests/config_tiny.py`: each variant, the bound and the single
    process, in the table and the JSON."""
    stdout, result = run_bench(bench_command("bench-tune", f"CONFIG={TINY}",
                                             f"PTB_DATA_PATH={ptb_path}",
                                             bench_args="--steps 150 --rounds 1"),
                               tmp_path / "tune.json")
    # the tiny config's gradients (2.7 MB) fit in one fusion buffer: small's variants
    variants = ["default", "2 threads a rank (--threads 2)", "HOROVOD_CYCLE_TIME=0.2",
                "HOROVOD_FUSION_THRESHOLD=0", "both of these", "fp16_allreduce=True",
                "reduce_type='param' (every 10 steps)"]
    names = [f"tiny, 2 ranks, {v}" for v in variants] + [
        "tiny, 2 processes x 1 thread, half batch each, no allreduce (the bound)",
        "tiny, single process (reference)"]
    assert all(result[name]["wps"] > 0 for name in names) and result["config"] == "tiny"
    assert [line.split("  ")[1].strip() for line in table(stdout, "2 ranks x 1 thread on one host")
            if line.startswith("  tiny, ")] == names


@pytest.mark.parametrize("late_until, says", [
    (200, "ran together for 0.0 s only; again with 200 steps each"),
    (10**6, "did not run together for a second (0.0 s), even with 400 steps; give them more")])
def test_copies_that_did_not_run_together_run_again_with_twice_the_steps(
        ptb_path, late_until, says, capfd, monkeypatch):
    """The bound's 2 copies once started 1 s apart and ran 1 s each (CI, 2026-12-02): measured
    together for less than a second, the benchmark failed. Real trainers, the second started
    only when the first has ended (tests/late_copy.py) while they run fewer than `late_until`
    steps: they run again with twice the steps, up to 4 times the first, then one line."""
    monkeypatch.setenv("PTB_LATE_UNTIL_STEPS", str(late_until))
    launcher = [sys.executable, os.path.join(REPO, "tests", "late_copy.py")]
    if late_until == 200:
        wps, how, rss = common.run_trainer(launcher, TINY, 100, 10, ptb_path, copies=2)
        assert wps > 0 and rss > 0 and how.startswith("2 copies together for "), how
    else:
        with pytest.raises(SystemExit) as ended:
            common.run_trainer(launcher, TINY, 100, 10, ptb_path, copies=2)
        assert "benchmark: the 2 copies of" in str(ended.value), ended.value
        assert says in str(ended.value) and "\n" not in str(ended.value)
        says = "only; again with 400 steps each"
    assert says in capfd.readouterr().err


def test_the_ceiling_floor_and_layer_profile_modes_on_the_tiny_config(tmp_path):
    """docs/performance.md's three other modes: each its lines for the tiny config's shapes."""
    def command(mode):
        return [sys.executable, f"scripts/bench/{mode}.py", "--configs", TINY]
    stdout, result = run_bench(command("ceiling"), tmp_path / "ceiling.json")
    # tiny's 4 shapes (20 x 10 rows of 32 units, a vocabulary of 10,000) and the 2 square ones
    assert sorted(result["matmul_gflops_by_shape"]) == sorted([
        "200x64 by 64x128", "200x32 by 32x10000", "32x200 by 200x10000", "200x10000 by 10000x32",
        "1024x1024 by 1024x1024", "2048x2048 by 2048x2048"])
    assert "  fp32 matmul ceiling (best of 6 shapes, all cores)  " in stdout
    stdout, result = run_bench(command("floor"), tmp_path / "floor.json")
    for prefix in ("", "bf16_"):
        assert set(result[f"tiny_{prefix}matmul_floor_ms"]) == {
            "recurrent chain of one layer", "one layer's 4 large products",
            "softmax's 3 products", "step floor"}
    assert "  tiny, bf16, a train step's matmuls alone (the floor)  " in stdout
    r = subprocess.run(command("profiles"), cwd=REPO, env=script_env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("one tiny LSTM layer (20 x 10 x 32), ")
    assert [line.split("  ")[1].strip() for line in r.stdout.splitlines()[1:]] == [
        "whole layer, fwd+bwd", "forward (projection + loop)",
        "10 forward recurrent products alone", "10 backward recurrent products alone",
        "4 large products (input projection, 2 weight gradients, input gradient)"]
