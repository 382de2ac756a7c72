"""Every command in the code blocks of README and docs/launching.md (its flags, one link away):
its flags are taken by the parser of the program that reads them (the trainers', evaluate.py's,
the launchers', horovodrun's; make's targets through make -n), and it is run by some test. COVERED
says which test runs each (a bounded variant: fewer steps, the tiny config), and that test's code
(its string constants, docstrings and comments not counted, through the functions it really
calls) names the command's program, files and action; NOT_HERE lists, by name, the commands that
need what this machine lacks."""
import ast
import os
import re
import shlex
import subprocess
import sys


from tests.helpers import REPO, TINY, run_job, script_env

COVERED = {
    "make train": "tests/test_readme_commands.py::test_make_train_and_single_bounded",
    "make test": ".ci/run (CI runs the whole suite through it)",
    "PTB_DATA_PATH=/path/to/ptb make train":
        "tests/test_readme_commands.py::test_make_train_and_single_bounded",
    "mpirun -np 4 -bind-to none -map-by slot python lm_ptb_distributed.py --config config_small":
        "tests/test_distributed.py::test_four_ranks_train_and_three_ranks_fail_cleanly",
    "mpirun -np 2 -H a:1,b:1 -bind-to none -map-by slot -x PATH -x LD_LIBRARY_PATH "
    "-mca pml ob1 -mca btl tcp,self -mca btl_tcp_if_include eth0 "
    "python lm_ptb_distributed.py --config config_small":
        "tests/test_distributed.py::test_two_hosts_over_veth",
    "horovodrun -np 2 -H localhost:2 python lm_ptb_distributed.py --config config_small":
        "tests/test_distributed.py::test_horovodrun_gloo_on_one_host",
    "python evaluate.py perplexity --run runs/config_small-np2":
        "tests/test_readme_commands.py::test_make_train_and_single_bounded",
    "python evaluate.py generate --run runs/config_small-np2 --prompt \"the company said\" "
    "--length 30": "tests/test_readme_commands.py::test_make_train_and_single_bounded",
    "python evaluate.py export --run runs/config_small-np2 --export_dir exported/small":
        "tests/test_readme_commands.py::test_make_train_and_single_bounded",
    "tensorboard --logdir runs": "tests/test_use.py::test_tensorboard_serves_the_runs_scalars",
    "horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script launch/discover_hosts.sh "
    "python lm_ptb_elastic.py --config config_small":
        "tests/test_elastic.py::test_a_lost_worker_shrinks_the_job_which_grows_back_and_finishes",
    "sbatch launch/slurm.sbatch": "tests/test_slurm.py::"
    "test_sbatch_trains_with_2_tasks_stops_on_scancel_and_requeue_continues",
    "TRAINER=tf.distribute sbatch launch/slurm.sbatch":
        "tests/test_slurm.py::test_sbatch_with_tf_distribute_trains_with_2_tasks",
    "python launch/tf_config.py -n 2 -- python lm_ptb_tf_distribute.py --config config_small":
        "tests/test_tf_distribute.py::test_two_workers_train_as_one_process_and_worker_0_alone_reports",
    "make reproduce CONFIG=config_medium":
        "tests/test_reproduce.py::test_make_reproduce_status_and_stop_as_the_readme_gives_them",
    "make reproduce-status CONFIG=config_medium":
        "tests/test_reproduce.py::test_make_reproduce_status_and_stop_as_the_readme_gives_them",
    "make reproduce-stop CONFIG=config_medium":
        "tests/test_reproduce.py::test_make_reproduce_status_and_stop_as_the_readme_gives_them",
}
NOT_HERE = {  # command -> what it needs that this machine lacks
    "CONFIG=config_medium sbatch -N 2 --ntasks-per-node=4 --gpus-per-node=4 launch/slurm.sbatch":
        "a Slurm cluster of 2 nodes with 4 GPUs each (the same script runs in test_slurm.py)",
}


def readme_commands(pages=("README.md", "docs/launching.md")):
    """Each command of the pages' sh code blocks, continuation lines joined, comments dropped."""
    text = "".join(open(os.path.join(REPO, page)).read() for page in pages)
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(re.sub(r"\s+", " ", line))
    return commands


