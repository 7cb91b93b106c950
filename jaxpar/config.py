"""The run's configuration: defaults, dataset presets and per-network recipes.

Config files in `configs/` start from `defaults()` and override what they need. This
module is a leaf (it imports nothing of jaxpar's, nor JAX or TensorFlow), so a config
file loads in milliseconds; `jaxpar/validation.py` checks a config, with one clear
`ConfigError` per bad field, and settles the fields left `auto` for the chosen method.
"""
import copy
import math

import ml_collections
from ml_collections import config_dict

EVAL_BATCH = 256  # the evaluation's global batch where config.eval_batch is unset
SCHEMES = ('sync-split', 'sync-join', 'async')  # and 'auto': settled by jaxpar.plan
SERVERS = ('allreduce', 'central', 'distributed', 'gossip')
# JAX's cluster detectors (jax.distributed.initialize's names), plus auto and none.
CLUSTERS = ('auto', 'none', 'slurm', 'ompi', 'mpi4py', 'gketpu', 'gcetpu', 'k8s')
COLLECTIVE_THREADS = ('idle', 'normal')  # gloo's event-loop threads' priority
DTYPES = ('float32', 'bfloat16', 'float16')
REDUCE_DTYPES = ('float32', 'bfloat16')
LOSS_SCALINGS = ('auto', 'dynamic', 'none')
ASYNC_BACKENDS = ('threads', 'ray')
LR_STALENESS = ('none', 'inverse')


class ConfigError(ValueError):
  """A config field has a value the run cannot use."""


class RunError(RuntimeError):
  """A run that cannot go on (e.g. every asynchronous worker lost), said in one line."""


def defaults() -> ml_collections.ConfigDict:
  """Every field with its default, area by area (each `_area(c)` below sets its own)."""
  c = ml_collections.ConfigDict()
  for area in (_network_and_compute, _data, _methods, _distributed, _scheme_and_plan, _async,
               _run):
    area(c)
  return c


def _network_and_compute(c) -> None:
  """The network, the compute dtype, and how its convolutions, host memory and compiled
  programs are handled."""
  c.model = 'resnet34'          # resnet34 | vgg16e | googlenet | squeezenet
  c.shortcut = 'projection'     # ResNet34 only: projection | zero_pad ([T] ch. 2)
  c.batch_norm = False          # VGG16E/GoogLeNet/SqueezeNet: add BN after each conv (not in the originals)
  # Mixed precision ([Y] §3): `dtype` is the compute dtype of convolutions,
  # activations and the input; parameters, optimizer state, BN statistics and the
  # loss stay float32. Gradients are reduced in `grad_reduce_dtype`.
  c.dtype = 'float32'           # float32 | bfloat16 | float16
  c.grad_reduce_dtype = 'float32'  # float32 | bfloat16 (half the bytes on the wire)
  # float16's small gradients flush to zero unless the loss is scaled: dynamic = scale it,
  # skip steps whose gradients overflow and adjust the scale (jaxpar/step.py: LossScale);
  # none; auto = dynamic for dtype='float16', none otherwise.
  c.loss_scaling = 'auto'
  # How convolutions are computed (jaxpar/models/conv.py): auto = on the CPU backend
  # oneDNN's convolutions (jaxpar/models/onednn.py): float32 above small output maps (one
  # matmul per kernel tap on those: XLA's CPU convolutions are slow there), every bfloat16
  # one; XLA's on GPU/TPU; onednn; xla; taps; im2col; winograd; measured.
  c.conv_impl = 'auto'
  # Host memory (jaxpar/host_memory.py): keep = glibc keeps freed memory for reuse in one
  # arena, so XLA's CPU temporaries above 32 MiB are not mapped and faulted in again every
  # step (ResNet34 at 32², batch 16, one device: 92 → 68 ms a step); mapped = the same
  # with each thread's own arena (up to 64 MiB of temporaries; no shared lock); system =
  # malloc as is; auto = on the CPU backend keep above 64 MiB of a step's temporaries
  # (estimated before the backend starts; GoogLeNet: 400, models.KEEP_ABOVE), mapped below;
  # system where an accelerator's plugin is installed.
  c.host_memory = 'auto'
  # JAX's persistent compilation cache for jaxpar.train (jaxpar/compile_cache.py): a run
  # started again loads its compiled programs. auto = JAX's setting where the environment
  # makes one, else ~/.cache/jaxpar/xla for one process, none across processes (a folder
  # every process sees must be named); off; or a folder.
  c.compilation_cache = 'auto'


