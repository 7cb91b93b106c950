#!/usr/bin/env bash
# What each method costs beyond the all-reduce step (analysis.benchmarks.bench, then
# analysis.benchmarks.bench_table --methods): on one device, where every method is plain SGD and
# should cost what all-reduce does (ResNet34, 32², batch 32), and the distributed
# server's peak memory against the replicated optimizer state on 8 emulated devices
# (VGG16E, 32², batch 8: SGD + momentum and LARS, even and greedy placement). Each run
# times the method beside the auto-sharded jit step (all-reduce, replicated state).
#   bash analysis/benchmarks/bench_methods.sh runs/methods      # ~15 min on 2 cores
set -euo pipefail
out=${1:-runs/methods}; mkdir -p "$out"
one="configs/thesis.py:net=resnet34,scheme=sync-split,workers=1,batch=32"
run() {
  name=$1; shift
  python -m analysis.benchmarks.bench --steps 10 --warmup 2 --out "$out/$name.json" "$@"
}
run n1_allreduce --config "$one,server=allreduce"
run n1_central --config "$one,server=central"
run n1_distributed --config "$one,server=distributed"
run n1_gossip --config "$one,server=allreduce" --config.server=gossip --config.bn_group_size=1
run n1_local_sgd --config "$one,server=allreduce" --config.sync_every=4 --config.bn_group_size=1
eight="configs/thesis.py:net=vgg16e,scheme=sync-split,workers=8,batch=8"
for opt in sgd lars; do
  run n8_allreduce_$opt --config "$eight,server=allreduce" --config.optimizer.name=$opt --steps 3 --warmup 1
  run n8_distributed_even_$opt --config "$eight,server=distributed" --config.placement=even \
      --config.optimizer.name=$opt --steps 3 --warmup 1
done
run n8_distributed_greedy_sgd --config "$eight,server=distributed" --steps 3 --warmup 1
python -m analysis.benchmarks.bench_table --methods "$out"/*.json
