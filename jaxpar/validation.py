"""Checks a config before anything compiles, and settles the defaults that depend on the method.

`validate` runs first (no devices needed), `validate_devices` once the device count is
known, `validate_schedule` once the run length is. Each raises `ConfigError`, whose
message names the field and what would be valid; `jaxpar.train` prints it as one line
and exits with code 2.

Fields left `auto` (`placement`, `bn_group_size`, `loss_scaling`, `optimizer.lr_scaling`)
take what the chosen method needs (`settle`, logged in one line); only a value the user
set that contradicts the method is an error.
"""
import importlib.util
import math
import os

from absl import logging

from jaxpar import optim
from jaxpar import config as config_lib
from jaxpar.config import (CLUSTERS, COLLECTIVE_THREADS, DTYPES, LOSS_SCALINGS, REDUCE_DTYPES,
                           SCHEMES, SERVERS, ConfigError, num_devices)
from jaxpar.data import sources
from jaxpar.data import dali
from jaxpar.data.pipeline import AUGMENTATIONS, DECODERS
from jaxpar.host_memory import HOST_MEMORY
from jaxpar.models import MIN_IMAGE_SIZE, MODELS
from jaxpar.models import onednn
from jaxpar.models.conv import CONV_IMPLS
from jaxpar.models.resnet import SHORTCUTS
from jaxpar.optim import LR_SCALINGS, OPTIMIZERS, SCHEDULES
from jaxpar.parallel.allreduce import GRAD_FUSIONS, SUMS
from jaxpar.parallel.gossip import GOSSIP_MIXES
from jaxpar.group_batchnorm import bn_group_sizes, group_sizes, split_for_groups
from jaxpar.parallel.hybrid import FC_PARALLEL, MODEL_AXIS
from jaxpar.parallel.servers import CENTRAL_SCHEDULES, PLACEMENTS


def _fail(field, value, valid):
  raise ConfigError(f'config.{field}={value!r} is invalid: {valid}')


def _get(c, field):
  for part in field.split('.'):
    c = c[part]
  return c


def _positive_int(c, field):
  value = _get(c, field)
  if not isinstance(value, int) or value <= 0:
    _fail(field, value, 'expected a positive integer')


def validate(c, quiet: bool = False) -> None:
  """Checks that need no devices (and no compilation), then settles the `auto` fields
  (in place, see `settle`; `quiet`: without logging them): a value the user set is checked
  against the method, one left `auto` is chosen to fit it."""
  if c.scheme == 'auto':
    _fail('scheme', c.scheme, "jaxpar.train settles it with jaxpar.plan before the run; this "
          f"tool needs one of {list(SCHEMES)}")
  _validate_choices(c)
  settle(c, quiet)
  _validate_data(c)
  shape, axes = _validate_mesh(c)
  _validate_method(c, shape, axes)
  _validate_distributed(c, shape)
  _validate_run(c)


def _validate_choices(c) -> None:
  """Every field with a fixed set of values holds one of them."""
  for field, choices in (('model', sorted(MODELS)), ('shortcut', SHORTCUTS), ('dtype', DTYPES),
                         ('grad_reduce_dtype', REDUCE_DTYPES), ('conv_impl', CONV_IMPLS),
                         ('host_memory', HOST_MEMORY),
                         ('loss_scaling', LOSS_SCALINGS),
                         ('scheme', SCHEMES),
                         ('server', SERVERS), ('placement', ('auto', *PLACEMENTS)),
                         ('central_schedule', CENTRAL_SCHEDULES), ('grad_reduce', SUMS),
                         ('grad_fusion', GRAD_FUSIONS), ('gossip_mix', GOSSIP_MIXES),
                         ('fc_parallel', FC_PARALLEL),
                         ('optimizer.name', OPTIMIZERS), ('optimizer.schedule', SCHEDULES),
                         ('optimizer.lr_scaling', LR_SCALINGS),
                         ('augment.kind', AUGMENTATIONS), ('dataset.decoder', DECODERS),
                         ('distributed.cluster', CLUSTERS),
                         ('distributed.collective_threads', COLLECTIVE_THREADS)):
    if _get(c, field) not in choices:
      _fail(field, _get(c, field), f'choose one of {list(choices)}')
  if c.conv_impl == 'onednn' and not onednn.available():  # builds it on first use
    _fail('conv_impl', c.conv_impl, f"oneDNN's convolutions cannot run here "
          f"({onednn.unavailable_reason()}); 'auto' takes the other lowerings then")