def _data(c) -> None:
  """The dataset, the input size and the augmentation."""
  c.dataset = ml_collections.ConfigDict()
  c.dataset.name = 'sklearn_digits'  # a TFDS name, 'image_folder' or 'synthetic'
  c.dataset.data_dir = ''            # TFDS data_dir ('' = TFDS default)
  c.dataset.train_split = 'train'
  c.dataset.test_split = 'test'
  c.dataset.path = ''                # image_folder: root with one sub-folder per class
  c.dataset.test_percent = 20        # image_folder: share of files held out for test
  # synthetic: random size² images with random labels (benchmarks without a dataset,
  # as PyTorch's FakeData); the pipeline resizes them to image_size as any dataset's.
  c.dataset.synthetic = ml_collections.ConfigDict()
  c.dataset.synthetic.classes = 10
  c.dataset.synthetic.channels = 3
  c.dataset.synthetic.size = 32
  c.dataset.synthetic.train_examples = 1024
  c.dataset.synthetic.test_examples = 256
  c.dataset.cache = True             # keep the train split's records in memory (TFDS: encoded)
  # global: every process reads the train split in one order and keeps its part of each
  # global batch, so the examples at a step do not depend on the number of processes (a
  # run resumes on another number exactly); per_process: each reads its own 1/P of the
  # split (less reading on many hosts; the order then depends on P). data/sources.py.
  c.dataset.order = 'global'
  # Evaluation batches (decoded, resized, float32) kept in host memory after an
  # evaluation's first pass and replayed by the next ones where a split's fit in this many
  # MiB per process (0: read every time): the digits' 1,437 training images at 16²: 1.5 MiB.
  c.dataset.eval_cache_mb = 1024
  c.dataset.shuffle_buffer = 50_000
  # A TFDS dataset not yet prepared in data_dir is downloaded and prepared, after a 3 s
  # check that the internet is reachable (cluster nodes often have none: then one line
  # says how to prepare it elsewhere). False: never download.
  c.dataset.download = True
  # Who decodes and augments the training images: 'tf' (tf.data, on the host's cores) or
  # 'dali' (NVIDIA DALI, `pip install -e '.[dali]'`: on the GPU where JAX runs on one, else
  # on the cores), fed the same examples, windows and flips (jaxpar/data/dali.py).
  c.dataset.decoder = 'tf'

  c.image_size = 32
  c.augment = ml_collections.ConfigDict()
  c.augment.kind = 'pad_crop'   # pad_crop | inception_crop | none
  c.augment.crop_padding = 4
  c.augment.flip = False


