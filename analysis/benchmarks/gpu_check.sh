#!/usr/bin/env bash
# One GPU machine's checks in one prepared run (~11 min on one H200 past its start, half of it
# compiling; 2026-12-04): where jaxpar's step stands against torch.compile and the GPU's peak,
# where their time goes, and how fast the host can feed it.
#   bash analysis/benchmarks/gpu_check.sh runs/gpu_check
# 1. VGG16E and ResNet34 at 224², batch 64, bfloat16 (VGG16E float32 last), each step beside
#    torch.compile's (analysis.benchmarks.bench --torch_compile), 3 more steps of each traced
#    (--trace): the device time by kernel kind in the JSON, the traces beside it.
# 2. ResNet34 bfloat16: the same step with XLA's CUDA graphs off, with every fusion in a graph
#    and concurrent regions, and at batch 256 (jaxpar and jit only).
# 3. The host's input rate (analysis.benchmarks.input_rate): PyTorch's ImageNet loader on
#    1-16 cores (the image holds no TensorFlow for jaxpar's tf.data stream) and nvJPEG's
#    decode on the GPU.
# The GPU image lacks flax, ml_collections and importlib_resources: carry their wheels in .whl
# (docs/install.md); they are installed here without dependencies, then jaxpar.
set -uo pipefail
out=${1:-runs/gpu_check}; mkdir -p "$out"
python=${PYTHON:-python3}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.45} PYTHONUNBUFFERED=1
if [ -d .whl ]; then
  $python -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
$python -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
cell() {  # name net dtype batch [bench flags...]
  local name=$1 net=$2 dtype=$3 b=batch=$4; shift 4
  echo "== $name ($(date +%T))"
  $python -m analysis.benchmarks.bench \
      --config "configs/thesis.py:net=$net,scheme=sync-split,server=allreduce,workers=1,$b" \
      --config.image_size=224 --config.dataset.name=synthetic \
      --config.dataset.synthetic.classes=1000 --config.dtype=$dtype \
      --steps 20 --warmup 3 --out "$out/$name.json" "$@" || echo "gpu_check.sh: $name FAILED" >&2
}
cell vgg16e_224_bfloat16_compile vgg16e bfloat16 64 --torch_compile \
  --trace "$out/traces_vgg16e_bf16"
cell resnet34_224_bfloat16_compile resnet34 bfloat16 64 --torch_compile \
  --trace "$out/traces_resnet34_bf16"
XLA_FLAGS=--xla_gpu_enable_command_buffer= cell resnet34_224_bfloat16_no_graphs resnet34 bfloat16 64
XLA_FLAGS="--xla_gpu_graph_min_graph_size=1 --xla_gpu_graph_enable_concurrent_region=true" \
  cell resnet34_224_bfloat16_concurrent_graphs resnet34 bfloat16 64
cell resnet34_224_bfloat16_b256 resnet34 bfloat16 256
echo "== input ($(date +%T))"
$python -m analysis.benchmarks.input_rate --pipeline torch --core_counts 1,2,4,8,16 --rounds 3 \
    --out "$out/input_rate_torch.json" || echo "gpu_check.sh: input_rate torch FAILED" >&2
$python -m analysis.benchmarks.input_rate --pipeline nvjpeg --rounds 3 --batches 16 --images 256 \
    --out "$out/input_rate_nvjpeg.json" || echo "gpu_check.sh: input_rate nvjpeg FAILED" >&2
cell vgg16e_224_float32_compile vgg16e float32 64 --torch_compile \
  --trace "$out/traces_vgg16e_f32"
echo "== done ($(date +%T))"
$python -m analysis.benchmarks.bench_table "$out"/[rv]*.json || true
