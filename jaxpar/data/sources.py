"""Where examples come from: a TFDS dataset by name, an image folder by path, or random
images (`synthetic`, for benchmarks: PyTorch's `--dummy`/`FakeData`).

A source yields a split in a fixed order as records, which `load` turns into examples
{'image': the encoded image (JPEG, PNG, …) as a string, 'label': int64}: a TFDS record is
its example; an image folder's is (path, label), read by `load`; a synthetic one is its
index, drawn by `load`. `pipeline.py` shuffles the records, keeps those of this process,
loads, decodes (for JPEG, only the crop window), augments and batches them.

Which records a process reads (`dataset.order`):
- 'global' (default): every process reads the whole train split, in the one order the
  run's seed gives, and keeps its part of each global batch (`Source.train_part`): the
  examples at a step, and each one's augmentation, are those of one process on the same
  global batch, whatever the number of processes — a run resumed on another number of
  processes continues as it would have. Each process reads every record (not decodes
  it): a TFDS dataset's bytes P times over, an image folder's paths.
- 'per_process': each process reads its own 1/P of the split (`tfds.even_splits`, as
  `split_for_jax_process`; every P-th file of a folder), shuffled on its own: reading
  stays 1/P a process (many hosts on a large dataset); the examples at a step depend on
  the number of processes.
The test split is always shared out, and so is the train split for an evaluation
(`Source.share`: an evaluation sees every example once).

TensorFlow and TFDS are imported where a split is read or prepared, not with the
module: opening a source (its classes and channels) needs neither for an image folder
or synthetic images, so the benchmarks run where TensorFlow is not installed.
"""
import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import json
import os
import socket
import zlib
from typing import TYPE_CHECKING, Callable

import jax
from absl import logging

from jaxpar import multihost, user_cache
from jaxpar.data import tf_import
from jaxpar.config import ConfigError

if TYPE_CHECKING:
  import tensorflow as tf

IMAGE_FOLDER = 'image_folder'
SYNTHETIC = 'synthetic'
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.gif', '.webp')  # tf.io.decode_image's


def folder_classes(root: str) -> list:
  """An image folder's classes: its sub-folders in sorted order, but hidden ones (a name
  starting with '.', e.g. `.ipynb_checkpoints`), which are no class."""
  return sorted(entry.name for entry in os.scandir(root)
                if entry.is_dir() and not entry.name.startswith('.'))


def folder_files(root: str, cls: str):
  """(path under `root`, is an image file) of every file in class folder `cls` and, as
  torchvision's `ImageFolder` and Keras's `image_dataset_from_directory` take them, in its
  sub-folders, in sorted order; a hidden file or folder is no image (is_image False; a
  hidden folder is one entry, its path ending in '/'). Lazy: the first image ends a search
  for one."""
  for folder, dirs, names in os.walk(os.path.join(root, cls), followlinks=True):
    rel = os.path.relpath(folder, root)
    hidden = sorted(d for d in dirs if d.startswith('.'))
    dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
    for name in hidden:
      yield f'{rel}/{name}/', False
    for name in sorted(names):
      yield f'{rel}/{name}', (not name.startswith('.')
                              and name.lower().endswith(IMAGE_EXTENSIONS))


