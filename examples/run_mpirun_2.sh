#!/bin/bash
# Two machines, 8 ranks on each, hosts read from a hostfile. Run it on one of the machines:
#   bash run_mpirun_2.sh ./hostfile
# Extra arguments after the hostfile go to mpilaunch, e.g.
#   bash run_mpirun_2.sh ./hostfile --dry-run
# NP sets the number of ranks (default 16).
# MPILAUNCH replaces the launcher command (default: mpilaunch), e.g. MPILAUNCH="python -m mpilaunch".
set -e
if [ $# -lt 1 ]; then
    echo "usage: bash run_mpirun_2.sh HOSTFILE [mpilaunch options]" >&2
    exit 2
fi
# -x DATA_PATH: remote ranks start from their host's own environment, not this shell's
export DATA_PATH=${DATA_PATH:-./MNIST_Data/train/}
HOSTFILE=$1
shift
${MPILAUNCH:-mpilaunch} -n "${NP:-16}" --hostfile "$HOSTFILE" -x DATA_PATH --output-filename log_output --merge-stderr-to-stdout "$@" python net.py