def _validate_data(c) -> None:
  """The dataset (an image folder, synthetic images or a TFDS name), its order and the
  input size."""
  if c.dataset.name == sources.IMAGE_FOLDER:
    if not os.path.isdir(c.dataset.path):
      _fail('dataset.path', c.dataset.path,
            'image_folder needs an existing folder with one sub-folder per class')
    classes = sources.folder_classes(c.dataset.path)
    if not classes:
      _fail('dataset.path', c.dataset.path, 'image_folder needs one sub-folder per class, '
            'holding its images (root/<class>/<image>; a hidden one is no class); this '
            'folder has no sub-folder')
    if not any(is_image for cls in classes
               for _, is_image in sources.folder_files(c.dataset.path, cls)):
      _fail('dataset.path', c.dataset.path, f'none of its {len(classes)} class folders holds '
            f'an image file ({", ".join(sources.IMAGE_EXTENSIONS)})')
    if not 0 < c.dataset.test_percent < 100:
      _fail('dataset.test_percent', c.dataset.test_percent, 'expected 1..99')
  elif c.dataset.name == sources.SYNTHETIC:
    synthetic = c.dataset.synthetic
    for field in ('classes', 'size', 'train_examples', 'test_examples'):
      if not isinstance(synthetic[field], int) or synthetic[field] < 1:
        _fail(f'dataset.synthetic.{field}', synthetic[field], 'expected a positive integer')
    if synthetic.classes < 2:
      _fail('dataset.synthetic.classes', synthetic.classes, 'expected at least 2')
    if synthetic.channels not in (1, 3):
      _fail('dataset.synthetic.channels', synthetic.channels, 'expected 1 or 3')
  else:
    try:
      tfds = sources.tfds_registered()
    except ImportError as e:  # an environment without TensorFlow (a GPU image's, say)
      _fail('dataset.name', c.dataset.name,
            f"{sources.NEEDS_TFDS}, which does not import here ({e}): `pip install -e .` "
            f"installs it; '{sources.SYNTHETIC}' (random images) needs no TensorFlow")
    try:
      tfds.builder_cls(c.dataset.name)
    except Exception:  # tfds raises DatasetNotFoundError with a long listing
      _fail('dataset.name', c.dataset.name,
            f"not a TFDS dataset; use 'sklearn_digits' (bundled), a name from "
            f"tfds.list_builders() such as 'cifar10', '{sources.IMAGE_FOLDER}' with "
            f"config.dataset.path, or '{sources.SYNTHETIC}' (random images)")

  if c.dataset.decoder == 'dali' and not dali.available():
    _fail('dataset.decoder', c.dataset.decoder, "NVIDIA DALI is not installed here: pip "
          "install -e '.[dali]' (Linux), or dataset.decoder='tf'")
  if c.dataset.order not in sources.ORDERS:
    _fail('dataset.order', c.dataset.order, f'expected one of {sources.ORDERS}')

  if isinstance(c.image_size, int) and c.image_size < MIN_IMAGE_SIZE[c.model]:
    _fail('image_size', c.image_size, f'{c.model} needs at least {MIN_IMAGE_SIZE[c.model]}')


def _validate_mesh(c) -> tuple:
  """(shape, axes) of `mesh`: positive sizes, one distinct name each."""
  shape, axes = tuple(c.mesh.shape), tuple(c.mesh.axes)
  if not _positive_sizes(shape):
    _fail('mesh.shape', shape, 'expected a tuple of positive integers, e.g. (2, 4)')
  if len(axes) != len(shape) or len(set(axes)) != len(axes):
    _fail('mesh.axes', axes, f'expected {len(shape)} distinct names, one per mesh.shape entry')
  return shape, axes


def _positive_sizes(shape: tuple) -> bool:
  return bool(shape) and all(isinstance(n, int) and n > 0 for n in shape)