def command_words(command):
    """What a test that runs `command` must name: its program (the script, for python), the
    files it runs, a make target or an evaluate.py action, and the settings before it
    (TRAINER=tf.distribute: the value; PTB_DATA_PATH: the name, its value being a placeholder)."""
    words, needed = shlex.split(command), []
    while "=" in words[0]:
        name, value = words.pop(0).split("=", 1)
        needed.append(value if name == "TRAINER" else name)
    program = words.pop(0)
    if program == "python":
        program = words.pop(0)
    needed.append(program)
    needed += [w for w in words if w.endswith((".py", ".sbatch", ".sh"))]
    if program in ("make", "evaluate.py"):
        needed.append(words[0])
    return needed


HELPER_MODULES = ("tests/helpers.py", "tests/slurm.py", "scripts/twohosts.py")  # command builders
RUNS_README_LINES = "<calls readme_commands()>"  # what code_strings gives for such a call


def _functions(module):
    """{name: node} of the module's functions and of its classes' methods ("Class.method")."""
    tree = ast.parse(open(os.path.join(REPO, module)).read())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = node
        elif isinstance(node, ast.ClassDef):
            found.update({f"{node.name}.{item.name}": item for item in node.body
                          if isinstance(item, ast.FunctionDef)})
    return tree, found


