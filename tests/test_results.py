"""scripts/results/: the README table from run logs, on hand-made logs and on the committed ones."""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from scripts import record_env
from scripts.results import common, plots, side_by_side, tables
from tests.helpers import REPO


def progress(step, time):
    return {"event": "progress", "step": step, "time": time, "wps": 0}


def run(kind, workers, events, batch_size=20, num_steps=20):
    return {"name": f"small-{workers}", "kind": kind, "workers": workers, "events": events,
            "config": {"name": "config_small", "batch_size": batch_size, "num_steps": num_steps}}


def epoch(n, train, valid, seconds):
    return {"event": "epoch", "epoch": n, "train_ppl": train, "valid_ppl": valid,
            "epoch_time_s": seconds}


def test_bounded_time_is_the_median_step_time_times_the_steps_of_a_full_epoch():
    # 929,589 training tokens in 20 rows: 46,479 per row, 46,478 targets, 2,323 windows of 20
    timed = run("bounded", 1, [progress(0, 100.0), progress(10, 110.0), progress(20, 122.0),
                               progress(30, 140.0)])
    assert common.full_epoch_steps(timed["config"]) == 2323
    assert abs(common.epoch_time(timed) - 1.2 * 2323) < 1e-6  # steps of 1.0, 1.2, 1.8 s


def test_an_epoch_resumed_inside_it_counts_its_time_scaled_to_all_its_steps():
    # 100 s for the last 250 of 1,000 steps: a 400 s epoch, the median of 380, 400 and 420
    resumed = dict(epoch(2, 90.0, 95.0, 100.0), steps_run=250, steps=1000)
    r = run("partial", 1, [epoch(1, 99.0, 99.0, 380.0), resumed, epoch(3, 80.0, 85.0, 420.0)])
    assert common.epoch_time(r) == 400.0


def test_a_full_row_shows_both_runs_last_epoch_and_the_speedup_from_median_epoch_times():
    single = run("full", 1, [epoch(0, 90.0, 95.0, 70.0), epoch(1, 51.0, 61.0, 90.0),
                             epoch(2, 51.0, 61.0, 80.0), {"event": "test", "test_ppl": 59.0}])
    dist = run("full", 2, [epoch(0, 91.0, 96.0, 100.0), epoch(1, 50.0, 60.0, 100.0),
                           epoch(2, 50.0, 60.0, 120.0), {"event": "test", "test_ppl": 58.0}])
    rows = tables.table([single, dist])
    assert rows[2] == ("| small | full | 3 | 50.00 / 51.00 | 60.00 / 61.00 | 58.00 / 59.00 | "
                       "100.0 s† | 80.0 s† | 0.80×† |")


def test_a_run_without_its_2_worker_partner_gets_dashes_in_that_column():
    single = run("partial", 1, [epoch(0, 300.0, 200.0, 50.0), {"event": "test", "test_ppl": 190.0}])
    assert tables.table([single])[2] == ("| small | partial (1 of 13 epochs) | 1 | — / 300.00 | "
                                          "— / 200.00 | — / 190.00 | — | 50.0 s† | — |")


def test_the_readme_table_is_what_make_results_builds_from_the_committed_logs():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    runs = common.load_all()
    block = "\n".join([tables.BEGIN, *tables.results_block(runs), tables.END])
    assert block in readme, "README.md's results table is stale: run `make results` and commit"
    with open(os.path.join(REPO, "results", "README.md")) as f:
        assert f.read() == tables.results_readme(runs), \
            "results/README.md is stale: run `make results` and commit"