def _methods(c) -> None:
  """The mesh and the parallel method: [T]'s servers, Local SGD, gossip, hybrid FC, BN
  groups."""
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
  # gossip: what the ring neighbours mix. gradients = [L]'s Algorithm 2 as written: on 2
  # devices each replica takes 2/3 of its partner's gradient and the two climb apart
  # (docs/accuracy.md); parameters = each replica steps on its own gradient, then takes
  # the same 1/3 mean of its own and its partners' weights and BN statistics
  # (decentralised SGD, Lian et al. 2017), which pulls the replicas together.
  c.gossip_mix = 'gradients'
  # central: serial = one worker at a time ([T] eq. 4.4, best case; the semaphore
  # of §7.2), parallel = all at once (eq. 4.7, worst case).
  c.central_schedule = 'serial'
  # distributed: which device owns what. even = 1/N of every tensor; greedy = [T]'s
  # Algorithm 3.7, whole tensors to the least-loaded device; auto = greedy for
  # scheme='async' (whole tensors on their owners, as [T]), even otherwise.
  c.placement = 'auto'
  # How gradients are summed over the data axes: psum (XLA's all-reduce), ring
  # ([L]: ppermute ring over all devices), torus2d ([Y]: a 2-axis mesh only).
  c.grad_reduce = 'psum'
  # psum and gossip: one_buffer sends every gradient as one buffer per dtype (one call
  # instead of one per tensor, for the price of copying the gradients in and out);
  # by_size the tensors under 64 KiB in one buffer and each larger one alone, as PyTorch
  # DDP's buckets bundle small gradients. auto = by_size (measured at or ahead of the
  # faster of the two, in one process and across: docs/performance.md); the distributed
  # server (not settable) sends one buffer across processes, per tensor within one.
  c.grad_fusion = 'auto'
  # Local SGD / model averaging ([S], [L]): > 0 trains one replica per device and
  # averages parameters and BN statistics every `sync_every` steps (1 = synchronous
  # SGD), after `local_sgd_warmup` fully synchronous steps. 0 = off.
  c.sync_every = 0
  c.local_sgd_warmup = 0
  # Hierarchical Local SGD: the devices of each group of this many (a product of trailing
  # mesh axes, e.g. one host's) all-reduce their gradients every step and train one
  # replica; the groups' replicas are averaged every `sync_every` steps. 1 = a replica
  # per device.
  c.local_sgd_group_size = 1
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
  # of trailing mesh axes (mesh (2, 4): 1, 4 or 8). 0 = all devices. Unset (None) =
  # auto: 1 for Local SGD and gossip (each device trains its own replica), else 0.
  c.bn_group_size = config_dict.placeholder(int)


def _distributed(c) -> None:
  """Several processes forming one mesh."""
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
  # gloo's TCP event-loop threads at idle priority (multihost.IdleGlooLoops: a small collective
  # across processes then takes ~0.1 ms, not a 4 ms timer tick; back at normal priority for a
  # while when another process busy on their core starves them) | 'normal'
  c.distributed.collective_threads = 'idle'


def _scheme_and_plan(c) -> None:
  """[T]'s scheme, the batch it splits, and jaxpar.plan's settings."""
  # [T] ch. 3: sync-split divides `global_batch` among the devices (= sequential
  # training); sync-join gives each device `per_device_batch` (global = N × per-device);
  # async (Downpour SGD) lets every device train on its own `per_device_batch`
  # batches, the server (central or distributed) applying each gradient as it arrives.
  # auto: jaxpar.train first runs jaxpar.plan (or reads `plan.file`) and trains with the
  # scheme, server, N and BN grouping it predicts to reach `plan.target_*` soonest.
  c.scheme = 'sync-split'
  c.global_batch = 128
  # jaxpar.plan (python -m jaxpar.plan, or scheme='auto'; docs/plan.md).
  c.plan = ml_collections.ConfigDict()
  c.plan.file = ''              # a plan.json to train with (scheme='auto'): none = make one
  c.plan.stop_at_target = False  # scheme='auto': end the run where the target is reached
  c.plan.target_loss = 0.0      # the target: a training-set loss (whole split, unaugmented) ...
  c.plan.target_accuracy = 0.0  # ... or a test top-1 (0-1); exactly one
  c.plan.budget_s = 0.0         # seconds the plan may measure for (0: bounded by steps)
  c.plan.eval_every = 20        # the serial run's evaluations (and B_noise readings)
  c.plan.eval_share = 0.1       # the metric's cost ≤ this share of the serial run (0: whole split)
  c.plan.max_steps = 2000       # the serial run's cap (beyond: K extrapolated)
  c.plan.seeds = 2              # serial (and each family's) runs at seed, seed + 1, ...: K's spread
  c.plan.cache = True           # reuse t_grad and the calls' costs of an earlier plan (plan/cache.py)
  c.plan.noise_batches = 4      # gradients per B_noise reading (0: none, perfect scaling)
  # The methods beside synchronous SGD whose steps to the target the plan measures (runs on
  # the run's devices: BN per device, Local SGD at the largest and smallest period; Downpour's
  # staleness simulated on one device) and ranks; () = synchronous SGD with BN over all only.
  c.plan.methods = ('bn_device', 'local_sgd', 'async')
  c.plan.periods = (2, 4, 8)    # Local SGD's averaging periods τ ranked
  c.plan.measure_top = 4        # candidates whose steps are timed, fastest predicted first ...
  c.plan.close = 2.0            # ... among those predicted within this factor of the best
  c.plan.measure_steps = 10     # steps of a timed window (and t_grad calls)
  c.plan.measure_windows = 3    # timed windows of each measured candidate
  c.plan.tie_windows = 9        # a tie judged round by round on fewer: its rows timed up to this