def _helper_names(tree):
    """Of a test file's imports, {name: helper module} for functions imported by name from a
    helper module, and {alias: helper module} for a helper module imported whole."""
    modules = {m.removesuffix(".py").replace("/", "."): m for m in HELPER_MODULES}
    names, aliases = {}, {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            names.update({a.asname or a.name: modules[node.module] for a in node.names})
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                if f"{node.module}.{a.name}" in modules:
                    aliases[a.asname or a.name] = modules[f"{node.module}.{a.name}"]
    return names, aliases


def code_strings(test):
    """The string constants in the code (not the docstrings, and never the comments) of
    `path::name`'s function and of every function it calls, in turn, their arguments' defaults
    too, that is one of its own file's, called by its name, or a helper module's (HELPER_MODULES, where tests build their
    mpirun, horovodrun and sbatch commands) that the file imports: by its name, through the
    module (twohosts.f), or a method of a helper's class on `self`. A call of a stdlib or
    package function of the same name (subprocess.run) leads nowhere."""
    path, name = test.split("::")
    tree, own = _functions(path)
    assert name in own, f"{test}: no such test function"
    names, aliases = _helper_names(tree)
    helpers = {module: _functions(module)[1] for module in HELPER_MODULES}
    strings, seen, todo = [], set(), [(path, own, name)]
    while todo:
        module, functions, current = todo.pop()
        if (module, current) in seen or current not in functions:
            continue
        seen.add((module, current))
        cls = current.split(".")[0] if "." in current else None  # a method's class
        node = functions[current]
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        # its arguments' defaults too: a helper's default script is what it runs
        defaults = [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
        for sub in (sub for part in (*defaults, *body) for sub in ast.walk(part)):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                strings.append(sub.value)
            if not isinstance(sub, ast.Call):
                continue
            call = sub.func
            if isinstance(call, ast.Name):
                if call.id == "readme_commands":
                    strings.append(RUNS_README_LINES)
                elif call.id in functions:  # its own module's (a test's, or a helper's)
                    todo.append((module, functions, call.id))
                elif call.id in names and module == path:
                    todo.append((names[call.id], helpers[names[call.id]], call.id))
            elif isinstance(call, ast.Attribute) and isinstance(call.value, ast.Name):
                if call.value.id in aliases and module == path:
                    origin = aliases[call.value.id]
                    todo.append((origin, helpers[origin], call.attr))
                elif call.value.id == "self" and cls:
                    todo.append((module, functions, f"{cls}.{call.attr}"))
    return strings


def test_code_strings_read_code_only_and_follow_only_real_calls(tmp_path):
    """The source check's reader, on a hand-made test file: a word in a docstring or a comment
    is not run, and subprocess.run is not tests/slurm.py's Slurm.run."""
    module = tmp_path / "test_fake.py"
    module.write_text(
        "import subprocess\n"
        "from tests.helpers import run_script\n\n"
        "def helper():\n"
        "    return ['lm_ptb_elastic.py']\n\n"
        "def test_x():\n"
        "    \"\"\"runs lm_ptb_distributed.py\"\"\"\n"
        "    # mpirun -np 2 lm_ptb_tf_distribute.py\n"
        "    subprocess.run(['true'])\n"
        "    helper()\n"
        "    run_script(['evaluate.py'])\n")
    strings = code_strings(f"{module}::test_x")
    joined = " ".join(strings)
    assert "lm_ptb_elastic.py" in joined and "evaluate.py" in joined  # its own and a helper's
    assert "lm_ptb_distributed.py" not in joined and "lm_ptb_tf_distribute.py" not in joined
    assert "sbatch" not in joined  # Slurm.run (tests/slurm.py) not followed from subprocess.run
    assert "mpirun" not in joined  # helpers.mpirun never called: not read


def test_every_readme_command_is_run_by_a_named_test():
    """Each command is listed with a test, and that test runs it: its function names the
    command's program, files and action (or runs README's own lines, readme_commands())."""
    commands = readme_commands()
    assert len(commands) >= 8
    missing = [c for c in commands if c not in COVERED and c not in NOT_HERE]
    assert not missing, f"README commands no test runs (add a test and list it): {missing}"
    unrun = []
    for command in commands:
        test = COVERED.get(command, "")
        if not test.startswith("tests/"):
            continue
        strings = code_strings(test)
        if RUNS_README_LINES in strings:  # it runs the lines readme_commands() reads
            continue
        lacking = [w for w in command_words(command) if not any(w in t for t in strings)]
        if lacking:
            unrun.append(f"{test} runs no {' '.join(lacking)} of `{command}`")
    assert not unrun, unrun


def test_the_check_of_a_command_fails_on_a_test_that_does_not_run_it():
    """The check above, against this file's own tests: the help test runs make, not train."""
    strings = code_strings(
        "tests/test_readme_commands.py::test_make_help_lists_every_target_with_what_it_does")
    assert [w for w in command_words("make train") if not any(w in t for t in strings)] == \
        ["train"]
    assert command_words("TRAINER=tf.distribute sbatch launch/slurm.sbatch") == [
        "tf.distribute", "sbatch", "launch/slurm.sbatch"]
    assert command_words("python evaluate.py generate --run runs/x --length 3") == [
        "evaluate.py", "generate"]


def test_make_train_and_single_bounded(ptb_path, tmp_path):
    """README's quick start, bounded: `make train` with the data variable and the tiny config;
    then README's evaluate.py commands as written, in a shell without the variable."""
    env = dict(os.environ, PTB_DATA_PATH=ptb_path)
    args = ["RUNS=" + str(tmp_path), f"CONFIG={TINY}",
            "ARGS=--set num_epochs=1 --set steps_per_epoch=5 --set eval_steps=2"]
    for target, folder in (("train", "config_tiny-np2"), ("single", "config_tiny-single")):
        r = run_job(["make", target, *args], 600, cwd=REPO, env=env)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert "[ptb] test ppl" in r.stdout
        assert os.path.exists(os.path.join(tmp_path, folder, "checkpoints", "checkpoint"))
    run = os.path.join(tmp_path, "config_tiny-np2")
    without = {k: v for k, v in script_env().items() if k != "PTB_DATA_PATH"}
    for command in [c for c in readme_commands() if c.startswith("python evaluate.py")]:
        args = [a.replace("runs/config_small-np2", run).replace("exported/", f"{tmp_path}/")
                for a in shlex.split(command)[1:]]
        r = subprocess.run([sys.executable, *args], cwd=REPO, env=without, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0 and r.stdout.strip(), f"{command}\n{r.stdout}{r.stderr}"
    assert os.path.exists(os.path.join(tmp_path, "small", "saved_model.pb"))


def test_make_help_lists_every_target_with_what_it_does():
    """`make help`: each target of the Makefile's .PHONY line once, each with a line of its own
    (taken from the `## ` remark on the target's line, so a new target without one shows here)."""
    phony = re.search(r"^\.PHONY:(.*)$", open(os.path.join(REPO, "Makefile")).read(), re.M)
    r = subprocess.run(["make", "-s", "help"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    listed = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^  make (\S+)\s+(\S.*)$", line)
        assert m, f"not a `make TARGET  what it does` line: {line!r}"
        listed[m.group(1)] = m.group(2)
    assert len(listed) == len(r.stdout.splitlines())  # no target twice
    assert sorted(listed) == sorted(phony.group(1).split())


TRAINERS = ("lm_ptb.py", "lm_ptb_distributed.py", "lm_ptb_elastic.py", "lm_ptb_tf_distribute.py")


def parsed(words):
    """The repository's Python programs in a command's words, each parsed by its own parser:
    [(program, parsed args)], a launcher's first, then the script it starts. mpirun's own flags
    are Open MPI's (the tests run those commands); horovodrun's are parsed by Horovod's parser."""
    import importlib
    sys.path.insert(0, os.path.join(REPO, "launch"))
    from utils import cli, config
    while words and "=" in words[0]:
        words = words[1:]
    program, rest = words[0], words[1:]
    if program == "mpirun":
        return parsed(rest[rest.index("python"):])
    if program == "horovodrun":
        from horovod.runner import launch
        saved, sys.argv = sys.argv, ["horovodrun", *rest]
        try:
            args = launch.parse_args()
        finally:
            sys.argv = saved
        return [("horovodrun", args), *parsed(args.command)]
    if program == "python":
        program, rest = rest[0], rest[1:]
    if program == "launch/tf_config.py":
        args = importlib.import_module("tf_config").parser().parse_args(rest)
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return [(program, args), *(parsed(command) if command else [])]
    if program in TRAINERS:
        args = cli.parse_args(rest)
        config.load_config(args.config, args.set)  # the config and its --set keys
        return [(program, args)]
    if program == "evaluate.py":
        import evaluate
        return [(program, evaluate.parse_args(rest))]
    return []


def test_every_readme_commands_flags_are_taken_by_the_parser_that_reads_them():
    """Each README and docs/launching.md command's flags, given to the parser of the program
    that takes them (a renamed or dropped flag fails here), and each make command's target and
    variables through make itself, dry (-n)."""
    taken, refused = 0, []
    for command in readme_commands():
        words = shlex.split(command)
        try:
            programs = parsed(words)
        except SystemExit as e:  # argparse's refusal, its message on stderr
            refused.append(f"`{command}`: exit {e.code}")
            continue
        taken += len(programs)
        make = [w for w in words if "=" not in w][:1] == ["make"]
        if make:
            r = subprocess.run(["make", "-n", *words[words.index("make") + 1:],
                                *[w for w in words[:words.index("make")]]],
                               cwd=REPO, capture_output=True, text=True, timeout=60)
            if r.returncode:
                refused.append(f"`{command}`: {r.stderr.strip()}")
            taken += 1
    assert taken >= 15, taken
    assert not refused, refused


def test_a_flag_no_parser_takes_is_refused():
    """The check above fails for a trainer flag or a --set key that does not exist."""
    import pytest
    with pytest.raises(SystemExit):
        parsed(shlex.split("python lm_ptb.py --config config_small --epochs 3"))
    from utils.config import ConfigError
    with pytest.raises(ConfigError):
        parsed(shlex.split("mpirun -np 2 python lm_ptb_distributed.py --set num_epoch=3"))
    with pytest.raises(SystemExit):
        parsed(shlex.split("horovodrun -np 2 --no-such-flag python lm_ptb_elastic.py"))
    # a launcher's command is parsed too
    assert [p for p, _ in parsed(shlex.split(
        "python launch/tf_config.py -n 2 -- python lm_ptb_tf_distribute.py --config config_small"
    ))] == ["launch/tf_config.py", "lm_ptb_tf_distribute.py"]
    with pytest.raises(SystemExit):
        parsed(shlex.split("python launch/tf_config.py -n 2 -- python evaluate.py perplexity"))