def test_a_readme_row_shows_the_2_worker_run_both_times_and_the_published_test():
    env = {"cpu": "AMD EPYC", "cores": 2}
    dist = dict(run("full", 2, [epoch(1, 51.0, 61.0, 100.0), epoch(2, 50.0, 60.0, 120.0),
                                epoch(3, 49.0, 59.0, 110.0), {"event": "test", "test_ppl": 58.0}]),
                env=env)
    single = dict(run("partial", 1, [epoch(1, 52.0, 62.0, 80.0), epoch(2, 51.0, 61.0, 90.0)]),
                  env=env)
    timed = dict(run("bounded", 1, [progress(0, 0.0), progress(10, 1.0)]), env=env)
    # times: the median epoch of each; the bounded run counts for nothing here
    assert tables.paper_table([single, timed, dist])[2] == (
        "| small | 3 | 49.00 | 59.00 | 58.00 | 110 s† | 85 s† | — | 114.72 / 115.91 / 114.5 | "
        "AMD EPYC, 2 cores |")


def test_a_readme_row_says_how_far_a_run_is_and_the_time_left():
    env = {"cpu": "AMD EPYC", "cores": 2}
    running = dict(run("running", 2, [epoch(1, 90.0, 95.0, 3600.0), epoch(2, 80.0, 85.0, 3600.0)]),
                   env=env)
    # 11 of config_small's 13 epochs left at 3,600 s each
    assert tables.paper_table([running])[2] == (
        "| small | 2 of 13, running, ETA ≈ 11 h | 80.00 | 85.00 | — | 3600 s† | — | — | "
        "114.72 / 115.91 / 114.5 | AMD EPYC, 2 cores |")
    alone = dict(run("running", 1, [epoch(1, 90.0, 95.0, 1800.0)]), env=env)  # 12 x 1,800 s left
    assert tables.paper_table([alone])[2].startswith(
        "| small | 1 of 13, running (1 process), ETA ≈ 6 h | 90.00 | 95.00 | — | — | 1800 s† | — |")
    partial = dict(run("partial", 1, [epoch(1, 300.0, 200.0, 50.0),
                                      {"event": "test", "test_ppl": 190.0}]), env=env)
    assert tables.paper_table([partial])[2].startswith(
        "| small | 1 of 13 (1 process, partial) | 300.00 | 200.00 | 190.00 | — | 50 s† | — |")


def test_epoch_by_epoch_pairs_the_longest_runs_at_the_epochs_both_reached():
    single = run("partial", 1, [epoch(1, 300.0, 200.0, 50.0), epoch(2, 200.0, 150.0, 50.0)])
    dist = run("running", 2, [epoch(1, 301.0, 202.0, 60.0), epoch(2, 199.0, 147.0, 60.0),
                              epoch(3, 150.0, 120.0, 60.0)])
    shorter = run("partial", 2, [epoch(1, 999.0, 999.0, 60.0)])
    assert tables.epoch_by_epoch([single, shorter, dist])[2:] == [
        "| small | 1 | 202.00 | 200.00 | +1.0 % |", "| small | 2 | 147.00 | 150.00 | -2.0 % |"]


def test_a_one_process_partial_run_is_compared_with_the_first_epochs_of_the_2_worker_run():
    env = {"cpu": "Intel(R) Xeon(R) Processor", "cores": 2}
    single = dict(run("partial", 1, [epoch(1, 300.0, 200.0, 3600.0), epoch(2, 200.0, 150.0, 3600.0),
                                     {"event": "test", "test_ppl": 140.0}]), env=env)
    dist = dict(run("running", 2, [epoch(1, 301.0, 202.0, 60.0), epoch(2, 199.0, 147.0, 60.0),
                                   epoch(3, 150.0, 120.0, 60.0)]), env=env)
    # the 2-worker cells are its epoch 2, with no test and no time: those ran in another sitting
    assert tables.table([single, dist])[3].startswith(
        "| small | partial (2 of 13 epochs; 2 workers: the running run's first 2) | 2 | "
        "199.00 / 200.00 | 147.00 / 150.00 | — / 140.00 | — | 3600.0 s† | — |")


def test_two_runs_of_the_same_row_are_refused_rather_than_one_silently_dropped():
    old, new = run("partial", 1, [epoch(1, 300.0, 200.0, 50.0)]), run("partial", 1, [])
    new["name"] = "small-1-new"
    with pytest.raises(SystemExit, match="both a partial run of config_small"):
        list(tables.row_runs([old, new]))


