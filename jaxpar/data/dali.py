"""The training stream's decode and augmentation in NVIDIA DALI (`dataset.decoder='dali'`).

Each training image is, as in `pipeline._augment` ([Y] §3's fused decode and crop),

    x = flip_f(resize_S(decode_w(jpeg))) / 127.5 − 1           augment.kind='inception_crop'
    x = flip_f(slice_w(resize_S(decode(image)) / 127.5 − 1))    'pad_crop' ('none': no slice)

with w its window ([top, left, height, width]: Inception's crop of the encoded image; for
'pad_crop' the S² part of the resized image kept, up to `augment.crop_padding` past its
edges, zeros there), S the image size (bilinear, antialiased) and f whether it is
mirrored. tf.data still reads the files in the stream's order and draws w and f from
(seed, position) as its own decoder does (`pipeline._augment_plan`), so the examples,
windows and flips at every position are the same and a run resumes at any position. DALI
decodes (Inception's w only, `decoders.image_slice`: for a JPEG, the window's blocks; a GIF
arrives as a PNG, `pipeline._dali_decodes`), resizes, scales, slices and mirrors. Where JAX
runs on a GPU, DALI decodes there (its `mixed` decoder: nvJPEG) and hands each batch to JAX
on that GPU (DLPack, then a copy: DALI reuses its buffers); on a CPU its own decoder runs on
the process's cores, a thread each, and the batch is numpy. Batches are decoded two ahead
of the one taken (DALI's prefetch queue).

The pixels: tf.data decodes JPEGs with libjpeg's fast integer inverse DCT, DALI with the
accurate one (about a grey level on average, at most 5); with the same inverse DCT every
pixel is equal to float rounding (DALI resizes the integers, then scales; tf.data the
other way round) but on the resized image's outermost rows and columns, where the two
resamplers treat the edge differently; without resampling, to the last bit
(tests/test_dali.py; the scale is a division, as tf.data's). Evaluation keeps tf.data's decoder:
its batches are decoded once and kept (`dataset.eval_cache_mb`).

Needs NVIDIA DALI (`pip install -e '.[dali]'`, Linux); imported only where chosen.
"""
import os
import warnings

import numpy as np
from absl import logging


def available() -> bool:
  """Whether NVIDIA DALI imports here."""
  try:
    import nvidia.dali  # noqa: F401
  except ImportError:
    return False
  return True


def _gpu():
  """JAX's first local GPU where it runs on GPUs, else None."""
  import jax
  device = jax.local_devices()[0]
  return device if device.platform == 'gpu' else None


def _pipeline(source, *, batch: int, image_size: int, channels: int, augment: str, device):
  """A DALI pipeline over `source` (an iterator of (encoded, window, flip, label) batches):
  the module docstring's x for `augment` ('inception_crop', 'pad_crop' or 'none'), on
  `device` (a JAX GPU) or the CPU (None)."""
  from nvidia.dali import fn, pipeline_def, types

  @pipeline_def(batch_size=batch, num_threads=len(os.sched_getaffinity(0)),
                device_id=None if device is None else device.local_hardware_id,
                prefetch_queue_depth=2)
  def pipe():
    encoded, window, flip, label = fn.external_source(
        source=source, num_outputs=4, batch=True,
        dtype=[types.UINT8, types.INT32, types.BOOL, types.INT64])
    kind = dict(device='cpu' if device is None else 'mixed',
                output_type=types.RGB if channels == 3 else types.GRAY)
    if augment == 'inception_crop':
      images = fn.decoders.image_slice(encoded, window[0:2], window[2:4], axis_names='HW',
                                       normalized_anchor=False, normalized_shape=False, **kind)
    else:
      images = fn.decoders.image(encoded, **kind)
    images = fn.resize(images, size=[image_size, image_size], interp_type=types.INTERP_LINEAR,
                       antialias=True, dtype=types.FLOAT) / 127.5 - 1.0
    if augment == 'pad_crop':
      images = fn.slice(images, window[0:2], window[2:4], axis_names='HW',
                        out_of_bounds_policy='pad', fill_values=0.0)
    return fn.flip(images, horizontal=fn.cast(flip, dtype=types.INT32)), label
  return pipe()


def decoded(stream, *, batch: int, image_size: int, channels: int, augment: str,
            tries: int = 10):
  """Yields {'image', 'label'} batches of `stream`'s {'encoded', 'window', 'flip', 'label'}
  (`pipeline.train_batches` with `decoder='dali'`), decoded and augmented by DALI: numpy on
  a CPU, JAX arrays on the GPU where JAX runs on one.

  A batch DALI cannot decode (the folder's files are checked once by tf.data's decoder:
  `sources._unreadable_files`) costs that batch and those DALI had read ahead, said in one
  line with their count; the stream goes on in a new pipeline. `tries` failures in a row
  with no batch between them raise the last."""
  device = _gpu()
  read = [0]

  def source():
    for b in stream:
      read[0] += 1
      yield ([np.frombuffer(e, np.uint8) for e in b['encoded']], b['window'], b['flip'],
             b['label'])
  batches, settled, failed = source(), 0, 0  # settled: batches yielded or skipped
  while True:
    with warnings.catch_warnings():  # 'none' leaves the windows unread
      warnings.filterwarnings('ignore', message='The external source node')
      pipe = _pipeline(batches, batch=batch, image_size=image_size, channels=channels,
                       augment=augment, device=device)
      pipe.build()
    try:
      while True:
        try:
          images, labels = pipe.run()
        except StopIteration:  # a finite stream's end
          return
        if device is None:
          images = images.as_array()
        else:
          import jax.dlpack
          images = jax.dlpack.from_dlpack(images.as_tensor()).copy()
        settled, failed = settled + 1, 0
        yield {'image': images, 'label': labels.as_array()}
    except RuntimeError as e:
      failed += 1
      if failed >= tries:
        raise
      lost, settled = read[0] - settled, read[0]
      logging.warning('DALI could not decode a training batch (%s): %d batch(es) of %d read '
                      'and not yet trained on skipped; the stream goes on.',
                      _reason(e), lost, batch)


def _reason(error) -> str:
  """The line of a DALI pipeline's error that says what went wrong (after 'encountered:')."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  after = lines[lines.index('encountered:') + 1:] if 'encountered:' in lines else lines
  return (after or ['no message'])[0][:200]
