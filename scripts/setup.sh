#!/usr/bin/env bash
# Set up everything the trainers and tests need; safe to run again (it skips what is done).
#   1. Debian packages: Open MPI (runtime and headers), cmake, g++, iproute2 (apt, as root or sudo)
#   2. .venv with the pinned requirements.txt (pip's cache is kept, so a rerun downloads nothing)
#   3. Horovod, built against that TensorFlow with MPI and Gloo, CPU ops
# GPU hosts: GPU=1 scripts/setup.sh installs tensorflow[and-cuda] and builds Horovod with NCCL;
# it first checks for a CUDA 12 nvcc and NCCL's headers and stops, changing nothing, without
# them (docs/gpu.md).
set -euo pipefail
cd "$(dirname "$0")/.."
HOROVOD_VERSION=0.28.1
PYTHON=${PYTHON:-python3.11}
GPU=${GPU:-0}

if [ "$GPU" = 1 ]; then
    # Horovod's CMake needs the CUDA compiler and headers, which the pip CUDA wheels lack.
    if ! command -v nvcc >/dev/null; then
        echo "error: GPU=1 needs nvcc, the CUDA compiler of a CUDA 12.x toolkit (e.g. the" \
             "nvidia/cuda:12.2.2-devel image or the cuda-toolkit-12-2 package); install it, put" \
             "it on PATH and rerun (docs/gpu.md)" >&2
        exit 1
    fi
    cuda=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    if [ "$cuda" != 12 ]; then
        echo "error: GPU=1: nvcc is CUDA ${cuda:-unknown}, TensorFlow 2.15 is built for CUDA 12.2;" \
             "put a CUDA 12.x toolkit's nvcc first on PATH (docs/gpu.md)" >&2
        exit 1
    fi
    nccl_home=${HOROVOD_NCCL_HOME:-/usr}
    if [ ! -f "$nccl_home/include/nccl.h" ]; then
        echo "error: GPU=1: no nccl.h in $nccl_home/include; install libnccl2 libnccl-dev, or" \
             "set HOROVOD_NCCL_HOME to the nvidia-nccl-cu12 wheel's nvidia/nccl folder" \
             "(docs/gpu.md)" >&2
        exit 1
    fi
fi

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
if [ "$GPU" = 1 ]; then
    grep -v '^tensorflow-cpu' requirements.txt > .venv/requirements-gpu.txt
    .venv/bin/python -m pip install -q -r .venv/requirements-gpu.txt "tensorflow[and-cuda]==2.15.1"
    gpu_build=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME="${HOROVOD_NCCL_HOME:-/usr}")
    built='h.mpi_built() and h.nccl_built()'
else
    .venv/bin/python -m pip install -q -r requirements.txt
    gpu_build=()
    built='h.mpi_built()'
fi

if ! .venv/bin/python -c "import horovod.tensorflow as h; assert $built" 2>/dev/null; then
    echo "setup: building horovod==$HOROVOD_VERSION (about 3 minutes; pip caches the wheel)"
    # --no-cache-dir in GPU mode: a wheel cached from a CPU build (or another TensorFlow) would
    # be reused and fail at import (HorovodVersionMismatchError, horovod#2619).
    env "${gpu_build[@]}" HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
        .venv/bin/python -m pip install -q --no-build-isolation \
        $([ "$GPU" = 1 ] && echo --no-cache-dir --force-reinstall --no-deps) \
        "horovod==$HOROVOD_VERSION"
fi
TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python -c "import horovod.tensorflow as h, tensorflow as tf; \
print(f'setup: ok (TensorFlow {tf.__version__}, Horovod MPI={h.mpi_built()} Gloo={h.gloo_built()})')"
