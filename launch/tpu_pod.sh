#!/usr/bin/env bash
# jaxpar on a Cloud TPU pod slice: the same command on every TPU VM worker at once.
#
#   launch/tpu_pod.sh TPU_NAME ZONE --config configs/resnet34_2d.py:imagenet2012 \
#       --workdir gs://BUCKET/runs/r34 --config.mesh.shape=32,1
#
# JAX reads the coordinator (worker 0), the process count and each worker's id from the
# TPU VM's metadata (distributed.cluster='auto'); each worker drives its local TPU chips.
# The mesh (config.mesh.shape) must hold every chip of the slice.
#
# Assumes: the slice TPU_NAME exists in ZONE; every worker has this repository at
# $HOME/jaxpar (or JAXPAR_DIR) and jaxpar installed with `pip install -U "jax[tpu]"` first
# (e.g. once: gcloud compute tpus tpu-vm ssh NAME --zone Z --worker=all --command
# "git clone ... ~/jaxpar && pip install -U 'jax[tpu]' -e ~/jaxpar"); the workdir is one
# every worker sees (a gs:// bucket or a shared mount: each worker writes its part of
# every checkpoint); the dataset is readable from every worker (config.dataset.data_dir).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 TPU_NAME ZONE --config FILE --workdir DIR [flags ...]" >&2
  exit 2
fi
name=$1 zone=$2; shift 2
flags=$(printf ' %q' "$@")
# Every worker's output comes back prefixed by gcloud; a lost worker ends the others
# within config.distributed.heartbeat_timeout. Run the same command again to resume.
exec gcloud compute tpus tpu-vm ssh "$name" --zone "$zone" --worker=all \
  --command "cd ${JAXPAR_DIR:-\$HOME/jaxpar} && python -m jaxpar.train$flags"
