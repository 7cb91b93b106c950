#!/usr/bin/env bash
# The sync-BN table (docs/performance.md, BatchNorm across devices): each network's step
# with BatchNorm over both processes beside the same step with BatchNorm per device
# (analysis.benchmarks.bench --device_bn, alternated round by round; the auto-sharded jit
# step, whose BN is over the whole batch, runs beside them), 2 processes over loopback, 32²,
# global batch 32; VGG16E and GoogLeNet with their BatchNorm variant (batch_norm=True).
# Rounds: at least 30, then more until the sync-BN ratio and jaxpar/jit are each known within
# ±3 % (`--within 0.03`), at most 600.
#   bash analysis/benchmarks/bench_sync_bn.sh runs      # ~20 min on 2 cores
set -euo pipefail
out=${1:-runs}; mkdir -p "$out"
for net in squeezenet resnet34 googlenet vgg16e; do
  launch/local.sh 2 --module analysis.benchmarks.bench --workdir "$out/logs" \
    --config "configs/thesis.py:net=$net,scheme=sync-split,server=allreduce,workers=2,batch=32" \
    --config.batch_norm=True --device_bn --steps 30 --within 0.03 --max_steps 600 --warmup 2 --out "$out/${net}_32_2p.json"
done
python -m analysis.benchmarks.bench_table --sync_bn "$out"/*_2p.json
