"""What the suite's time went to, from the JUnit XML `make test` wrote (.ci/run keeps it):
CPU seconds (tests/conftest.py's cpu_s: the test's processes and its own) and wall seconds
per test file, and the costliest tests. CPU, not wall, says what a test costs: with the files
in 2 workers and CI's fresh-machine check beside them, a test's wall time is mostly its
neighbours'.

    python .ci/suite_cost.py /var/tmp/ptb-ci/<time>-<commit>/suite.xml [--top 15]
"""
import argparse
import collections
import sys
import xml.etree.ElementTree as ET


def tests(path):
    """(file, test, wall s, CPU s or None) of each test case in the JUnit XML at path."""
    for case in ET.parse(path).iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        cpu = float(props["cpu_s"]) if "cpu_s" in props else None
        yield (case.get("classname").rsplit(".", 1)[-1], case.get("name"),
               float(case.get("time")), cpu)


def report(rows, top):
    by_file = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for file, _, wall, cpu in rows:
        total = by_file[file]
        total[0] += 1
        total[1] += wall
        total[2] += cpu or 0.0
    cpu_all = sum(t[2] for t in by_file.values())
    lines = [f"suite cost: {len(rows)} tests, {cpu_all:.0f} CPU s in their processes, "
             f"{sum(t[1] for t in by_file.values()):.0f} wall s summed over the workers",
             "file | tests | CPU s | share | wall s"]
    for file, (n, wall, cpu) in sorted(by_file.items(), key=lambda kv: -kv[1][2]):
        if cpu >= 1:
            lines.append(f"{file} | {n} | {cpu:.0f} | {cpu / max(cpu_all, 1e-9):.0%} | {wall:.0f}")
    lines.append(f"the {top} costliest tests, CPU s | wall s")
    for file, name, wall, cpu in sorted(rows, key=lambda r: -(r[3] or 0))[:top]:
        lines.append(f"{cpu or 0:.0f} | {wall:.0f} | {file}::{name}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    try:
        rows = list(tests(args.xml))
    except (OSError, ET.ParseError) as e:
        sys.exit(f"error: cannot read the suite's JUnit XML {args.xml}: {e}")
    if not any(cpu is not None for *_, cpu in rows):
        sys.exit(f"error: {args.xml} has no cpu_s properties: it was written without "
                 "tests/conftest.py's hook (an older commit?)")
    print(report(rows, args.top))


if __name__ == "__main__":
    main()
