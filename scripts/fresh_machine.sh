#!/usr/bin/env bash
# The README's quick start on a fresh Debian 13, as a new user meets it: a debootstrap root,
# `apt-get install git make python3 python3-venv sudo`, a user `ptb` with sudo, a clone of this
# checkout's HEAD (committed work only), PTB bound read-only from PTB_DATA_PATH, and inside it,
# as that user, the README's two commands:
#   make train ARGS=...         2 workers, bounded to a few steps (FRESH_TRAIN_ARGS)
#   make test TESTS="-m smoke"  setup is done by then; the tests marked smoke (FRESH_TESTS)
# pip inside reaches the package index as this host's pip does: its settings (`pip config
# list`, the PIP_* variables) are copied in, and the local files and folders they name are
# copied or bound read-only at the same paths.
#
#   sudo PTB_DATA_PATH=/path/to/ptb scripts/fresh_machine.sh [--keep] [ROOT]
#
# Root is needed (debootstrap, chroot, mounts). ROOT defaults to a new folder under /tmp; it is
# deleted at the end, its mounts undone first, unless --keep. CI runs this (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
SUITE=${FRESH_SUITE:-trixie}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TRAIN_ARGS=${FRESH_TRAIN_ARGS:---set num_epochs=1 --set steps_per_epoch=40 --log_every 20}
TESTS=${FRESH_TESTS:--m smoke}
USER_NAME=ptb
keep=0
if [ "${1:-}" = --keep ]; then keep=1; shift; fi
START=$(date +%s)

fail() { echo "error: $*" >&2; exit 1; }
stage() { echo "fresh: $1 (at $(( $(date +%s) - START )) s)"; }

[ "$(id -u)" -eq 0 ] || fail "fresh_machine.sh needs root (debootstrap, chroot, mounts); rerun with sudo"
DATA=${PTB_DATA_PATH:-}
[ -n "$DATA" ] && [ -f "$DATA/ptb.train.txt" ] || \
    fail "PTB_DATA_PATH must name a folder with ptb.{train,valid,test}.txt (got '${DATA}')"
DATA=$(cd "$DATA" && pwd)
ROOT=${1:-$(mktemp -d /tmp/ptb-fresh-XXXXXX)}  # made after the checks: a refusal leaves nothing
[ ! -e "$ROOT" ] || [ -z "$(ls -A "$ROOT")" ] || fail "$ROOT is not empty; name a new folder"

mounts=()  # every mount made under ROOT, undone in reverse order before ROOT is deleted
bind() {  # bind <host path> <path inside ROOT> [ro]
    mkdir -p "$ROOT$2"
    mount --bind "$1" "$ROOT$2"
    mounts+=("$ROOT$2")
    if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$ROOT$2"; fi
}
cleanup() {
    local status=$? m i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        m=${mounts[i]}
        umount -R "$m" 2>/dev/null || umount -R -l "$m" 2>/dev/null || true
    done
    if [ "$keep" = 1 ]; then
        echo "fresh: kept $ROOT (its mounts undone)"
    elif grep -q " $ROOT[/ ]" /proc/mounts; then
        echo "error: $ROOT still has mounts (see /proc/mounts); not deleted" >&2
        status=1
    else
        rm -rf --one-file-system "$ROOT"
    fi
    exit "$status"
}
trap cleanup EXIT

command -v debootstrap >/dev/null || {
    stage "installing debootstrap"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
}
stage "debootstrap --variant=minbase $SUITE into $ROOT"
mkdir -p "$ROOT"
chmod 755 "$ROOT"  # mktemp's folder is 0700: no user of the root could reach its /
debootstrap --variant=minbase "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.debootstrap.log" 2>&1 || {
    tail -5 "$ROOT.debootstrap.log" >&2; fail "debootstrap failed (log: $ROOT.debootstrap.log)"; }
rm -f "$ROOT.debootstrap.log"

mount -t proc proc "$ROOT/proc"; mounts+=("$ROOT/proc")
mount -t sysfs sysfs "$ROOT/sys"; mounts+=("$ROOT/sys")
mount --rbind /dev "$ROOT/dev"; mount --make-rslave "$ROOT/dev"; mounts+=("$ROOT/dev")
cp /etc/resolv.conf /etc/hosts "$ROOT/etc/"
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"  # no daemons started by packages
chmod +x "$ROOT/usr/sbin/policy-rc.d"

# This host's pip settings. A value naming a local file is copied, a folder bound read-only;
# a file:// index's pages point at files beside its simple/ folder, so its parent is bound.
carry_path() {
    local value=$1 path
    path=${value#file://}
    case $path in /*) ;; *) return 0 ;; esac
    case $path in */simple | */simple/) path=${path%/simple*} ;; esac
    if [ -f "$path" ]; then
        mkdir -p "$ROOT$(dirname "$path")"
        cp "$path" "$ROOT$path"
    elif [ -d "$path" ] && ! mountpoint -q "$ROOT$path" 2>/dev/null; then
        bind "$path" "$path" ro
    fi
}
pip_env=()
{
    echo "[global]"
    python3 -m pip config list 2>/dev/null | sed -n "s/^[a-z]*\.\([^=]*\)='\(.*\)'$/\1 = \2/p"
} >"$ROOT/etc/pip.conf"
for value in $(sed -n 's/^[^[][^=]* = //p' "$ROOT/etc/pip.conf"); do carry_path "$value"; done
while IFS='=' read -r name value; do
    pip_env+=("$name=$value")
    for token in $value; do carry_path "$token"; done
done < <(env | grep '^PIP_' || true)

in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

stage "apt-get install git make python3 python3-venv sudo (the user's own step)"
in_root apt-get update -q >/dev/null
in_root apt-get install -y -q git make python3 python3-venv sudo ca-certificates >/dev/null
CA=/etc/ssl/certs/ca-certificates.crt  # this host's bundle over the one ca-certificates made
[ -f "$CA" ] && carry_path "$CA"
in_root useradd -m -s /bin/bash "$USER_NAME"
echo "$USER_NAME ALL=(ALL) NOPASSWD:ALL" >"$ROOT/etc/sudoers.d/$USER_NAME"
chmod 440 "$ROOT/etc/sudoers.d/$USER_NAME"
git clone -q --no-hardlinks "$REPO" "$ROOT/home/$USER_NAME/ptb-horovod"
in_root chown -R "$USER_NAME:$USER_NAME" "/home/$USER_NAME/ptb-horovod"
bind "$DATA" /data/ptb ro
echo "fresh: $(in_root sh -c '. /etc/os-release; echo $PRETTY_NAME'), $(in_root python3 --version)," \
     "commit $(git -C "$REPO" rev-parse --short HEAD)"

as_user() {
    in_root /usr/sbin/runuser -u "$USER_NAME" -- /usr/bin/env HOME="/home/$USER_NAME" \
        USER="$USER_NAME" "${pip_env[@]}" PTB_DATA_PATH=/data/ptb \
        bash -c "cd ~/ptb-horovod && $1"
}
stage "make train (setup, then 2 workers: $TRAIN_ARGS)"
as_user "make train ARGS='$TRAIN_ARGS'"
stage "make test TESTS='$TESTS'"
as_user "make test TESTS='$TESTS'"
stage "done: the quick start works on a fresh $SUITE"