def _validate_method(c, shape, axes) -> None:
  """The method's fields against each other and the mesh: servers, Local SGD, gossip,
  hybrid FC, reductions, BN groups."""
  if c.placement != 'even' and c.server != 'distributed':
    _fail('placement', c.placement, "placement applies to server='distributed'; leave it 'auto'")
  if c.central_schedule != 'serial' and c.server != 'central':
    _fail('central_schedule', c.central_schedule,
          "central_schedule applies to server='central'; leave it 'serial'")
  if c.scheme == 'async':
    _validate_async(c)
  for field in ('sync_every', 'local_sgd_warmup'):
    if not isinstance(_get(c, field), int) or _get(c, field) < 0:
      _fail(field, _get(c, field), 'expected 0 or a positive integer')
  if c.local_sgd_warmup and not c.sync_every:
    _fail('local_sgd_warmup', c.local_sgd_warmup,
          'warm-up steps precede Local SGD: set sync_every (τ) too, or leave it 0')
  if c.local_sgd_group_size != 1 and not c.sync_every:
    _fail('local_sgd_group_size', c.local_sgd_group_size,
          'it groups the devices of hierarchical Local SGD: set sync_every (τ) too, or leave '
          'it 1')
  if c.sync_every or c.server == 'gossip':
    _validate_replicas(c)
  _validate_sparsify(c)
  if c.gossip_mix != 'gradients' and (c.server != 'gossip' or c.sparsify.capacity):
    _fail('gossip_mix', c.gossip_mix, "it chooses what dense gossip (server='gossip', "
          "sparsify.capacity=0) mixes; sparsified gossip sends gradient entries and the "
          "other servers mix nothing: leave it 'gradients'")
  if c.fc_parallel != 'data':
    _validate_hybrid(c, axes)
  if c.server != 'allreduce' and c.grad_reduce != 'psum':
    _fail('grad_reduce', c.grad_reduce,
          f"ring and torus2d are all-reduce algorithms, for server='allreduce'; "
          f"server={c.server!r} moves gradients its own way: leave grad_reduce=psum")
  method = config_lib.method(c)
  fusible = method == 'allreduce' and c.grad_reduce == 'psum' or method == 'gossip'
  if c.grad_fusion != 'auto' and not fusible:
    _fail('grad_fusion', c.grad_fusion,
          "it chooses how psum (server='allreduce', grad_reduce='psum') or gossip's permutes "
          "send the gradients; ring and torus2d always send one buffer, sparsified gossip "
          "per tensor, Local SGD (sync_every) its averages, the split FC layers "
          "(fc_parallel) and the servers their own: leave 'auto'")
  if c.grad_reduce == 'torus2d' and len(shape) != 2:
    _fail('grad_reduce', c.grad_reduce,
          f'torus2d reduces over two mesh axes but mesh.shape={shape} has {len(shape)}; '
          f'use a 2-axis mesh such as (2, 4), or grad_reduce=psum or ring')
  valid_groups = bn_group_sizes(shape)
  if not isinstance(c.bn_group_size, int) or (c.bn_group_size and
                                              c.bn_group_size not in valid_groups):
    _fail('bn_group_size', c.bn_group_size,
          f'a BN group is a run of consecutive devices of mesh.shape={shape} that trailing '
          f'axes (one of them split) can hold: choose 0 (all devices) or one of '
          f'{valid_groups}')
  *_, split = split_for_groups(shape, axes, c.bn_group_size)
  if split and c.grad_reduce == 'torus2d':
    _fail('bn_group_size', c.bn_group_size, f'it splits mesh axis {split!r} in two (groups '
          f'of {c.bn_group_size} are not a product of trailing axes of {shape}) and torus2d '
          f'reduces over exactly two axes: choose one of {group_sizes(shape)}, or '
          f'grad_reduce=psum or ring')
  if split == MODEL_AXIS and c.fc_parallel != 'data':
    _fail('bn_group_size', c.bn_group_size, f"it would split the {MODEL_AXIS!r} axis that "
          f"the FC layers are split over: choose one of {group_sizes(shape)}")
  if c.bn_group_size and not config_lib.has_batch_norm(c):
    _fail('bn_group_size', c.bn_group_size,
          f'{c.model} has no BatchNorm unless config.batch_norm=True; set it, or leave '
          f'bn_group_size unset')


