"""Input: the bundled TFDS dataset, image folders, synthetic images, a resumable train stream,
exhaustive eval; and the step's and the benchmarks' modules importing without TensorFlow."""
import itertools
import logging
import os
import subprocess
import sys

import ml_collections
import numpy as np
import pytest

tf = pytest.importorskip('tensorflow')  # a GPU image without it skips the file, saying so

from jaxpar import config as config_lib  # noqa: E402
from jaxpar.config import ConfigError  # noqa: E402
from jaxpar.data import pipeline, sources  # noqa: E402


def _digits(data_dir, shard=None):
  c = ml_collections.ConfigDict(dict(name='sklearn_digits', data_dir=data_dir,
                                     train_split='train', test_split='test', order='global'))
  return sources.open_source(c, shard=shard)


TRAIN = dict(image_size=16, augment='pad_crop', crop_padding=2, flip=True, shuffle_buffer=10_000,
             cache=True)


def test_bundled_digits(data_dir):
  source = _digits(data_dir)
  assert (source.num_classes, source.channels, source.num_train, source.num_test) == (
      10, 1, 1437, 360)
  ex = next(iter(source.test()))  # encoded: the pipeline decodes (and crops) it
  assert ex['image'].dtype == tf.string
  assert tf.io.decode_image(ex['image']).shape == (8, 8, 1)


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


def test_evaluation_reads_a_small_split_once_and_replays_the_same_batches(data_dir, monkeypatch):
  """`evaluation.evaluate` keeps a split's batches after its first pass where they fit in
  `dataset.eval_cache_mb`: the next evaluations read nothing and sum the same numbers as
  evaluations that read the split every time (a split above the size)."""
  import jax
  import jax.numpy as jnp
  from jaxpar.evaluation import evaluate
  from jaxpar.mesh import make_mesh
  reads, read = [], pipeline.eval_batches
  monkeypatch.setattr(pipeline, 'eval_batches',
                      lambda *a, **k: reads.append(k['split']) or read(*a, **k))
  mesh = make_mesh((1,), ('data',), jax.devices()[:1])

  def sums(variables, batch):  # what the images and labels of the unmasked rows add up to
    mask = batch['mask']
    return {'top1': jnp.sum(batch['image'] * mask[:, None, None, None]),
            'top5': jnp.sum(batch['image'] ** 2 * mask[:, None, None, None]),
            'loss': jnp.sum(batch['label'] * mask), 'count': jnp.sum(mask)}
  cfg = config_lib.defaults()
  cfg.image_size, cfg.eval_batch = 16, 64
  cfg.dataset.data_dir = data_dir
  # 1 MiB: the test split (6 batches of 64 at 16², 0.4 MiB) fits, the train split (1.4 MiB) does not.
  cfg.dataset.eval_cache_mb = 1
  kept = sources.open_source(cfg.dataset)
  train = [evaluate(sums, {}, mesh, kept, cfg, split='train') for _ in range(2)]
  test = [evaluate(sums, {}, mesh, kept, cfg, split='test') for _ in range(3)]
  assert reads == ['train', 'train', 'test']
  assert train[0] == train[1] and test[0] == test[1] == test[2]
  assert (train[0]['count'], test[0]['count']) == (1437, 360)
  cfg.dataset.eval_cache_mb = 0
  fresh = sources.open_source(cfg.dataset)
  assert evaluate(sums, {}, mesh, fresh, cfg, split='test') == test[0]
  assert reads[3:] == ['test'] and not any(fresh.kept.values())
  # A subset of whole batches replays the kept split's first batches; one of part of a batch,
  # or the whole split asked for by its size, reads what it needs.
  for examples, read_again in ((128, False), (100, True), (360, False)):
    alone = evaluate(sums, {}, mesh, fresh, cfg, split='test', examples=examples)
    before = len(reads)
    assert evaluate(sums, {}, mesh, kept, cfg, split='test', examples=examples) == alone
    assert (len(reads) > before) == read_again


