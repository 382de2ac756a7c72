#!/usr/bin/env bash
# Set up everything the trainers and tests need; safe to run again (it skips what is done).
#   1. Debian packages: Open MPI (runtime and headers), cmake, g++, patch, iproute2 (apt, as
#      root or with sudo)
#   2. .venv, made with PYTHON if set, else the newest of python3.13 .. python3.10 on PATH,
#      with the pinned requirements.txt and requirements-no-deps.txt
#   3. Horovod 0.28.1 from PyPI's source, patched by scripts/patches/horovod-0.28.1/ (one file
#      per cause: new compilers, TensorFlow and Keras; GPU=1 adds horovod-0.28.1-gpu/), built
#      against that TensorFlow with MPI and Gloo, without debug information
#      (scripts/horovod-build.cmake); built again when the patches change, the wheel
#      kept in ~/.cache/ptb-horovod by all it was built from (HOROVOD_WHEELS= to not keep it)
# --wheel-to DIR (make horovod-wheel): then also copies that wheel into DIR and prints how another
# project installs it (docs/keras3.md#using-this-horovod-in-another-project).
# GPU hosts: GPU=1 scripts/setup.sh installs tensorflow[and-cuda] and builds Horovod with NCCL
# (the system's, else the nvidia-nccl-cu12 wheel's); it first checks for a CUDA 12 nvcc and
# stops, changing nothing, without one (docs/gpu.md; make gpu-build-check proves it here).
set -euo pipefail
cd "$(dirname "$0")/.."
HOROVOD_VERSION=0.28.1
PATCHES=scripts/patches/horovod-$HOROVOD_VERSION
BUILD_SETTINGS=scripts/horovod-build.cmake  # its compiler flags: no debug information
SUPPORTED="Python 3.10 to 3.13"
GPU=${GPU:-0}
VENV=${VENV:-.venv}  # another folder for another stack (make venv-tf2.15)
REQUIREMENTS=${REQUIREMENTS:-requirements.txt}
NO_DEPS_REQUIREMENTS=${NO_DEPS_REQUIREMENTS-requirements-no-deps.txt}

