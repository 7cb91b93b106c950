"""From a validated config to what a run needs: the mesh, the model, the optimizer, the
initial state, the train step and the input stream. `train.py` and the benchmarks in
`analysis/` build a run the same way."""
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import config as config_lib
from jaxpar import mesh as mesh_lib
from jaxpar import models, optim
from jaxpar.data import pipeline
from jaxpar.parallel.allreduce import mean_all_reduce
from jaxpar.parallel.group_batchnorm import group_axes
from jaxpar.step import TrainState, make_train_step


def mesh(cfg):
  """Joins a multi-process run if configured, emulates CPU devices if asked, and
  builds the mesh. Must run before anything else starts JAX's backend."""
  mesh_lib.initialize_distributed(**cfg.distributed)
  if cfg.mesh.emulate_cpu_devices:
    mesh_lib.emulate_cpu_devices(config_lib.num_devices(cfg) // cfg.distributed.num_processes)
  config_lib.validate_devices(cfg, jax.device_count(), jax.process_count())
  return mesh_lib.make_mesh(cfg.mesh.shape, cfg.mesh.axes)


def model(cfg, num_classes: int, mesh):
  kwargs = dict(num_classes=num_classes, dtype=jnp.dtype(cfg.dtype),
                bn_axis_name=group_axes(cfg.mesh.shape, mesh.axis_names, cfg.bn_group_size))
  if cfg.model == 'resnet34':
    kwargs['shortcut'] = cfg.shortcut
  else:
    kwargs['batch_norm'] = cfg.batch_norm
  return models.MODELS[cfg.model](**kwargs)


def optimizer(cfg, global_batch: int, total_steps: int):
  """(optax transformation, learning-rate schedule)."""
  schedule = optim.learning_rate(cfg.optimizer, global_batch, total_steps)
  return optim.make_optimizer(cfg.optimizer, schedule), schedule


def initial_state(cfg, model, tx, channels: int, mesh, rng) -> TrainState:
  """Freshly initialised parameters, BN statistics and optimizer state, replicated."""
  def init():
    # BN's axis name is bound only inside shard_map; the parameters do not depend on it.
    variables = model.clone(bn_axis_name=None).init(
        {'params': rng, 'dropout': rng},
        jnp.zeros((1, cfg.image_size, cfg.image_size, channels)), train=True)
    return TrainState(step=jnp.int32(0), examples_seen=jnp.int32(0), params=variables['params'],
                      batch_stats=variables.get('batch_stats', {}),
                      opt_state=tx.init(variables['params']))
  return jax.jit(init, out_shardings=NamedSharding(mesh, P()))()


def train_step(cfg, model, tx, mesh):
  reduce_grads = mean_all_reduce(mesh.axis_names, cfg.grad_reduce,
                                 jnp.dtype(cfg.grad_reduce_dtype))
  return make_train_step(model, tx, mesh, reduce_grads)


def train_batches(cfg, source, global_batch: int, start: int):
  """This process's share of the training stream from global example `start`, as numpy."""
  return pipeline.train_batches(
      source, batch=global_batch // jax.process_count(), start=start // jax.process_count(),
      seed=cfg.seed, image_size=cfg.image_size, augment=cfg.augment.kind,
      crop_padding=cfg.augment.crop_padding, flip=cfg.augment.flip,
      shuffle_buffer=cfg.dataset.shuffle_buffer, cache=cfg.dataset.cache)
