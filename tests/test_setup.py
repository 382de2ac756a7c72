"""scripts/setup.sh's refusals, each before it installs anything: an unsupported Python, missing
tools where there is no apt-get, a Horovod patch that does not apply, GPU mode on this machine,
which has no GPU, and the two Debian-root checks (fresh machine, GPU build) without their data;
the key of the Horovod wheel it keeps, the two warnings its build holds back, and its import
check's one line."""
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO


def venv_state():
    """Names and mtimes of .venv's top entries and of its site-packages: any install changes it."""
    site = glob.glob(os.path.join(REPO, ".venv", "lib", "python3.*", "site-packages"))[0]
    return {p: os.stat(p).st_mtime_ns for folder in (os.path.join(REPO, ".venv"), site)
            for p in (os.path.join(folder, n) for n in os.listdir(folder))}


def tools_only(tmp_path, *tools):
    """A PATH folder holding just these programs (links to the real ones)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in tools:
        os.symlink(shutil.which(tool), bin_dir / tool)
    return str(bin_dir)


def setup_copy(tmp_path):
    """setup.sh and its patches in an empty checkout of their own: it works on that folder."""
    shutil.copytree(os.path.join(REPO, "scripts"), tmp_path / "repo" / "scripts")
    for name in ("requirements.txt", "requirements-no-deps.txt"):
        shutil.copy(os.path.join(REPO, name), tmp_path / "repo" / name)
    return tmp_path / "repo"


def run_setup(repo, path, **env):
    return subprocess.run([shutil.which("bash"), os.path.join(repo, "scripts", "setup.sh")],
                          cwd=repo, capture_output=True, text=True, timeout=120,
                          env={"PATH": path, "HOME": os.environ.get("HOME", "/root"), **env})


def one_error_line(r, start):
    assert r.returncode == 1 and not r.stdout, r.stdout + r.stderr
    assert r.stderr.startswith(start), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def unsupported_python():
    """A real interpreter outside 3.10-3.13 on this machine (pyenv's, or Debian's python2)."""
    found = glob.glob("/root/.pyenv/versions/3.[5-9].*/bin/python3") + \
        [p for p in ("/usr/bin/python2",) if os.path.exists(p)]
    if not found:
        pytest.skip("no Python outside 3.10-3.13 on this machine (the development machines "
                    "have pyenv's 3.6-3.9)")
    return found[0]


def test_an_unsupported_python_is_refused_in_one_line_before_anything_is_installed(tmp_path):
    repo = setup_copy(tmp_path)
    python = unsupported_python()
    r = run_setup(repo, tools_only(tmp_path, "dirname"), PYTHON=python)
    one_error_line(r, f"error: PYTHON={python} is Python 3.")
    assert "setup supports Python 3.10 to 3.13" in r.stderr
    assert not (repo / ".venv").exists()


def test_no_python_on_path_names_the_supported_range(tmp_path):
    repo = setup_copy(tmp_path)
    r = run_setup(repo, tools_only(tmp_path, "dirname"))
    one_error_line(r, "error: no Python 3.10 to 3.13 found (python3.13 .. python3.10 on PATH)")
    assert not (repo / ".venv").exists()


def test_a_python3_outside_the_range_is_named_with_the_fix(tmp_path):
    """A system whose only python3 is one TensorFlow 2.21 has no wheels for (3.14 on a newer
    distribution; here an older one stands in): its version is named, and the fix is another
    Python beside it, not 'install python3'."""
    repo = setup_copy(tmp_path)
    python = unsupported_python()
    path = tools_only(tmp_path, "dirname")
    os.symlink(python, os.path.join(path, "python3"))
    version = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True).stdout.strip()
    r = run_setup(repo, path)
    one_error_line(r, "error: no Python 3.10 to 3.13 found (python3.13 .. python3.10 on PATH; "
                      f"python3 here is {version}, which TensorFlow 2.21 has no wheels for)")
    assert "set PYTHON=" in r.stderr and "python3-venv)" not in r.stderr
    assert not (repo / ".venv").exists()


def test_missing_tools_without_apt_get_are_named_in_one_line_before_anything_is_installed(
        tmp_path):
    """Another distribution (no apt-get): the tools are named, not a 'command not found'."""
    repo = setup_copy(tmp_path)
    r = run_setup(repo, tools_only(tmp_path, "dirname", "id"), PYTHON=sys.executable)
    one_error_line(r, "error: need openmpi-bin libopenmpi-dev cmake g++ patch iproute2 "
                      "(Debian's names: ")
    assert "found no apt-get to install them" in r.stderr
    assert not (repo / ".venv").exists()


def test_the_newest_supported_python_on_path_is_chosen(tmp_path):
    """Every python3.1x on this PATH that runs, the newest first; a pyenv shim of a Python
    that is not installed is on PATH but does not run, and is passed over."""
    script = ("set -e; source <(sed -n '/^python_version()/,/^}/p;"
              "/^supported_version()/,/^}/p;/^choose_python()/,/^}/p' "
              "scripts/setup.sh); SUPPORTED='Python 3.10 to 3.13'; choose_python")
    r = subprocess.run([shutil.which("bash"), "-c", script], cwd=REPO, capture_output=True,
                       text=True, env={k: v for k, v in os.environ.items() if k != "PYTHON"})
    runnable = [p for p in ("python3.13", "python3.12", "python3.11", "python3.10")
                if shutil.which(p) and subprocess.run([p, "-c", ""], capture_output=True)
                .returncode == 0]
    assert r.returncode == 0 and r.stdout.strip() == runnable[0], r.stderr


def test_a_patch_that_does_not_apply_stops_setup_in_one_line(tmp_path):
    """Another Horovod's source (here: 0.28.1's with one patch already in it) is refused by
    the patch, not built half-patched."""
    repo = setup_copy(tmp_path)
    src = repo / ".venv" / "horovod-src"
    script = ("set -eu; source <(sed -n '/^patched_horovod_source()/,/^}/p' scripts/setup.sh); "
              "VENV=.venv; HOROVOD_VERSION=0.28.1; PATCHES=scripts/patches/horovod-0.28.1; "
              "patched_horovod_source")
    # The same sdist setup downloads (pip's cache keeps it), then the first patch applied twice.
    shutil.copy(os.path.join(REPO, "scripts", "patches", "horovod-0.28.1",
                             "01-common-stdexcept.patch"),
                repo / "scripts" / "patches" / "horovod-0.28.1" / "06-again.patch")
    os.makedirs(repo / ".venv" / "bin")
    # The repository's venv Python by its own path (a symlink to it would be taken for the
    # system Python, which on Debian 13 has no pip): pip downloads the sdist as setup does
    python = repo / ".venv" / "bin" / "python"
    python.write_text(f"#!/bin/sh\nexec {os.path.join(REPO, '.venv', 'bin', 'python')} \"$@\"\n")
    python.chmod(0o755)
    r = subprocess.run([shutil.which("bash"), "-c", script], cwd=repo, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: scripts/patches/horovod-0.28.1/06-again.patch does not apply to "
                      "horovod 0.28.1's source in .venv/horovod-src/horovod-0.28.1; the "
                      "patches are made for that version (scripts/patches/)"], r.stderr
    assert (src / "horovod-0.28.1" / "horovod" / "common" / "common.h").exists()


def build_key(**env):
    """setup.sh's horovod_build_key for the repository's .venv, with these variables set."""
    script = ("set -eu; source <(sed -n '/^horovod_build_key()/,/^}/p' scripts/setup.sh); "
              "VENV=.venv; HOROVOD_VERSION=0.28.1; GPU=${GPU:-0}; gpu_build=(${GPU_BUILD:-}); "
              "build_recipe=$(cat scripts/patches/horovod-0.28.1/*.patch ${EXTRA_PATCH:-} "
              "${BUILD_SETTINGS:-scripts/horovod-build.cmake} "
              "| sha256sum); horovod_build_key")
    r = subprocess.run([shutil.which("bash"), "-c", script], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env={**os.environ, **env})
    assert r.returncode == 0 and len(r.stdout.strip()) == 16, r.stdout + r.stderr
    return r.stdout.strip()


def test_the_kept_wheels_key_changes_with_what_the_build_depends_on(tmp_path):
    """The Horovod wheel setup keeps (~/.cache/ptb-horovod/<key>/) is taken again only for the
    same patches, build settings, compiler and venv packages; TensorFlow's version among them."""
    key = build_key()
    assert build_key() == key
    extra = tmp_path / "10-more.patch"
    extra.write_text("another patch\n")
    assert build_key(EXTRA_PATCH=str(extra)) != key
    assert build_key(GPU="1", GPU_BUILD="HOROVOD_GPU_OPERATIONS=NCCL") != key
    settings = tmp_path / "with-debug-info.cmake"
    settings.write_text('set(CMAKE_CXX_FLAGS_RELWITHDEBINFO "-O2 -g -DNDEBUG" CACHE STRING "")\n')
    assert build_key(BUILD_SETTINGS=str(settings)) != key
    gxx = tmp_path / "g++"
    gxx.write_text("#!/bin/sh\necho 'g++ (Other) 99.1'\n")
    gxx.chmod(0o755)
    assert build_key(CXX=str(gxx)) != key
    # the venv's packages go in as pip freeze lists them, TensorFlow's exact version among them:
    # requirements.txt's tensorflow-cpu, or on a GPU host (GPU=1) tensorflow of that version
    freeze = subprocess.run([os.path.join(REPO, ".venv", "bin", "python"), "-m", "pip",
                             "freeze", "--all", "--exclude", "horovod", "--exclude", "pip"],
                            capture_output=True, text=True, check=True).stdout
    version = re.search(r"^tensorflow-cpu==(\S+)", open(os.path.join(REPO, "requirements.txt"))
                        .read(), re.M).group(1)
    installed = freeze.lower().replace("_", "-").splitlines()
    assert {f"tensorflow-cpu=={version}", f"tensorflow=={version}"} & set(installed), freeze