def test_a_run_of_several_sittings_names_the_epochs_machine_commit_and_settings_of_each():
    segment = {"cpu": "AMD EPYC", "cores": 2}
    r = run("full", 2, [epoch(n, 90.0, 95.0, 60.0) for n in (1, 2, 3, 4)])
    r["segments"] = [dict(segment, started_utc="d1", commit="aaa", epochs_done_at_start=0,
                          shared=["a CI run"]),
                     dict(segment, started_utc="d2", commit="bbb", epochs_done_at_start=2),
                     dict(segment, started_utc="d3", commit="ccc", epochs_done_at_start=2),
                     dict(segment, started_utc="d4", commit="ddd", epochs_done_at_start=3,
                          settings={"TF_ENABLE_ONEDNN_OPTS": "1"})]
    # the sitting d2 stopped before it finished an epoch: d3 trained epoch 3 again from ckpt-2
    assert tables.sittings(r) == (
        "In 3 sittings: epochs 1-2 from d1 UTC on AMD EPYC, 2 cores, commit aaa (beside it: a CI "
        "run) | epoch 3 from d3 UTC on AMD EPYC, 2 cores, commit ccc (beside it: nothing else "
        "noted) | epoch 4 from d4 UTC on AMD EPYC, 2 cores, commit ddd, TF_ENABLE_ONEDNN_OPTS=1 "
        "(beside it: nothing else noted)")


def bf16(r):
    return dict(r, name=r["name"] + "-bf16", config=dict(r["config"], precision="bf16"))


def test_the_readme_row_is_fp32_where_both_precisions_ran_and_says_bf16_where_only_it_did():
    env = {"cpu": "AMD EPYC", "cores": 2}
    fp32 = dict(run("full", 2, [epoch(1, 51.0, 61.0, 100.0), {"event": "test", "test_ppl": 58.0}]),
                env=env)
    fast = bf16(dict(run("full", 2, [epoch(1, 52.0, 62.0, 50.0),
                                     {"event": "test", "test_ppl": 59.0}]), env=env))
    assert tables.paper_table([fast, fp32])[2].startswith(
        "| small | 1 | 51.00 | 61.00 | 58.00 | 100 s† | — | — |")
    # a one-process bf16 run of the whole schedule before an fp32 partial one, times its own
    partial = dict(run("partial", 1, [epoch(1, 300.0, 200.0, 900.0)]), env=env)
    running = bf16(dict(run("running", 1, [epoch(1, 290.0, 190.0, 600.0)]), env=env))
    assert tables.paper_table([partial, running])[2].startswith(
        "| small, bf16 | 1 of 13, running (1 process), ETA ≈ 2 h | 290.00 | 190.00 | — | — | "
        "600 s† | — |")
    # of two partial runs, the one further on, whatever its precision
    further = bf16(dict(run("partial", 1, [epoch(n, 290.0, 190.0, 600.0) for n in (1, 2)]),
                        env=env))
    assert tables.paper_table([partial, further])[2].startswith(
        "| small, bf16 | 2 of 13 (1 process, partial) |")
    # and the tables of results/README.md keep to fp32
    assert len(tables.table(common.fp32_only([fast, fp32]))) == 3


