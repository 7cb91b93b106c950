#!/usr/bin/env bash
# The README's benchmark table (analysis.benchmarks.bench, then
# analysis.benchmarks.bench_table): the four networks × {32², 224²} × {float32, bfloat16}
# on one device; ResNet34 on 8 emulated devices and across 2 processes; the float32 steps
# beside their PyTorch peer (needs the [bench] extra; PyTorch's bfloat16 autocast on CPU
# runs 10-25x slower than its float32). Rounds: multiples of 6, so that with the peer (3
# runners) and without (2) each round starts with the next runner and each starts as often;
# then more, a turn at a time (a round led by each runner), until jaxpar's throughput over
# jit's is known within ±3 % (`--within 0.03`: the median's 95 % interval), up to a cap that
# keeps the slow steps' rows within minutes (a shared host's speed moves 20-90 % between
# rounds).
#   bash analysis/benchmarks/bench_all.sh runs      # 1.5-2 h on 2 cores
set -euo pipefail
out=${1:-runs}; mkdir -p "$out"
cell() { echo "configs/thesis.py:net=$1,scheme=sync-split,server=allreduce,workers=$2,batch=$3"; }
# At least 30 rounds; at most: 600 for steps under ~0.5 s a round, fewer for the slower.
within() { echo "--steps 30 --within 0.03 --max_steps $1"; }
declare -A most=([resnet34]=240 [squeezenet]=600 [googlenet]=600 [vgg16e]=120)
for net in resnet34 squeezenet googlenet vgg16e; do
  for dtype in float32 bfloat16; do
    peer=(); [ $dtype = float32 ] && peer=(--torch)
    # The published networks (the digits recipe gives SqueezeNet BatchNorm; its peer has none).
    [ $net = squeezenet ] && peer+=(--config.batch_norm=False)
    python -m analysis.benchmarks.bench --config "$(cell $net 1 32)" --config.dtype=$dtype \
        $(within ${most[$net]}) --warmup 1 "${peer[@]}" --out "$out/${net}_32_${dtype}_1.json"
    python -m analysis.benchmarks.bench --config "$(cell $net 1 2)" --config.image_size=224 \
        --config.dtype=$dtype $(within ${most[$net]}) --warmup 1 "${peer[@]}" \
        --out "$out/${net}_224_${dtype}_1.json"
  done
done
for dtype in float32 bfloat16; do
  peer=(); [ $dtype = float32 ] && peer=(--torch)
  python -m analysis.benchmarks.bench --config "$(cell resnet34 8 64)" --config.dtype=$dtype \
      $(within 120) --warmup 2 "${peer[@]}" --out "$out/resnet34_32_${dtype}_8.json"
done
launch/local.sh 2 --module analysis.benchmarks.bench --workdir "$out/logs" \
  --config "$(cell resnet34 2 32)" \
    $(within 240) --warmup 1 --torch --out "$out/resnet34_32_float32_2p.json"
launch/local.sh 2 --module analysis.benchmarks.bench --workdir "$out/logs" \
  --config "$(cell resnet34 2 32)" \
    --config.bn_group_size=1 $(within 240) --warmup 1 --torch --out "$out/resnet34_32_float32_2p_bn1.json"
python -m analysis.benchmarks.bench_table "$out"/*.json
