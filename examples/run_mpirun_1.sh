#!/bin/bash
# Two machines, 8 ranks on each, hosts given with -H. Run it on one of the machines:
#   bash run_mpirun_1.sh
# Set HOSTS (and NP) for your machines; extra arguments go to mpilaunch, e.g.
#   bash run_mpirun_1.sh --dry-run
#   HOSTS=localhost:2,127.0.0.1:2 NP=4 bash run_mpirun_1.sh
# Every machine needs password-less SSH from this one, Python 3.9+ and net.py in the same directory.
# MPILAUNCH replaces the launcher command (default: mpilaunch), e.g. MPILAUNCH="python -m mpilaunch".
set -e
# -x DATA_PATH: remote ranks start from their host's own environment, not this shell's
export DATA_PATH=${DATA_PATH:-./MNIST_Data/train/}
HOSTS=${HOSTS:-DEVICE1_IP:8,DEVICE2_IP:8}
NP=${NP:-16}
${MPILAUNCH:-mpilaunch} -n "$NP" -H "$HOSTS" -x DATA_PATH --output-filename log_output --merge-stderr-to-stdout "$@" python net.py