def _async(c) -> None:
  """Downpour's workers and servers."""
  # Downpour (scheme='async'; jaxpar/parallel/async_sgd.py, async_ray.py, docs/async.md).
  c.async_sgd = ml_collections.ConfigDict()
  # threads: a thread per device of this process (one host); ray: a Ray actor (process)
  # per worker, on this machine or a Ray cluster, going on when workers die.
  c.async_sgd.backend = 'threads'
  c.async_sgd.ray_address = ''      # ray: a cluster's address; '' = $RAY_ADDRESS, else a local Ray
  # A worker's push is held (the worker waits, stale-synchronous style) while applying it
  # would let an older gradient's staleness exceed this; at least N - 1. None = no bound
  # (Downpour as published).
  c.async_sgd.max_staleness = config_dict.placeholder(int)
  c.async_sgd.lr_staleness = 'none'  # none | inverse: the update's rate divided by its staleness
  c.async_sgd.restart_workers = 0   # ray: how often Ray restarts each lost worker (0 = never)
  c.async_sgd.gpus_per_worker = 0.0  # ray: GPUs each worker actor reserves (1 on a GPU cluster)
  # ray: CPUs each worker actor reserves, and so its OpenMP threads (oneDNN's convolutions:
  # Ray sets OMP_NUM_THREADS to them). 0 = the cluster's CPUs / workers, at least 1 (logged).
  c.async_sgd.cpus_per_worker = 0


def _run(c) -> None:
  """Batches, run length, the optimizer and its schedule, logging and checkpoints."""
  c.per_device_batch = 16
  # Global; the last batch is padded and masked. Unset (default): EVAL_BATCH, rounded up to a
  # multiple of the data devices (`validation.settle`, logged where it differs).
  c.eval_batch = config_dict.placeholder(int)
  # Gradient accumulation: every device takes its share of an update's batch in this
  # many micro-batches, one after another, and the update applies their mean gradient
  # (communication once per update; a batch larger than memory). BatchNorm normalises
  # each micro-batch on its own (jaxpar/step.py: gradients).
  c.grad_accum_steps = 1

  c.total_steps = 0             # > 0 wins; otherwise num_epochs sets the length
  c.num_epochs = 10.0

  c.optimizer = ml_collections.ConfigDict()
  c.optimizer.name = 'sgd'      # sgd | lars (You et al. 2017) | adam | adamw ([T] ch. 3: Adam)
  c.optimizer.schedule = 'cosine'  # cosine | poly | constant: warm-up, then cosine or (1 - t)^poly_power decay, or none
  c.optimizer.poly_power = 2.0
  c.optimizer.trust_coefficient = 0.001  # lars: η of the trust ratio η·‖w‖/‖g + λw‖
  c.optimizer.base_lr = 0.1     # for a global batch of base_batch, scaled by lr_scaling
  c.optimizer.base_batch = 256
  # How the rate follows the global batch: linear ([Y] §3: base_lr × batch/base_batch),
  # sqrt, or none (base_lr as given); auto = linear for sgd/lars, none for adam/adamw.
  c.optimizer.lr_scaling = 'auto'
  c.optimizer.momentum = 0.9    # sgd, lars
  c.optimizer.nesterov = True   # sgd, lars
  c.optimizer.b1 = 0.9          # adam, adamw: [T] ch. 3's (Kingma & Ba's) defaults
  c.optimizer.b2 = 0.999
  c.optimizer.eps = 1e-8
  c.optimizer.weight_decay = 5e-4   # kernels only (as lars' trust ratio): not biases, BN scale/bias
  c.optimizer.warmup_steps = 50

  c.seed = 0
  c.log_every = 10
  c.eval_every = 0              # 0 = only at the end
  c.checkpoint_every = 100
  c.keep_checkpoints = 3
  c.stop_after_steps = 0        # > 0: checkpoint and exit after this many steps (time-limited jobs)


