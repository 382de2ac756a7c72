"""scripts/compare.py (make compare): both trainers in turns, on this host and on two namespace
hosts, with real workers; the tiny config keeps it short."""
import json
import subprocess
import sys

from tests.helpers import REPO, TINY, need_root, run_job, script_env


def test_compare_runs_both_trainers_on_one_host_and_over_a_link(ptb_path, tmp_path):
    need_root()
    out = tmp_path / "compare.json"
    r = run_job([sys.executable, "scripts/compare.py", "--quick", "--config", TINY, "--steps",
                 "12", "--data_path", ptb_path, "--out", str(out)], 600, cwd=REPO,
                env=script_env())
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads(out.read_text())
    assert [row["link"] for row in result["rows"]] == ["this host", "1 Gbit/s"]
    for row in result["rows"]:
        for kind in ("Horovod", "tf.distribute"):
            # the tiny model on 2 workers: hundreds to tens of thousands of words a second, a
            # TensorFlow process of more than 100 MB, its first window within the run's minutes
            assert 100 < row[f"{kind} words_per_s"] < 1e6, row
            assert 100 < row[f"{kind} peak_rss_mb"] < 24 * 1024, row
            assert 0 < row[f"{kind} first_window_s"] < 600, row
    over_link = result["rows"][1]
    # each step sends about the tiny model's gradients (the 32 x 10,000 softmax is most of
    # them); read at log lines 2 steps apart while training goes on, so only roughly
    for kind in ("Horovod", "tf.distribute"):
        assert over_link[f"{kind} bytes_per_step"] > 0.5 * 4 * 32 * 10000, kind
    # the lines each script adds to lm_ptb.py: at least its tagged lines (lm_ptb.py has none),
    # at most all its lines
    for kind, script, tag in (("tf.distribute", "lm_ptb_tf_distribute.py", "# tf.distribute "),
                              ("Horovod", "lm_ptb_distributed.py", "# Horovod ")):
        lines = open(f"{REPO}/{script}").read().splitlines()
        tagged = sum(tag in line for line in lines)
        assert tagged > 10 and tagged <= result["lines_added_to_lm_ptb"][kind]["added"] \
            <= len(lines), kind
    assert "ratio" in r.stdout and "written to" in r.stdout
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
