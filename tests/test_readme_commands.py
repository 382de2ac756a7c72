"""Every command in the code blocks of README and docs/launching.md (its flags, one link away) is
run by some test: a command they show and no test runs fails here. COVERED says which test runs
each (a bounded variant: fewer steps, the tiny config); NOT_HERE lists, by name, the commands
that need what this machine lacks."""
import ast
import os
import re
import shlex
import subprocess
import sys


from tests.helpers import REPO, TINY, script_env

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


def source_of_test(test):
    """The source of `path::name`'s function and of every function it calls, in turn, that is
    defined in its file or in HELPER_MODULES (where tests build their mpirun, horovodrun and
    sbatch commands)."""
    path, name = test.split("::")
    functions = {}
    for module in (*HELPER_MODULES, path):
        source = open(os.path.join(REPO, module)).read()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef):
                functions[node.name] = (node, ast.get_source_segment(source, node))
    assert name in functions, f"{test}: no such test function"
    seen, todo, parts = set(), [name], []
    while todo:
        current = todo.pop()
        if current in seen or current not in functions:
            continue
        seen.add(current)
        node, text = functions[current]
        parts.append(text)
        todo += [n.func.id if isinstance(n.func, ast.Name) else n.func.attr
                 for n in ast.walk(node) if isinstance(n, ast.Call)
                 and isinstance(n.func, (ast.Name, ast.Attribute))]
    return "\n".join(parts)


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
        source = source_of_test(test)
        if "readme_commands(" in source:
            continue
        lacking = [w for w in command_words(command) if w not in source]
        if lacking:
            unrun.append(f"{test} runs no {' '.join(lacking)} of `{command}`")
    assert not unrun, unrun


def test_the_check_of_a_command_fails_on_a_test_that_does_not_run_it():
    """The check above, against this file's own tests: the help test runs make, not train."""
    source = source_of_test(
        "tests/test_readme_commands.py::test_make_help_lists_every_target_with_what_it_does")
    assert [w for w in command_words("make train") if w not in source] == ["train"]
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
        r = subprocess.run(["make", target, *args], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=600)
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