def _validate_distributed(c, shape) -> None:
  """Several processes: their count, ids, coordinator and timeouts."""
  d = c.distributed
  _positive_int(c, 'distributed.num_processes')
  if not isinstance(d.process_id, int) or not 0 <= d.process_id < d.num_processes:
    _fail('distributed.process_id', d.process_id, f'expected 0..{d.num_processes - 1}')
  if d.num_processes > 1 and not d.coordinator:
    _fail('distributed.coordinator', d.coordinator,
          'several processes need the host:port of process 0, e.g. 127.0.0.1:8476 (or leave '
          'num_processes=1 and let distributed.cluster read them from SLURM, MPI, ...)')
  if d.coordinator and d.cluster not in ('auto', 'none'):
    _fail('distributed.cluster', d.cluster, 'an explicit distributed.coordinator is given: '
          "leave cluster='auto', or drop the coordinator to read the run from the cluster")
  for field in ('distributed.initialization_timeout', 'distributed.heartbeat_timeout'):
    _positive_int(c, field)
  if math.prod(shape) % d.num_processes:
    _fail('distributed.num_processes', d.num_processes,
          f'the mesh\'s {math.prod(shape)} devices must split evenly among the processes')


def _validate_run(c) -> None:
  """Batches, run length, evaluation and the optimizer's numbers."""
  for field in ('image_size', 'eval_batch', 'log_every', 'checkpoint_every', 'keep_checkpoints',
                'optimizer.base_batch', 'dataset.shuffle_buffer'):
    _positive_int(c, field)
  _positive_int(c, 'global_batch' if c.scheme == 'sync-split' else 'per_device_batch')
  _positive_int(c, 'grad_accum_steps')
  if c.scheme != 'sync-split' and c.per_device_batch % c.grad_accum_steps:
    _fail('grad_accum_steps', c.grad_accum_steps,
          f'it splits per_device_batch={c.per_device_batch} into equal micro-batches: use a '
          f'divisor of it')
  mb = c.dataset.eval_cache_mb
  if isinstance(mb, bool) or not isinstance(mb, (int, float)) or not 0 <= mb < math.inf:
    _fail('dataset.eval_cache_mb', mb, 'MiB of evaluation batches kept in memory per process, '
          'e.g. 1024 (0: read the split again at every evaluation)')
  for field in ('eval_every', 'stop_after_steps', 'optimizer.warmup_steps', 'augment.crop_padding'):
    value = _get(c, field)
    if not isinstance(value, int) or value < 0:
      _fail(field, value, 'expected 0 or a positive integer')
  if not isinstance(c.total_steps, int) or c.total_steps < 0:
    _fail('total_steps', c.total_steps, 'expected a positive integer (or 0 to use num_epochs)')
  if c.total_steps == 0 and not c.num_epochs > 0:
    _fail('num_epochs', c.num_epochs, 'expected > 0 (or set config.total_steps > 0)')
  for field in ('optimizer.base_lr', 'optimizer.poly_power', 'optimizer.trust_coefficient',
                'optimizer.eps'):
    if not _get(c, field) > 0:
      _fail(field, _get(c, field), 'expected > 0')
  for field in ('optimizer.b1', 'optimizer.b2'):
    if not 0 <= _get(c, field) < 1:
      _fail(field, _get(c, field), 'expected a decay rate in [0, 1)')