@dataclasses.dataclass(frozen=True)
class Source:
  num_classes: int
  channels: int             # of the decoded images
  num_train: int            # records of the train split this process reads
  num_test: int             # examples of the test split in this process's share
  num_train_global: int     # ... and of each split in all processes' shares together
  num_test_global: int
  train_records: Callable[[], 'tf.data.Dataset']
  test: Callable[[], 'tf.data.Dataset']   # examples
  unreadable: tuple = ()    # files left out because they could not be decoded
  load: Callable = None     # a train record -> its example (None: the record is one)
  # (index, count): the part of each global batch this process keeps of the records it
  # reads ('global' order: its share; 'per_process': (0, 1), all of its own records) ...
  train_part: tuple = (0, 1)
  # ... and the share of the train split those records are ('global': (0, 1), the whole).
  train_shard: tuple = (0, 1)
  # Evaluation batches kept in memory after a first pass (`evaluation.evaluate`,
  # `dataset.eval_cache_mb`): {(split, batch, batches, image_size, augment): [batch, ...],
  # or None where they do not fit (read at every evaluation; said once)}.
  kept: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)

  @property
  def meta(self) -> dict:
    """{'num_classes', 'channels'}: what a network is built for (`build.model`'s
    arguments), as the plan and the tools that time a network pass it on."""
    return {'num_classes': self.num_classes, 'channels': self.channels}

  def train(self):
    """The train records this process reads, as examples."""
    return self._loaded(self.train_records())

  def share(self, split: str):
    """This process's share of `split` ('test' or 'train') as examples, for an evaluation:
    the shares of all processes are disjoint and together the split; the first n of each
    are the split's first n·P ('global' order: every P-th record from this process's index,
    as the test split of an image folder or synthetic images is shared)."""
    if split == 'test':
      return self.test()
    index, count = self.train_part
    records = self.train_records()
    return self._loaded(records.shard(count, index) if count > 1 else records)

  def _loaded(self, records):
    return records.map(self.load) if self.load else records

  def stream_start(self, start: int) -> int:
    """The position in this process's stream of records of the run's example `start`."""
    return start // self.train_shard[1]


ORDERS = ('global', 'per_process')


def open_source(dataset_config, shard=None) -> Source:
  """The dataset's share (index, count) `shard`; by default this process's share of the
  processes of the run (`jax.process_index()` of `jax.process_count()`). The train split
  is read whole, this share kept of each global batch, in `dataset.order='global'`."""
  shard = shard or (jax.process_index(), jax.process_count())
  whole = dataset_config.order == 'global'
  train_shard, part = ((0, 1), shard) if whole else (shard, (0, 1))
  if dataset_config.name == IMAGE_FOLDER:
    source = _image_folder(dataset_config.path, dataset_config.test_percent, shard, train_shard)
  elif dataset_config.name == SYNTHETIC:
    source = _synthetic(dataset_config.synthetic, shard, train_shard)
  else:
    source = _tfds(dataset_config, shard, train_shard)
  return dataclasses.replace(source, train_part=part, train_shard=train_shard)


def classes_and_channels(dataset_config):
  """(classes, channels) of the dataset, read without TensorFlow and without opening it, or
  None where that cannot be known so early: synthetic images (their config), an image folder
  (its class folders; 3 channels), a TFDS dataset already prepared in `data_dir` (its
  `features.json`; a dataset not prepared yet: None). `host_memory='auto'` sizes the step
  with it before JAX's backend starts, which opening a source can need."""
  if dataset_config.name == SYNTHETIC:
    return dataset_config.synthetic.classes, dataset_config.synthetic.channels
  if dataset_config.name == IMAGE_FOLDER:
    try:
      return len(folder_classes(dataset_config.path)), 3
    except OSError:
      return None
  root = os.path.expanduser(dataset_config.data_dir or os.environ.get('TFDS_DATA_DIR')
                            or '~/tensorflow_datasets')
  name, _, version = dataset_config.name.partition(':')
  folder = os.path.join(root, *name.split('/'))
  try:
    versions = [version] if version else sorted(os.listdir(folder), reverse=True)
    for v in versions:
      path = os.path.join(folder, v, 'features.json')
      if os.path.exists(path):
        with open(path) as f:
          return _classes_and_channels(json.load(f))
  except (OSError, ValueError, KeyError, IndexError, TypeError):
    pass
  return None


def _classes_and_channels(features: dict):
  """(classes, channels) from a TFDS `features.json`: its first class label and image."""
  found = {}

  def walk(node):
    if isinstance(node, dict):
      if 'classLabel' in node and 'classes' not in found:
        found['classes'] = int(node['classLabel']['numClasses'])
      if 'image' in node and isinstance(node['image'], dict) and 'shape' in node['image'] \
          and 'channels' not in found:
        found['channels'] = int(node['image']['shape']['dimensions'][-1])
      for value in node.values():
        walk(value)
  walk(features)
  return (found['classes'], found['channels']) if len(found) == 2 else None


