"""A study's table (results/studies/tutorial-schedule-*): the learning rate, train and valid
perplexity of two runs' metrics.jsonl (folders or files) at each epoch from FIRST_EPOCH
(default 1) that both finished.

    python scripts/results/side_by_side.py RUN_A RUN_B LABEL_A LABEL_B [FIRST_EPOCH]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.results.common import epoch_ends, read_events  # noqa: E402


def side_by_side(run_a, run_b, label_a, label_b, first=1):
    """Markdown rows: each epoch from `first` that both runs finished, "a / b" in each cell."""
    a, b = (epoch_ends(read_events(path)) for path in (run_a, run_b))
    rows = [f"| epoch | lr, {label_a} / {label_b} | train | valid |", "|" + " --- |" * 4]
    for n in sorted(set(a) & set(b)):
        if n >= first:
            rows.append(f"| {n} | {a[n]['lr']:.4g} / {b[n]['lr']:.4g} | "
                        f"{a[n]['train_ppl']:.2f} / {b[n]['train_ppl']:.2f} | "
                        f"{a[n]['valid_ppl']:.2f} / {b[n]['valid_ppl']:.2f} |")
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (4, 5):
        sys.exit(__doc__)
    print("\n".join(side_by_side(*argv[:4], *map(int, argv[4:]))))


if __name__ == "__main__":
    main()