def settle(c, quiet: bool = False) -> None:
  """Fills the fields left `auto` with what the chosen method needs, in place, and logs
  those that matter to the run in one line (unless `quiet`). A field already set is left as
  it is (an explicit contradiction is `validate`'s error). Idempotent."""
  chosen = []
  if c.placement == 'auto':
    c.placement = 'greedy' if c.scheme == 'async' and c.server == 'distributed' else 'even'
    if c.server == 'distributed':
      chosen.append(f'placement={c.placement!r} (' + (
          "[T]'s Algorithm 3.7: whole tensors on their owners, as Downpour pushes them"
          if c.scheme == 'async' else '1/N of every tensor on each device') + ')')
  if c.bn_group_size is None:
    replica = _replica_size(c)
    c.bn_group_size = replica if replica and config_lib.has_batch_norm(c) else 0
    if config_lib.has_batch_norm(c):
      chosen.append(f'bn_group_size={c.bn_group_size} (' + (
          'statistics over all devices' if not c.bn_group_size else
          'one replica per device normalises over its own batch' if c.bn_group_size == 1 else
          f'each replica, a group of {replica} devices, normalises over its batch') + ')')
  if c.loss_scaling == 'auto':
    c.loss_scaling = 'dynamic' if c.dtype == 'float16' and c.scheme != 'async' else 'none'
    if c.dtype == 'float16':
      chosen.append(f'loss_scaling={c.loss_scaling!r} (float16 gradients)')
  if c.optimizer.lr_scaling == 'auto':
    c.optimizer.lr_scaling = optim.lr_scaling(c.optimizer)
    chosen.append(f'optimizer.lr_scaling={c.optimizer.lr_scaling!r} ({c.optimizer.name})')
  shape = c.mesh.shape  # a bad one is `_validate_mesh`'s to name
  if c.eval_batch is None and isinstance(shape, (tuple, list)) and _positive_sizes(tuple(shape)):
    c.eval_batch = config_lib.eval_batch(c)
    if c.eval_batch != config_lib.EVAL_BATCH:
      chosen.append(f'eval_batch={c.eval_batch} ({config_lib.EVAL_BATCH} rounded up to a '
                    f'multiple of the {config_lib.driver_devices(c)} data devices)')
  if chosen and not quiet:
    logging.info('Defaults for this method: %s.', '; '.join(chosen))


def _replica_size(c):
  """Devices that train one replica: 1 for gossip, the group for Local SGD; None when the
  whole mesh trains one model."""
  if c.server == 'gossip':
    return 1
  if c.sync_every and c.scheme != 'async':
    return c.local_sgd_group_size if isinstance(c.local_sgd_group_size, int) else 1
  return None


def _validate_async(c) -> None:
  """Downpour SGD: per-device loops on one host, whole tensors on the server(s)."""
  if c.server not in ('central', 'distributed'):
    _fail('server', c.server, "scheme='async' needs a parameter server: 'central' or "
          "'distributed'")
  if c.server == 'distributed' and c.placement != 'greedy':
    _fail('placement', c.placement, "scheme='async' with server='distributed' places whole "
          "tensors by [T]'s Algorithm 3.7: set placement='greedy', or leave it 'auto'")
  if c.server == 'central' and c.central_schedule != 'serial':
    _fail('central_schedule', c.central_schedule, "scheme='async' applies one push at a time "
          "(the serial schedule): leave it 'serial'")
  if c.dtype == 'float16':
    _fail('dtype', c.dtype, "Downpour's workers do not scale their loss, and float16 "
          "gradients flush to zero without it: use 'bfloat16' or 'float32' with "
          "scheme='async'")
  if c.loss_scaling == 'dynamic':
    _fail('loss_scaling', c.loss_scaling, "scheme='async' does not scale the loss: leave it "
          "'auto'")
  a = c.async_sgd
  if a.backend not in config_lib.ASYNC_BACKENDS:
    _fail('async_sgd.backend', a.backend, f'choose one of {list(config_lib.ASYNC_BACKENDS)}')
  if a.lr_staleness not in config_lib.LR_STALENESS:
    _fail('async_sgd.lr_staleness', a.lr_staleness,
          f'choose one of {list(config_lib.LR_STALENESS)}')
  workers = num_devices(c)
  if a.max_staleness is not None and a.max_staleness < workers - 1:
    _fail('async_sgd.max_staleness', a.max_staleness,
          f'{workers} workers that pulled the same weights are applied one after another, '
          f'the last with staleness {workers - 1}: use at least {workers - 1}, or None (no bound)')
  if a.backend == 'threads':
    for field, value in (('restart_workers', 0), ('ray_address', ''), ('gpus_per_worker', 0.0),
                         ('cpus_per_worker', 0)):
      if a[field] != value:
        _fail(f'async_sgd.{field}', a[field], "applies to Ray's worker processes: set "
              f"async_sgd.backend='ray', or leave it {value!r}")
  for field in ('restart_workers', 'gpus_per_worker', 'cpus_per_worker'):
    if a[field] < 0:
      _fail(f'async_sgd.{field}', a[field], 'must be 0 or more')
  if a.backend == 'ray' and importlib.util.find_spec('ray') is None:
    _fail('async_sgd.backend', a.backend, "Ray is not installed: pip install 'jaxpar[ray]', "
          "or use 'threads'")
  for field, synchronous_only in (('grad_reduce', 'psum'), ('grad_reduce_dtype', 'float32'),
                                  ('bn_group_size', 0), ('distributed.num_processes', 1)):
    if _get(c, field) != synchronous_only:
      _fail(field, _get(c, field), f"not supported with scheme='async' (the run is one "
            f"process: threads, or Ray's actors with async_sgd.backend='ray'; each worker's BN "
            f"statistics are its own; pushes are float32): set it to {synchronous_only!r}")


