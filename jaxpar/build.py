"""From a validated config to what a run needs: the mesh, the model, the parallel
strategy, the optimizer, the initial state and the input stream. `train.py` and the
benchmarks in `analysis/` build a run the same way."""
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from absl import logging

from jaxpar import config as config_lib
from jaxpar import mesh as mesh_lib
from jaxpar import compile_cache, host_memory, models, multihost, optim, validation
from jaxpar.data import pipeline, sources
from jaxpar.models import live_taps
from jaxpar.models.conv import conv_general_dilated
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.parallel.async_ray import RayDownpour
from jaxpar.parallel.async_sgd import AsyncServer, Downpour
from jaxpar.parallel.averaging import LocalSGD
from jaxpar.parallel.gossip import Gossip
from jaxpar.parallel.hybrid import MODEL_AXIS, HybridFC, choose_split
from jaxpar.group_batchnorm import group_axes
from jaxpar.parallel.servers import CentralServer, DistributedServer
from jaxpar.parallel.sparsify import SparseGossip
from jaxpar.step import Synchronous, TrainState, init_state, init_variables, make_train_step


def mesh(cfg):
  """Joins a multi-process run if configured (or the cluster's environment says so),
  emulates CPU devices if asked, and builds the mesh. Must run before anything else
  starts JAX's backend."""
  keep_freed_memory(cfg)
  processes = multihost.join(**cfg.distributed)
  if config_lib.on_ray(cfg):  # the workers are Ray's actors; this process evaluates
    mesh_lib.emulate_cpu_devices(1)
    logging.info('Downpour on Ray: %d worker actors; this process (the driver) evaluates on '
                 'one device.', config_lib.num_devices(cfg))
    validation.validate_devices(cfg, 1, jax.process_count())
    return driver_mesh(cfg)
  if cfg.mesh.emulate_cpu_devices:
    mesh_lib.emulate_cpu_devices(config_lib.num_devices(cfg) // processes)
  logging.info('%s', multihost.describe_process())
  validation.validate_devices(cfg, jax.device_count(), jax.process_count())
  n, devices = config_lib.num_devices(cfg), None
  if n < jax.device_count():  # one process only (validate_devices): the first n
    logging.info('The mesh uses %d of the %d devices JAX sees (the first).', n, jax.device_count())
    devices = jax.devices()[:n]
  return mesh_lib.make_mesh(cfg.mesh.shape, cfg.mesh.axes, devices=devices,
                            bn_group_size=cfg.bn_group_size)


def driver_mesh(cfg):
  """Downpour on Ray's mesh in this process, the driver's: its first device (the workers
  are Ray's actors, each with devices of its own)."""
  return mesh_lib.make_mesh((1,), cfg.mesh.axes[:1], devices=jax.devices()[:1])


def keep_freed_memory(cfg, batch: int | None = None) -> bool:
  """`host_memory.keep_freed_memory` as `config.host_memory` says, for 'auto' on the CPU
  sized by this config's step (`estimated_temporaries`; `batch`: the largest device batch
  of the steps the process will run, if not the config's own). Before JAX's backend starts."""
  return host_memory.keep_freed_memory(
      cfg.host_memory, functools.partial(estimated_temporaries, cfg, batch),
      models.KEEP_ABOVE.get(cfg.model))


def estimated_temporaries(cfg, batch: int | None = None) -> int | None:
  """`step_temporaries` of this config's dataset (`sources.classes_and_channels`, else
  `UNKNOWN_DATASET`'s, logged), or None where the step cannot be sized (logged: a setting's
  estimate must not end the run)."""
  known = sources.classes_and_channels(cfg.dataset)
  if known is None:
    logging.info('host_memory=auto: the dataset is not prepared yet, so its classes and '
                 'channels are not known before the backend starts: the step is sized with '
                 '%d and %d.', *UNKNOWN_DATASET)
  try:
    return step_temporaries(cfg, *(known or UNKNOWN_DATASET), batch=batch)
  except Exception as e:  # noqa: BLE001
    logging.warning('host_memory=auto: the step could not be sized before the backend '
                    'starts (%s: %s).', type(e).__name__, e)
    return None


# Classes and channels a step is sized with where the dataset cannot tell before it is
# opened (`sources.classes_and_channels`): ImageNet's, the most a network here is given.
UNKNOWN_DATASET = (1000, 3)


def step_temporaries(cfg, num_classes: int, channels: int, batch: int | None = None) -> int:
  """About the bytes one device's training step holds as XLA's temporaries, found without
  starting JAX's backend (`host_memory='auto'` decides before it starts): the gradients (the
  parameters' size in float32) and the activations the backward pass keeps (the residuals
  of `jax.vjp` of the loss that have the batch as their leading dimension) of one
  micro-batch of the device batch (`batch`, else `config.device_batch`), traced abstractly
  with XLA's convolutions and flax's pooling, which ask no backend. Against the compiled
  one-device step's memory analysis (jax 0.10.2, 2026-11-29; docs/performance.md):
  0.86-1.33 × the temporaries of SqueezeNet-BN, GoogLeNet and ResNet34 at 16², batch
  32-640 (VGG16E at 32²: 0.90 ×)."""
  from jaxpar.models import pooling
  from jaxpar.step import model_loss
  # flax's pooling: the CPU's asks which backend it is
  network = _network(cfg, num_classes, None, 'xla').clone(
      pool=functools.partial(pooling.max_pool, forward='flax'))
  b = max(1, (batch or config_lib.device_batch(cfg)) // max(1, cfg.grad_accum_steps))
  shape = (b, cfg.image_size, cfg.image_size, channels)

  def residuals(variables, images, labels):
    stats = variables.get('batch_stats', {})
    loss = lambda params: model_loss(network, params, stats, {'image': images, 'label': labels},
                                     jax.random.key(0))[0]
    return jax.vjp(loss, variables['params'])[1]

  variables = jax.eval_shape(lambda: init_variables(network, (1, *shape[1:]),
                                                    jax.random.key(0)))
  kept = jax.eval_shape(residuals, variables, jax.ShapeDtypeStruct(shape, jnp.float32),
                        jax.ShapeDtypeStruct((b,), jnp.int32))
  params = jax.tree.leaves(variables['params'])
  shapes = {p.shape for p in params}
  size = lambda x: math.prod(x.shape) * jnp.dtype(x.dtype).itemsize
  activations = sum(size(x) for x in jax.tree.leaves(kept)
                    if hasattr(x, 'shape') and x.ndim and x.shape[0] == b
                    and x.shape not in shapes)
  return int(sum(math.prod(p.shape) * 4 for p in params) + activations)


def _network(cfg, num_classes: int, bn_axis_name, conv_impl: str):
  kwargs = dict(num_classes=num_classes, dtype=jnp.dtype(cfg.dtype), bn_axis_name=bn_axis_name,
                conv=functools.partial(nn.Conv, conv_general_dilated=conv_general_dilated(
                    conv_impl)))
  if cfg.model == 'resnet34':
    kwargs['shortcut'] = cfg.shortcut
  else:
    kwargs['batch_norm'] = cfg.batch_norm
  return models.MODELS[cfg.model](**kwargs)


def model(cfg, num_classes: int, channels: int, mesh):
  """The network, its FC layers split over the 'model' axis as `fc_parallel` decides."""
  network = _network(cfg, num_classes,
                     group_axes(mesh.axis_sizes, mesh.axis_names, cfg.bn_group_size),
                     cfg.conv_impl)
  if cfg.fc_parallel == 'data':
    return network
  r = dict(zip(mesh.axis_names, mesh.devices.shape))[MODEL_AXIS]
  try:
    split = choose_split(_abstract_params(cfg, network, channels), network.FC_LAYERS,
                         cfg.fc_parallel, config_lib.device_batch(cfg), r)
  except ValueError as e:
    raise config_lib.ConfigError(f'config.fc_parallel={cfg.fc_parallel!r} is invalid: {e}; '
                                 f"use 'auto' or a 'model' axis size that divides it") from None
  logging.info('FC layers split over the %d-device model axis: %s.', r, ', '.join(split) or 'none')
  return network.clone(fc_axis=MODEL_AXIS, fc_split=split)


def strategy(cfg, mesh, model):
  """The parallel method of `config.scheme`, `config.server` and the like: how gradients
  are combined, the weights updated and the state laid out."""
  dtype = jnp.dtype(cfg.grad_reduce_dtype)
  # psum's and gossip's exchanges: by size unless set (docs/performance.md). The distributed
  # server's even placement: one buffer across processes, where every call costs a latency.
  fusion = 'by_size' if cfg.grad_fusion == 'auto' else cfg.grad_fusion
  one_buffer = jax.process_count() > 1
  every = cfg.sync_every or 1  # gossip: exchange on every p-th step (Local SGD(p) + gossip)
  make = {
      'hybrid': lambda: HybridFC(mesh, MODEL_AXIS, model.fc_split, dtype,
                                 config_lib.device_batch(cfg), cfg.dtype),
      'async': lambda: AsyncServer(mesh, cfg.server, config_lib.num_devices(cfg)),
      'sparse_gossip': lambda: SparseGossip(mesh, cfg.sparsify.threshold, cfg.sparsify.capacity,
                                            cfg.sparsify.error_feedback, every,
                                            cfg.local_sgd_warmup),
      'gossip': lambda: Gossip(mesh, every, cfg.local_sgd_warmup, fusion, cfg.gossip_mix),
      'local_sgd': lambda: LocalSGD(mesh, cfg.sync_every, cfg.local_sgd_warmup, group_axes(
          mesh.axis_sizes, mesh.axis_names, cfg.local_sgd_group_size)),
      'central': lambda: CentralServer(mesh, dtype, cfg.central_schedule),
      'distributed': lambda: DistributedServer(mesh, dtype, cfg.placement, one_buffer),
      # The live taps only matter where there is a sum: one device's build skips the trace.
      'allreduce': lambda: AllReduce(mesh.axis_names, cfg.grad_reduce, dtype, fusion,
                                     live_taps.boxes(model, cfg.image_size)
                                     if mesh.size > 1 else None),
  }
  return make[config_lib.method(cfg)]()


def optimizer(cfg, model, channels: int, strategy, global_batch: int, total_steps: int,
              params=None):
  """(optax transformation, learning-rate schedule), for the strategy's layout; `params`:
  the model's parameters or their shapes, where the caller has them (else traced here)."""
  schedule = optim.learning_rate(cfg.optimizer, global_batch, total_steps)
  if params is None:
    params = _abstract_params(cfg, model, channels)
  return strategy.make_optimizer(cfg.optimizer, schedule, params), schedule


def seed_keys(seed: int):
  """(the network's initialisation key, the dropout stream's key) of a run with
  `config.seed=seed`. Whatever must start where `jaxpar.train` starts (the plan's serial run
  and timed steps, time-to-accuracy, the collapse study) takes its keys from here."""
  rng_init, rng_dropout = jax.random.split(jax.random.key(seed))
  return rng_init, rng_dropout


def initial_state(cfg, model, tx, strategy, channels: int, mesh, rng,
                  abstract: bool = False, variables=None) -> TrainState:
  """Freshly initialised parameters, BN statistics and optimizer state, in the
  strategy's layout on the mesh (`abstract`: their shapes and shardings only; `variables`:
  the model's initial ones, made already: `step.init_state`)."""
  return init_state(model, tx, strategy, mesh, _input_shape(cfg, channels), rng,
                    loss_scaling=cfg.loss_scaling == 'dynamic', abstract=abstract,
                    variables=variables)


def timing_steps(cfg) -> int:
  """A run length for the tools that time steps (`analysis/`): the schedule never ends
  within their steps."""
  return max(1000, cfg.optimizer.warmup_steps + 1)


def for_timing(cfg, num_classes: int, channels: int, mesh, abstract: bool = False,
               variables=None):
  """(model, strategy, tx, state) of a config on a mesh, for the tools that time its steps
  (`analysis/`, `jaxpar.plan`), with a schedule of `timing_steps`; `abstract`: the state's
  shapes and shardings only (`timing_state` makes the state itself); `variables`: the
  model's initial ones, made already (`timing_state`), whose shapes need no tracing."""
  network = model(cfg, num_classes, channels, mesh)
  method = strategy(cfg, mesh, network)
  tx, _ = optimizer(cfg, network, channels, method, config_lib.global_batch(cfg),
                    total_steps=timing_steps(cfg),
                    params=None if variables is None else variables['params'])
  return network, method, tx, timing_state(cfg, network, tx, method, channels, mesh, abstract,
                                           variables)


def timing_state(cfg, model, tx, strategy, channels: int, mesh, abstract: bool = False,
                 variables=None):
  """`for_timing`'s state: the same seed whether made with it or afterwards (or from the
  model's `variables`, made already)."""
  return initial_state(cfg, model, tx, strategy, channels, mesh, jax.random.key(0), abstract,
                       variables)


def loop(cfg, model, tx, mesh, strategy, source, state, steps: int, rng, train_step=None):
  """`loop(state) -> (state, metrics)`, called `steps` times from `state`: one synchronous
  step on the next global batch, or (async) one applied push of a worker's batch.
  `train_step`: a synchronous scheme's `make_train_step`, made already (`jaxpar.plan`
  lowers it first to read its collectives; calling that one reuses its trace)."""
  a = cfg.async_sgd
  if config_lib.on_ray(cfg):  # each worker reads its own shard, where it runs
    return RayDownpour(model, tx, strategy, functools.partial(worker_batches, cfg), steps, rng,
                       workers=config_lib.num_devices(cfg), micro_batches=cfg.grad_accum_steps,
                       max_staleness=a.max_staleness, lr_staleness=a.lr_staleness,
                       restart_workers=a.restart_workers, gpus_per_worker=a.gpus_per_worker,
                       cpus_per_worker=a.cpus_per_worker, address=a.ray_address,
                       # the driver's choice: the actors' steps are the run's
                       host_memory=host_memory.applied() or cfg.host_memory,
                       compile_cache=compile_cache.applied())
  start = int(state.examples_seen)
  # A step's examples: the global batch, or (async) one worker's push.
  batches = train_batches(cfg, source, config_lib.global_batch(cfg), start)
  if config_lib.method(cfg) == 'async':
    return Downpour(model, tx, strategy, batches, steps, rng, cfg.grad_accum_steps,
                    a.max_staleness, a.lr_staleness)
  return Synchronous(train_step or make_train_step(model, tx, mesh, strategy,
                                                  cfg.grad_accum_steps),
                     pipeline.prefetch_to_device(batches, mesh), rng)


def _input_shape(cfg, channels):
  return (1, cfg.image_size, cfg.image_size, channels)


def abstract_variables(cfg, model, channels) -> dict:
  """The model's {'params', 'batch_stats'?} as shapes and dtypes (nothing is computed)."""
  return jax.eval_shape(lambda: init_variables(model, _input_shape(cfg, channels),
                                               jax.random.key(0)))


def _abstract_params(cfg, model, channels):
  return abstract_variables(cfg, model, channels)['params']


def train_batches(cfg, source, global_batch: int, start: int):
  """This process's share of the training stream from global example `start`, as numpy."""
  return pipeline.train_batches(
      source, batch=global_batch // jax.process_count(), start=source.stream_start(start),
      seed=cfg.seed, image_size=cfg.image_size, augment=cfg.augment.kind,
      crop_padding=cfg.augment.crop_padding, flip=cfg.augment.flip,
      shuffle_buffer=cfg.dataset.shuffle_buffer, cache=cfg.dataset.cache,
      decoder=cfg.dataset.decoder)


def worker_batches(cfg, worker: int, position: int):
  """Asynchronous worker `worker`'s shard (`worker` of N) of the training stream, from its
  batch `position` on, as numpy: what a Ray worker reads where it runs."""
  workers = config_lib.num_devices(cfg)
  source = sources.open_source(cfg.dataset, shard=(worker, workers))
  return pipeline.train_batches(
      source, batch=cfg.per_device_batch,
      start=source.stream_start(position * cfg.per_device_batch * workers),
      seed=cfg.seed, image_size=cfg.image_size, augment=cfg.augment.kind,
      crop_padding=cfg.augment.crop_padding, flip=cfg.augment.flip,
      shuffle_buffer=cfg.dataset.shuffle_buffer, cache=cfg.dataset.cache,
      decoder=cfg.dataset.decoder)
