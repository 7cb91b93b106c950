"""`dataset.decoder='dali'`: DALI decodes and augments the training stream tf.data feeds it,
against tf.data's own decoder on the same examples (jaxpar/data/dali.py), and a short run."""
import functools
import os

import numpy as np
import pytest

from analysis.benchmarks import input_rate
from jaxpar import config as config_lib
from jaxpar import validation
from jaxpar.config import ConfigError
from jaxpar.data import dali, pipeline, sources, tf_import

needs_dali = pytest.mark.skipif(not dali.available(), reason='NVIDIA DALI is not installed '
                                "(pip install -e '.[dali]', Linux)")
SIZE = 48
LEVEL = 1 / 127.5  # one of 256 grey levels on the stream's [-1, 1] scale


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
  """JPEGs at ImageNet's shapes (smooth fields with pixel noise: a window off by one pixel
  or a wrong mirror moves every pixel by tens of levels) and one PNG (decoded whole to read
  its shape, as tf.data's decoder does), a GIF (which DALI does not read: tf.data hands it
  over as a PNG) and a WebP."""
  from PIL import Image
  root = str(tmp_path_factory.mktemp('jpegs'))
  input_rate.write_images(root, 24, classes=2)
  tf = tf_import.tensorflow()
  image = np.random.default_rng(0).integers(0, 255, (90, 70, 3), np.uint8)
  tf.io.write_file(os.path.join(root, 'class_0', 'odd.png'), tf.io.encode_png(image))
  Image.fromarray(image[:60, :80]).convert('P').save(os.path.join(root, 'class_1', 'odd.gif'))
  Image.fromarray(image[:50]).save(os.path.join(root, 'class_1', 'odd.webp'), lossless=True)
  return root


def _streams(folder, augment, padding, start=3, batches=2):
  c = config_lib.defaults()
  c.dataset.name, c.dataset.path, c.dataset.test_percent = sources.IMAGE_FOLDER, folder, 20
  source = sources.open_source(c.dataset)
  out = {}
  for decoder in ('tf', 'dali'):
    stream = pipeline.train_batches(
        source, batch=8, start=start, seed=1, image_size=SIZE, augment=augment,
        crop_padding=padding, flip=True, shuffle_buffer=source.num_train, cache=True,
        decoder=decoder)
    out[decoder] = [next(stream) for _ in range(batches)]
  return out


@pytest.fixture
def accurate_idct(monkeypatch):
  """tf.data's decoder with libjpeg's accurate inverse DCT, as DALI's (tf.data's default is
  the fast one): what is left between the two is the resampling and the windows."""
  tf = tf_import.tensorflow()
  monkeypatch.setattr(tf.image, 'decode_and_crop_jpeg', functools.partial(
      tf.image.decode_and_crop_jpeg, dct_method='INTEGER_ACCURATE'))

  def decode(data, channels):
    image = tf.cond(tf.io.is_jpeg(data),
                    lambda: tf.io.decode_jpeg(data, channels, dct_method='INTEGER_ACCURATE'),
                    lambda: tf.io.decode_image(data, channels, expand_animations=False))
    image.set_shape([None, None, channels])
    return image
  monkeypatch.setattr(pipeline, '_decode', decode)


@needs_dali
@pytest.mark.parametrize('augment', ['inception_crop', 'none'])
def test_dali_decodes_the_same_windows_and_flips_as_tf_data(folder, accurate_idct, augment):
  """The same labels; every pixel but the image's outermost rows and columns equal (where the
  two resamplers treat the edge differently: within 16 levels on these noisy images). Three
  batches of 8: the whole train split (about 20 of the 27 files, the PNG, GIF and WebP
  among them)."""
  out = _streams(folder, augment, 0, batches=3)
  for ours, theirs in zip(out['tf'], out['dali']):
    assert isinstance(theirs['image'], np.ndarray) and theirs['image'].dtype == np.float32
    assert theirs['image'].shape == (8, SIZE, SIZE, 3)
    np.testing.assert_array_equal(theirs['label'], ours['label'])
    diff = np.abs(theirs['image'] - ours['image'])
    assert diff[:, 1:-1, 1:-1].max() < 0.01 * LEVEL
    assert diff.max() < 16 * LEVEL


@needs_dali
def test_dali_pads_and_crops_as_tf_data(folder, accurate_idct):
  """'pad_crop' (4 pixels): the same padding (zeros) and offsets — every pixel equal but on
  the resized image's own edge, wherever the crop puts it."""
  out = _streams(folder, 'pad_crop', 4)
  edge = 4 * SIZE / SIZE ** 2  # the share of a SIZE² image on its edge, at most
  for ours, theirs in zip(out['tf'], out['dali']):
    np.testing.assert_array_equal(theirs['label'], ours['label'])
    np.testing.assert_array_equal(theirs['image'] == 0, ours['image'] == 0)
    assert (ours['image'] == 0).any()  # some padding in the batch
    differs = np.abs(theirs['image'] - ours['image']).max(-1) > 0.01 * LEVEL
    assert differs.mean() <= edge
    assert np.abs(theirs['image'] - ours['image']).max() < 16 * LEVEL


