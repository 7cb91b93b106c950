"""Input: the bundled TFDS dataset, image folders, a resumable train stream, exhaustive eval."""
import itertools
import os

import ml_collections
import numpy as np
import pytest
import tensorflow as tf

from jaxpar.config import ConfigError
from jaxpar.data import pipeline, sources


def _digits(data_dir):
  c = ml_collections.ConfigDict(dict(name='sklearn_digits', data_dir=data_dir,
                                     train_split='train', test_split='test'))
  return sources.open_source(c)


TRAIN = dict(image_size=16, augment='pad_crop', crop_padding=2, flip=True, shuffle_buffer=10_000,
             cache=True)


def test_bundled_digits(data_dir):
  source = _digits(data_dir)
  assert (source.num_classes, source.channels, source.num_train, source.num_test) == (
      10, 1, 1437, 360)
  ex = next(iter(source.test()))
  assert ex['image'].shape == (8, 8, 1) and ex['image'].dtype == tf.uint8


def test_train_stream_resumes_at_any_example(data_dir):
  source = _digits(data_dir)
  full = list(itertools.islice(pipeline.train_batches(source, batch=100, start=0, seed=3, **TRAIN), 17))
  resumed = list(itertools.islice(pipeline.train_batches(source, batch=100, start=1500, seed=3,
                                                         **TRAIN), 2))
  # Batches 15 and 16 start at example 1500 and cross into the third epoch.
  for a, b in zip(full[15:], resumed):
    np.testing.assert_array_equal(a['label'], b['label'])
    np.testing.assert_array_equal(a['image'], b['image'])
  assert full[0]['image'].shape == (100, 16, 16, 1)
  # Each epoch is a new permutation of the whole train split.
  first_epoch = np.concatenate([b['label'] for b in full[:15]])[:1437]
  np.testing.assert_array_equal(np.bincount(first_epoch, minlength=10),
                                np.bincount([int(e['label']) for e in source.train()], minlength=10))
  assert not np.array_equal(full[0]['label'], full[15]['label'])


def test_eval_covers_every_example_once(data_dir):
  source = _digits(data_dir)
  batches = list(pipeline.eval_batches(source, batch=64, num_batches=6, image_size=16,
                                       augment='pad_crop'))
  assert len(batches) == 6 and all(b['image'].shape == (64, 16, 16, 1) for b in batches)
  mask = np.concatenate([b['mask'] for b in batches])
  labels = np.concatenate([b['label'] for b in batches])[mask == 1]
  assert mask.sum() == 360 and np.all(mask[:360] == 1)
  np.testing.assert_array_equal(labels, [int(e['label']) for e in source.test()])
  # A process whose share ran out still yields fully masked batches of the same shape.
  extra = list(pipeline.eval_batches(source, batch=64, num_batches=8, image_size=16,
                                     augment='pad_crop'))[6:]
  assert all(b['mask'].sum() == 0 and b['image'].shape == (64, 16, 16, 1) for b in extra)


def test_image_folder(tmp_path):
  rng = np.random.default_rng(0)
  for cls in ('ant', 'bee', 'cat'):
    os.makedirs(tmp_path / cls)
    for i in range(20):
      image = rng.integers(0, 255, (rng.integers(10, 30), rng.integers(10, 30), 3), np.uint8)
      tf.io.write_file(str(tmp_path / cls / f'{i}.png'), tf.io.encode_png(image))
  (tmp_path / 'notes.txt').write_text('not a class')
  c = ml_collections.ConfigDict(dict(name='image_folder', path=str(tmp_path), test_percent=25))
  source = sources.open_source(c)
  assert source.num_classes == 3 and source.channels == 3
  assert source.num_train + source.num_test == 60
  assert 5 <= source.num_test <= 25
  labels = sorted(int(e['label']) for e in source.train()) + [int(e['label']) for e in source.test()]
  assert np.bincount(labels).tolist() == [20, 20, 20]
  batch = next(pipeline.train_batches(source, batch=8, start=0, seed=0, **TRAIN))
  assert batch['image'].shape == (8, 16, 16, 3) and batch['image'].dtype == np.float32


def test_unprepared_dataset_is_a_config_error(tmp_path):
  c = ml_collections.ConfigDict(dict(name='imagenet2012', data_dir=str(tmp_path),
                                     train_split='train', test_split='validation'))
  with pytest.raises(ConfigError) as e:
    sources.open_source(c)
  message = str(e.value)
  assert message.startswith("config.dataset.name='imagenet2012' could not be prepared in "
                            f"config.dataset.data_dir='{tmp_path}'")
  assert 'ILSVRC2012_img_train.tar' in message and '\n' not in message
