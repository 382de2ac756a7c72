#!/usr/bin/env bash
# The GPU install built as far as a machine without a GPU goes (docs/gpu.md). In a fresh
# Debian 13 root (scripts/debian_root.sh) with its non-free section, whose nvidia-cuda-toolkit
# is CUDA 12.4 (no pip wheel has an nvcc for CUDA 12, and this repository's machines have
# CUDA 13, which TensorFlow 2.21 is not built for), as a new user in a clone of HEAD:
#   1. make setup                           the CPU build, .venv
#   2. GPU=1 VENV=.venv-gpu make setup      tensorflow[and-cuda], Horovod built with NCCL
#   3. horovodrun --check-build lists NCCL; hvd.nccl_built(); what the library links
#   4. the same bounded 2-rank run of lm_ptb_distributed.py with each build (on the CPU: there
#      is no driver) and their losses compared: equal within a relative 1e-4
#
#   sudo PTB_DATA_PATH=/path/to/ptb scripts/gpu_build_check.sh [--keep] [ROOT]
#
# Root is needed (debootstrap, chroot, mounts); gigabytes of downloads (CUDA toolkit, CUDA
# wheels), so not part of CI. Everything is also written to LOG (results/stack/gpu-build-check.log).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
SUITE=${GPU_CHECK_SUITE:-trixie}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
RUN_ARGS=${GPU_CHECK_RUN_ARGS:---config config_small --set num_epochs=1 --set steps_per_epoch=40 --set eval_steps=20 --log_every 2}
LOG=${LOG:-$REPO/results/stack/gpu-build-check.log}

# shellcheck source=scripts/debian_root.sh
. scripts/debian_root.sh
root_checks gpu_build_check.sh gpu-check "$@"
mkdir -p "$(dirname "$LOG")"
exec > >(tee "$LOG") 2>&1
echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)," \
     "host $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1), $(nproc) cores"

stage "debootstrap --variant=minbase --components=main,contrib,non-free $SUITE into $ROOT"
root_debootstrap "$SUITE" "$MIRROR" main,contrib,non-free
root_carry_pip
stage "apt-get install git make python3 python3-venv sudo nvidia-cuda-toolkit"
root_apt_install --no-install-recommends git make python3 python3-venv sudo ca-certificates \
    nvidia-cuda-toolkit
root_user_with_clone "$REPO" ptb "$DATA"

stage "make setup (the CPU build, .venv)"
as_user "make setup"
# Debian's /usr/bin/nvcc puts its own g++ first on PATH, a wrapper that runs the newest g++
# this CUDA accepts (g++-13), while Horovod's C++ is compiled by the system g++ (14).
as_user 'echo "gpu-check: $(nvcc --version | tail -2 | head -1); host compiler for nvcc:" \
    "$(PATH=/usr/lib/nvidia-cuda-toolkit/bin:$PATH g++ --version | head -1), for C++: $(g++ --version | head -1)"'
stage "GPU=1 VENV=.venv-gpu scripts/setup.sh (tensorflow[and-cuda], Horovod with NCCL)"
as_user "GPU=1 VENV=.venv-gpu scripts/setup.sh"
as_user ".venv-gpu/bin/python -m pip list 2>/dev/null | grep -iE '^(tensorflow|tf.keras|horovod|nvidia-(cuda-(runtime|nvcc)|cudnn|nccl|cublas)-cu12) '"

stage "the GPU build: horovodrun --check-build, hvd.nccl_built(), its libraries"
as_user ".venv-gpu/bin/horovodrun --check-build | sed -n '/Available Tensor Operations/,\$p'"
as_user ".venv-gpu/bin/horovodrun --check-build | grep -q '\\[X\\] NCCL'" ||
    fail "horovodrun --check-build does not list NCCL as built"
as_user ".venv-gpu/bin/python -c 'import utils, horovod.tensorflow as h; \
assert h.nccl_built(), \"nccl_built() is false\"; print(\"gpu-check: hvd.nccl_built() =\", h.nccl_built())'"
as_user 'ldd $(ls .venv-gpu/lib/python3*/site-packages/horovod/tensorflow/mpi_lib*.so) |
    grep -E "nccl|cudart" | sed "s/^\s*/gpu-check: links /"'

stage "a bounded 2-rank run with each build: $RUN_ARGS"
for venv in .venv .venv-gpu; do
    as_user "set -o pipefail; mpirun -np 2 -bind-to none -map-by slot $venv/bin/python lm_ptb_distributed.py \
        --data_path /data/ptb --output_dir runs/check$venv $RUN_ARGS 2>&1 | grep -E '^\[ptb\]'"
done
stage "losses of the GPU build against the CPU build's"
as_user ".venv/bin/python - <<'EOF'
import json
def losses(run):
    with open(f'runs/check{run}/metrics.jsonl') as f:
        return [e['loss'] for e in map(json.loads, f) if e['event'] == 'progress']
cpu, gpu = losses('.venv'), losses('.venv-gpu')
assert len(cpu) == len(gpu) > 1, (len(cpu), len(gpu))
rel = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
print(f'gpu-check: {len(cpu)} losses, CPU build {cpu[0]:.6f} .. {cpu[-1]:.6f},'
      f' GPU build {gpu[0]:.6f} .. {gpu[-1]:.6f}; largest relative difference {rel:.2e}')
assert cpu[0] != cpu[-1], 'the losses did not move'
assert rel < 1e-4, f'the GPU build trains differently: {rel:.2e} >= 1e-4'
EOF"
stage "done: Horovod built with NCCL against TensorFlow 2.21; on the CPU it trains as the CPU build"