def test_replicas_far_apart_are_evaluated_as_their_average_and_as_replica_0(data_dir, caplog):
  """`evaluate_model`: the strategy's `variables` (for replicas their average) with
  `replica_spread`; above `SPREAD_WARN` also replica 0's own model, and a warning. A
  strategy without replicas: `evaluate` alone."""
  import jax
  import jax.numpy as jnp
  from jaxpar import evaluation
  from jaxpar.mesh import make_mesh
  mesh = make_mesh((1,), ('data',), jax.devices()[:1])

  def sums(variables, batch):  # a "model" whose every score is its weight w
    mask = batch['mask']
    return {'top1': jnp.sum(mask) * variables['w'], 'top5': jnp.sum(mask) * variables['w'],
            'loss': jnp.sum(mask) * variables['w'], 'count': jnp.sum(mask)}

  class Replicas:
    def __init__(self, spread):
      self.spread = spread

    def variables(self, state):
      return {'w': jnp.mean(state)}

    def replica_spread(self, state):
      return self.spread

    def replica_variables(self, state, index):
      return {'w': state[index]}

  class Whole:
    def variables(self, state):
      return {'w': state[0]}

  cfg = config_lib.defaults()
  cfg.image_size, cfg.eval_batch = 16, 64
  cfg.dataset.data_dir = data_dir
  source = sources.open_source(cfg.dataset)
  state = jnp.array([0.75, 0.25])
  evaluate = lambda strategy: evaluation.evaluate_model(sums, strategy, state, mesh, source, cfg)
  assert evaluate(Whole()) == evaluation.evaluate(sums, {'w': 0.75}, mesh, source, cfg)
  close = evaluate(Replicas(evaluation.SPREAD_WARN / 2))
  assert close['top1'] == pytest.approx(0.5) and close['replica_spread'] == 0.025
  assert 'top1_replica0' not in close and 'apart' not in caplog.text
  apart = evaluate(Replicas(0.1))
  assert apart['top1'] == pytest.approx(0.5) and apart['replica_spread'] == 0.1
  assert [apart[f'{k}_replica0'] for k in ('top1', 'top5', 'loss')] == pytest.approx([0.75] * 3)
  assert ('The replicas are 10.0 % apart' in caplog.text
          and 'top-1 50.00 %, replica 0 alone 75.00 %' in caplog.text)


def test_an_evaluation_of_the_first_examples_gives_their_mean_and_its_standard_error(data_dir):
  """`evaluate(..., examples=n)`: the split's first n examples, every time the same, the loss
  with its standard error (from the summed squares) as numpy computes them."""
  import jax
  import jax.numpy as jnp
  from jaxpar.evaluation import evaluate
  from jaxpar.mesh import make_mesh
  mesh = make_mesh((1,), ('data',), jax.devices()[:1])

  def sums(variables, batch):  # the label as each example's "loss"
    mask, label = batch['mask'], batch['label'].astype(jnp.float32)
    return {'top1': jnp.sum(mask), 'top5': jnp.sum(mask), 'loss': jnp.sum(label * mask),
            'loss_sq': jnp.sum(label ** 2 * mask), 'count': jnp.sum(mask)}
  cfg = config_lib.defaults()
  cfg.image_size, cfg.eval_batch = 16, 64
  cfg.dataset.data_dir = data_dir
  source = sources.open_source(cfg.dataset)
  labels = np.array([int(e['label']) for e in source.test()], np.float64)[:100]
  first = evaluate(sums, {}, mesh, source, cfg, split='test', examples=100)
  assert first['count'] == 100
  assert first['loss'] == pytest.approx(labels.mean())
  assert first['loss_se'] == pytest.approx(labels.std(ddof=1) / 10)
  assert evaluate(sums, {}, mesh, source, cfg, split='test', examples=100) == first
  assert evaluate(sums, {}, mesh, source, cfg, split='test')['count'] == 360


