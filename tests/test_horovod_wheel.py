"""The patched Horovod for another project (docs/keras3.md#using-this-horovod-in-another-project):
`make horovod-wheel-check` writes the wheel where it is told, with the lines that install it, then
installs it beside TensorFlow alone into a new venv outside the repository and runs a 2-rank
Keras 3 model.fit there (scripts/horovod_wheel_fit.py); and the refusals of bad input, each one
line. The first test installs TensorFlow into its venv: from pip's cache or a local index in
seconds, else a download of about 250 MB."""
import base64
import glob
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

from tests.helpers import REPO, read_only_folder, run_job


def requirements_tensorflow():
    """The TensorFlow .venv was set up with (requirements.txt's pin): the wheel's own."""
    return re.search(r"^tensorflow-cpu==(\S+)", open(os.path.join(REPO, "requirements.txt"))
                     .read(), re.M).group(1)


def installed_library_matches(wheel):
    """Whether the wheel's compiled library is, byte for byte, the one .venv's Horovod runs
    (the build setup installed and the suite tests): its sha256 in the wheel's RECORD."""
    with zipfile.ZipFile(wheel) as z:
        record = z.read("horovod-0.28.1.dist-info/RECORD").decode()
    path, digest = re.search(r"^(horovod/tensorflow/mpi_lib[^,]*\.so),sha256=([^,]+),", record,
                             re.M).groups()
    site = glob.glob(os.path.join(REPO, ".venv", "lib", "python3.*", "site-packages"))[0]
    data = open(os.path.join(site, path), "rb").read()
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode() == digest


def test_make_horovod_wheel_check_installs_the_wheel_elsewhere_and_fits_on_two_ranks(tmp_path):
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "ptb-horovod-wheel-check-*")))
    dist = tmp_path / "my wheels"  # a folder the user names, a space in it
    r = run_job(["make", "horovod-wheel-check", f"WHEEL_DIR={dist}"], 1800, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"  # .venv's Python, the build's
    wheel = str(dist / f"horovod-0.28.1-{tag}-{tag}-linux_x86_64.whl")
    assert os.listdir(dist) == [os.path.basename(wheel)]
    assert installed_library_matches(wheel)
    tf = requirements_tensorflow()
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    block = r.stdout[r.stdout.index("horovod-wheel: "):].splitlines()
    assert block[0] == f"horovod-wheel: {wheel}", r.stdout
    assert block[1].endswith(f"built for Python {python} against TensorFlow {tf}: it works with "
                             "that TensorFlow alone"), block
    assert block[2].startswith("  needs on the machine: Open MPI's runtime as here (Open MPI "), \
        block
    assert block[3:5] == [f"    pip install tensorflow-cpu=={tf}", f"    pip install {wheel}"]
    # the check, in its own venv: 3 epochs of 32 rows in global batches of 8 are 12 steps
    [ok] = [line for line in r.stdout.splitlines() if line.startswith("check: ok: ")]
    assert ok.startswith(f"check: ok: Python {python}.") and f"TensorFlow {tf}, Keras 3." in ok
    assert "from the new venv alone; 2 ranks, 12 steps of model.fit, their weights equal" in ok
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "ptb-horovod-wheel-check-*"))) \
        == before  # its 1.6 GB removed


def one_line(r, start):
    assert r.returncode == 1 and not r.stdout, r.stdout + r.stderr
    assert r.stderr.startswith(start), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_bad_wheel_folders_and_wheels_are_refused_in_one_line(tmp_path):
    """A WHEEL_DIR that cannot be written (a read-only mount, a path under a file) stops
    `make horovod-wheel` before setup does anything; setup.sh's other arguments and the check's
    wrong WHEEL each get one line too."""
    setup = ["bash", os.path.join(REPO, "scripts", "setup.sh")]
    with read_only_folder(tmp_path / "read-only") as read_only:
        r = subprocess.run(setup + ["--wheel-to", str(read_only)], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        one_line(r, f"error: cannot write the Horovod wheel into {read_only} (Read-only file "
                    "system); name a folder you can write: make horovod-wheel WHEEL_DIR=DIR")
        r = subprocess.run(["make", "horovod-wheel", f"WHEEL_DIR={read_only}/dist"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "setup: " not in r.stdout, r.stdout
        assert f"error: cannot write the Horovod wheel into {read_only}/dist" in r.stderr
    under_a_file = os.path.join(REPO, "README.md", "dist")
    r = subprocess.run(setup + ["--wheel-to", under_a_file], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    one_line(r, f"error: cannot write the Horovod wheel into {under_a_file} (Not a directory)")
    for args in (["--wheel-to"], ["dist"], ["--wheel-to", ""]):
        r = subprocess.run(setup + args, cwd=REPO, capture_output=True, text=True, timeout=60)
        one_line(r, "error: setup.sh takes no arguments but --wheel-to DIR")

    check = [sys.executable, os.path.join(REPO, "scripts", "horovod_wheel_check.py")]
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
    other = tmp_path / "horovod-0.28.1-cp39-cp39-linux_x86_64.whl"
    other.write_bytes(b"")
    not_zip = tmp_path / "wheels" / f"horovod-0.28.1-{tag}-{tag}-linux_x86_64.whl"
    not_zip.parent.mkdir()
    not_zip.write_bytes(b"not a zip")
    (tmp_path / "empty").mkdir()
    for wheel, start in (
            (tmp_path / "missing", "error: no such wheel or folder: "),
            (tmp_path / "empty", f"error: no Horovod wheels for Python 3.{sys.version_info[1]} "),
            (os.path.join(REPO, "README.md"),
             f"error: {os.path.join(REPO, 'README.md')} is not a Horovod wheel (horovod-*.whl)"),
            (other, "error: horovod-0.28.1-cp39-cp39-linux_x86_64.whl is not for this Python"),
            (not_zip.parent, f"error: {not_zip} is no Horovod wheel built with TensorFlow")):
        r = subprocess.run(check + [str(wheel)], capture_output=True, text=True, timeout=60)
        one_line(r, start)
    r = subprocess.run(check, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "the following arguments are required: WHEEL" in r.stderr
