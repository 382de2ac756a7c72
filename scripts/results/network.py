"""docs/network.md's table of the network study, between its netstudy markers, from
results/studies/netstudy.json (`make netstudy` writes it)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.results.common import REPO, RESULTS, rewrite_block  # noqa: E402


NET_BEGIN, NET_END = "<!-- netstudy:begin -->", "<!-- netstudy:end -->"


def netstudy_block():
    path = os.path.join(RESULTS, "studies", "netstudy.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        study = json.load(f)
    commands = dict.fromkeys(r["command"] for r in study["rows"])
    lines = [f"Measured by {' and '.join(f'`{c}`' for c in commands)} (2 ranks, one per namespace, one core each; "
             "efficiency = one process's step time / (2 × the 2-worker step time)):", "",
             "| config | link | variant | ms/step | efficiency | MB sent/step, model | "
             "MB sent/step, measured |", "|" + " --- |" * 7]
    for r in study["rows"]:
        measured = r["bytes_per_step_measured"]
        lines.append(f"| {r['config'].replace('config_', '')} | {r['link']} | {r['variant']} | "
                     f"{r['step_ms']:.0f} | {r['efficiency']:.2f} | "
                     f"{r['bytes_per_step_predicted'] / 1e6:.2f} | "
                     f"{'—' if measured is None else format(measured / 1e6, '.2f')} |")
    lines += ["", "**Projection** (ring-allreduce cost model fitted to the measured steps, not a "
              "measurement; rows per worker as measured, 50 µs assumed per message): compute "
              "share of the step at 8 and 64 workers.", "",
              "| config | variant | workers | 10 Gbit/s | 1 Gbit/s | 100 Mbit/s |",
              "|" + " --- |" * 6]
    keyed = {}
    for r in study["projection"]:
        keyed.setdefault((r["config"], r["variant"], r["workers"]), {})[r["link"]] = r
    for (name, variant, workers), by_link in keyed.items():
        cells = " | ".join(f"{by_link[l]['efficiency']:.2f}" if l in by_link else "—"
                           for l in ("10 Gbit/s", "1 Gbit/s", "100 Mbit/s"))
        lines.append(f"| {name.replace('config_', '')} | {variant} | {workers} | {cells} |")
    return lines


def write():
    """docs/network.md's table, if the study has run."""
    study = netstudy_block()
    if study:
        rewrite_block(os.path.join(REPO, "docs", "network.md"), NET_BEGIN, NET_END, study)
