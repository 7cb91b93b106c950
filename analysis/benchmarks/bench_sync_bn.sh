#!/usr/bin/env bash
# The sync-BN table (docs/performance.md, BatchNorm across devices): each network's step
# with BatchNorm over both processes beside the same step with BatchNorm per device
# (analysis.benchmarks.bench --device_bn, alternated round by round; the auto-sharded jit
# step, whose BN is over the whole batch, runs beside them), 2 processes over loopback, 32²,
# global batch 32; VGG16E and GoogLeNet with their BatchNorm variant (batch_norm=True).
#   bash analysis/benchmarks/bench_sync_bn.sh runs      # ~8 min on 2 cores
set -euo pipefail
out=${1:-runs}; mkdir -p "$out"
for net in squeezenet resnet34 googlenet vgg16e; do
  launch/local.sh 2 --module analysis.benchmarks.bench --workdir "$out/logs" \
    --config "configs/thesis.py:net=$net,scheme=sync-split,server=allreduce,workers=2,batch=32" \
    --config.batch_norm=True --device_bn --steps 30 --warmup 2 --out "$out/${net}_32_2p.json"
done
python -m analysis.benchmarks.bench_table --sync_bn "$out"/*_2p.json
