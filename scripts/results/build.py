"""make results: README's results table, results/README.md (the full table and every run's
provenance), results/runs/*.png (fp32 and bf16 curves, words/sec of `make timing`) and
docs/network.md's table, built only from committed logs under results/; each job a file beside
this one (tables.py, plots.py,
network.py; record.py and side_by_side.py keep a run and a study's table).

    python scripts/results/build.py      # = make results
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.results import network, plots, tables  # noqa: E402
from scripts.results.common import load_all, tf_keras_only  # noqa: E402


def build():
    runs = load_all()
    if not runs:
        sys.exit("error: no runs under results/runs/; record some first")
    plots.plots(tf_keras_only(tables.trained(runs)), tables.newest_idle_timings(runs))
    tables.write(runs)
    network.write()
    print(f"README.md table, results/README.md and results/runs/*.png rebuilt from {len(runs)} "
          "runs")


def main():
    build()


if __name__ == "__main__":
    main()
