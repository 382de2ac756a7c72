"""scripts/benchmark.py's arithmetic and its report, without running the benchmark: a kept
result gives the very table its run printed, and the FLOPs and floor rows against hand
computation."""
import json
import os

from scripts import benchmark
from tests.helpers import REPO

KEPT = os.path.join(REPO, "results", "bench", "bench-full-bf16-0946")


def test_the_report_of_a_kept_result_is_the_table_its_run_printed():
    """make bench of 2026-11-25 09:46 (every row: peer, bf16, 3 rounds) kept its JSON and its
    output: the rows made from the JSON alone are the lines it printed, in order."""
    with open(KEPT + ".json") as f:
        result = json.load(f)
    with open(KEPT + ".log") as f:
        log = f.read().splitlines()
    start = next(i for i, line in enumerate(log) if line.startswith("benchmark (full, "))
    end = next(i for i, line in enumerate(log) if line.startswith("  written to "))
    rows = benchmark.report_rows(result, benchmark.SIZES)
    assert benchmark.table_lines(rows) == log[start + 1:end]


def test_flops_per_word_counts_the_lstm_and_softmax_products_forward_and_backward():
    # small: 2 layers of h=200; per word forward, each layer's gates are a (2h x 4h) product
    # (2 * 400 * 800 = 640,000 FLOPs) and the softmax a (h x 10,000) one (4,000,000 FLOPs);
    # the backward pass is twice the forward: 3 x (2 x 640,000 + 4,000,000)
    assert benchmark.flops_per_word({"hidden_size": 200, "num_layers": 2}) == 15_840_000
    # large: 2 x 2 x 3000 x 6000 + 2 x 1500 x 10,000 = 102,000,000, x 3
    assert benchmark.flops_per_word({"hidden_size": 1500, "num_layers": 2}) == 306_000_000


def test_a_floor_row_is_the_rate_a_step_of_just_its_matmuls_would_reach():
    # a step of 20 x 35 words at 15.84 MFLOP each is 11.088 GFLOP; in 22.176 ms that is
    # 500 GFLOP/s, half of a 1,000 GFLOP/s ceiling
    cfg = {"hidden_size": 200, "num_layers": 2, "batch_size": 20, "num_steps": 35}
    assert benchmark.floor_row("small", {"step floor": 22.176}, 1000.0, cfg) == (
        "small, a train step's matmuls alone (the floor)",
        "22.2 ms = 500 GFLOP/s: at most 50 % of ceiling")


def test_against_a_checkout_runs_its_own_trainers_with_its_own_venv(tmp_path):
    other = tmp_path / "other"
    (other / ".venv" / "bin").mkdir(parents=True)
    python = other / ".venv" / "bin" / "python"
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    runs = {"small_single_all_cores": ([benchmark.sys.executable, "lm_ptb.py"], "config_small",
                                       10, (), 1),
            "small_2ranks_1thread": (["mpirun", "-np", "2", benchmark.sys.executable,
                                      "lm_ptb_distributed.py"], "config_small", 5, (), 1),
            "small_1rank_1thread": (["mpirun"], "config_small", 5, (), 1)}
    out = benchmark.with_runs_against(runs, str(other), "S")
    assert list(out) == ["small_single_all_cores", "small_single_all_cores (S)",
                         "small_2ranks_1thread", "small_2ranks_1thread (S)", "small_1rank_1thread"]
    assert out["small_single_all_cores (S)"][0] == [str(python), str(other / "lm_ptb.py")]
    assert out["small_2ranks_1thread (S)"][0] == ["mpirun", "-np", "2", str(python),
                                                  str(other / "lm_ptb_distributed.py")]
    # an interpreter alone runs this checkout's trainers
    alone = benchmark.with_runs_against(runs, "/other/python", "S")
    assert alone["small_single_all_cores (S)"][0] == ["/other/python",
                                                      os.path.join(REPO, "lm_ptb.py")]


def test_the_against_rows_are_each_rounds_ratio_and_their_median():
    # ours 100, 90, 120 wps against 100, 100, 100: ratios 1.00, 0.90, 1.20, median 1.00
    ours, theirs = [100.0, 90.0, 120.0], [100.0, 100.0, 100.0]
    rounds = [{"a": {"wps": o}, "a (S)": {"wps": t}} for o, t in zip(ours, theirs)]
    result = {"a": {"wps": 100.0, "wps_per_round": ours},
              "a (S)": {"wps": 100.0, "wps_per_round": theirs},
              "against": {"stack": "S", "ours": "O", "ratios": {
                  "a": benchmark.median_ratio(rounds, "a", "a (S)")}}}
    assert benchmark.against_rows(result) == [
        ("ours / against", "O / S"),
        ("a, ours / against", "100 / 100 wps: 1.00x (rounds: 1.00, 0.90, 1.20)")]


def test_against_only_without_against_or_with_a_bare_directory_is_one_line(tmp_path):
    for args, says in ((["--against_only"], "--against_only needs --against"),
                       (["--against_only", "--against", str(tmp_path)],
                        "is a directory without .venv/bin/python")):
        r = benchmark.subprocess.run([benchmark.sys.executable, "scripts/benchmark.py", *args],
                                     cwd=REPO, capture_output=True, text=True, timeout=120)
        assert r.returncode != 0 and r.stdout == "", r.stdout
        errors = r.stderr.strip().splitlines()
        assert errors[-1].startswith("error: ") and says in errors[-1], r.stderr
        assert "Traceback" not in r.stderr
