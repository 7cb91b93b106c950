"""The run's configuration: defaults, and validation with one clear error per bad field.

Config files in `configs/` start from `defaults()` and override what they need.
`validate` runs before anything is compiled; `validate_devices` once the device
count is known. Each raises `ConfigError`, whose message names the field and
what would be valid; `jaxpar.train` prints it as one line and exits with code 2.
"""
import math
import os

import ml_collections

SCHEMES = ('sync-split', 'sync-join', 'async')
SERVERS = ('allreduce', 'central', 'distributed', 'gossip')
# JAX's cluster detectors (jax.distributed.initialize's names), plus auto and none.
CLUSTERS = ('auto', 'none', 'slurm', 'ompi', 'mpi4py', 'gketpu', 'gcetpu', 'k8s')
DTYPES = ('float32', 'bfloat16', 'float16')
REDUCE_DTYPES = ('float32', 'bfloat16')


class ConfigError(ValueError):
  """A config field has a value the run cannot use."""


def defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.model = 'resnet34'          # resnet34 | vgg16e | googlenet | squeezenet
  c.shortcut = 'projection'     # ResNet34 only: projection | zero_pad ([T] ch. 2)
  c.batch_norm = False          # VGG16E/GoogLeNet/SqueezeNet: add BN after each conv (not in the originals)
  # Mixed precision ([Y] §3): `dtype` is the compute dtype of convolutions,
  # activations and the input; parameters, optimizer state, BN statistics and the
  # loss stay float32. Gradients are reduced in `grad_reduce_dtype`.
  c.dtype = 'float32'           # float32 | bfloat16 | float16
  c.grad_reduce_dtype = 'float32'  # float32 | bfloat16 (half the bytes on the wire)
  # How convolutions are computed (jaxpar/models/conv.py): auto = on the CPU backend one
  # matmul per kernel tap where the output map is small (XLA's CPU convolutions are slow
  # there), XLA's convolution everywhere else and on GPU/TPU; xla; taps.
  c.conv_impl = 'auto'

  c.dataset = ml_collections.ConfigDict()
  c.dataset.name = 'sklearn_digits'  # a TFDS name, or 'image_folder'
  c.dataset.data_dir = ''            # TFDS data_dir ('' = TFDS default)
  c.dataset.train_split = 'train'
  c.dataset.test_split = 'test'
  c.dataset.path = ''                # image_folder: root with one sub-folder per class
  c.dataset.test_percent = 20        # image_folder: share of files held out for test
  c.dataset.cache = True             # cache decoded train examples in memory
  c.dataset.shuffle_buffer = 50_000

  c.image_size = 32
  c.augment = ml_collections.ConfigDict()
  c.augment.kind = 'pad_crop'   # pad_crop | inception_crop | none
  c.augment.crop_padding = 4
  c.augment.flip = False

  c.mesh = ml_collections.ConfigDict()
  c.mesh.shape = (8,)
  c.mesh.axes = ('data',)       # every axis is a data axis: the batch is split over all of them
  c.mesh.emulate_cpu_devices = True  # on CPU, create as many devices as the mesh needs

  # [T]'s parameter servers: allreduce (every device holds and updates all the
  # weights), central (device 0 receives every gradient, updates, and sends the
  # weights back), distributed (each device owns part of the weights: gradients
  # are reduce-scattered to the owners, which alone hold its optimizer state) or
  # gossip ([L]: no server; each device mixes gradients with two ring neighbours and
  # keeps its own replica).
  c.server = 'allreduce'
  # central: serial = one worker at a time ([T] eq. 4.4, best case; the semaphore
  # of §7.2), parallel = all at once (eq. 4.7, worst case).
  c.central_schedule = 'serial'
  # distributed: which device owns what. even = 1/N of every tensor; greedy = [T]'s
  # Algorithm 3.7, whole tensors to the least-loaded device.
  c.placement = 'even'
  # How gradients are summed over the data axes: psum (XLA's all-reduce), ring
  # ([L]: ppermute ring over all devices), torus2d ([Y]: a 2-axis mesh only).
  c.grad_reduce = 'psum'
  # psum only: one_buffer all-reduces every gradient as one buffer per dtype (as PyTorch
  # DDP buckets them): one call instead of one per tensor, for the price of copying the
  # gradients in and out. auto = one_buffer across processes (each call then costs a
  # fixed latency, ~4 ms on gloo), per_tensor within one process (calls are cheap).
  c.grad_fusion = 'auto'
  # Local SGD / model averaging ([S], [L]): > 0 trains one replica per device and
  # averages parameters and BN statistics every `sync_every` steps (1 = synchronous
  # SGD), after `local_sgd_warmup` fully synchronous steps. 0 = off.
  c.sync_every = 0
  c.local_sgd_warmup = 0
  # Hybrid parallelism ([H]): FC layers data-parallel, or model-parallel over the mesh
  # axis named 'model' (weights split along the output dimension), or `auto`: per layer,
  # model-parallel where [H]'s rule M·R < (K+1)·N / (3K + 2N) says it moves less.
  c.fc_parallel = 'data'
  # Sparsified gossip ([L] Algorithm 3), server='gossip' only: each tensor's message
  # holds its ⌈capacity·size⌉ largest entries, those above `threshold` sent; error
  # feedback keeps the rest for the next step. capacity 0 = off (dense gossip).
  c.sparsify = ml_collections.ConfigDict()
  c.sparsify.capacity = 0.0
  c.sparsify.threshold = 0.0
  c.sparsify.error_feedback = True
  # [Y]'s sub-group batch norm: how many devices share BN statistics, a product
  # of trailing mesh axes (mesh (2, 4): 1, 4 or 8). 0 = all devices.
  c.bn_group_size = 0

  # Several processes (hosts) forming one mesh, through jax.distributed. Either
  # explicit (`launch/local.sh` sets coordinator, num_processes and process_id for each
  # process), or read from the cluster's environment by JAX's detectors when no
  # coordinator is given: SLURM (srun), Open MPI (mpirun), mpi4py (opt-in), Cloud TPU
  # pods (gcetpu, gketpu), Kubernetes (k8s). 'auto' uses whichever is present, and runs
  # alone when none is (or it has one process); 'none' never joins.
  c.distributed = ml_collections.ConfigDict()
  c.distributed.coordinator = ''    # host:port of process 0
  c.distributed.num_processes = 1
  c.distributed.process_id = 0
  c.distributed.cluster = 'auto'
  # Seconds: every process must have joined within the first; a process silent for the
  # second (killed, crashed, out of memory, hung) ends all others with its name.
  c.distributed.initialization_timeout = 300
  c.distributed.heartbeat_timeout = 100

  # [T] ch. 3: sync-split divides `global_batch` among the devices (= sequential
  # training); sync-join gives each device `per_device_batch` (global = N × per-device);
  # async (Downpour SGD) lets every device train on its own `per_device_batch`
  # batches, the server (central or distributed) applying each gradient as it arrives.
  c.scheme = 'sync-split'
  c.global_batch = 128
  c.per_device_batch = 16
  c.eval_batch = 256            # global; the last batch is padded and masked

  c.total_steps = 0             # > 0 wins; otherwise num_epochs sets the length
  c.num_epochs = 10.0

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = 'sgd'      # sgd | lars (You et al. 2017)
  c.optimizer.schedule = 'cosine'  # cosine | poly | constant: warm-up, then cosine or (1 - t)^poly_power decay, or none
  c.optimizer.poly_power = 2.0
  c.optimizer.trust_coefficient = 0.001  # lars: η of the trust ratio η·‖w‖/‖g + λw‖
  c.optimizer.base_lr = 0.1     # for a global batch of base_batch; scaled linearly ([Y] §3)
  c.optimizer.base_batch = 256
  c.optimizer.momentum = 0.9
  c.optimizer.nesterov = True
  c.optimizer.weight_decay = 5e-4   # kernels only (as lars' trust ratio): not biases, BN scale/bias
  c.optimizer.warmup_steps = 50

  c.seed = 0
  c.log_every = 10
  c.eval_every = 0              # 0 = only at the end
  c.checkpoint_every = 100
  c.keep_checkpoints = 3
  c.stop_after_steps = 0        # > 0: checkpoint and exit after this many steps (time-limited jobs)
  return c


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


