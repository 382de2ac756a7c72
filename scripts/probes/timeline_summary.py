"""Wall time of each Horovod timeline activity: the union of its intervals over all tensors
(a fused allreduce logs the same activity once per tensor in it), per training step.

    python timeline_summary.py TIMELINE.json STEPS [SKIP_S]

SKIP_S: seconds from the first event left out (tracing, the first steps)."""
import argparse
import json
from collections import defaultdict


def load(path):
    text = open(path).read().rstrip().rstrip(",")
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


def intervals(events):
    stacks, out = defaultdict(list), defaultdict(list)
    for e in events:
        if e.get("ph") == "B":
            stacks[(e["pid"], e.get("tid"))].append(e)
        elif e.get("ph") == "E":
            stack = stacks[(e["pid"], e.get("tid"))]
            if stack:
                b = stack.pop()
                out[b["name"]].append((b["ts"], e["ts"]))
        elif e.get("ph") == "X":
            out[e["name"]].append((e["ts"], e["ts"] + e.get("dur", 0)))
    return out


def union(spans):
    total, end = 0, None
    for a, b in sorted(spans):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def main():
    p = argparse.ArgumentParser(description="Wall time of each Horovod timeline activity, "
                                "per training step.")
    p.add_argument("timeline", help="the JSON file HOROVOD_TIMELINE wrote")
    p.add_argument("steps", type=int, help="training steps the timeline covers")
    p.add_argument("skip_s", type=float, nargs="?", default=0,
                   help="seconds from the first event left out (tracing, the first steps)")
    args = p.parse_args()
    path, steps, skip = args.timeline, args.steps, args.skip_s
    if steps < 1 or skip < 0:
        p.error(f"steps must be 1 or more and skip_s 0 or more (got {steps} and {skip:g})")
    try:
        events = [e for e in load(path) if "ts" in e]
    except (OSError, ValueError) as e:  # no such file, or not a timeline's JSON
        p.error(f"{path} is not a readable Horovod timeline ({e})")
    t0 = min((e["ts"] for e in events), default=0) + skip * 1e6
    spans = intervals(e for e in events if e["ts"] >= t0)
    if not spans:
        p.error(f"{path} has no activity after the first {skip:g} s")
    t1 = max(b for s in spans.values() for _, b in s)
    print(f"{path}: {(t1 - t0) / 1e6:.1f} s after the first {skip:.0f} s, {steps} steps")
    for name, s in sorted(spans.items(), key=lambda kv: -union(kv[1])):
        print(f"  {name:<32} {union(s) / 1e6 / steps * 1e3:9.1f} ms a step (union), {len(s)} intervals")


if __name__ == "__main__":
    main()
