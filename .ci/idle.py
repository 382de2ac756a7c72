"""How long the cores sat idle while CI's suite ran, beside the fresh-machine check and after
it, from .ci/run's samples of /proc/stat (each line: UNIX time, idle + iowait clock ticks of all
cores). A core idle while the suite's workers wait (timeouts, daemons, restarts) is CI time that
more work at once could fill; a report only, never what fails CI.

    python .ci/idle.py idle.tsv fresh.log CI_START_UNIX_TIME CORES
"""
import os
import re
import sys


def samples(path):
    points = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 2 and all(x.isdigit() for x in fields):  # not a line cut short
                points.append((int(fields[0]), int(fields[1])))
    return points


def idle_between(points, t0, t1, hz):
    """Idle core-seconds between t0 and t1, interpolated between the samples."""
    def at(t):
        for (ta, ia), (tb, ib) in zip(points, points[1:]):
            if ta <= t <= tb:
                return ia + (ib - ia) * ((t - ta) / (tb - ta) if tb > ta else 0)
        return points[0][1] if t < points[0][0] else points[-1][1]
    return (at(t1) - at(t0)) / hz


def report(points, check_end, cores, hz):
    start, end = points[0][0], points[-1][0]
    spans = [("the suite", start, end)]
    if check_end is not None and start < check_end < end:
        spans += [("beside the check", start, check_end), ("after it", check_end, end)]
    lines = []
    for name, t0, t1 in spans:
        wall = t1 - t0
        idle = idle_between(points, t0, t1, hz)
        lines.append(f"cores idle {name}: {idle:.0f} of {wall * cores} core-seconds "
                     f"({idle / max(wall * cores, 1):.0%}), {wall} s")
    return lines


def main(argv):
    tsv, fresh_log, ci_start, cores = argv
    points = samples(tsv)
    if len(points) < 2:
        return 0
    check_end = None
    with open(fresh_log, errors="replace") as f:
        found = re.findall(r"the check ended after (\d+) s", f.read())
    if found:
        check_end = int(ci_start) + int(found[-1])
    print("\n".join(report(points, check_end, int(cores), os.sysconf("SC_CLK_TCK"))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
