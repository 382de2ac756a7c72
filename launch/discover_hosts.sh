#!/bin/sh
# Host discovery for horovodrun's elastic mode (lm_ptb_elastic.py): print the hosts that may run
# workers now, one "host:slots" per line. Horovod runs this every few seconds; a host that
# disappears from the list loses its workers, one that appears gets new ones. This one reads
# the list from a file (ELASTIC_HOSTS, default launch/hosts.txt next to it); on a cluster,
# print what the scheduler says instead (e.g. `scontrol show hostnames` with a slot count).
exec cat "${ELASTIC_HOSTS:-$(dirname "$0")/hosts.txt}"
