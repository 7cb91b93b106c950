"""tf.data pipelines: a resumable training stream and an exhaustive, masked eval.

Training order is a pure function of (seed, example position): epoch e is the
train split shuffled with seed `seed + e`, and each example's augmentation is
drawn from `(seed, position)`. A run resumed at position p therefore sees
exactly the batches the uninterrupted run would have seen.
"""
import numpy as np
import tensorflow as tf

AUGMENTATIONS = ('pad_crop', 'inception_crop', 'none')


def _to_float(image):
  # [0, 255] → [-1, 1]; a fixed scale keeps the pipeline free of per-dataset statistics.
  return tf.cast(image, tf.float32) / 127.5 - 1.0


def _resize(image, size):
  return tf.image.resize(image, (size, size), method='bilinear', antialias=True)


def _augment(image, seed, size, kind, crop_padding, flip):
  seeds = tf.random.experimental.stateless_split(seed, 3)
  if kind == 'inception_crop':
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), tf.zeros((1, 0, 4)), seed=seeds[0], area_range=(0.08, 1.0),
        aspect_ratio_range=(3 / 4, 4 / 3), use_image_if_no_bounding_boxes=True)
    image = _resize(tf.slice(image, begin, crop_size), size)
  else:
    image = _resize(image, size)
    if kind == 'pad_crop' and crop_padding:
      image = tf.pad(image, [[crop_padding] * 2, [crop_padding] * 2, [0, 0]])
      image = tf.image.stateless_random_crop(image, (size, size, tf.shape(image)[-1]), seeds[1])
  if flip:
    image = tf.image.stateless_random_flip_left_right(image, seeds[2])
  return image


def eval_image(image, size, kind):
  image = _to_float(image)
  if kind == 'inception_crop':  # the usual ImageNet eval: central 87.5 %, then resize
    image = tf.image.central_crop(image, 0.875)
  return _resize(image, size)


def train_batches(source, *, batch: int, start: int, seed: int, image_size: int,
                  augment: str, crop_padding: int, flip: bool, shuffle_buffer: int,
                  cache: bool):
  """Yields numpy batches of this process's share, beginning at example `start`."""
  base = source.train()
  if cache:
    base = base.cache()
  buffer = min(shuffle_buffer, source.num_train)
  epoch, offset = divmod(start, source.num_train)
  ds = tf.data.Dataset.range(epoch, np.iinfo(np.int64).max).flat_map(
      lambda e: base.shuffle(buffer, seed=seed + e, reshuffle_each_iteration=False))
  ds = ds.skip(offset).enumerate(start)

  def prepare(position, ex):
    image = _augment(_to_float(ex['image']), tf.stack([tf.constant(seed, tf.int64), position]),
                     image_size, augment, crop_padding, flip)
    return {'image': image, 'label': ex['label']}
  ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
  return ds.as_numpy_iterator()


def eval_batches(source, *, batch: int, num_batches: int, image_size: int, augment: str):
  """Every test example of this process's share exactly once, in `num_batches`
  batches of `batch`; padding rows carry mask 0 (and every process runs the same
  number of batches, so collectives stay matched)."""
  ds = source.test().map(
      lambda ex: {'image': eval_image(ex['image'], image_size, augment), 'label': ex['label']},
      num_parallel_calls=tf.data.AUTOTUNE).batch(batch).prefetch(tf.data.AUTOTUNE)
  it = ds.as_numpy_iterator()
  empty = {'image': np.zeros((0, image_size, image_size, source.channels), np.float32),
           'label': np.zeros((0,), np.int64)}
  for _ in range(num_batches):
    b = next(it, empty)  # past this process's examples: a fully masked batch
    n = len(b['label'])
    pad = batch - n
    yield {'image': np.pad(b['image'], [(0, pad)] + [(0, 0)] * 3),
           'label': np.pad(b['label'], (0, pad)),
           'mask': np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)])}