def method(c) -> str:
  """The parallel method a config selects, decided here once: `build.strategy` builds it,
  `analysis` labels it and counts its bytes. One of: hybrid (fc_parallel), async
  (Downpour), sparse_gossip and gossip (with Local SGD(p) when sync_every is set),
  local_sgd, central, distributed, allreduce."""
  if c.fc_parallel != 'data':
    return 'hybrid'
  if c.scheme == 'async':
    return 'async'
  if c.server == 'gossip':
    return 'sparse_gossip' if c.sparsify.capacity else 'gossip'
  if c.sync_every:
    return 'local_sgd'
  return c.server


def num_devices(c) -> int:
  """The mesh's devices: the workers of every scheme (async on Ray: its worker actors)."""
  return math.prod(c.mesh.shape)


def has_batch_norm(c) -> bool:
  """Whether the network normalises its batches: ResNet34 always, the others with
  `batch_norm=True` (a variant, not the published network)."""
  return c.model == 'resnet34' or bool(c.batch_norm)


def on_ray(c) -> bool:
  """Downpour with Ray's actors as workers and servers (`async_sgd.backend='ray'`)."""
  return c.scheme == 'async' and c.async_sgd.backend == 'ray'


def eval_batch(c) -> int:
  """The evaluation's global batch: `eval_batch` where set, else EVAL_BATCH rounded up to a
  multiple of the devices that evaluate (`driver_devices`), as `validation.settle` sets it."""
  if c.eval_batch is not None:
    return c.eval_batch
  n = driver_devices(c)
  return -(-EVAL_BATCH // n) * n


def driver_devices(c) -> int:
  """The devices of this process's mesh: every worker's, or (on Ray) one, the driver's,
  which evaluates while the actors train."""
  return 1 if on_ray(c) else num_devices(c)


def with_overrides(c, overrides: dict):
  """A copy of config `c` with `overrides` ({'field.sub': value}) set."""
  c = copy.deepcopy(c)
  c.unlock()
  c.update_from_flattened_dict(overrides)
  return c


def global_batch(c) -> int:
  """Examples per step: given (sync-split), N × per-device (sync-join), or one worker's
  batch (async, where a step is one applied push), [T] ch. 3. The run's sizes are
  decided here and in `device_batch`; the stream of a process reads its
  `global_batch / process count`."""
  if c.scheme == 'async':
    return c.per_device_batch
  return c.global_batch if c.scheme == 'sync-split' else num_devices(c) * c.per_device_batch


def run_steps(c, train_examples: int) -> int:
  """The run's length in steps: `total_steps` where set, else `num_epochs` passes over the
  `train_examples` of the train split (all processes' shares) at the `global_batch`."""
  return c.total_steps or math.ceil(c.num_epochs * train_examples / global_batch(c))


def device_batch(c) -> int:
  """Examples one device computes per step (async: per push); with `grad_accum_steps`
  = k, in k micro-batches of `device_batch / k`."""
  if c.scheme == 'sync-split':
    return c.global_batch // num_devices(c)
  return c.per_device_batch


DATASET_PRESETS = ('digits', 'cifar10', 'imagenet2012', 'caltech256')

# What trains each network on the bundled digits (32², global batch 64), measured
# (docs/training.md): the learning rate for a batch of 256, scaled linearly; the epochs;
# and for SqueezeNet BatchNorm after each convolution, a variant: the published network's
# classifier ReLUs die on 32² inputs whatever the learning rate.
DIGITS_RECIPES = {
    'resnet34': dict(base_lr=0.1, num_epochs=8),
    'googlenet': dict(base_lr=0.05, num_epochs=16),
    'vgg16e': dict(base_lr=0.1, num_epochs=16),
    'squeezenet': dict(base_lr=0.1, num_epochs=16, batch_norm=True),
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
    c.global_batch = 256
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


def from_file(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """A config file's `get_config(arg)` (its default without one), as `--config PATH[:ARG]`
  reads it: for the tools and tests that build a config outside a command line."""
  import importlib.util
  import os
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config() if arg is None else module.get_config(arg)