WHEEL_TO=""
if [ $# -gt 0 ]; then
    if [ "$1" != --wheel-to ] || [ $# -ne 2 ] || [ -z "$2" ]; then
        echo "error: setup.sh takes no arguments but --wheel-to DIR (the folder to copy the" \
             "Horovod wheel into: make horovod-wheel WHEEL_DIR=DIR)" >&2
        exit 1
    fi
    WHEEL_TO=$2
    # refused before anything is installed or built: a folder that cannot take the wheel
    if ! out=$( { mkdir -p "$WHEEL_TO" && touch "$WHEEL_TO/.horovod-wheel-probe" &&
                  rm "$WHEEL_TO/.horovod-wheel-probe"; } 2>&1); then
        echo "error: cannot write the Horovod wheel into $WHEEL_TO (${out##*: }); name a folder" \
             "you can write: make horovod-wheel WHEEL_DIR=DIR" >&2
        exit 1
    fi
fi

if [ "$GPU" = 1 ]; then
    # Horovod's CMake needs the CUDA compiler and headers, which the pip CUDA wheels lack.
    if ! command -v nvcc >/dev/null; then
        echo "error: GPU=1 needs nvcc, the CUDA compiler of a CUDA 12.x toolkit (e.g. the" \
             "nvidia/cuda:12.5.1-devel image or the cuda-toolkit-12-5 package); install it, put" \
             "it on PATH and rerun (docs/gpu.md)" >&2
        exit 1
    fi
    cuda=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    if [ "$cuda" != 12 ]; then
        echo "error: GPU=1: nvcc is CUDA ${cuda:-unknown}, TensorFlow 2.21 is built for CUDA 12;" \
             "put a CUDA 12.x toolkit's nvcc first on PATH (docs/gpu.md)" >&2
        exit 1
    fi
    if [ -n "${HOROVOD_NCCL_HOME:-}" ] && [ ! -f "$HOROVOD_NCCL_HOME/include/nccl.h" ]; then
        echo "error: GPU=1: no nccl.h in HOROVOD_NCCL_HOME=$HOROVOD_NCCL_HOME/include; unset it" \
             "to use the system's NCCL (libnccl-dev) or else the nvidia-nccl-cu12 wheel's" \
             "(docs/gpu.md)" >&2
        exit 1
    fi
fi

# "3.14" if $1 runs, else nothing.
python_version() {
    "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

# "3.11" if $1 runs and is a supported Python, else nothing (a pyenv shim of a Python that is
# not installed exists on PATH but fails to run).
supported_version() {
    local version
    version=$(python_version "$1")
    case "$version" in
        3.1[0-3]) echo "$version" ;;
    esac
}

choose_python() {
    if [ -n "${PYTHON:-}" ]; then
        if ! "$PYTHON" -c '' 2>/dev/null; then
            echo "error: PYTHON=$PYTHON does not run; set PYTHON to a $SUPPORTED interpreter" >&2
            exit 1
        fi
        if [ -z "$(supported_version "$PYTHON")" ]; then
            echo "error: PYTHON=$PYTHON is Python $(python_version "$PYTHON");" \
                 "setup supports $SUPPORTED (TensorFlow 2.21's wheels); set PYTHON to one of those" >&2
            exit 1
        fi
        echo "$PYTHON"
        return
    fi
    for candidate in python3.13 python3.12 python3.11 python3.10; do
        if command -v "$candidate" >/dev/null && [ -n "$(supported_version "$candidate")" ]; then
            echo "$candidate"
            return
        fi
    done
    # A python3 outside the range (a distribution newer than TensorFlow 2.21's wheels, whose
    # python3 is 3.14, or an old one) is named, so that "install python3" is not the fix read.
    local other found=""
    local fix="install one with its venv module (Debian/Ubuntu: python3 python3-venv) or set"
    fix+=" PYTHON=/path/to/python3.X"
    other=$(python_version python3)
    if [ -n "$other" ]; then
        found="; python3 here is $other, which TensorFlow 2.21 has no wheels for"
        fix="install one beside it (the distribution's python3.1X and python3.1X-venv, pyenv"
        fix+=" or uv) and set PYTHON=/path/to/python3.1X"
    fi
    echo "error: no $SUPPORTED found (python3.13 .. python3.10 on PATH$found); $fix" >&2
    exit 1
}

# The Python first, so that an unsupported one is refused before anything is installed.
python=""
if [ -x "$VENV/bin/python" ]; then
    if [ -z "$(supported_version "$VENV/bin/python")" ]; then
        echo "error: $VENV's Python is not one of $SUPPORTED (an older setup's?); remove it" \
             "(rm -rf $VENV) and rerun" >&2
        exit 1
    fi
else
    python=$(choose_python)
fi

missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicxx >/dev/null || missing+=(libopenmpi-dev)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v patch >/dev/null || missing+=(patch)
command -v ip >/dev/null || missing+=(iproute2)
if [ ${#missing[@]} -gt 0 ]; then
    if ! command -v apt-get >/dev/null; then
        echo "error: need ${missing[*]} (Debian's names: Open MPI with its headers, CMake, g++," \
             "patch, iproute2) and found no apt-get to install them; install them with this" \
             "system's package manager and rerun" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]} with apt-get"
    if [ "$(id -u)" -eq 0 ]; then sudo=""; elif command -v sudo >/dev/null; then sudo="sudo"; else
        echo "error: need ${missing[*]}; run as root or install them with apt-get" >&2; exit 1
    fi
    $sudo apt-get update -q
    # through env: sudo resets the environment, and a DEBIAN_FRONTEND set before it is lost
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
if [ "$GPU" = 1 ]; then
    # Horovod compiles its CUDA kernels with the C++ compiler as nvcc's host compiler, and each
    # nvcc accepts gcc only up to some version (CUDA 12.4: 13; Debian 13's g++ is 14). So try
    # nvcc on the compiler the build would use, and if it names its newest, take that g++-N.
    probe=$(mktemp -d)
    echo '__global__ void probe() {}' >"$probe/probe.cu"
    host_cxx=${CXX:-g++}
    if ! out=$(nvcc -ccbin "$host_cxx" -c "$probe/probe.cu" -o "$probe/probe.o" 2>&1); then
        newest=$(sed -n 's/.*gcc versions later than \([0-9]*\) are not supported.*/\1/p' <<<"$out")
        if [ -n "$newest" ] && [ -z "${CXX:-}" ] && command -v "g++-$newest" >/dev/null &&
           nvcc -ccbin "g++-$newest" -c "$probe/probe.cu" -o "$probe/probe.o" >/dev/null 2>&1; then
            export CXX=g++-$newest CC=gcc-$newest
        else
            rm -rf "$probe"
            echo "error: GPU=1: nvcc (CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))" \
                 "cannot compile with $host_cxx: $(grep -m1 -i error <<<"$out");" \
                 "install a g++ it supports${newest:+ (g++-$newest)} or set CXX to one (docs/gpu.md)" >&2
            exit 1
        fi
    fi
    rm -rf "$probe"
fi

if [ -n "$python" ]; then
    if ! "$python" -m venv "$VENV"; then
        rm -rf "$VENV"
        echo "error: $python cannot make a venv; install its venv module (Debian/Ubuntu:" \
             "apt-get install python3-venv, or python3.X-venv for $python) and rerun" >&2
        exit 1
    fi
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
if [ "$GPU" = 1 ]; then
    grep -v '^tensorflow-cpu' "$REQUIREMENTS" > "$VENV/requirements-gpu.txt"
    tf_pin=$(sed -n 's/^tensorflow-cpu==\([^ ]*\).*/\1/p' "$REQUIREMENTS")
    "$VENV/bin/python" -m pip install -q -r "$VENV/requirements-gpu.txt" "tensorflow[and-cuda]==$tf_pin"
    # Native code for Volta (7.0) to Hopper (9.0); by default Horovod builds every architecture
    # its nvcc knows, which takes far longer.
    gpu_build=(HOROVOD_GPU_OPERATIONS=NCCL
               HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-70,75,80,86,89,90}")
    if [ -n "${HOROVOD_NCCL_HOME:-}" ]; then
        gpu_build+=(HOROVOD_NCCL_HOME="$HOROVOD_NCCL_HOME")
    elif [ -f /usr/include/nccl.h ]; then
        gpu_build+=(HOROVOD_NCCL_HOME=/usr)
    else
        # The NCCL that tensorflow[and-cuda] brings (nvidia-nccl-cu12): it has libnccl.so.2 but
        # no libnccl.so for the linker, and Horovod's library must find it at run time without
        # LD_LIBRARY_PATH, hence the link and the rpath.
        nccl=$("$VENV/bin/python" -c 'import nvidia.nccl as n; print(list(n.__path__)[0])')
        ln -sf libnccl.so.2 "$nccl/lib/libnccl.so"
        gpu_build+=(HOROVOD_NCCL_HOME="$nccl" HOROVOD_NCCL_LINK=SHARED
                    LDFLAGS="${LDFLAGS:-} -Wl,-rpath,$nccl/lib")
    fi
    echo "setup: NCCL from ${gpu_build[2]#HOROVOD_NCCL_HOME=}, nvcc $(command -v nvcc)" \
         "($(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/CUDA \1/p')), host compiler ${CXX:-g++}"
    built='h.mpi_built() and h.nccl_built()'
else
    "$VENV/bin/python" -m pip install -q -r "$REQUIREMENTS"
    gpu_build=()
    built='h.mpi_built() and h.gloo_built()'
fi
if [ -n "$NO_DEPS_REQUIREMENTS" ]; then
    "$VENV/bin/python" -m pip install -q --no-deps -r "$NO_DEPS_REQUIREMENTS"
fi

# Horovod's sdist, unpacked and patched in $VENV/horovod-src; each patch is first tried alone,
# so one that does not fit (another Horovod version) stops setup before anything is built.
patched_horovod_source() {
    local src="$VENV/horovod-src" tree
    rm -rf "$src"
    mkdir -p "$src"
    "$VENV/bin/python" -m pip download -q --no-deps --no-binary :all: -d "$src" \
        "horovod==$HOROVOD_VERSION" >&2
    tar xzf "$src/horovod-$HOROVOD_VERSION.tar.gz" -C "$src"
    tree=$src/horovod-$HOROVOD_VERSION
    for patch_file in "$PATCHES"/*.patch $([ "$GPU" = 1 ] && echo "$PATCHES-gpu"/*.patch); do
        if ! patch -d "$tree" -p1 --forward --batch --dry-run <"$patch_file" >/dev/null 2>&1; then
            echo "error: $patch_file does not apply to horovod $HOROVOD_VERSION's source in" \
                 "$tree; the patches are made for that version (scripts/patches/)" >&2
            exit 1
        fi
        patch -d "$tree" -p1 --forward --batch --silent <"$patch_file"
    done
    echo "$tree"
}

# The import check and setup's last line in one interpreter (TensorFlow's import is most of a
# warm setup's 8 CPU s, and every make target runs setup); utils first: it sees the Keras the
# trainers use (utils/__init__.py), and its import_tensorflow holds back TensorFlow's start-up
# notes, which a fresh machine's setup printed twice here once the trainers turned oneDNN on.
check_horovod="import sys, utils; tf = utils.import_tensorflow(); import horovod.tensorflow as h; \
assert $built; \
keras = 'Keras ' + tf.keras.__version__ if hasattr(tf.keras, '__version__') else \
    'tf-keras ' + __import__('tf_keras').__version__; \
print(f'setup: ok (Python {sys.version.split()[0]}, TensorFlow {tf.__version__}, {keras}, ' \
      f'Horovod MPI={h.mpi_built()} Gloo={h.gloo_built()} NCCL={bool(h.nccl_built())})')"
# The patches and build settings Horovod was built with, recorded beside it: a checkout with
# others (a new patch, say) rebuilds it, where the import check alone would keep the old build.
build_recipe=$(cat "$PATCHES"/*.patch $([ "$GPU" = 1 ] && echo "$PATCHES-gpu"/*.patch) \
    "$BUILD_SETTINGS" | sha256sum)
built_with="$VENV/horovod-build.sha256"

# Everything the built wheel depends on, hashed: the patches, the Python, every package of the
# venv (TensorFlow's exact build above all: a wheel built against another one fails at import,
# HorovodVersionMismatchError, horovod#2619), the compilers, MPI and the build's settings.
# pip's own wheel cache keys a wheel by the source alone, hence --no-cache-dir below.
horovod_build_key() {
    {
        echo "horovod $HOROVOD_VERSION, GPU=$GPU ${gpu_build[*]}, $(uname -m)"
        echo "$build_recipe"
        "$VENV/bin/python" -c 'import sys, sysconfig; print(sys.version, sysconfig.get_platform())'
        "$VENV/bin/python" -m pip freeze --all --exclude horovod --exclude pip
        "${CXX:-g++}" --version | sed -n 1p  # sed, not head: it reads all, so no SIGPIPE under pipefail
        mpirun --version 2>&1 | sed -n 1p
        cmake --version | sed -n 1p
        [ "$GPU" = 1 ] && nvcc --version | tail -1
        true
    } | sha256sum | cut -c1-16
}

# Horovod 0.28.1's setup.py predates the setuptools pinned in requirements.txt: its
# `tests_require` and its license classifier each print a deprecation warning, boxed, twice in
# every build. They concern Horovod's packaging, not this build; those two alone are held back.
HOROVOD_BUILD_WARNINGS="ignore:Unknown distribution option:UserWarning"
HOROVOD_BUILD_WARNINGS+=",ignore:License classifiers are deprecated:Warning"

# The wheel, built once per key and kept outside the venv (HOROVOD_WHEELS, empty: not kept),
# so a new clone or venv on this machine installs it in seconds instead of building it again.
HOROVOD_WHEELS=${HOROVOD_WHEELS-${XDG_CACHE_HOME:-$HOME/.cache}/ptb-horovod}
wheels="" wheel=""
# Sets wheel, the path of this venv's patched wheel (in wheels/<key>), building it if not there.
find_horovod_wheel() {
    local key
    [ -z "$wheel" ] || return 0  # found (or built) before in this run
    wheels=$HOROVOD_WHEELS
    if [ -z "$wheels" ] || ! mkdir -p "$wheels" 2>/dev/null; then
        wheels="$VENV/horovod-wheel"  # not kept: built in the venv, removed at the end
        rm -rf "$wheels" && mkdir "$wheels"
    fi
    key=$(horovod_build_key)
    if ls "$wheels/$key"/horovod-*.whl >/dev/null 2>&1; then
        echo "setup: horovod==$HOROVOD_VERSION as built before for this stack ($wheels/$key)"
    else
        build_horovod_wheel "$wheels/$key"
    fi
    wheel=$(ls "$wheels/$key"/horovod-*.whl)
}

install_horovod() {
    find_horovod_wheel
    "$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$wheel"
    echo "$build_recipe" >"$built_with"
}

# Builds the patched wheel into a new folder beside $1 and renames it to $1 once whole, so an
# interrupted build leaves no wheel under the key (and its unfinished folder is removed).
build_horovod_wheel() {
    local patches tree
    [ -d "$PATCHES" ] || { echo "error: no patches for horovod $HOROVOD_VERSION in $PATCHES" >&2; exit 1; }
    tree=$(patched_horovod_source)
    patches=$(ls "$PATCHES" $([ "$GPU" = 1 ] && echo "$PATCHES-gpu") | grep -c '\.patch$')
    echo "setup: building horovod==$HOROVOD_VERSION with $patches patches (about 4 minutes)"
    building=$(mktemp -d "$1.building.XXXXXX")
    trap 'rm -rf "$building"' EXIT
    env "${gpu_build[@]}" CMAKE_TOOLCHAIN_FILE="$PWD/$BUILD_SETTINGS" \
        HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
        HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
        PYTHONWARNINGS="$HOROVOD_BUILD_WARNINGS" \
        "$VENV/bin/python" -m pip wheel -q --no-build-isolation --no-cache-dir --no-deps \
        -w "$building" "$tree"
    rm -rf "$VENV/horovod-src" "$1"
    mv -T "$building" "$1"
    trap - EXIT
}

if [ "$(cat "$built_with" 2>/dev/null)" != "$build_recipe" ] \
        || ! "$VENV/bin/python" -c "$check_horovod" 2>/dev/null; then
    install_horovod
    "$VENV/bin/python" -c "$check_horovod" || {
        echo "error: the Horovod just installed fails setup's import check ($built): its" \
            "build lacks what it needs; see the build's output above" >&2
        exit 1
    }
fi

# The wheel for another project (--wheel-to), and what it takes there: the TensorFlow it was
# built against (its own record, horovod/metadata.json), the Python of its tag, Open MPI.
copy_horovod_wheel() {
    local copy=$WHEEL_TO/${wheel##*/} tf python tf_install
    cp "$wheel" "$copy"
    copy=$(cd "$(dirname "$copy")" && pwd)/${copy##*/}
    tf=$("$VENV/bin/python" -c 'import json, sys, zipfile
print(json.loads(zipfile.ZipFile(sys.argv[1]).read("horovod/metadata.json"))["tensorflow"])' "$copy")
    python=$(sed -n 's/.*-cp\([0-9]\)\([0-9]*\)-.*/\1.\2/p' <<<"${copy##*/}")
    tf_install="tensorflow-cpu==$tf"
    [ "$GPU" = 1 ] && tf_install="\"tensorflow[and-cuda]==$tf\""
    echo "horovod-wheel: $copy"
    echo "  Horovod $HOROVOD_VERSION with this repository's patches, built for Python $python against" \
         "TensorFlow $tf$([ "$GPU" = 1 ] && echo " with NCCL"): it works with that TensorFlow alone"
    echo "  needs on the machine: Open MPI's runtime as here ($(mpirun --version 2>&1 | sed -n '1{s/^mpirun (\(.*\)) /\1 /;p}');" \
         "Debian: openmpi-bin); in a Python $python venv of the other project:"
    echo "    pip install $tf_install"
    echo "    pip install $copy"
}

if [ -n "$WHEEL_TO" ]; then
    find_horovod_wheel
    copy_horovod_wheel
fi
[ -z "$wheels" ] || [ "$wheels" = "$HOROVOD_WHEELS" ] || rm -rf "$wheels"
