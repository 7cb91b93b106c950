#!/usr/bin/env bash
# The README's GPU table (analysis.benchmarks.bench, then analysis.benchmarks.bench_table):
# the four networks at 224² on one GPU, bfloat16 and float32, global batch 64, random
# ImageNet-shaped data (config.dataset.name='synthetic', 1000 classes: no dataset and no
# TensorFlow needed), each step beside the auto-sharded jit step and PyTorch's eager and
# torch.compile'd steps on CUDA (torchvision's networks; SqueezeNet without BatchNorm, as
# published and as its peer).
#   bash analysis/benchmarks/bench_gpu.sh runs/gpu     # 1.4-3.8 min a cell on one H200 (2026-11-29),
#                                                      # mostly jaxpar's and torch.compile's compilation
# NETS and DTYPES choose the cells (default: all eight), e.g. the ones still without torch.compile:
#   NETS="googlenet squeezenet" DTYPES=float32 bash analysis/benchmarks/bench_gpu.sh runs/gpu
# A cell that fails is named and the others still run. JAX takes 45 % of the GPU's memory
# (XLA_PYTHON_CLIENT_MEM_FRACTION), leaving PyTorch, in the same process, the rest.
set -uo pipefail
out=${1:-runs/gpu}; mkdir -p "$out"
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.45}
python=${PYTHON:-python3}
for dtype in ${DTYPES:-bfloat16 float32}; do
  for net in ${NETS:-resnet34 squeezenet googlenet vgg16e}; do
    extra=(); [ $net = squeezenet ] && extra=(--config.batch_norm=False)
    $python -m analysis.benchmarks.bench \
        --config "configs/thesis.py:net=$net,scheme=sync-split,server=allreduce,workers=1,batch=64" \
        --config.image_size=224 --config.dataset.name=synthetic \
        --config.dataset.synthetic.classes=1000 --config.dtype=$dtype "${extra[@]}" \
        --steps 20 --warmup 3 --torch --torch_compile --out "$out/${net}_224_${dtype}_gpu.json" \
      || echo "bench_gpu.sh: $net $dtype FAILED" >&2
  done
done
$python -m analysis.benchmarks.bench_table "$out"/*_gpu.json
