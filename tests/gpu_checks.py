"""One backend's side of test_gpu.py: jaxpar's one-device step on the platform JAX_PLATFORMS
names, the same arithmetic the test then compares across platforms.

  JAX_PLATFORMS=cuda python tests/gpu_checks.py OUT.npz
  JAX_PLATFORMS=cpu  python tests/gpu_checks.py OUT.npz

Each of the four published networks (ResNet34 with its BatchNorm, the others without, as
published) at 32², float32, a batch of 8 random images with 10 classes, as a one-device
run builds them (`jaxpar.build`: the config's `conv_impl='auto'` choosing the convolution
each platform runs, the configured optimizer, its warm-up starting at rate 0): 3 steps from
the same initial state on the same batch. Matrix products and convolutions run at full float32 precision
(`jax_default_matmul_precision='highest'`): on a GPU JAX's default is TF32, whose 10-bit
mantissa differs from float32 by ~1e-3 and would hide a real difference. Saves each step's
loss, the initial parameters and those after the three steps.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from jaxpar import build  # noqa: E402
from jaxpar import config as config_lib  # noqa: E402
from jaxpar.step import make_train_step, to_global  # noqa: E402

NETWORKS = ('resnet34', 'squeezenet', 'googlenet', 'vgg16e')
STEPS, BATCH, SIZE, CLASSES = 3, 8, 32, 10


def run(net: str, mesh) -> dict:
  cfg = config_lib.defaults()
  cfg.model, cfg.global_batch, cfg.image_size = net, BATCH, SIZE
  cfg.batch_norm = net == 'resnet34'
  cfg.mesh.shape, cfg.mesh.axes = (1,), ('data',)
  model, strategy, tx, state = build.for_timing(cfg, CLASSES, 3, mesh)
  rng = np.random.default_rng(0)
  batch = to_global(mesh, {
      'image': rng.normal(size=(BATCH, SIZE, SIZE, 3)).astype(np.float32),
      'label': rng.integers(0, CLASSES, BATCH).astype(np.int32)})
  step = make_train_step(model, tx, mesh, strategy)
  out = {f'{net}/initial/{jax.tree_util.keystr(path)}': np.asarray(leaf)
         for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)}
  for i in range(STEPS):
    state, metrics = step(state, batch, jax.random.key(1))
    out[f'{net}/loss/{i}'] = np.asarray(metrics['loss'])
  for path, leaf in jax.tree_util.tree_leaves_with_path(state.params):
    out[f'{net}/params/{jax.tree_util.keystr(path)}'] = np.asarray(leaf)
  return out


def main(path: str):
  jax.config.update('jax_default_matmul_precision', 'highest')
  from jaxpar import mesh as mesh_lib
  mesh = mesh_lib.make_mesh((1,), ('data',), devices=jax.devices()[:1])
  out = {'platform': np.asarray(jax.devices()[0].platform),
         'device_kind': np.asarray(jax.devices()[0].device_kind)}
  for net in NETWORKS:
    out.update(run(net, mesh))
  np.savez(path, **out)


if __name__ == '__main__':
  main(sys.argv[1])