# Where TFDS first looks for a prepared copy; a machine that cannot reach it within
# REACH_SECONDS is taken to be offline (cluster nodes often are).
DOWNLOAD_HOST = ('storage.googleapis.com', 443)
REACH_SECONDS = 3.0


def _online() -> bool:
  try:
    socket.create_connection(DOWNLOAD_HOST, timeout=REACH_SECONDS).close()
    return True
  except OSError:
    return False


@contextlib.contextmanager
def _exclusive(data_dir: str | None):
  """Holds a lock file in a local `data_dir` (TFDS's default when None): processes of one host
  that share the directory prepare it one at a time. URLs (gs://) and directories where no
  lock file can be made (read-only: prepared already) are not locked."""
  root = os.path.expanduser(data_dir or os.environ.get('TFDS_DATA_DIR')
                            or os.path.join('~', 'tensorflow_datasets'))
  lock = None
  if '://' not in root:
    try:
      os.makedirs(root, exist_ok=True)
      lock = open(os.path.join(root, '.jaxpar-prepare.lock'), 'w')
    except OSError:
      pass  # TFDS says what is wrong with the directory, if anything
  if lock is None:
    yield
    return
  with lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    yield  # closing the file releases the lock


def _prepared(cfg):
  """The dataset's builder, its data prepared (a no-op once it is; the bundled digits build
  locally), or one line saying why it cannot be."""
  with _exclusive(cfg.data_dir or None):
    return _prepare(cfg)


# What a dataset other than 'synthetic' needs, as the one-line error says it.
NEEDS_TFDS = 'reading it needs TensorFlow Datasets'


def tfds_registered():
  """TFDS, imported here rather than with the module, with the bundled digits' builder
  ('sklearn_digits') registered."""
  tfds = tf_import.datasets()
  from jaxpar.data.sklearn_digits import SklearnDigits
  del SklearnDigits  # imported for its side effect: the class registers itself with TFDS
  return tfds


def _prepare(cfg):
  builder = tfds_registered().builder(cfg.name, data_dir=cfg.data_dir or None)
  from jaxpar.data.sklearn_digits import SklearnDigits
  # The bundled digits build locally, and a dataset downloaded by hand (ImageNet) says
  # which files to fetch; another dataset not prepared yet needs a download, which on a
  # machine without internet retries for minutes before failing.
  fetched = not isinstance(builder, SklearnDigits) and not builder.MANUAL_DOWNLOAD_INSTRUCTIONS
  if fetched and not builder.is_prepared() and not (cfg.download and _online()):
    why = ('config.dataset.download=False' if not cfg.download
           else f'this machine cannot reach {DOWNLOAD_HOST[0]}')
    raise ConfigError(
        f'config.dataset.name={cfg.name!r} is not prepared in config.dataset.data_dir='
        f'{str(builder.data_dir_root)!r} and {why}: prepare it on a machine with internet '
        f'(`tfds build {cfg.name} --data_dir DIR`), copy DIR here and pass '
        f'--config.dataset.data_dir=DIR')
  try:
    builder.download_and_prepare()
  except Exception as e:  # manual downloads, no network, a bad data_dir: say which and why
    raise ConfigError(f'config.dataset.name={cfg.name!r} could not be prepared in '
                      f'config.dataset.data_dir={str(builder.data_dir_root)!r}: '
                      + ' '.join(str(e).split())) from e
  return builder