def validate(c) -> None:
  """Checks that need no devices (and no compilation)."""
  # Imported here, not at the top: config files import this module for
  # `defaults()`, and should not pay for TensorFlow and JAX to do so.
  import tensorflow_datasets as tfds

  from jaxpar.data import sources
  from jaxpar.data.pipeline import AUGMENTATIONS
  from jaxpar.models import MIN_IMAGE_SIZE, MODELS
  from jaxpar.models.conv import CONV_IMPLS
  from jaxpar.models.resnet import SHORTCUTS
  from jaxpar.optim import OPTIMIZERS, SCHEDULES
  from jaxpar.parallel.allreduce import GRAD_FUSIONS, SUMS
  from jaxpar.parallel.group_batchnorm import group_sizes
  from jaxpar.parallel.hybrid import FC_PARALLEL
  from jaxpar.parallel.servers import CENTRAL_SCHEDULES, PLACEMENTS

  for field, choices in (('model', sorted(MODELS)), ('shortcut', SHORTCUTS), ('dtype', DTYPES),
                         ('grad_reduce_dtype', REDUCE_DTYPES), ('conv_impl', CONV_IMPLS),
                         ('scheme', SCHEMES),
                         ('server', SERVERS), ('placement', PLACEMENTS),
                         ('central_schedule', CENTRAL_SCHEDULES), ('grad_reduce', SUMS),
                         ('grad_fusion', GRAD_FUSIONS),
                         ('fc_parallel', FC_PARALLEL),
                         ('optimizer.name', OPTIMIZERS), ('optimizer.schedule', SCHEDULES),
                         ('augment.kind', AUGMENTATIONS), ('distributed.cluster', CLUSTERS)):
    if _get(c, field) not in choices:
      _fail(field, _get(c, field), f'choose one of {list(choices)}')

  if c.dataset.name == sources.IMAGE_FOLDER:
    if not os.path.isdir(c.dataset.path):
      _fail('dataset.path', c.dataset.path,
            'image_folder needs an existing folder with one sub-folder per class')
    if not 0 < c.dataset.test_percent < 100:
      _fail('dataset.test_percent', c.dataset.test_percent, 'expected 1..99')
  else:
    try:
      tfds.builder_cls(c.dataset.name)
    except Exception:  # tfds raises DatasetNotFoundError with a long listing
      _fail('dataset.name', c.dataset.name,
            f"not a TFDS dataset; use 'sklearn_digits' (bundled), a name from "
            f"tfds.list_builders() such as 'cifar10', or '{sources.IMAGE_FOLDER}' with "
            f"config.dataset.path")

  if isinstance(c.image_size, int) and c.image_size < MIN_IMAGE_SIZE[c.model]:
    _fail('image_size', c.image_size, f'{c.model} needs at least {MIN_IMAGE_SIZE[c.model]}')

  shape, axes = tuple(c.mesh.shape), tuple(c.mesh.axes)
  if not shape or any(not isinstance(n, int) or n <= 0 for n in shape):
    _fail('mesh.shape', shape, 'expected a tuple of positive integers, e.g. (2, 4)')
  if len(axes) != len(shape) or len(set(axes)) != len(axes):
    _fail('mesh.axes', axes, f'expected {len(shape)} distinct names, one per mesh.shape entry')

  if c.placement != 'even' and c.server != 'distributed':
    _fail('placement', c.placement, "placement applies to server='distributed'; leave it 'even'")
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
  if c.sync_every or c.server == 'gossip':
    _validate_replicas(c)
  _validate_sparsify(c)
  if c.fc_parallel != 'data':
    _validate_hybrid(c, axes)
  if c.server != 'allreduce' and c.grad_reduce != 'psum':
    _fail('grad_reduce', c.grad_reduce,
          f"ring and torus2d are all-reduce algorithms, for server='allreduce'; "
          f"server={c.server!r} moves gradients its own way: leave grad_reduce=psum")
  if c.grad_fusion != 'auto' and (c.server != 'allreduce' or c.grad_reduce != 'psum'):
    _fail('grad_fusion', c.grad_fusion,
          "it chooses how psum sends the gradients (server='allreduce', grad_reduce='psum'); "
          "ring and torus2d always send one buffer and the servers their own: leave 'auto'")
  if c.grad_reduce == 'torus2d' and len(shape) != 2:
    _fail('grad_reduce', c.grad_reduce,
          f'torus2d reduces over two mesh axes but mesh.shape={shape} has {len(shape)}; '
          f'use a 2-axis mesh such as (2, 4), or grad_reduce=psum or ring')
  valid_groups = group_sizes(shape)
  if not isinstance(c.bn_group_size, int) or (c.bn_group_size and
                                              c.bn_group_size not in valid_groups):
    _fail('bn_group_size', c.bn_group_size,
          f'a BN group is a set of trailing mesh axes of mesh.shape={shape}: choose 0 (all '
          f'devices) or one of {valid_groups}, or reshape the mesh (group size 2 on 8 '
          f'devices: mesh.shape=(4, 2))')
  if c.bn_group_size and c.model != 'resnet34' and not c.batch_norm:
    _fail('bn_group_size', c.bn_group_size,
          f'{c.model} has no BatchNorm unless config.batch_norm=True; set it, or leave '
          f'bn_group_size=0')

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

  for field in ('image_size', 'eval_batch', 'log_every', 'checkpoint_every', 'keep_checkpoints',
                'optimizer.base_batch', 'dataset.shuffle_buffer'):
    _positive_int(c, field)
  _positive_int(c, 'global_batch' if c.scheme == 'sync-split' else 'per_device_batch')
  for field in ('eval_every', 'stop_after_steps', 'optimizer.warmup_steps', 'augment.crop_padding'):
    value = _get(c, field)
    if not isinstance(value, int) or value < 0:
      _fail(field, value, 'expected 0 or a positive integer')
  if not isinstance(c.total_steps, int) or c.total_steps < 0:
    _fail('total_steps', c.total_steps, 'expected a positive integer (or 0 to use num_epochs)')
  if c.total_steps == 0 and not c.num_epochs > 0:
    _fail('num_epochs', c.num_epochs, 'expected > 0 (or set config.total_steps > 0)')
  for field in ('optimizer.base_lr', 'optimizer.poly_power', 'optimizer.trust_coefficient'):
    if not _get(c, field) > 0:
      _fail(field, _get(c, field), 'expected > 0')


