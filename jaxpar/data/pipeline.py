"""tf.data pipelines: a resumable training stream and an exhaustive, masked eval.

Training order is a pure function of (seed, example position): epoch e is the
train split shuffled with seed `seed + e`, and each example's augmentation is
drawn from `(seed, position)`. A run resumed at position p therefore sees
exactly the batches the uninterrupted run would have seen.

The training stream runs with tf.data's autotuner off (parallel maps then use every
core): its optimisation thread sleeps for up to a minute between rounds, and the
iterator's destructor waited for it at the end of every run — 35 s of each 2-process
run's exit, measured; the input rate of `analysis.benchmarks.input_bench` on 224² JPEGs was the
same within its noise (871 and 734 images/s off, 880 on).

TensorFlow is imported inside the functions that use it (by `tf_import`, without Keras),
not with the module: the step, `build` and the benchmarks import this module on machines
without TensorFlow (a GPU machine with JAX and PyTorch only) and never build a pipeline there.
"""
import collections
import itertools

import numpy as np

from jaxpar.data import tf_import
from jaxpar.step import to_global

AUGMENTATIONS = ('pad_crop', 'inception_crop', 'none')
DECODERS = ('tf', 'dali')


def _to_float(image):
  tf = tf_import.tensorflow()
  # [0, 255] → [-1, 1]; a fixed scale keeps the pipeline free of per-dataset statistics.
  return tf.cast(image, tf.float32) / 127.5 - 1.0


def _resize(image, size):
  tf = tf_import.tensorflow()
  return tf.image.resize(image, (size, size), method='bilinear', antialias=True)


def _decode(data, channels):
  tf = tf_import.tensorflow()
  image = tf.io.decode_image(data, channels=channels, expand_animations=False)
  image.set_shape([None, None, channels])
  return image


def _decode_crop(data, channels, window):
  """Decodes only `window(shape) -> (begin, size)` of an encoded image.

  JPEG is decoded and cropped in one pass (`decode_and_crop_jpeg`: only the
  window's blocks are decoded, [Y]'s fused decode and crop); other formats are
  decoded whole, then sliced. The pixels are those of decode-then-crop, but at
  the window's last row and column, where JPEG's chroma upsampling cannot look
  past the window.
  """
  tf = tf_import.tensorflow()
  def jpeg():
    begin, size = window(tf.image.extract_jpeg_shape(data))
    image = tf.image.decode_and_crop_jpeg(data, tf.stack([begin[0], begin[1], size[0], size[1]]),
                                          channels=channels)
    image.set_shape([None, None, channels])
    return image

  def other():
    image = _decode(data, channels)
    begin, size = window(tf.shape(image))
    return tf.slice(image, tf.concat([begin[:2], [0]], 0), tf.concat([size[:2], [-1]], 0))
  return tf.cond(tf.io.is_jpeg(data), jpeg, other)


def _inception_window(seed):
  """`window(shape) -> (begin, size)`: Inception's random crop, 8–100 % of the area at an
  aspect ratio of 3/4–4/3 (Szegedy et al. 2015), drawn from `seed`."""
  tf = tf_import.tensorflow()

  def window(shape):
    begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, tf.zeros((1, 0, 4)), seed=seed, area_range=(0.08, 1.0),
        aspect_ratio_range=(3 / 4, 4 / 3), use_image_if_no_bounding_boxes=True)
    return begin, crop_size
  return window


def _flips(seed):
  """Whether the image drawn with `seed` is mirrored: a uniform draw below 0.5
  (`tf.image.stateless_random_flip_left_right`'s rule), read by both decoders."""
  tf = tf_import.tensorflow()
  return tf.random.stateless_uniform([], seed=seed, minval=0, maxval=1.0) < 0.5


def _pad_crop_offset(seed, crop_padding):
  """Where 'pad_crop' cuts its image from the one padded by `crop_padding`: [top, left, 0],
  each 0..2·crop_padding (`tf.image.stateless_random_crop`'s rule), read by both
  decoders."""
  tf = tf_import.tensorflow()
  limit = tf.constant([2 * crop_padding + 1, 2 * crop_padding + 1, 1])
  return tf.random.stateless_uniform([3], seed=seed, maxval=tf.int32.max, dtype=tf.int32) % limit


def _augment(data, seed, size, kind, crop_padding, flip, channels):
  """Encoded image → augmented float image of `size`², deterministic in `seed`."""
  tf = tf_import.tensorflow()
  seeds = tf.random.experimental.stateless_split(seed, 3)
  if kind == 'inception_crop':
    image = _resize(_to_float(_decode_crop(data, channels, _inception_window(seeds[0]))), size)
  else:
    image = _resize(_to_float(_decode(data, channels)), size)
    if kind == 'pad_crop' and crop_padding:
      image = tf.pad(image, [[crop_padding] * 2, [crop_padding] * 2, [0, 0]])
      image = tf.slice(image, _pad_crop_offset(seeds[1], crop_padding), [size, size, channels])
  if flip:
    image = tf.cond(_flips(seeds[2]), lambda: tf.reverse(image, [1]), lambda: image)
  return image


def _shape(data, channels):
  """An encoded image's [height, width, channels]: read from a JPEG's header, else decoded."""
  tf = tf_import.tensorflow()
  return tf.cond(tf.io.is_jpeg(data), lambda: tf.image.extract_jpeg_shape(data),
                 lambda: tf.shape(_decode(data, channels)))


