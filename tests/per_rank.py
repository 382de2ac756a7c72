"""Started by mpirun as every rank of a job whose ranks need different arguments (tests/helpers.py
`mpirun`): runs lm_ptb_distributed.py with this rank's arguments, given as a JSON list of one
argument list per rank. mpirun's own form for it, `-np 1 a : -np 1 b`, crashes the mpirun of
Debian 13's Open MPI 5.0.7 with a segmentation fault (open-mpi/ompi issue 13303)."""
import json
import os
import sys

rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMIX_RANK", "-1")))
if rank < 0:
    sys.exit("per_rank.py: no rank in the environment (OMPI_COMM_WORLD_RANK, PMIX_RANK); "
             "start it with mpirun")
os.execv(sys.executable, [sys.executable, "lm_ptb_distributed.py", *json.loads(sys.argv[1])[rank]])