def _validate_async(c) -> None:
  """Downpour SGD: per-device loops on one host, whole tensors on the server(s)."""
  if c.server not in ('central', 'distributed'):
    _fail('server', c.server, "scheme='async' needs a parameter server: 'central' or "
          "'distributed'")
  if c.server == 'distributed' and c.placement != 'greedy':
    _fail('placement', c.placement, "scheme='async' with server='distributed' places whole "
          "tensors by [T]'s Algorithm 3.7: set placement='greedy'")
  if c.server == 'central' and c.central_schedule != 'serial':
    _fail('central_schedule', c.central_schedule, "scheme='async' applies one push at a time "
          "(the serial schedule): leave it 'serial'")
  for field, synchronous_only in (('grad_reduce', 'psum'), ('grad_reduce_dtype', 'float32'),
                                  ('bn_group_size', 0), ('distributed.num_processes', 1)):
    if _get(c, field) != synchronous_only:
      _fail(field, _get(c, field), f"not supported with scheme='async' (one host; each "
            f"worker's BN statistics are its own; pushes are float32): set it to "
            f"{synchronous_only!r}")


def _validate_replicas(c) -> None:
  """Local SGD and gossip: one replica per device, no server, no all-reduce of gradients."""
  method = 'gossip' if c.server == 'gossip' else 'Local SGD'
  if c.server == 'gossip' and c.sync_every:
    _fail('sync_every', c.sync_every, "Local SGD and server='gossip' do not combine (yet): "
          "choose one")
  if c.scheme == 'async' or c.server not in ('allreduce', 'gossip'):
    _fail('sync_every', c.sync_every, f"Local SGD averages replicas with an all-reduce: it "
          f"needs scheme='sync-split' or 'sync-join' and server='allreduce', not "
          f"scheme={c.scheme!r}, server={c.server!r}")
  for field, default in (('grad_reduce', 'psum'), ('grad_reduce_dtype', 'float32')):
    if _get(c, field) != default:
      _fail(field, _get(c, field), f'{method} does not all-reduce gradients: leave it '
            f'{default!r}')
  if (c.model == 'resnet34' or c.batch_norm) and c.bn_group_size != 1:
    _fail('bn_group_size', c.bn_group_size, f'{method} trains one replica per device, whose '
          f'BatchNorm normalises over its own batch: set bn_group_size=1')


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
  if c.optimizer.name == 'lars':
    _fail('fc_parallel', c.fc_parallel, "LARS needs whole-tensor norms, which split FC layers "
          "do not have on one device: use optimizer.name='sgd'")


