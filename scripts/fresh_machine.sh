#!/usr/bin/env bash
# The README's quick start on a fresh Debian 13, as a new user meets it: a debootstrap root,
# `apt-get install git make python3 python3-venv sudo`, a user `ptb` with sudo, a clone of this
# checkout's HEAD (committed work only), PTB bound read-only from PTB_DATA_PATH, and inside it,
# as that user, the README's two commands:
#   make train ARGS=...         2 workers, bounded to a few steps (FRESH_TRAIN_ARGS)
#   make test TESTS="-m smoke"  setup is done by then; the tests marked smoke (FRESH_TESTS)
#   make peer PEER_INSTALL=no   make bench's set-up step: the peer's venv on setup's Python
# pip inside reaches the package index as this host's pip does: its settings (`pip config
# list`, the PIP_* variables) are copied in, and the local files and folders they name are
# copied or bound read-only at the same paths.
#
#   sudo PTB_DATA_PATH=/path/to/ptb scripts/fresh_machine.sh [--keep] [ROOT]
#
# Root is needed (debootstrap, chroot, mounts). ROOT defaults to a new folder under /tmp; it is
# deleted at the end, its mounts undone first, unless --keep. CI runs this (.ci/run). The root
# itself is made by scripts/debian_root.sh, shared with scripts/gpu_build_check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
SUITE=${FRESH_SUITE:-trixie}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TRAIN_ARGS=${FRESH_TRAIN_ARGS:---set num_epochs=1 --set steps_per_epoch=40 --log_every 20}
TESTS=${FRESH_TESTS:--m smoke}
USER_NAME=ptb

# shellcheck source=scripts/debian_root.sh
. scripts/debian_root.sh
root_checks fresh_machine.sh fresh "$@"

stage "debootstrap --variant=minbase $SUITE into $ROOT"
root_debootstrap "$SUITE" "$MIRROR"
root_carry_pip

stage "apt-get install git make python3 python3-venv sudo (the user's own step)"
root_apt_install git make python3 python3-venv sudo ca-certificates
root_user_with_clone "$REPO" "$USER_NAME" "$DATA"

# What the user sees is kept too: setup's apt-get steps run under sudo, which resets the
# environment, so a DEBIAN_FRONTEND set before sudo is lost, and debconf then asks for a
# terminal (about 36 lines here; a user at a terminal gets its dialogs instead)
seen="$ROOT/var/tmp/fresh-output.log"
as_user_seen() { as_user "$1" 2>&1 | tee -a "$seen"; }
stage "make train (setup, then 2 workers: $TRAIN_ARGS)"
as_user_seen "make train ARGS='$TRAIN_ARGS'"
stage "make test TESTS='$TESTS'"
as_user_seen "make test TESTS='$TESTS'"
! grep -m1 '^debconf: unable to initialize frontend' "$seen" ||
    fail "setup's apt-get ran with a debconf frontend that needs a terminal (line above)"
# make bench's own set-up step, the peer's venv, with the Python setup chose (3.13 here); its
# PyTorch is left out: on 3.13 PyPI's torch is the CUDA build, gigabytes (docs/testing.md)
stage "make peer PEER_INSTALL=no (the benchmark's set-up, on the Python setup chose)"
as_user "make peer PEER_INSTALL=no && .venv-peer/bin/python -c 'import sys; \
assert sys.version_info[:2] == (3, 13), sys.version; print(\"peer venv:\", sys.version.split()[0])'"
stage "done: the quick start works on a fresh $SUITE"