def test_image_folder(tmp_path):
  rng = np.random.default_rng(0)
  for cls in ('ant', 'bee', 'cat'):
    os.makedirs(tmp_path / cls)
    for i in range(20):
      image = rng.integers(0, 255, (rng.integers(10, 30), rng.integers(10, 30), 3), np.uint8)
      tf.io.write_file(str(tmp_path / cls / f'{i}.png'), tf.io.encode_png(image))
  (tmp_path / 'notes.txt').write_text('not a class')
  c = ml_collections.ConfigDict(dict(name='image_folder', path=str(tmp_path), test_percent=25,
                                     order='global'))
  source = sources.open_source(c)
  assert source.num_classes == 3 and source.channels == 3
  assert source.num_train + source.num_test == 60
  assert 5 <= source.num_test <= 25
  labels = sorted(int(e['label']) for e in source.train()) + [int(e['label']) for e in source.test()]
  assert np.bincount(labels).tolist() == [20, 20, 20]
  batch = next(pipeline.train_batches(source, batch=8, start=0, seed=0, **TRAIN))
  assert batch['image'].shape == (8, 16, 16, 3) and batch['image'].dtype == np.float32


# A 6×6 grey image as a lossless WebP (Pillow's; tf.io.decode_image reads WebP).
_WEBP = (b'RIFF"\x00\x00\x00WEBPVP8L\x16\x00\x00\x00/\x05@\x01\x00\x07P\xadjU\xab\xff'
         b'\x01\x80 \xfco\x9b\x88\xe8\x7f\x08')