def test_horovod_is_built_optimized_without_debug_information():
    """scripts/horovod-build.cmake reached the build: the installed library has no DWARF
    sections (Horovod's own setup.py builds with -g: 57.9 MB against 2.2) and is the build
    setup.sh made from the repository's patches and that file (their hash, recorded beside it)."""
    site = glob.glob(os.path.join(REPO, ".venv", "lib", "python3.*", "site-packages"))[0]
    [lib] = glob.glob(os.path.join(site, "horovod", "tensorflow", "mpi_lib.*.so"))
    sections = subprocess.run(["readelf", "-S", "-W", lib], capture_output=True, text=True,
                              check=True).stdout
    assert " .text " in sections and " .debug_info " not in sections, sections
    recipe = sorted(glob.glob(os.path.join(REPO, "scripts", "patches", "horovod-0.28.1",
                                           "*.patch")))
    recipe.append(os.path.join(REPO, "scripts", "horovod-build.cmake"))
    recorded = open(os.path.join(REPO, ".venv", "horovod-build.sha256")).read().split()[0]
    assert recorded == hashlib.sha256(b"".join(open(p, "rb").read() for p in recipe)).hexdigest()


def test_gpu_mode_without_nvcc_says_what_to_install_and_changes_nothing(tmp_path):
    before = venv_state()
    r = run_setup(REPO, tools_only(tmp_path, "dirname", "sed"), GPU="1")
    one_error_line(r, "error: GPU=1 needs nvcc, the CUDA compiler of a CUDA 12.x toolkit")
    assert venv_state() == before


