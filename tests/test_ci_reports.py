"""CI's own reports (.ci/): the cores' idle time while the suite ran, computed by hand."""
import os
import subprocess
import sys

from tests.helpers import REPO


def idle_report(tmp_path, ci_start, cores):
    """.ci/idle.py's lines for tmp_path's idle.tsv and fresh.log."""
    r = subprocess.run([sys.executable, os.path.join(REPO, ".ci", "idle.py"),
                        str(tmp_path / "idle.tsv"), str(tmp_path / "fresh.log"), ci_start, cores],
                       capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def test_idle_report_splits_the_suite_at_the_checks_end_and_skips_a_cut_line(tmp_path):
    # samples 5 s apart, idle ticks at 100 a second: 5, 1 and 10 idle core-seconds in turn
    (tmp_path / "idle.tsv").write_text("1000 50000\n1005 50500\n1010 50600\n1015 51600\n1016")
    # CI started at 998; the check ended 7 s later, at 1005
    (tmp_path / "fresh.log").write_text("fresh: ...\nci: the check ended after 7 s\n")
    hz = os.sysconf("SC_CLK_TCK")
    whole, beside, after = (round(t * 100 / hz) for t in (16, 5, 11))
    assert idle_report(tmp_path, "998", "2") == [
        f"cores idle the suite: {whole} of 30 core-seconds ({whole / 30:.0%}), 15 s",
        f"cores idle beside the check: {beside} of 10 core-seconds ({beside / 10:.0%}), 5 s",
        f"cores idle after it: {after} of 20 core-seconds ({after / 20:.0%}), 10 s"]
    # a check that ended after the suite: the suite's line alone
    (tmp_path / "fresh.log").write_text("ci: the check ended after 60 s\n")
    assert idle_report(tmp_path, "998", "2") == [
        f"cores idle the suite: {whole} of 30 core-seconds ({whole / 30:.0%}), 15 s"]