def num_devices(c) -> int:
  return math.prod(c.mesh.shape)


def global_batch(c) -> int:
  """Examples per step: given (sync-split), N × per-device (sync-join), or one worker's
  batch (async, where a step is one applied push), [T] ch. 3."""
  if c.scheme == 'async':
    return c.per_device_batch
  return c.global_batch if c.scheme == 'sync-split' else num_devices(c) * c.per_device_batch


def validate_devices(c, device_count: int, process_count: int) -> None:
  n = num_devices(c)
  if n != device_count:
    _fail('mesh.shape', tuple(c.mesh.shape),
          f'it has {n} devices but JAX sees {device_count}; use a shape whose product is '
          f'{device_count}, or on CPU leave config.mesh.emulate_cpu_devices=True')
  if c.scheme == 'sync-split' and c.global_batch % n:
    _fail('global_batch', c.global_batch,
          f'sync-split divides it among the {n} data devices; use a multiple of {n}')
  if c.eval_batch % n or c.eval_batch % process_count:
    _fail('eval_batch', c.eval_batch, f'use a multiple of the {n} data devices')
  if c.scheme == 'async' and process_count > 1:
    _fail('scheme', c.scheme, f'the {process_count} processes of this cluster cannot run '
          f"Downpour (one host only): choose 'sync-split' or 'sync-join', or set "
          f"distributed.cluster='none'")


