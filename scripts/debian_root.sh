# A fresh Debian root for the checks that must run on a machine nobody has touched
# (scripts/fresh_machine.sh: the quick start; scripts/gpu_build_check.sh: the GPU build).
# Sourced, not run. The caller calls, in order:
#   root_checks SCRIPT TAG [--keep] [ROOT]       root, PTB_DATA_PATH and an empty ROOT checked
#                                                before anything is made; sets DATA, ROOT
#                                                (default /tmp/ptb-TAG-XXXXXX) and keep (1:
#                                                leave ROOT for a look, its mounts undone)
#   root_debootstrap SUITE MIRROR [COMPONENTS]   debootstrap --variant=minbase, /proc /sys /dev
#                                                (host_debootstrap first: the tool itself)
#   root_carry_pip                               this host's pip settings, so pip inside works
#   root_apt_install PACKAGE...                  apt-get inside
#   root_user_with_clone REPO USER DATA          a sudo user, a clone of REPO's HEAD in its
#                                                home, PTB bound read-only at /data/ptb
#   as_user "COMMAND"                            bash in the clone, as that user
# Every mount is undone, and ROOT deleted (unless keep=1), when the calling script exits.

mounts=()  # every mount made under ROOT, undone in reverse order before ROOT is deleted
ROOT_TAG=root
START=$(date +%s)

fail() { echo "error: $*" >&2; exit 1; }
stage() { echo "$ROOT_TAG: $1 (at $(( $(date +%s) - START )) s)"; }

root_checks() {  # SCRIPT TAG [--keep] [ROOT]
    local script=$1
    ROOT_TAG=$2
    shift 2
    keep=0
    if [ "${1:-}" = --keep ]; then keep=1; shift; fi
    [ "$(id -u)" -eq 0 ] || fail "$script needs root (debootstrap, chroot, mounts); rerun with sudo"
    DATA=${PTB_DATA_PATH:-}
    [ -n "$DATA" ] && [ -f "$DATA/ptb.train.txt" ] || \
        fail "PTB_DATA_PATH must name a folder with ptb.{train,valid,test}.txt (got '${DATA}')"
    DATA=$(cd "$DATA" && pwd)
    ROOT=${1:-$(mktemp -d "/tmp/ptb-$ROOT_TAG-XXXXXX")}  # made after the checks: a refusal leaves nothing
    [ ! -e "$ROOT" ] || [ -z "$(ls -A "$ROOT")" ] || fail "$ROOT is not empty; name a new folder"
}
pip_env=()
ROOT_USER=""

bind() {  # bind <host path> <path inside ROOT> [ro]
    mkdir -p "$ROOT$2"
    mount --bind "$1" "$ROOT$2"
    mounts+=("$ROOT$2")
    if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$ROOT$2"; fi
}

root_cleanup() {
    local status=$? m i
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
        m=${mounts[i]}
        umount -R "$m" 2>/dev/null || umount -R -l "$m" 2>/dev/null || true
    done
    # and what others mounted there: a debootstrap stopped with us (Ctrl-C) still has the root's
    # /proc and /sys mounted while its own exit handler runs, deepest first
    for m in $(awk -v root="$ROOT/" 'index($2, root) == 1 {print $2}' /proc/mounts | sort -r); do
        umount -l "$m" 2>/dev/null || true
    done
    if [ "${keep:-0}" = 1 ]; then
        echo "root: kept $ROOT (its mounts undone)"
    elif grep -q " $ROOT[/ ]" /proc/mounts; then
        echo "error: $ROOT still has mounts (see /proc/mounts); not deleted" >&2
        status=1
    else  # again after a second if a process stopped with us was still writing there
        rm -rf --one-file-system "$ROOT" 2>/dev/null || { sleep 1; rm -rf --one-file-system "$ROOT"; }
    fi
    [ -n "${failed_log:-}" ] || rm -f "$ROOT.debootstrap.log"  # a stopped debootstrap's
    exit "$status"
}

in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"; }

host_debootstrap() {  # debootstrap on this host, installed with apt-get if missing
    command -v debootstrap >/dev/null && return
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
}

root_debootstrap() {  # SUITE MIRROR [COMPONENTS, e.g. main,non-free]
    local suite=$1 mirror=$2 components=${3:-main}
    trap root_cleanup EXIT
    host_debootstrap
    mkdir -p "$ROOT"
    chmod 755 "$ROOT"  # mktemp's folder is 0700: no user of the root could reach its /
    debootstrap --variant=minbase --components="$components" "$suite" "$ROOT" "$mirror" \
        >"$ROOT.debootstrap.log" 2>&1 || {
        tail -5 "$ROOT.debootstrap.log" >&2; failed_log=$ROOT.debootstrap.log
        echo "error: debootstrap failed (log: $failed_log)" >&2; exit 1; }
    rm -f "$ROOT.debootstrap.log"
    mount -t proc proc "$ROOT/proc"; mounts+=("$ROOT/proc")
    mount -t sysfs sysfs "$ROOT/sys"; mounts+=("$ROOT/sys")
    mount --rbind /dev "$ROOT/dev"; mount --make-rslave "$ROOT/dev"; mounts+=("$ROOT/dev")
    cp /etc/resolv.conf /etc/hosts "$ROOT/etc/"
    printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"  # no daemons started by packages
    chmod +x "$ROOT/usr/sbin/policy-rc.d"
    in_root apt-get update -q >/dev/null
}

# A pip setting naming a local file is copied in, a folder bound read-only at the same path;
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

root_carry_pip() {
    local value name token
    {
        echo "[global]"
        python3 -m pip config list 2>/dev/null | sed -n "s/^[a-z]*\.\([^=]*\)='\(.*\)'$/\1 = \2/p"
    } >"$ROOT/etc/pip.conf"
    for value in $(sed -n 's/^[^[][^=]* = //p' "$ROOT/etc/pip.conf"); do carry_path "$value"; done
    while IFS='=' read -r name value; do
        pip_env+=("$name=$value")
        for token in $value; do carry_path "$token"; done
    done < <(env | grep '^PIP_' || true)
}

root_apt_install() {
    in_root apt-get install -y -q "$@" >/dev/null
    local ca=/etc/ssl/certs/ca-certificates.crt  # this host's bundle over the one made inside
    [ ! -f "$ca" ] || carry_path "$ca"
}

root_user_with_clone() {  # REPO USER DATA
    local repo=$1 data=$3
    ROOT_USER=$2
    in_root useradd -m -s /bin/bash "$ROOT_USER"
    echo "$ROOT_USER ALL=(ALL) NOPASSWD:ALL" >"$ROOT/etc/sudoers.d/$ROOT_USER"
    chmod 440 "$ROOT/etc/sudoers.d/$ROOT_USER"
    git clone -q --no-hardlinks "$repo" "$ROOT/home/$ROOT_USER/ptb-horovod"
    in_root chown -R "$ROOT_USER:$ROOT_USER" "/home/$ROOT_USER/ptb-horovod"
    bind "$data" /data/ptb ro
    echo "root: $(in_root sh -c '. /etc/os-release; echo $PRETTY_NAME'), $(in_root python3 --version)," \
         "commit $(git -C "$repo" rev-parse --short HEAD)"
}

as_user() {
    in_root /usr/sbin/runuser -u "$ROOT_USER" -- /usr/bin/env HOME="/home/$ROOT_USER" \
        USER="$ROOT_USER" "${pip_env[@]}" PTB_DATA_PATH=/data/ptb \
        bash -c "cd ~/ptb-horovod && $1"
}