@needs_dali
def test_dali_against_tf_data_s_own_fast_idct_and_resumed_streams(folder):
  """With tf.data's default decoder (libjpeg's fast inverse DCT): within about a grey level
  on average. A stream started at a later position is the same stream from there."""
  out = _streams(folder, 'inception_crop', 0, start=3, batches=2)
  for ours, theirs in zip(out['tf'], out['dali']):
    diff = np.abs(theirs['image'] - ours['image'])
    assert diff.mean() < 2 * LEVEL and diff.max() < 12 * LEVEL
  later = _streams(folder, 'inception_crop', 0, start=3 + 8, batches=1)['dali'][0]
  np.testing.assert_array_equal(later['image'], out['dali'][1]['image'])
  np.testing.assert_array_equal(later['label'], out['dali'][1]['label'])


def test_the_decoder_is_checked_before_anything_compiles(monkeypatch):
  c = config_lib.defaults()
  c.dataset.decoder = 'nvjpeg'
  with pytest.raises(ConfigError, match=r"config.dataset.decoder='nvjpeg' is invalid: choose "
                     r"one of \['tf', 'dali'\]"):
    validation.validate(c)
  monkeypatch.setattr(dali, 'available', lambda: False)
  c.dataset.decoder = 'dali'
  with pytest.raises(ConfigError, match=r"config.dataset.decoder='dali' is invalid: NVIDIA "
                     r"DALI is not installed here: pip install -e '.\[dali\]' \(Linux\), or "
                     r"dataset.decoder='tf'"):
    validation.validate(c)


@needs_dali
def test_a_batch_dali_cannot_decode_is_skipped_and_said(folder, caplog):
  """Garbage in one batch: that batch and the one DALI had read ahead are skipped, in one
  line with their count, and the stream goes on; a finite stream ends."""
  jpeg = open(os.path.join(folder, 'class_1', sorted(os.listdir(
      os.path.join(folder, 'class_1')))[0]), 'rb').read()

  def stream():
    for i in range(6):
      encoded = [jpeg, b'not an image' if i == 2 else jpeg]
      yield {'encoded': np.array(encoded, object), 'window': np.zeros((2, 4), np.int32),
             'flip': np.zeros(2, bool), 'label': np.full(2, i, np.int64)}
  with caplog.at_level('WARNING'):
    labels = [int(b['label'][0]) for b in dali.decoded(stream(), batch=2, image_size=16,
                                                       channels=3, augment='none')]
  assert labels == [0, 1, 4, 5]
  (line,) = [r.getMessage() for r in caplog.records if 'DALI' in r.getMessage()]
  assert line.startswith('DALI could not decode a training batch (')
  assert line.endswith('): 2 batch(es) of 2 read and not yet trained on skipped; the stream '
                       'goes on.')


@needs_dali
@pytest.mark.slow
def test_a_run_trains_on_dali_s_batches_as_on_tf_data_s(accurate_idct, tmp_path):
  """`jaxpar.train` on a folder of 32² JPEGs (no resampling: 'none' at their own size,
  mirrored), SqueezeNet with BatchNorm on 2 devices, the same run with each decoder: the
  same pixels, so the same losses (BatchNorm at 4 images a device turns a last-bit
  difference in the inputs into 1e-3 of the loss by the third step)."""
  pytest.importorskip('tensorflow')
  from jaxpar.train import train_and_evaluate
  tf = tf_import.tensorflow()
  rng = np.random.default_rng(1)
  for label in ('a', 'b'):
    os.makedirs(tmp_path / 'jpegs' / label)
    for i in range(12):
      image = rng.integers(0, 255, (32, 32, 3), np.uint8)
      tf.io.write_file(str(tmp_path / 'jpegs' / label / f'{i}.jpg'), tf.io.encode_jpeg(image))
  losses = {}
  for decoder in ('tf', 'dali'):
    c = config_lib.use_dataset(config_lib.defaults(), 'caltech256')
    c.dataset.path, c.dataset.test_percent = str(tmp_path / 'jpegs'), 20
    c.dataset.decoder, c.augment.kind, c.augment.flip = decoder, 'none', True
    c.model, c.batch_norm, c.image_size = 'squeezenet', True, 32
    c.mesh.shape, c.scheme, c.per_device_batch, c.eval_batch = (2,), 'sync-join', 4, 8
    c.total_steps, c.optimizer.warmup_steps, c.log_every = 3, 1, 1
    result = train_and_evaluate(c, str(tmp_path / decoder))
    assert result.step == 3 and result.examples_seen == 3 * 8
    losses[decoder] = [result.train_loss[s] for s in (1, 2, 3)]
  assert losses['dali'] == pytest.approx(losses['tf'], rel=1e-6)