def test_an_attempt_lost_with_its_machine_stays_the_row_until_the_new_run_passes_it():
    env = {"cpu": "AMD EPYC", "cores": 2}
    lost = bf16(dict(run("partial", 1, [epoch(n, 290.0, 190.0 - n, 600.0) for n in (1, 2, 3)]),
                     env=env, lost="after 3 epochs: ..."))
    again = dict(run("running", 1, [epoch(1, 300.0, 200.0, 900.0)]), env=env, segments=[{}])
    assert tables.paper_table([lost, again])[2].startswith(
        "| small, bf16 | 3 of 13 (1 process, partial); its machine ended; started again in "
        "fp32: 1 of 13 | 290.00 | 187.00 | — | — | 600 s† | — |")
    # stopped between sittings, the new run is named the same way
    assert tables.paper_table([lost, dict(again, kind="partial")])[2].startswith(
        "| small, bf16 | 3 of 13 (1 process, partial); its machine ended; started again in "
        "fp32: 1 of 13 |")
    again["events"] = [epoch(n, 300.0, 100.0, 900.0) for n in (1, 2, 3, 4)]
    assert tables.paper_table([lost, again])[2].startswith(
        "| small | 4 of 13, running (1 process), ETA ≈ 2 h | 300.00 | 100.00 |")
    # two lost attempts of one row: the results table shows the one that got further
    shorter = dict(run("partial", 1, [epoch(1, 300.0, 200.0, 900.0)]), lost="after 1 epoch")
    longer = dict(run("partial", 1, [epoch(n, 290.0, 190.0, 600.0) for n in (1, 2, 3)]),
                  name="small-1-lost-2", lost="after 3 epochs")
    assert [r[2] for r in tables.row_runs([shorter, longer])] == [longer]
    # and says it was lost, and how far the run started again has come
    again = dict(run("partial", 1, [epoch(1, 300.0, 200.0, 900.0)]), segments=[{}])
    assert tables.table([longer, again])[2].startswith(
        "| small | partial (3 of 13 epochs; its machine ended; started again: 1 so far) | 3 |")
    assert tables.table([again])[2].startswith("| small | partial (1 of 13 epochs) | 1 |")


def test_a_run_started_again_before_its_first_epoch_ends_shows_dashes_not_a_crash():
    # `make results` a minute after a start from epoch 0: progress lines, no epoch yet
    env = {"cpu": "AMD EPYC", "cores": 2}
    lost = dict(run("partial", 1, [epoch(n, 290.0, 190.0, 600.0) for n in (1, 2, 3)]), env=env,
                lost="after 3 epochs")
    again = dict(run("running", 1, [progress(100, 10.0)]), env=env,
                 segments=[{"epochs_done_at_start": 0, "started_utc": "d1", "cpu": "AMD EPYC",
                            "cores": 2, "commit": "aaa"}])
    assert common.epoch_time(again) is None
    assert tables.table([lost, again])[2] == (
        "| small | running (0 of 13 epochs so far) | 0 | — / — | — / — | — / — | — | — | — |")
    assert tables.paper_table([lost, again])[2].startswith(
        "| small | 3 of 13 (1 process, partial); its machine ended; started again in fp32: "
        "0 of 13 | 290.00 | 190.00 | — | — | 600 s† | — |")
    assert tables.sittings(again) == "No epoch finished yet"


def test_the_bf16_table_sets_each_epoch_beside_the_fp32_runs_same_epoch():
    fp32 = run("full", 2, [epoch(1, 300.0, 200.0, 60.0), epoch(2, 200.0, 150.0, 60.0),
                           {"event": "test", "test_ppl": 140.0}])
    fast = bf16(run("full", 2, [epoch(1, 300.0, 202.0, 30.0), epoch(2, 200.0, 148.5, 30.0),
                                {"event": "test", "test_ppl": 141.4}]))
    assert tables.bf16_table([fp32, fast])[2:] == [
        "| small | 2 | 1 | 202.00 | 200.00 | +1.00 % |",
        "| small | 2 | 2 | 148.50 | 150.00 | -1.00 % |",
        "| small | 2 | test | 141.40 | 140.00 | +1.00 % |"]


def test_an_epoch_trained_twice_is_one_row_of_the_bf16_table_its_later_one():
    # stopped in epoch 2's validation, then resumed from epoch 1: epoch 2 ends twice in the log
    fp32 = run("full", 2, [epoch(1, 300.0, 200.0, 60.0), epoch(2, 200.0, 150.0, 60.0)])
    again = bf16(run("full", 2, [epoch(1, 300.0, 202.0, 30.0), epoch(2, 200.0, 153.0, 30.0),
                                 epoch(2, 200.0, 151.5, 30.0)]))
    assert tables.bf16_table([fp32, again])[2:] == [
        "| small | 2 | 1 | 202.00 | 200.00 | +1.00 % |",
        "| small | 2 | 2 | 151.50 | 150.00 | +1.00 % |"]


