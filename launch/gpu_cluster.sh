#!/usr/bin/env bash
# jaxpar on GPU machines without a scheduler: one process per GPU on every host, started
# over ssh with an explicit coordinator, process count and id (as local.sh does on one
# machine).
#
#   launch/gpu_cluster.sh host1,host2 8 --workdir /shared/runs/r34 \
#       --config configs/resnet34_2d.py:imagenet2012 --config.mesh.shape=16,1
#
# The first host is the coordinator (port JAXPAR_PORT, default 8476). Process i runs on
# host i / GPUS_PER_HOST and sees one GPU, CUDA_VISIBLE_DEVICES = i mod GPUS_PER_HOST. The
# mesh (config.mesh.shape) must hold hosts × GPUS_PER_HOST devices.
#
# Assumes: ssh without a password from here to every host; this repository at the same
# path on every host (this one's, or JAXPAR_DIR) with jaxpar and `jax[cuda12]` installed
# for the `python` found there (or PYTHON); --workdir on a file system every host sees
# (every process writes its part of each checkpoint); the hosts reach the coordinator's
# port. Logs: WORKDIR/process_<i>.log. A lost process ends the others within
# config.distributed.heartbeat_timeout; run the same command again to resume.
# Under Open MPI instead: mpirun -np N -H host1:8,host2:8 python -m jaxpar.train ...
# (JAX reads the ranks: distributed.cluster='auto', or 'mpi4py' for Open MPI 5).
set -euo pipefail
. "$(dirname "$0")/processes.sh"
if [ $# -lt 2 ] || ! [[ $2 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 HOST[,HOST...] GPUS_PER_HOST --workdir DIR --config FILE [flags ...]" >&2
  exit 2
fi
IFS=, read -ra hosts <<< "$1"
per_host=$2; shift 2
workdir=$(workdir_of "$@") || exit 2
mkdir -p "$workdir"
n=$((${#hosts[@]} * per_host))
flags=$(printf ' %q' "$@")
pids=()
for ((i = 0; i < n; i++)); do
  ssh "${hosts[i / per_host]}" "cd $(printf %q "${JAXPAR_DIR:-$PWD}") && \
    CUDA_VISIBLE_DEVICES=$((i % per_host)) ${PYTHON:-python} -m jaxpar.train$flags \
    --config.distributed.coordinator=${hosts[0]}:${JAXPAR_PORT:-8476} \
    --config.distributed.num_processes=$n --config.distributed.process_id=$i" \
    > "$workdir/process_$i.log" 2>&1 &
  pids+=($!)
done
wait_all "$workdir" "${pids[@]}"
