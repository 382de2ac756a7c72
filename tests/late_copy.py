"""lm_ptb.py as the benchmark's second copy of a pair, started only once the first copy has
ended its epoch, so that the two never run together, while its steps are fewer than
PTB_LATE_UNTIL_STEPS; the first copy, and any copy given as many steps, start at once. Usage:
python tests/late_copy.py ARGS... (lm_ptb.py's own arguments)."""
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def argument(args, flag):
    return args[args.index(flag) + 1]


def first_copy_ended(output_dir):
    path = os.path.join(os.path.dirname(output_dir), "0", "metrics.jsonl")
    if not os.path.exists(path):
        return False
    with open(path) as f:
        return any(json.loads(line)["event"] == "epoch" for line in f if line.endswith("\n"))


def main():
    args = sys.argv[1:]
    output_dir = argument(args, "--output_dir")
    steps = int(next(a for a in args if a.startswith("steps_per_epoch=")).split("=")[1])
    if os.path.basename(output_dir) == "1" and steps < int(os.environ["PTB_LATE_UNTIL_STEPS"]):
        deadline = time.time() + 300
        while not first_copy_ended(output_dir):
            if time.time() > deadline:
                sys.exit("late_copy: the first copy did not end its epoch in 300 s")
            time.sleep(0.1)
    os.execv(sys.executable, [sys.executable, os.path.join(REPO, "lm_ptb.py"), *args])


if __name__ == "__main__":
    main()
