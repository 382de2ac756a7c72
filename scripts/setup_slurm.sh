#!/usr/bin/env bash
# Slurm for tests/test_slurm.py: Debian's slurm-wlm (22.05) and munge, installed with apt-get
# when missing. The test starts its own daemons (a one-node cluster in a temporary folder);
# this only installs the programs. Without root or sudo it changes nothing and says so: the
# Slurm test then skips locally (and fails in CI, which must run it).
set -euo pipefail
if command -v slurmctld >/dev/null && command -v munged >/dev/null; then
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo"; else
    echo "setup: no Slurm here and no root to install it (slurm-wlm, munge); the Slurm test" \
         "will skip" >&2
    exit 0
fi
echo "setup: installing slurm-wlm and munge with apt-get (for the Slurm test)"
$sudo apt-get update -q >/dev/null
# through env: sudo resets the environment, and a DEBIAN_FRONTEND set before it is lost
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    slurm-wlm munge >/dev/null
# Daemons the packages may start (systemd hosts) are left alone: the test's own use other
# ports and sockets.