def test_the_curves_set_the_longest_bf16_run_beside_the_fp32_ones_of_its_config():
    fp32 = run("partial", 1, [epoch(n, 300.0, 200.0, 900.0) for n in (1, 2, 3)])
    short, longer = (bf16(run("partial", 1, [epoch(n, 290.0, 190.0, 600.0) for n in range(1, k)]))
                     for k in (3, 6))
    assert plots.curves([fp32, short, longer]) == {"config_small": [fp32, longer]}
    # bf16 alone is drawn too; one epoch of each is no curve; bounded runs are not drawn
    assert plots.curves([longer]) == {"config_small": [longer]}
    one = run("partial", 1, [epoch(1, 300.0, 200.0, 900.0)])
    assert plots.curves([one, bf16(one)]) == {}
    bounded = bf16(run("bounded", 1, [epoch(n, 1.0, 1.0, 1.0) for n in (1, 2)]))
    assert plots.curves([fp32, bounded]) == {"config_small": [fp32]}


def test_no_file_under_results_is_ignored_by_git():
    # a run folder that .gitignore swallows is in the README's table here and missing from a clone
    files = [os.path.join(root, name) for root, _, names in os.walk(os.path.join(REPO, "results"))
             for name in names]
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *files], cwd=REPO,
                             capture_output=True, text=True).stdout.split()
    assert files and not ignored, f"git ignores {ignored[:3]}: fix .gitignore"


def test_a_run_names_its_cpu_by_family_and_model_and_its_vector_units(tmp_path):
    # "AMD EPYC" alone was a Zen 3 in one sitting and a Zen 4 in the next, at other speeds
    cpuinfo = tmp_path / "cpuinfo"
    core = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC\nstepping\t: 0\nflags\t\t: fpu sse2 avx2 fma{more}\n\n")
    cpuinfo.write_text(core.format(n=0, more="") + core.format(n=1, more=" avx512f"))
    assert record_env.cpu_model(str(cpuinfo)) == "AMD EPYC family 25 model 17 (avx2, fma)"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fp asimd\n")  # no name, family or model
    assert record_env.cpu_model(str(cpuinfo)).endswith(" (no AVX2)")


