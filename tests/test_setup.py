"""scripts/setup.sh's GPU mode on this machine, which has no GPU: it must refuse in one line,
before touching anything, when the CUDA 12 compiler is missing or of another version."""
import os
import shutil
import subprocess

from tests.helpers import REPO


def venv_state():
    """Names and mtimes of .venv's top entries and of its site-packages: any install changes it."""
    site = os.path.join(REPO, ".venv", "lib", "python3.11", "site-packages")
    return {p: os.stat(p).st_mtime_ns for folder in (os.path.join(REPO, ".venv"), site)
            for p in (os.path.join(folder, n) for n in os.listdir(folder))}


def gpu_setup(path):
    script = os.path.join(REPO, "scripts", "setup.sh")
    return subprocess.run([shutil.which("bash"), script], cwd=REPO,
                          env={"PATH": path, "GPU": "1", "HOME": os.environ.get("HOME", "/root")},
                          capture_output=True, text=True, timeout=60)


def test_gpu_mode_without_nvcc_says_what_to_install_and_changes_nothing(tmp_path):
    bin_dir = tmp_path / "bin"  # the tools the script needs before its check, and no nvcc
    bin_dir.mkdir()
    for tool in ("dirname", "sed"):
        os.symlink(shutil.which(tool), bin_dir / tool)
    before = venv_state()
    r = gpu_setup(str(bin_dir))
    assert r.returncode == 1 and not r.stdout, r.stdout + r.stderr
    assert r.stderr.startswith("error: GPU=1 needs nvcc, the CUDA compiler of a CUDA 12.x toolkit")
    assert len(r.stderr.strip().splitlines()) == 1
    assert venv_state() == before


def test_gpu_mode_refuses_an_nvcc_of_another_cuda_version():
    nvcc = shutil.which("nvcc")
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout \
        if nvcc else ""
    if not nvcc or "release 12." in version:
        import pytest
        pytest.skip(f"this machine's nvcc is {'absent' if not nvcc else 'CUDA 12'}; the check "
                    "runs where a CUDA 13 nvcc is installed (the development machines)")
    before = venv_state()
    r = gpu_setup(os.environ["PATH"])
    assert r.returncode == 1 and "TensorFlow 2.15 is built for CUDA 12.2" in r.stderr, r.stderr
    assert venv_state() == before