def _dali_decodes(data, channels):
  """`data` in a format DALI decodes: a GIF (which DALI does not read; its CPU decoder
  crashes the process on one in a batch of 32 or more) as a PNG of the same pixels, any
  other image as it is."""
  tf = tf_import.tensorflow()
  return tf.cond(tf.strings.substr(data, 0, 3) == b'GIF',
                 lambda: tf.io.encode_png(_decode(data, channels)), lambda: data)


def _augment_plan(data, seed, size, kind, crop_padding, flip, channels):
  """What `_augment` does to one image, for a decoder elsewhere (`jaxpar.data.dali`), drawn
  from the same `seed` as `_augment`'s: a window [top, left, height, width] — for
  'inception_crop' of the encoded image, the part decoded; for 'pad_crop' of the image
  resized to `size`², the part kept, reaching up to `crop_padding` past its edges (zeros
  there); for 'none' (or no padding) zeros: the whole image — and whether it is mirrored."""
  tf = tf_import.tensorflow()
  seeds = tf.random.experimental.stateless_split(seed, 3)
  window = tf.zeros(4, tf.int32)
  if kind == 'inception_crop':
    begin, extent = _inception_window(seeds[0])(_shape(data, channels))
    window = tf.cast(tf.concat([begin[:2], extent[:2]], 0), tf.int32)
  elif kind == 'pad_crop' and crop_padding:
    offset = _pad_crop_offset(seeds[1], crop_padding)
    window = tf.concat([offset[:2] - crop_padding, [size, size]], 0)
  return window, (_flips(seeds[2]) if flip else tf.constant(False))


def eval_image(data, size, kind, channels):
  tf = tf_import.tensorflow()
  if kind == 'inception_crop':  # the usual ImageNet eval: central 87.5 %, then resize
    def window(shape):  # tf.image.central_crop's window
      begin = tf.cast(tf.cast(shape[:2], tf.float32) * (1 - 0.875) / 2, tf.int32)
      return begin, shape[:2] - 2 * begin
    return _resize(_to_float(_decode_crop(data, channels, window)), size)
  return _resize(_to_float(_decode(data, channels)), size)


def train_batches(source, *, batch: int, start: int, seed: int, image_size: int,
                  augment: str, crop_padding: int, flip: bool, shuffle_buffer: int,
                  cache: bool, decoder: str = 'tf'):
  """Yields batches of `batch` examples, this process's part of the stream of the records it
  reads (`source.train_part`: its `batch` of each `batch × count` from `start`), beginning
  at position `start` of that stream (`source.stream_start` of the run's example count).
  `decoder='tf'`: tf.data decodes and augments here, numpy batches; 'dali': tf.data reads
  the files and draws each image's window and flip as it would, NVIDIA DALI decodes and
  augments (`jaxpar.data.dali`: on the GPU where JAX runs on one, its batches there)."""
  tf = tf_import.tensorflow()
  base = source.train_records()
  if cache:
    base = base.cache()
  buffer = min(shuffle_buffer, source.num_train)
  epoch, offset = divmod(start, source.num_train)
  ds = tf.data.Dataset.range(epoch, np.iinfo(np.int64).max).flat_map(
      lambda e: base.shuffle(buffer, seed=seed + e, reshuffle_each_iteration=False))
  ds = ds.skip(offset).enumerate(start)
  index, count = source.train_part
  if count > 1:  # this process's rows of each global batch, before anything is loaded
    ds = ds.filter(lambda position, _: (position - start) % (batch * count) // batch == index)
  load = source.load or (lambda record: record)

  def prepare(position, record):
    ex = load(record)
    seeds = tf.stack([tf.constant(seed, tf.int64), position])
    if decoder == 'dali':
      window, flips = _augment_plan(ex['image'], seeds, image_size, augment, crop_padding, flip,
                                    source.channels)
      return {'encoded': _dali_decodes(ex['image'], source.channels), 'window': window,
              'flip': flips, 'label': ex['label']}
    image = _augment(ex['image'], seeds, image_size, augment, crop_padding, flip,
                     source.channels)
    return {'image': image, 'label': ex['label']}
  ds = ds.map(prepare, num_parallel_calls=tf.data.AUTOTUNE)
  ds = ds.batch(batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.autotune.enabled = False  # see the module docstring
  stream = ds.with_options(options).as_numpy_iterator()
  if decoder == 'dali':
    from jaxpar.data import dali
    return dali.decoded(stream, batch=batch, image_size=image_size, channels=source.channels,
                        augment=augment if augment != 'pad_crop' or crop_padding else 'none')
  return stream


def eval_batches(source, *, batch: int, num_batches: int, image_size: int, augment: str,
                 split: str = 'test', take: int = 0):
  """Every example of the `split` ('test' or 'train', unaugmented) of this process's share
  (its first `take`, where given) exactly once, in `num_batches` batches of `batch`; padding
  rows carry mask 0 (and every process runs the same number of batches, so collectives stay
  matched)."""
  tf = tf_import.tensorflow()
  ds = source.share(split)
  ds = ds.take(take) if take else ds
  ds = ds.map(
      lambda ex: {'image': eval_image(ex['image'], image_size, augment, source.channels),
                  'label': ex['label']},
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


def prefetch_to_device(batches, mesh, size: int = 2):
  """Yields `batches` as global arrays sharded over `mesh`, `size` batches ahead.

  Transfers are asynchronous: while the step runs on batch t, batches t+1 … t+size
  are already on their devices.
  """
  queue = collections.deque()

  def enqueue(n):
    for batch in itertools.islice(batches, n):
      queue.append(to_global(mesh, batch))
  enqueue(size)
  while queue:
    batch = queue.popleft()
    enqueue(1)
    yield batch
