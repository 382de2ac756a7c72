#!/usr/bin/env bash
# Set up everything the trainers and tests need; safe to run again (it skips what is done).
#   1. Debian packages: Open MPI (runtime and headers), cmake, g++, iproute2 (apt, as root or sudo)
#   2. .venv with the pinned requirements.txt (pip's cache is kept, so a rerun downloads nothing)
#   3. Horovod, built against that TensorFlow with MPI and Gloo, CPU ops
# GPU hosts: see README "GPU install" for the two lines that differ.
set -euo pipefail
cd "$(dirname "$0")/.."
HOROVOD_VERSION=0.28.1
PYTHON=${PYTHON:-python3.11}

missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicxx >/dev/null || missing+=(libopenmpi-dev)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]} with apt-get"
    if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else
        echo "error: need ${missing[*]}; run as root or install them with apt-get" >&2; exit 1
    fi
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
    if ! command -v "$PYTHON" >/dev/null; then
        echo "error: $PYTHON not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
        exit 1
    fi
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt

if ! .venv/bin/python -c "import horovod.tensorflow as h; assert h.mpi_built()" 2>/dev/null; then
    echo "setup: building horovod==$HOROVOD_VERSION (about 3 minutes; pip caches the wheel)"
    HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
        .venv/bin/python -m pip install -q --no-build-isolation "horovod==$HOROVOD_VERSION"
fi
TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python -c "import horovod.tensorflow as h, tensorflow as tf; \
print(f'setup: ok (TensorFlow {tf.__version__}, Horovod MPI={h.mpi_built()} Gloo={h.gloo_built()})')"
