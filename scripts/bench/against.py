"""Ours against another stack: each config's single process in fp32 and in bf16 and small's 2
ranks, on this checkout and on AGAINST (another venv's interpreter: another TensorFlow, say,
from make venv-tf2.15; or another checkout with its own .venv: another commit, whose own
trainers run), in turns over 3 rounds (5-6 minutes a round on a 2-core EPYC with avx512_bf16):

    make bench-against AGAINST=../other-checkout
    .venv/bin/python scripts/bench/against.py --against PYTHON_OR_CHECKOUT [--rounds N]

make bench (scripts/bench/full.py --against) runs these rows beside all the others.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from scripts.bench import common  # noqa: E402
from scripts.bench.common import REPO, SIZES, median_ratio  # noqa: E402
from scripts.record_env import cpu_model  # noqa: E402
from utils import child_env, import_tensorflow  # noqa: E402


def against_rows_of(sizes):
    """The rows run with --against too: each config's single process in fp32 and in bf16, and
    the first config's (small's) 2 ranks."""
    return tuple(f"{size}_{row}" for size in sizes for row in ("single_all_cores",
                                                               "single_bf16")) + (
        f"{sizes[0]}_2ranks_1thread",)


AGAINST_ROWS = against_rows_of(SIZES)
TRAINERS = ("lm_ptb.py", "lm_ptb_distributed.py")

# "TensorFlow X, Keras Y, Python Z" as a trainer of that checkout sees it: its utils first (which
# picks the Keras), then Horovod (which the trainers need)
STACK_PROBE = """
import sys
from utils import import_tensorflow
tf = import_tensorflow()
import horovod.tensorflow
keras = tf.keras.__name__.split(".")[0]
name = "tf-keras" if keras == "tf_keras" else "Keras"
print(f"TensorFlow {tf.__version__}, {name} {__import__(keras).__version__}, "
      f"Python {sys.version.split()[0]}")
"""


def stack(python, code):
    r = subprocess.run([python, "-c", STACK_PROBE], capture_output=True, text=True, cwd=code,
                       env=child_env(TF_CPP_MIN_LOG_LEVEL="3"))
    if r.returncode:
        raise SystemExit(f"error: {python} cannot import TensorFlow and Horovod in {code} "
                         f"({(r.stderr.strip().splitlines() or ['no output'])[-1]}); make it "
                         "with `make venv-tf2.15`, or scripts/setup.sh in that checkout")
    return r.stdout.strip()


def this_stack():
    return stack(sys.executable, REPO)


def against_target(against):
    """(its interpreter, its checkout) of --against: an interpreter runs this checkout's code; a
    checkout (a directory with its own .venv) runs its own code with its own venv."""
    if os.path.isdir(against):
        python = os.path.join(against, ".venv", "bin", "python")
        if not os.access(python, os.X_OK):
            raise SystemExit(f"error: --against {against} is a directory without .venv/bin/python;"
                             " run scripts/setup.sh in that checkout first")
        return python, os.path.abspath(against)
    return against, REPO


def other_stack(against):
    """this_stack() of --against, and its commit if it is another checkout."""
    python, code = against_target(against)
    if code == REPO:
        return stack(python, code)
    commit = subprocess.run(["git", "-C", code, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "no git"
    return f"{stack(python, code)}, at {commit}"


def with_runs_against(runs, against, stack, rows=AGAINST_ROWS):
    """The runs, each of `rows` followed by the same run on --against's stack (its
    interpreter, and its trainers if it is another checkout)."""
    python, code = against_target(against)
    out = {}
    for name, (launcher, *rest) in runs.items():
        out[name] = (launcher, *rest)
        if name in rows:
            out[f"{name} ({stack})"] = ([python if part == sys.executable else
                                         os.path.join(code, part) if part in TRAINERS else part
                                         for part in launcher], *rest)
    return out


def against_ratios(rounds, stack, rows=AGAINST_ROWS):
    """Ours / theirs, the median of the within-round ratios, for each of `rows` run."""
    return {"stack": stack, "ours": this_stack(), "ratios": {
        name: median_ratio(rounds, name, f"{name} ({stack})") for name in rows
        if name in rounds[0]}}


def measure_against(args, configs, steps, launchers, cores):
    """The against rows alone, ours and --against's in turns, in rounds."""
    if not args.against:
        raise SystemExit("error: the comparison needs --against (an interpreter, or a checkout "
                         "with its own .venv); e.g. make bench-against AGAINST=../other-checkout")
    import_tensorflow()  # as the trainers start it, before utils.hardware loads it
    from utils.hardware import bf16_units
    stack = other_stack(args.against)
    rows = against_rows_of(list(configs))
    runs = {name: run for name, run in common.trainer_runs(configs, steps, launchers, None).items()
            if name in rows}
    n_rounds = args.rounds or 3
    rounds, summary = common.run_rounds(with_runs_against(runs, args.against, stack, rows),
                                        n_rounds, args.data_path)
    return {"cores": cores, "cpu": cpu_model(), "bf16_units": bf16_units(),
            "rounds": n_rounds, **summary, "against": against_ratios(rounds, stack, rows)}


def against_rows(result):
    """(label, value) rows of the --against comparison: each row's words/sec on both stacks,
    the within-round ratios and their median."""
    stack, ours = result["against"]["stack"], result["against"]["ours"]
    rows = [("ours / against", f"{ours} / {stack}")]
    for name, ratio in result["against"]["ratios"].items():
        theirs = result[f"{name} ({stack})"]
        per_round = ", ".join(f"{a / b:.2f}" for a, b in zip(result[name]["wps_per_round"],
                                                             theirs["wps_per_round"]))
        rows.append((f"{name}, ours / against",
                     f"{result[name]['wps']:,.0f} / {theirs['wps']:,.0f} wps: {ratio:.2f}x "
                     f"(rounds: {per_round})"))
    return rows


def main(argv=None):
    p = common.parser(__doc__.splitlines()[0], data=True)
    p.add_argument("--against", default="",
                   help="another venv's interpreter, or another checkout with its own .venv")
    common.add_runs_flags(p)
    args = p.parse_args(argv)
    configs = common.checked_configs(args.configs) or common.DEFAULT_CONFIGS
    result = measure_against(args, configs, common.steps_of(configs, args.steps),
                             common.launchers(), common.cores())
    print(f"\nours against {result['against']['stack']} ({result['cores']} cores, "
          f"{result['cpu']}, bf16 units: {', '.join(result['bf16_units']) or 'none'}; "
          f"{result['rounds']} rounds in turns; ratios are medians of within-round ratios)")
    print("\n".join(common.table_lines(against_rows(result))))
    common.write_result(result, args.out)


if __name__ == "__main__":
    main()