def _tfds(cfg, shard, train_shard) -> Source:
  tfds = tfds_registered()
  # Process 0 first (a no-op without a joined run), then the others, each host's one at a
  # time: two processes building into one data_dir at once failed (FileExistsError, or an
  # empty dataset), and one building for minutes broke the run's first collective.
  builder = multihost.process_0_first(f'prepare/{cfg.name}',
                                      functools.partial(_prepared, cfg))
  image_key, label_key = builder.info.supervised_keys
  if not isinstance(builder.info.features[image_key], tfds.features.Image):
    # The pipeline decodes (and for JPEG crops while decoding) encoded images itself.
    raise ConfigError(f'config.dataset.name={cfg.name!r} is invalid: its {image_key!r} feature '
                      f'is not an encoded image (tfds.features.Image); use an image dataset')

  def split(name, shard):
    own = tfds.even_splits(name, n=shard[1], drop_remainder=False)[shard[0]]  # as split_for_jax_process

    def dataset():
      ds = builder.as_dataset(split=own, shuffle_files=False,
                              decoders={image_key: tfds.decode.SkipDecoding()})
      return ds.map(lambda ex: {'image': ex[image_key], 'label': ex[label_key]})
    return dataset, builder.info.splits[own].num_examples

  train, num_train = split(cfg.train_split, train_shard)
  test, num_test = split(cfg.test_split, shard)
  splits = builder.info.splits
  return Source(builder.info.features[label_key].num_classes,
                builder.info.features[image_key].shape[-1], num_train, num_test,
                splits[cfg.train_split].num_examples, splits[cfg.test_split].num_examples,
                train, test)


def _image_folder(root: str, test_percent: int, shard, train_shard) -> Source:
  """Caltech-256 layout: `root/<class>/<image>` (`folder_classes`, `folder_files`: images
  in a class's sub-folders are its too), classes in sorted order.

  The test split is the files whose path hashes (crc32) below `test_percent`
  of 100: stable across runs and machines, and independent of the file count.
  Files that cannot be decoded are left out of both splits (`unreadable`), named
  in one warning: a truncated or mislabelled file must not end a long run. What else is
  left out (files not named as images, hidden ones) is said in one line, and a class
  folder without an image in one warning (its label stays: an output no example trains).
  """
  classes = folder_classes(root)
  listed, others, empty = [], [], []
  for label, cls in enumerate(classes):
    count = len(listed)
    for rel, is_image in folder_files(root, cls):
      if is_image:
        listed.append((rel, label))
      else:
        others.append(rel)
    if len(listed) == count:
      empty.append(f'{cls} (label {label})')
  others += [f'{entry.name}' + ('/' if entry.is_dir() else '') for entry in
             sorted(os.scandir(root), key=lambda e: e.name)
             if entry.name.startswith('.') or not entry.is_dir()]
  if others:
    logging.info('Left out of the image folder %s: %d files or folders that are not class '
                 'folders or image files (%s by name) or are hidden: %s', root, len(others),
                 ' '.join(IMAGE_EXTENSIONS), _shown(others))
  if empty:
    logging.warning('Of the %d classes under %s, %d hold%s no image file: %s. Each keeps '
                    'its label, so the network has an output no example trains; remove the '
                    'folder if it is no class.', len(classes), root, len(empty),
                    's' if len(empty) == 1 else '', _shown(empty))
  unreadable = _unreadable_files(root, [rel for rel, _ in listed])
  if unreadable:
    logging.warning('Skipping %d of %d image files under %s that cannot be decoded: %s',
                    len(unreadable), len(listed), root, _shown(unreadable))
  files = {'train': [], 'test': []}
  skip = set(unreadable)
  for rel, label in listed:
    if rel not in skip:
      split = 'test' if zlib.crc32(rel.encode()) % 100 < test_percent else 'train'
      files[split].append((os.path.join(root, rel), label))
  if not files['train'] and not files['test']:
    raise ConfigError(f'config.dataset.path={root!r} holds no readable image: all {len(listed)} '
                      f'image files tried failed to decode and were skipped (e.g. '
                      f'{", ".join(unreadable[:3])}); point dataset.path at a folder of '
                      f'images that decode')
  for split, fix in (('train', 'lower dataset.test_percent'),
                     ('test', 'raise dataset.test_percent')):
    if not files[split]:
      raise ConfigError(
          f'config.dataset.path={root!r}: its {split} split is empty (dataset.test_percent='
          f'{test_percent} sends the {len(listed) - len(unreadable)} readable of {len(listed)} '
          f'image files elsewhere; {len(unreadable)} skipped as undecodable): add images or '
          f'{fix}')
  train = files['train'][train_shard[0]::train_shard[1]]
  test = files['test'][shard[0]::shard[1]]

  def records(items):
    def dataset():
      tf = tf_import.tensorflow()
      paths, labels = zip(*items) if items else ((), ())
      return tf.data.Dataset.from_tensor_slices({'path': list(paths),
                                                 'label': tf.constant(labels, tf.int64)})
    return dataset

  def load(record):
    tf = tf_import.tensorflow()
    return {'image': tf.io.read_file(record['path']), 'label': record['label']}

  def test_examples():
    tf = tf_import.tensorflow()
    return records(test)().map(load, num_parallel_calls=tf.data.AUTOTUNE)

  return Source(len(classes), 3, len(train), len(test), len(files['train']), len(files['test']),
                records(train), test_examples, tuple(unreadable), load)


