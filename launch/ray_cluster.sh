#!/usr/bin/env bash
# Asynchronous training (Downpour) on a Ray cluster of GPU machines without a scheduler:
# `ray start` on every host over ssh, the run on this machine as Ray's driver, `ray stop`
# everywhere at the end.
#
#   launch/ray_cluster.sh host1,host2 8 --workdir /shared/runs/async \
#       --config configs/thesis.py:net=resnet34,scheme=async,server=distributed,workers=16,data=caltech256 \
#       --config.dataset.path=/shared/256_ObjectCategories
#
# The first host is Ray's head (port RAY_PORT, default 6379); every host offers
# GPUS_PER_HOST GPUs (0: a CPU cluster, one CPU per worker). The run (here) starts one worker actor per device of
# config.mesh.shape, each reserving one GPU (async_sgd.gpus_per_worker=1), spread over the
# hosts, and the server actors (central: one; distributed: one per Algorithm 3.7 part).
# Each worker reads its own shard of the data where it runs.
#
# Assumes: ssh without a password from here to every host; jaxpar with `jax[cuda12]` and
# Ray (pip install 'jaxpar[ray]') installed for the `python` and `ray` found on every host
# (or PYTHON), the same versions everywhere; the data at the same path on every host; the
# hosts reach the head's port and each other (Ray's object transfers). --workdir needs to
# be writable here only (the driver saves checkpoints and summaries). A lost worker is
# logged and training goes on (async_sgd.restart_workers restarts it); a lost server or
# all workers lost ends the run (exit 1): run the same command again to resume.
set -euo pipefail
if [ $# -lt 2 ] || ! [[ $2 =~ ^[0-9]+$ ]]; then
  echo "usage: $0 HOST[,HOST...] GPUS_PER_HOST --workdir DIR --config FILE [flags ...]" >&2
  exit 2
fi
IFS=, read -ra hosts <<< "$1"
gpus=$2; shift 2
head="${hosts[0]}:${RAY_PORT:-6379}"
stop() { for h in "${hosts[@]}"; do ssh "$h" "ray stop" >/dev/null 2>&1 || true; done; }
trap stop EXIT
ssh "${hosts[0]}" "ray start --head --port=${RAY_PORT:-6379} --num-gpus=$gpus"
# The cluster wants the token the head made (Ray's token authentication): every node
# joining it and the driver present it.
token=$(ssh "${hosts[0]}" "cat ~/.ray/auth_token")
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$token
for h in "${hosts[@]:1}"; do
  ssh "$h" "RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$token ray start --address=$head --num-gpus=$gpus"
done
RAY_ADDRESS=$head XLA_PYTHON_CLIENT_PREALLOCATE=false ${PYTHON:-python} -m jaxpar.train "$@" \
  --config.async_sgd.backend=ray --config.async_sgd.gpus_per_worker=$(( gpus > 0 ? 1 : 0 ))