def test_gpu_mode_refuses_an_nvcc_of_another_cuda_version():
    nvcc = shutil.which("nvcc")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout \
        if nvcc else ""
    if not nvcc or "release 12." in version:
        pytest.skip(f"this machine's nvcc is {'absent' if not nvcc else 'CUDA 12'}; the check "
                    "runs where a CUDA 13 nvcc is installed (the development machines)")
    before = venv_state()
    r = run_setup(REPO, os.environ["PATH"], GPU="1")
    assert r.returncode == 1 and "TensorFlow 2.21 is built for CUDA 12" in r.stderr, r.stderr
    assert venv_state() == before


def test_the_fresh_machine_check_refuses_missing_data_in_one_line_and_leaves_nothing(tmp_path):
    """scripts/fresh_machine.sh (CI's Debian 13 check) before it makes its root."""
    before = set(glob.glob("/tmp/ptb-fresh-*"))
    r = subprocess.run([shutil.which("bash"), os.path.join(REPO, "scripts", "fresh_machine.sh")],
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ["PATH"], "PTB_DATA_PATH": str(tmp_path)})
    one_error_line(r, "error: PTB_DATA_PATH must name" if os.geteuid() == 0 else
                   "error: fresh_machine.sh needs root")
    assert set(glob.glob("/tmp/ptb-fresh-*")) == before