def _shown(names: list, most: int = 10) -> str:
  """The first `most` of `names` and how many more."""
  return ', '.join(names[:most]) + (f' and {len(names) - most} more' if len(names) > most
                                    else '')


def _synthetic(cfg, shard, train_shard) -> Source:
  """`cfg.train_examples` and `cfg.test_examples` random `cfg.size`² images (uniform pixels,
  PNG-encoded as a stored dataset's are) with uniform labels among `cfg.classes`, each drawn
  from its split and index alone (the record): every process's share, and every epoch, sees
  the same examples. For timing the input pipeline and the step without a dataset."""
  def draw(seed):
    def example(i):
      tf = tf_import.tensorflow()
      key = tf.stack([tf.constant(seed, tf.int64), i])
      pixels = tf.random.stateless_uniform((cfg.size, cfg.size, cfg.channels), key,
                                           maxval=256, dtype=tf.int32)
      label = tf.random.stateless_uniform((), key[::-1], maxval=cfg.classes, dtype=tf.int64)
      return {'image': tf.io.encode_png(tf.cast(pixels, tf.uint8)), 'label': label}
    return example

  def indices(total, shard):
    def dataset():
      return tf_import.tensorflow().data.Dataset.range(shard[0], total, shard[1])
    return dataset, len(range(shard[0], total, shard[1]))

  train, num_train = indices(cfg.train_examples, train_shard)
  test, num_test = indices(cfg.test_examples, shard)
  return Source(cfg.classes, cfg.channels, num_train, num_test, cfg.train_examples,
                cfg.test_examples, train, lambda: test().map(draw(1)), load=draw(0))


def _unreadable_files(root: str, relpaths: list) -> list:
  """The files among `relpaths` that do not decode, found by decoding each once.

  The answer is cached (in jaxpar's cache folder, `user_cache`, keyed by the folder and its
  files' names, sizes and modification times), so only the first run over a folder pays for
  the check.
  """
  stats = []
  for rel in relpaths:
    st = os.stat(os.path.join(root, rel))
    stats.append((rel, st.st_size, st.st_mtime_ns))
  key = hashlib.sha256(json.dumps([os.path.abspath(root), stats]).encode()).hexdigest()[:24]
  cache = user_cache.folder(f'unreadable-{key}.json')
  if os.path.exists(cache):
    with open(cache) as f:
      return json.load(f)
  tf = tf_import.tensorflow()
  logging.info('Checking that the %d image files under %s decode (once; the result is cached).',
               len(relpaths), root)
  ds = tf.data.Dataset.from_tensor_slices(list(relpaths) or tf.zeros((0,), tf.string)).enumerate()
  ds = ds.map(lambda i, rel: (i, tf.shape(tf.io.decode_image(
      tf.io.read_file(tf.strings.join([root, '/', rel])), channels=3,
      expand_animations=False))[0]), num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
  readable = {int(i) for i, _ in ds.ignore_errors().as_numpy_iterator()}
  unreadable = [rel for i, rel in enumerate(relpaths) if i not in readable]
  os.makedirs(os.path.dirname(cache), exist_ok=True)
  with open(cache + f'.{os.getpid()}', 'w') as f:  # processes may race: write, then rename
    json.dump(unreadable, f)
  os.replace(cache + f'.{os.getpid()}', cache)
  return unreadable