def test_an_image_folder_takes_its_classes_sub_folders_and_says_what_it_leaves_out(
    tmp_path, caplog):
  """As torchvision's `ImageFolder`: a class's images in its sub-folders are its; a hidden
  folder is no class and a hidden file no image; what is left out is said, and a class
  folder without an image is warned of (its label kept)."""
  image = tf.io.encode_png(np.zeros((12, 12, 3), np.uint8))
  for rel in ('ant/0.png', 'ant/1.PNG', 'ant/more/2.png', 'ant/.hidden/3.png', 'bee/0.png',
              'bee/a/b/1.png', '.ipynb_checkpoints/x/0.png'):
    os.makedirs(os.path.dirname(tmp_path / rel), exist_ok=True)
    tf.io.write_file(str(tmp_path / rel), image)
  tf.io.write_file(str(tmp_path / 'bee' / '2.webp'), tf.constant(_WEBP))
  (tmp_path / 'bee' / 'notes.txt').write_text('not an image')
  (tmp_path / 'ant' / '._0.png').write_text('a resource fork')
  os.makedirs(tmp_path / 'cow')
  c = ml_collections.ConfigDict(dict(name='image_folder', path=str(tmp_path), test_percent=50,
                                     order='global'))
  assert sources.classes_and_channels(c) == (3, 3)
  caplog.set_level(logging.INFO)
  source = sources.open_source(c)
  assert source.num_classes == 3 and source.num_train + source.num_test == 6
  labels = [int(e['label']) for e in source.train()] + [int(e['label']) for e in source.test()]
  assert sorted(labels) == [0, 0, 0, 1, 1, 1]
  (left,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith('Left out')]
  assert left.endswith(': ant/.hidden/, ant/._0.png, bee/notes.txt, .ipynb_checkpoints/')
  (empty,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert 'Of the 3 classes' in empty and '1 holds no image file: cow (label 2)' in empty


def test_classes_and_channels_are_known_before_a_source_is_opened(data_dir, tmp_path):
  """Without TensorFlow (host_memory='auto' sizes the step before JAX's backend starts)."""
  digits = ml_collections.ConfigDict(dict(name='sklearn_digits', data_dir=data_dir))
  assert sources.classes_and_channels(digits) == (10, 1)
  assert sources.classes_and_channels(ml_collections.ConfigDict(dict(
      name='sklearn_digits', data_dir=str(tmp_path)))) is None  # not prepared there
  for cls in ('ant', 'bee', 'cat'):
    os.makedirs(tmp_path / 'folder' / cls)
  (tmp_path / 'folder' / 'notes.txt').write_text('not a class')
  assert sources.classes_and_channels(ml_collections.ConfigDict(dict(
      name='image_folder', path=str(tmp_path / 'folder')))) == (3, 3)
  synthetic = ml_collections.ConfigDict(dict(name='synthetic', synthetic=dict(classes=7,
                                                                               channels=2)))
  assert sources.classes_and_channels(synthetic) == (7, 2)


def test_unprepared_dataset_is_a_config_error(tmp_path):
  """A dataset whose files are downloaded by hand says which (no reachability check)."""
  c = ml_collections.ConfigDict(dict(name='imagenet2012', data_dir=str(tmp_path),
                                     train_split='train', test_split='validation',
                                     download=True, order='global'))
  with pytest.raises(ConfigError) as e:
    sources.open_source(c)
  message = str(e.value)
  assert message.startswith("config.dataset.name='imagenet2012' could not be prepared in "
                            f"config.dataset.data_dir='{tmp_path}'")
  assert 'ILSVRC2012_img_train.tar' in message and '\n' not in message


def _jpeg_folder(root, sizes, classes=('ant', 'bee')):
  rng = np.random.default_rng(0)
  for cls in classes:
    os.makedirs(root / cls, exist_ok=True)
    for i, (h, w) in enumerate(sizes):
      image = rng.integers(0, 255, (h, w, 3), np.uint8)
      tf.io.write_file(str(root / cls / f'{i}.jpg'), tf.io.encode_jpeg(image))


def test_jpeg_crop_is_decoded_fused_and_equals_decode_then_crop(tmp_path):
  _jpeg_folder(tmp_path, [(40, 56)], classes=('a',))
  data = tf.io.read_file(str(tmp_path / 'a' / '0.jpg'))
  window = lambda shape: (tf.constant([5, 9, 0]), tf.constant([20, 31, -1]))
  fused = pipeline._decode_crop(data, 3, window).numpy().astype(int)
  whole = tf.io.decode_jpeg(data, channels=3)
  cropped = whole[5:25, 9:40].numpy().astype(int)
  # Equal but at the window's last row and column, where libjpeg's chroma upsampling
  # cannot see the pixels beyond the window.
  np.testing.assert_array_equal(fused[:-1, :-1], cropped[:-1, :-1])
  assert fused.shape == cropped.shape and np.abs(fused - cropped).mean() < 1
  # The same window on a PNG takes the decode-then-slice path.
  png = tf.io.encode_png(whole)
  np.testing.assert_array_equal(pipeline._decode_crop(png, 3, window), whole[5:25, 9:40])
  # The training graph uses the fused op for JPEG input.
  graph = tf.function(lambda d: pipeline._augment(
      d, tf.constant([0, 1], tf.int64), 16, 'inception_crop', 0, True, 3)).get_concrete_function(
          tf.TensorSpec([], tf.string)).graph
  graph_def = graph.as_graph_def()
  ops = {n.op for f in graph_def.library.function for n in f.node_def}
  assert 'DecodeAndCropJpeg' in ops


def test_unreadable_files_are_skipped_named_once_and_counted(tmp_path, caplog, monkeypatch):
  monkeypatch.setenv('JAXPAR_CACHE_DIR', str(tmp_path / 'cache'))  # a fresh decode check's
  root = tmp_path / 'images'
  _jpeg_folder(root, [(24, 30)] * 6)
  good = (root / 'ant' / '0.jpg').read_bytes()
  (root / 'ant' / 'truncated.jpg').write_bytes(good[:len(good) // 2])
  (root / 'bee' / 'notes.jpg').write_text('not an image')
  c = ml_collections.ConfigDict(dict(name='image_folder', path=str(root), test_percent=30,
                                     order='global'))
  with caplog.at_level('WARNING'):
    source = sources.open_source(c)
  assert sorted(source.unreadable) == ['ant/truncated.jpg', 'bee/notes.jpg']
  warnings = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert len(warnings) == 1
  assert 'ant/truncated.jpg' in warnings[0] and 'bee/notes.jpg' in warnings[0]
  assert source.num_train_global + source.num_test_global == 12
  # Two epochs of training and a whole evaluation run through without an error.
  batches = pipeline.train_batches(source, batch=4, start=0, seed=0, **{
      **TRAIN, 'augment': 'inception_crop'})
  assert all(next(batches)['image'].shape == (4, 16, 16, 3) for _ in range(6))
  evaluated = list(pipeline.eval_batches(source, batch=4, num_batches=4, image_size=16,
                                         augment='inception_crop'))
  assert sum(b['mask'].sum() for b in evaluated) == source.num_test
  # The second open reads the cached answer and warns again, once.
  caplog.clear()
  with caplog.at_level('INFO'):
    assert sources.open_source(c).unreadable == source.unreadable
  assert not any('Checking' in r.getMessage() for r in caplog.records)


def test_prefetch_to_device_places_batches_ahead_in_order():
  import jax

  from jaxpar.mesh import make_mesh
  mesh = make_mesh((8,), ('data',))
  taken = []

  def batches():
    for i in range(5):
      taken.append(i)
      yield {'x': np.full((8, 2), i, np.float32)}
  stream = pipeline.prefetch_to_device(batches(), mesh, size=2)
  first = next(stream)
  assert taken == [0, 1, 2]  # while batch 0 is used, the next two are already on their way
  assert isinstance(first['x'], jax.Array) and len(first['x'].sharding.device_set) == 8
  rest = [int(b['x'][0, 0]) for b in stream]
  assert int(first['x'][0, 0]) == 0 and rest == [1, 2, 3, 4]


def _synthetic(**overrides):
  c = config_lib.defaults().dataset
  c.name = 'synthetic'
  c.synthetic.update(overrides)
  return c


def test_synthetic_images_are_fixed_by_split_and_index_and_shared_out_whole():
  c = _synthetic(classes=5, channels=1, size=12, train_examples=10, test_examples=3)
  whole = sources.open_source(c, shard=(0, 1))
  assert (whole.num_classes, whole.channels, whole.num_train, whole.num_test) == (5, 1, 10, 3)
  train = list(whole.train().as_numpy_iterator())
  images = [tf.io.decode_png(ex['image']).numpy() for ex in train]
  assert all(i.shape == (12, 12, 1) and i.dtype == np.uint8 for i in images)
  assert len({i.tobytes() for i in images}) == 10  # random, not one image repeated
  assert {int(ex['label']) for ex in train} <= set(range(5))
  again = [ex['image'] for ex in whole.train().as_numpy_iterator()]
  assert again == [ex['image'] for ex in train]  # every epoch the same examples
  test = [ex['image'] for ex in whole.test().as_numpy_iterator()]
  assert not set(test) & set(again)  # the splits are drawn apart
  # Two processes' shares: the test split's disjoint and together whole; the train split
  # read whole by each ('global' order), or shared out alike ('per_process').
  for order, reads in (('global', [10, 10]), ('per_process', [5, 5])):
    c.order = order
    shares = [sources.open_source(c, shard=(k, 2)) for k in range(2)]
    assert [s.num_train for s in shares] == reads and [s.num_test for s in shares] == [2, 1]
    assert all(s.num_train_global == 10 for s in shares)
    split = [ex['image'] for s in shares for ex in s.test().as_numpy_iterator()]
    assert sorted(split) == sorted(test)
  split = [ex['image'] for s in shares for ex in s.train().as_numpy_iterator()]
  assert sorted(split) == sorted(again)


@pytest.mark.parametrize('processes, start', [(2, 0), (3, 0), (2, 50)])
def test_the_global_order_gives_every_process_count_the_same_examples_at_a_step(
    data_dir, processes, start):
  """In 'global' order the processes' batches at each step, side by side, are one process's
  global batch — images, augmentation and labels — from a start on a global batch's edge or
  not, and across an epoch's end (1,437 examples)."""
  batch, steps = 4 * processes, 1437 // (4 * processes) + 2
  one = list(itertools.islice(pipeline.train_batches(_digits(data_dir, (0, 1)), batch=batch,
                                                     start=start, seed=5, **TRAIN), steps))
  parts = []
  for k in range(processes):
    source = _digits(data_dir, (k, processes))
    assert source.train_part == (k, processes) and source.stream_start(start) == start
    parts.append(list(itertools.islice(pipeline.train_batches(
        source, batch=4, start=start, seed=5, **TRAIN), steps)))
  for step, whole in enumerate(one):
    for key in ('image', 'label'):
      np.testing.assert_array_equal(np.concatenate([p[step][key] for p in parts]), whole[key])


def test_an_evaluation_s_shares_of_the_train_split_are_disjoint_and_their_firsts_the_split_s(
    data_dir):
  """Evaluating the train split (`analysis.accuracy`'s target) on P processes: each its share,
  the shares together the split once, the first n of each the split's first n·P."""
  whole = [int(e['label']) for e in _digits(data_dir, (0, 1)).share('train')]
  shares = [[int(e['label']) for e in _digits(data_dir, (k, 3)).share('train')]
            for k in range(3)]
  assert sorted(sum(shares, [])) == sorted(whole) and len(whole) == 1437
  firsts = [x for row in zip(*(s[:10] for s in shares)) for x in row]
  assert firsts == whole[:30]


def test_the_per_process_order_reads_a_share_each_from_its_part_of_the_count():
  c = _synthetic(classes=5, channels=1, size=12, train_examples=40, test_examples=3)
  c.order = 'per_process'
  shares = [sources.open_source(c, shard=(k, 2)) for k in range(2)]
  assert all(s.train_part == (0, 1) and s.stream_start(24) == 12 for s in shares)
  streams = [pipeline.train_batches(s, batch=4, start=s.stream_start(0), seed=0, **TRAIN)
             for s in shares]
  seen = [np.concatenate([next(st)['image'] for _ in range(5)]) for st in streams]
  # Each process's epoch is its own 20 examples: none of one process's in the other's.
  assert not {x.tobytes() for x in seen[0]} & {x.tobytes() for x in seen[1]}


def test_synthetic_images_train_through_the_pipeline():
  source = sources.open_source(_synthetic(classes=3, size=20, train_examples=8), shard=(0, 1))
  batch = next(pipeline.train_batches(source, batch=4, start=0, seed=0, **TRAIN))
  assert batch['image'].shape == (4, 16, 16, 3) and batch['image'].dtype == np.float32
  assert -1.0 <= batch['image'].min() < batch['image'].max() <= 1.0


def test_the_step_and_benchmarks_import_without_tensorflow():
  # A GPU machine with JAX and PyTorch only: the bench opens synthetic data, validates and
  # builds without TensorFlow or TFDS (they are imported where a split is read).
  code = """
import sys
sys.modules['tensorflow'] = sys.modules['tensorflow_datasets'] = None  # import fails
from analysis.benchmarks import bench
from analysis.steptime import measure
from jaxpar import build, config, validation
from jaxpar.data import sources
c = config.defaults()
c.dataset.name = 'synthetic'
validation.validate(c)
print(sources.open_source(c.dataset, shard=(0, 1)).num_classes)
"""
  done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.dirname(__file__)), timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split()[-1] == '10'


def test_tensorflow_is_imported_without_keras_and_keras_still_imports_whole(data_dir, tmp_path):
  """A run's process reads its data and writes its summaries with TensorFlow imported
  without Keras (`jaxpar.data.tf_import`: 1.5 s of every process's start); Keras imported
  afterwards in the same process is whole, its optimizers included. tf.data's AutoGraph,
  converting the pipeline's calls, finds nothing it cannot read (it logged a warning for
  importlib's frozen functions while `tf_import` called into the import system every time)."""
  code = """
import sys
from jaxpar import config, metrics
from jaxpar.data import pipeline, sources
c = config.defaults()
c.dataset.data_dir = sys.argv[1]
source = sources.open_source(c.dataset, shard=(0, 1))
next(pipeline.train_batches(source, batch=4, start=0, seed=0, image_size=16, augment='pad_crop',
                            crop_padding=2, flip=True, shuffle_buffer=10, cache=False))
reporter = metrics.Reporter(sys.argv[2], total_steps=1, first_step=0, global_batch=4)
reporter.evaluation(1, {'top1': 0.5})
reporter.close()
print(sorted(m for m in ('keras', 'sklearn') if m in sys.modules))
import keras
print(keras.optimizers.get('adam').__class__.__name__)
"""
  done = subprocess.run([sys.executable, '-c', code, data_dir, str(tmp_path)],
                        capture_output=True, text=True,
                        cwd=os.path.dirname(os.path.dirname(__file__)), timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.split('\n')[-3:-1] == ['[]', 'Adam']
  assert 'AutoGraph could not transform' not in done.stderr, done.stderr[-2000:]
  assert list(tmp_path.glob('events.out.tfevents.*'))  # the summary was written