def test_the_gpu_build_check_refuses_missing_data_in_one_line_and_leaves_nothing(tmp_path):
    """scripts/gpu_build_check.sh (make gpu-build-check) before it makes its root or its log."""
    before = set(glob.glob("/tmp/ptb-gpu-*"))
    log = tmp_path / "gpu-build-check.log"
    r = subprocess.run([shutil.which("bash"), os.path.join(REPO, "scripts", "gpu_build_check.sh")],
                       capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ["PATH"], "PTB_DATA_PATH": str(tmp_path),
                            "LOG": str(log)})
    one_error_line(r, "error: PTB_DATA_PATH must name" if os.geteuid() == 0 else
                   "error: gpu_build_check.sh needs root")
    assert set(glob.glob("/tmp/ptb-gpu-*")) == before and not log.exists()


def test_setups_import_check_prints_its_one_line_and_no_tensorflow_notes():
    """The check setup runs after installing Horovod (on a fresh machine, every first setup),
    with oneDNN on as the trainers set it: TensorFlow's start-up notes, which ignore
    TF_CPP_MIN_LOG_LEVEL, printed twice there before utils.import_tensorflow held them back."""
    script = ("set -eu; built='h.mpi_built() and h.gloo_built()'; "
              "eval \"$(sed -n '/^check_horovod=/,/)\"$/p' scripts/setup.sh)\"; "
              ".venv/bin/python -c \"$check_horovod\"")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    r = subprocess.run([shutil.which("bash"), "-c", script], cwd=REPO, capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0 and r.stdout.startswith("setup: ok (Python 3."), r.stdout + r.stderr
    assert "oneDNN custom operations" not in r.stderr and "absl" not in r.stderr, r.stderr


def test_the_horovod_build_holds_back_its_two_packaging_warnings_and_no_other(tmp_path):
    """setup.sh's HOROVOD_BUILD_WARNINGS, as its build passes them to pip wheel, on a package
    with the two options of Horovod 0.28.1's setup.py that the pinned setuptools warns about
    (each a box, twice, in every fresh build's log) and one warning of another kind."""
    package = tmp_path / "pkg"
    (package / "pkg").mkdir(parents=True)
    (package / "pkg" / "__init__.py").write_text("")
    (package / "setup.py").write_text(
        "import warnings\nfrom setuptools import setup\n"
        "warnings.warn('another warning of the build')\n"
        "setup(name='pkg', version='0.1', packages=['pkg'], tests_require=['pytest'],\n"
        "      classifiers=['License :: OSI Approved :: Apache Software License'])\n")

    def build(filtered):
        script = ("set -eu; eval \"$(grep '^HOROVOD_BUILD_WARNINGS' scripts/setup.sh)\"; "
                  + ('PYTHONWARNINGS="$HOROVOD_BUILD_WARNINGS" ' if filtered else "")
                  + f".venv/bin/python -m pip wheel -q --no-build-isolation --no-cache-dir "
                  f"--no-deps -w {tmp_path / 'wheels'} {package}")
        r = subprocess.run([shutil.which("bash"), "-c", script], cwd=REPO, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stderr

    shown = build(filtered=False)
    assert "'tests_require'" in shown and "License classifiers are deprecated" in shown, shown
    held = build(filtered=True)
    assert "tests_require" not in held and "License classifiers" not in held, held
    assert "another warning of the build" in held, held


def test_each_patch_opens_with_what_breaks_where_and_the_upstream_reference():
    """A patch to Horovod's source says, before its diff, what breaks (or slows: patch 09), where,
    and the upstream issue or pull request, so that it can be dropped when upstream has the
    fix."""
    paths = sorted(glob.glob(os.path.join(REPO, "scripts", "patches", "*", "*.patch")))
    assert len(paths) >= 13
    for path in paths:
        text = open(path).read()
        header = text[:text.index("\n--- a/")]
        assert header.startswith(("Breaks: ", "Slows: ")) and "Upstream: " in header, path
        assert re.search(r"\b(horovod|third_party)/\S+", header), path  # where: a source file