def validate_schedule(c, total_steps: int) -> None:
  if c.optimizer.warmup_steps >= total_steps:
    _fail('optimizer.warmup_steps', c.optimizer.warmup_steps,
          f'must be below the run length of {total_steps} steps')


DATASET_PRESETS = ('digits', 'cifar10', 'imagenet2012', 'caltech256')

# What trains each network on the bundled digits (32², global batch 64), measured
# (docs/training.md): the learning rate for a batch of 256, scaled linearly; the epochs;
# and for SqueezeNet BatchNorm after each convolution, a variant: the published network's
# classifier ReLUs die on 32² inputs whatever the learning rate.
DIGITS_RECIPES = {
    'resnet34': dict(base_lr=0.1, num_epochs=8),
    'googlenet': dict(base_lr=0.05, num_epochs=16),
    'vgg16e': dict(base_lr=0.1, num_epochs=16),
    'squeezenet': dict(base_lr=0.02, num_epochs=16, batch_norm=True),
}


def use_network(c, model: str, preset: str) -> ml_collections.ConfigDict:
  """Sets the network, and on the bundled digits its recipe (`DIGITS_RECIPES`)."""
  c.model = model
  if preset == 'digits':
    recipe = DIGITS_RECIPES[model]
    c.optimizer.base_lr, c.optimizer.base_batch = recipe['base_lr'], 256
    c.num_epochs = recipe['num_epochs']
    c.batch_norm = recipe.get('batch_norm', c.batch_norm)
  return c


def use_dataset(c, preset: str) -> ml_collections.ConfigDict:
  """Sets dataset, input size, augmentation and run length for a known dataset.

  `caltech256` is the thesis' dataset ([T] ch. 6) as an image folder: pass its
  root with `--config.dataset.path=.../256_ObjectCategories`.
  """
  if preset == 'digits':  # bundled: trains in minutes on a CPU
    c.dataset.name = 'sklearn_digits'
    c.image_size = 32
    c.global_batch = 64
    c.num_epochs = 8
    c.optimizer.warmup_steps = 20
    c.log_every = 20
  elif preset == 'cifar10':
    c.dataset.name = 'cifar10'
    c.image_size = 32
    c.augment.flip = True
    c.global_batch = 256
    c.num_epochs = 90
    c.optimizer.warmup_steps = 500
    c.eval_every = c.checkpoint_every = 1000
  elif preset in ('imagenet2012', 'caltech256'):
    if preset == 'imagenet2012':
      c.dataset.name, c.dataset.test_split = 'imagenet2012', 'validation'
    else:
      c.dataset.name = 'image_folder'
    c.dataset.cache = False
    c.image_size = 224
    c.augment.kind = 'inception_crop'
    c.augment.flip = True
    c.global_batch = c.eval_batch = 256
    c.num_epochs = 90
    c.optimizer.weight_decay = 1e-4
    c.optimizer.warmup_steps = 5000
    c.log_every = 100
    c.eval_every = 10_000
    c.checkpoint_every = 2_000
  else:
    raise ConfigError(f'config file argument {preset!r} is invalid: choose one of '
                      f'{list(DATASET_PRESETS)}')
  return c
