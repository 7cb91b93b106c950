"""Input pipeline against train step: images/s of each, for the same config, side by side.

  python -m analysis.benchmarks.input_bench --config configs/resnet34_2d.py
  python -m analysis.benchmarks.input_bench --config configs/resnet34_2d.py:caltech256 \
      --jpeg_folder=512 --config.global_batch=32

[Y] made input fast enough never to starve the accelerators: this measures whether
jaxpar's tf.data pipeline (parallel decode, fused JPEG decode and crop, augmentation,
prefetch) keeps up with the train step on this machine. `--jpeg_folder=N` first writes N
generated 224×224 JPEGs into a temporary image folder and reads that instead of the
configured dataset. Input is timed alone (this process's share of each global batch, as
numpy), then the train step alone on one fixed batch, so neither waits for the other.
"""
import os
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxpar import build, validation  # noqa: E402
from jaxpar import config as config_lib  # noqa: E402
from jaxpar.data import sources  # noqa: E402
from jaxpar.step import make_train_step, to_global  # noqa: E402

def write_jpeg_folder(root: str, count: int, size: int = 224, classes: int = 8):
  """Smooth random images (photographs compress like this, noise does not) as JPEGs."""
  from jaxpar.data import tf_import
  tf = tf_import.tensorflow()
  rng = np.random.default_rng(0)
  for i in range(count):
    folder = os.path.join(root, f'class_{i % classes}')
    os.makedirs(folder, exist_ok=True)
    low = rng.uniform(0, 255, (8, 8, 3)).astype(np.float32)
    image = tf.image.resize(low[None], (size, size), method='bicubic')[0]
    image += rng.normal(0, 8, image.shape)
    tf.io.write_file(os.path.join(folder, f'{i}.jpg'),
                     tf.io.encode_jpeg(tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8),
                                       quality=90))


def measure(cfg, batches: int, steps: int) -> dict:
  validation.validate(cfg)
  mesh = build.mesh(cfg)
  source = sources.open_source(cfg.dataset)
  global_batch = config_lib.global_batch(cfg)

  stream = build.train_batches(cfg, source, global_batch, start=0)
  batch = next(stream)  # warm-up: tf.data starts its threads, caches
  start = time.perf_counter()
  for i in range(batches):
    next(stream)
    print(f'\rinput: batch {i + 1}/{batches}', end='', file=sys.stderr, flush=True)
  input_time = (time.perf_counter() - start) / batches
  print(file=sys.stderr)

  model = build.model(cfg, source.num_classes, source.channels, mesh)
  strategy = build.strategy(cfg, mesh, model)
  tx, _ = build.optimizer(cfg, model, source.channels, strategy, global_batch,
                          total_steps=max(steps, cfg.optimizer.warmup_steps) + 1)
  state = build.initial_state(cfg, model, tx, strategy, source.channels, mesh, jax.random.key(0))
  step = make_train_step(model, tx, mesh, strategy)
  device_batch = to_global(mesh, batch)
  rng = jax.random.key(1)
  state, metrics = step(state, device_batch, rng)  # compilation
  jax.block_until_ready(metrics)
  times = []
  for i in range(steps):
    start = time.perf_counter()
    state, metrics = step(state, device_batch, rng)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
    print(f'\rstep: {i + 1}/{steps}', end='', file=sys.stderr, flush=True)
  print(file=sys.stderr)
  # Each process reads its own share; the input rate of the whole run is the sum.
  per_process = global_batch // jax.process_count()
  return {'dataset': cfg.dataset.name, 'image_size': cfg.image_size,
          'augment': cfg.augment.kind, 'global_batch': global_batch,
          'input_images_per_s': per_process / input_time * jax.process_count(),
          'step_images_per_s': global_batch / float(np.median(times))}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  cfg, args = flags.FLAGS.config, flags.FLAGS
  with tempfile.TemporaryDirectory() as folder:
    if args.jpeg_folder:
      write_jpeg_folder(folder, args.jpeg_folder)
      cfg.dataset.name, cfg.dataset.path = sources.IMAGE_FOLDER, folder
    try:
      r = measure(cfg, args.batches, args.steps)
    except config_lib.ConfigError as e:
      print(f'jaxpar: {e}', file=sys.stderr)
      sys.exit(2)
  print('| dataset | image size | augment | global batch | input images/s | train step images/s '
        '| input / step |')
  print('|---|---|---|---|---|---|---|')
  print(f"| {r['dataset']} | {r['image_size']} | {r['augment']} | {r['global_batch']} "
        f"| {r['input_images_per_s']:.0f} | {r['step_images_per_s']:.1f} "
        f"| {r['input_images_per_s'] / r['step_images_per_s']:.1f}× |")


if __name__ == '__main__':
  # Defined here, not at import: jaxpar.train defines --config too, and tests import both.
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].')
  flags.DEFINE_integer('jpeg_folder', 0, 'Write this many generated 224² JPEGs (8 classes) into '
                       'a temporary image folder and read that (0: the configured dataset).')
  flags.DEFINE_integer('batches', 40, 'Input batches to time, after one of warm-up.')
  flags.DEFINE_integer('steps', 5, 'Train steps to time, after one of compilation.')
  flags.mark_flag_as_required('config')
  app.run(main)