def _validate_replicas(c) -> None:
  """Local SGD and gossip: one replica per device, no server, no all-reduce of gradients."""
  method = 'gossip' if c.server == 'gossip' else 'Local SGD'
  if c.scheme == 'async' or c.server not in ('allreduce', 'gossip'):
    _fail('sync_every', c.sync_every, f"Local SGD averages replicas with an all-reduce (or, "
          f"with server='gossip', exchanges with two partners): it needs scheme='sync-split' "
          f"or 'sync-join' and server='allreduce' or 'gossip', not scheme={c.scheme!r}, "
          f"server={c.server!r}")
  for field, default in (('grad_reduce', 'psum'), ('grad_reduce_dtype', 'float32')):
    if _get(c, field) != default:
      _fail(field, _get(c, field), f'{method} does not all-reduce gradients: leave it '
            f'{default!r}')
  group = c.local_sgd_group_size
  if not isinstance(group, int) or group not in group_sizes(tuple(c.mesh.shape)) or not group:
    _fail('local_sgd_group_size', group, f'a group is a set of trailing mesh axes of '
          f'mesh.shape={tuple(c.mesh.shape)}: choose one of '
          f'{[g for g in group_sizes(tuple(c.mesh.shape)) if g]}')
  if group != 1 and c.server == 'gossip':
    _fail('local_sgd_group_size', group, "groups train synchronously inside hierarchical "
          "Local SGD (server='allreduce'); gossip exchanges per device: leave it 1")
  replica = _replica_size(c)
  if config_lib.has_batch_norm(c) and not (c.bn_group_size and replica % c.bn_group_size == 0):
    if replica == 1:
      _fail('bn_group_size', c.bn_group_size, f'{method} trains one replica per device, '
            f'whose BatchNorm normalises over its own batch: set bn_group_size=1, or leave '
            f'it unset (auto)')
    _fail('bn_group_size', c.bn_group_size, f'{method} trains one replica per group of '
          f'{replica} devices, whose BatchNorm normalises within it: set bn_group_size to '
          f'a divisor of {replica}, or leave it unset (auto: {replica})')


def _validate_sparsify(c) -> None:
  sp = c.sparsify
  if not isinstance(sp.capacity, (int, float)) or not 0 <= sp.capacity <= 1:
    _fail('sparsify.capacity', sp.capacity, 'expected a fraction of each tensor in (0, 1], '
          'or 0 for no sparsification')
  if not isinstance(sp.threshold, (int, float)) or sp.threshold < 0:
    _fail('sparsify.threshold', sp.threshold, 'expected a magnitude >= 0')
  if sp.capacity and c.server != 'gossip':
    _fail('sparsify.capacity', sp.capacity, "sparsification applies to server='gossip'")
  if not sp.capacity:
    for field, default in (('sparsify.threshold', 0.0), ('sparsify.error_feedback', True)):
      if _get(c, field) != default:
        _fail(field, _get(c, field), 'applies to sparsified gossip: set sparsify.capacity '
              '(e.g. 0.01) too, or leave it at its default')


def _validate_hybrid(c, axes) -> None:
  if 'model' not in axes or len(axes) < 2:
    _fail('fc_parallel', c.fc_parallel, f"model-parallel FC layers are split over a mesh axis "
          f"named 'model' beside the data axes; mesh.axes={axes}: use e.g. "
          f"mesh.shape=(2, 4), mesh.axes=('data', 'model')")
  if c.model == 'squeezenet':
    _fail('fc_parallel', c.fc_parallel, 'squeezenet has no FC layer (its classifier is a 1×1 '
          "convolution): leave fc_parallel='data'")
  if (c.scheme == 'async' or c.server != 'allreduce' or c.sync_every
      or c.grad_reduce != 'psum'):
    _fail('fc_parallel', c.fc_parallel, "hybrid parallelism runs with synchronous all-reduce "
          "(scheme sync-*, server='allreduce', grad_reduce='psum', sync_every=0)")