def test_the_commit_recorded_says_when_the_tree_differs_from_it(tmp_path):
    """A run from an edited checkout is not its commit's run: record_env says so."""
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
    git("init", "-q")
    (tmp_path / "f.py").write_text("a = 1\n")
    git("add", "f.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / "new.txt").write_text("untracked: a run's own output\n")
    assert record_env.commit(str(tmp_path)) == head
    (tmp_path / "f.py").write_text("a = 2\n")
    assert record_env.commit(str(tmp_path)) == f"{head} and changes"


def test_the_perplexity_axis_reads_as_plain_numbers():
    """The plot's log axis is labelled 50, 60, 80, 100, 150, 200, 300 within its limits, not
    5 x 10^1: the ticks of plain_log_ticks in [45, 320], each printed as itself."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots()
    ax.plot([1, 2, 3], [320, 120, 45])
    ax.set(yscale="log", ylim=(45, 320))
    plots.plain_log_ticks(ax)
    fig.canvas.draw()
    ticks = list(ax.get_yticks())
    assert ticks == [50, 60, 80, 100, 150, 200, 300]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["50", "60", "80", "100", "150", "200",
                                                           "300"]
    assert not any(t.get_text() for t in ax.yaxis.get_minorticklabels())
    plt.close(fig)


def test_a_keras3_run_is_a_row_of_its_own_beside_the_tf_keras_run_of_the_same_row():
    env = {"cpu": "AMD EPYC", "cores": 2}
    legacy = dict(run("full", 2, [epoch(1, 51.0, 61.0, 100.0), epoch(2, 50.0, 60.0, 100.0),
                                  {"event": "test", "test_ppl": 58.0}]), env=env)
    keras3 = dict(run("full", 2, [epoch(1, 52.0, 61.61, 90.0), epoch(2, 49.0, 59.4, 90.0),
                                  {"event": "test", "test_ppl": 57.42}]),
                  env=dict(env, keras="3.15.1"), name="small-2workers-keras3")
    # README: a row per config from the code as shipped (Keras 3), else tf-keras's, labelled
    assert tables.results_block([legacy])[2].startswith(
        "| small, tf-keras | 2 | 50.00 | 60.00 | 58.00 | 100 s† |")
    rows = tables.results_block([legacy, keras3])
    assert rows[2].startswith("| small, Keras 3 | 2 | 49.00 | 59.40 | 57.42 | 90 s† |")
    assert len(rows) == 5 and rows[4].startswith("- †: the training run's own time")  # the note
    assert tables.keras3_table([legacy, keras3])[2:] == [
        "| small | 2 | 1 | 61.61 | 61.00 | +1.00 % |",
        "| small | 2 | 2 | 59.40 | 60.00 | -1.00 % |",
        "| small | 2 | test | 57.42 | 58.00 | -1.00 % |"]
    # the tf-keras tables of results/README.md keep to tf-keras: no "two runs of a row" refusal
    assert len(tables.table(common.fp32_only(common.tf_keras_only([legacy, keras3])))) == 3


def test_a_run_is_read_under_the_config_of_its_newest_start(tmp_path, monkeypatch):
    # started for 1 epoch, resumed to the paper's 13 with --set num_epochs=13
    folder = tmp_path / "small-1workers"
    folder.mkdir()
    (folder / "run.json").write_text('{"kind": "full", "command": "c", "env": {}}')
    starts = [{"event": "start", "world_size": 1, "config": {"name": "config_small",
                                                            "num_epochs": n}} for n in (1, 13)]
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps(e) + "\n" for e in (starts[0], epoch(1, 300.0, 200.0, 60.0), starts[1])))
    monkeypatch.setattr(common, "RUNS", str(tmp_path))
    run = common.load("small-1workers")
    assert run["config"]["num_epochs"] == 13 and run["workers"] == 1


def test_a_config_trained_with_several_seeds_is_one_row_of_their_mean_and_the_tests_range():
    """Three seeds of `make reproduce SEED=N` (folders ...-seedN), two finished, one running:
    README's row averages the finished ones (train, valid, test) and gives the tests' range;
    results/README.md has each seed's row, with its commit."""
    env = {"cpu": "AMD EPYC", "cores": 2, "keras": "3.15.1", "commit": "abc1234"}

    def seeded(seed, kind, train, valid, test, seconds):
        events = [epoch(1, train + 10, valid + 10, seconds), epoch(2, train, valid, seconds)]
        return dict(run(kind, 2, events + ([{"event": "test", "test_ppl": test}] if test else [])),
                    env=env, name=f"small-2workers-seed{seed}",
                    command=f"mpirun -np 2 python lm_ptb_distributed.py --seed {seed}")
    runs = [seeded(2, "full", 41.0, 120.0, 116.0, 300.0),
            seeded(1, "full", 40.0, 119.0, 114.0, 280.0),
            seeded(3, "running", 45.0, 125.0, None, 290.0)]
    runs[2]["events"] = runs[2]["events"][:1]  # the running one: 1 epoch so far
    row = tables.results_block(runs)[2]
    assert row.startswith("| small, Keras 3, seeds 1, 2 | 2; seed 3: 1 of 13 so far | 40.50 | 119.50 | "
                          "115.00 (114.00-116.00) | 290 s† | — | — | 114.72 / 115.91 / 114.5 | "
                          "AMD EPYC, 2 cores |"), row
    every = tables.every_row(runs)
    assert [r.split(" | ")[0] for r in every[2:]] == [
        "| small, Keras 3, seed 1, commit abc1234", "| small, Keras 3, seed 2, commit abc1234",
        "| small, Keras 3, seed 3, commit abc1234"]
    assert common.seed_of({"command": "python lm_ptb.py --config config_small"}) == 1234


def test_a_bf16_seed_run_is_never_averaged_with_the_fp32_seeds_and_is_set_beside_its_own_seed():
    """medium on Keras 3: fp32 seeds 1 and 2 done, bf16 seed 1 done. README's row is the fp32
    seeds' mean; the bf16 table sets bf16 seed 1 beside fp32 seed 1 (not seed 2, not tf-keras)."""
    env = {"cpu": "AMD EPYC", "cores": 2, "keras": "3.15.1", "commit": "abc1234"}

    def seeded(seed, valid, test, precision="fp32"):
        events = [epoch(1, 60.0, valid, 100.0), {"event": "test", "test_ppl": test}]
        r = run("full", 2, events)  # its folder as `make reproduce` names it: ...-bf16-seedN
        return dict(r, env=env, command=f"mpirun python x.py --seed {seed}",
                    name=f"small-2workers{'-bf16' * (precision == 'bf16')}-seed{seed}",
                    config=dict(r["config"], precision=precision))
    legacy = run("full", 2, [epoch(1, 60.0, 130.0, 100.0), {"event": "test", "test_ppl": 125.0}])
    runs = [seeded(1, 120.0, 115.0), seeded(2, 122.0, 117.0), seeded(1, 121.2, 115.5, "bf16"),
            legacy]
    assert tables.results_block(runs)[2].startswith(
        "| small, Keras 3, seeds 1, 2 | 1 | 60.00 | 121.00 | 116.00 (115.00-117.00) |")
    assert tables.bf16_table(runs)[2:] == [
        "| small, Keras 3, seed 1 | 2 | 1 | 121.20 | 120.00 | +1.00 % |",
        "| small, Keras 3, seed 1 | 2 | test | 115.50 | 115.00 | +0.43 % |"]
    # with only the bf16 seed finished, the row is bf16's, said so
    only = [dict(seeded(1, 120.0, 115.0), kind="running"), seeded(1, 121.2, 115.5, "bf16")]
    assert tables.results_block(only)[2].startswith("| small, bf16, Keras 3, seed 1 | 1 |")


SIDE_BY_SIDE = re.compile(r"```sh\npython (scripts/results/side_by_side.py .*?)\n```", re.S)
STUDIES = os.path.join(REPO, "results", "studies")


def study_readme(study):
    """The text of a study's README.md ("" if it has none)."""
    path = os.path.join(STUDIES, study, "README.md")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        return f.read()


def side_by_side_studies():
    """The studies whose README gives its table with the side-by-side command."""
    return sorted(name for name in os.listdir(STUDIES) if SIDE_BY_SIDE.search(study_readme(name)))


def test_the_schedule_studies_give_their_tables_with_the_side_by_side_command():
    assert {"tutorial-schedule-small", "tutorial-schedule-medium",
            "tutorial-schedule-medium-bf16"} <= set(side_by_side_studies())


@pytest.mark.parametrize("study", side_by_side_studies())
def test_a_study_table_is_what_its_readme_command_prints_from_the_committed_logs(study):
    text = study_readme(study)
    argv = shlex.split(SIDE_BY_SIDE.search(text).group(1).replace("\\\n", " "))
    printed = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(printed) > 4 and printed == table


def test_side_by_side_pairs_the_epochs_both_finished_from_the_first_asked(tmp_path):
    def log(name, lrs):
        path = tmp_path / name
        path.write_text("".join(json.dumps(dict(epoch(n, 100.0 / n, 200.0 / n, 1.0), lr=lr)) + "\n"
                                for n, lr in enumerate(lrs, 1)))
        return str(path)
    a, b = log("a.jsonl", [1.0, 0.5, 0.25]), log("b.jsonl", [1.0, 1.0])
    assert side_by_side.side_by_side(a, b, "default", "late", 2) == [
        "| epoch | lr, default / late | train | valid |", "| --- | --- | --- | --- |",
        "| 2 | 0.5 / 1 | 50.00 / 50.00 | 100.00 / 100.00 |"]