def validate_devices(c, device_count: int, process_count: int) -> None:
  n = config_lib.driver_devices(c)
  if n > device_count or (n < device_count and process_count > 1):
    _fail('mesh.shape', tuple(c.mesh.shape),
          f'it has {n} devices but JAX sees {device_count}'
          f"{' over ' + str(process_count) + ' processes' if process_count > 1 else ''}; use "
          f'a shape whose product is {device_count}{"" if process_count > 1 else " or less"}, '
          f'or on CPU leave config.mesh.emulate_cpu_devices=True')
  if c.scheme == 'sync-split' and c.global_batch % n:
    _fail('global_batch', c.global_batch,
          f'sync-split divides it among the {n} data devices; use a multiple of {n}')
  if c.scheme == 'sync-split' and c.global_batch % (n * c.grad_accum_steps):
    _fail('grad_accum_steps', c.grad_accum_steps,
          f'each device takes global_batch/{n} = {c.global_batch // n} examples in '
          f'{c.grad_accum_steps} equal micro-batches: use a divisor of {c.global_batch // n}')
  eval_batch = config_lib.eval_batch(c)
  if eval_batch % n or eval_batch % process_count:
    _fail('eval_batch', eval_batch, f'use a multiple of the {n} data devices')
  if c.scheme == 'async' and process_count > 1:
    _fail('scheme', c.scheme, f'the {process_count} processes of this cluster cannot run '
          f"Downpour as SPMD processes: run one process with async_sgd.backend='ray' (its "
          f"workers are Ray actors on the cluster) and distributed.cluster='none', or "
          f"choose 'sync-split' or 'sync-join'")


def _say_unaveraged(c, total_steps: int) -> None:
  """Warns where Local SGD's replicas are never averaged within the run's `total_steps`."""
  tau, synchronous = c.sync_every, c.local_sgd_warmup
  if not tau or synchronous + tau <= total_steps:
    return
  if synchronous >= total_steps:
    logging.warning('config.local_sgd_warmup=%d: all %d steps of the run are synchronous, so '
                    'Local SGD (sync_every=%d) never starts.', synchronous, total_steps, tau)
    return
  logging.warning('config.sync_every=%d: the run ends after %d steps, before the first average '
                  '(at step %d): each replica trains alone after step %d and the evaluation '
                  'reads their mean; a period of at most %d averages them within the run.', tau,
                  total_steps, synchronous + tau, synchronous, total_steps - synchronous)


def say_batch_over_split(c, train_examples: int) -> None:
  """A batch larger than the train split (all processes' shares) is said: each of its
  batches repeats examples (the stream is the split's shuffled epochs one after another)."""
  batch = config_lib.global_batch(c)
  if batch <= train_examples:
    return
  field = 'global_batch' if c.scheme == 'sync-split' else 'per_device_batch'
  logging.warning('A batch of %d examples (config.%s=%d) from a train split of %d: every batch '
                  'holds some examples twice or more; a batch of at most %d sees each once an '
                  'epoch.', batch, field, c[field], train_examples, train_examples)


def validate_schedule(c, total_steps: int, warmup_from_recipe: bool = False) -> None:
  """The warm-up fits the run. `warmup_from_recipe`: `optimizer.warmup_steps` is the
  config's own (its dataset recipe's, e.g. the digits' 20 steps), not one the user asked
  for; where it does not fit a shorter run it becomes a quarter of the run (as
  configs/thesis.py sizes it), in place and logged. Asked for (the default), it is an error.
  A Local SGD period the run ends before is said (each replica then trains alone to the end)."""
  _say_unaveraged(c, total_steps)
  warmup = c.optimizer.warmup_steps
  if warmup < total_steps:
    return
  if not warmup_from_recipe:
    _fail('optimizer.warmup_steps', warmup,
          f'must be below the run length of {total_steps} steps: set it to at most '
          f'{total_steps - 1}')
  c.optimizer.warmup_steps = total_steps // 4
  logging.info("optimizer.warmup_steps=%d: the config's %d warm-up steps do not fit a run of %d "
               'steps, a quarter of it instead (--config.optimizer.warmup_steps sets it).',
               c.optimizer.warmup_steps, warmup, total_steps)


