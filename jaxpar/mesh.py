"""Named device meshes from config, with CPU-device emulation."""
import os

import jax
from absl import logging
from jax.sharding import AxisType, Mesh

from jaxpar.group_batchnorm import split_for_groups


def emulate_cpu_devices(count: int) -> bool:
  """Asks XLA's CPU backend for `count` devices in this process; False if the backend
  already started.

  Only the CPU backend is affected, so this is harmless where a GPU or TPU is
  the default backend (the mesh is then validated against the real devices).
  """
  try:
    jax.config.update('jax_num_cpu_devices', count)
    return True
  except RuntimeError:  # backends initialized: the device count is what it is
    return False


def make_mesh(shape, axes, devices=None, bn_group_size: int = 0) -> Mesh:
  """A mesh of all devices, or of `devices` (e.g. the first N, to time N of them). A
  `bn_group_size` that is not a product of trailing axes splits one axis in two
  (`group_batchnorm.split_for_groups`): same devices, same order."""
  # Auto axes: shard_map and NamedSharding place the data; Explicit axes (the
  # default of jax.make_mesh) would reject replicated inputs.
  mesh = jax.make_mesh(tuple(shape), tuple(axes), axis_types=(AxisType.Auto,) * len(shape),
                       devices=devices)
  split_shape, split_axes, split = split_for_groups(shape, axes, bn_group_size)
  if split:
    logging.info('BatchNorm groups of %d devices: mesh axis %r split into %s of %s.',
                 bn_group_size, split, split_axes, split_shape)
    mesh = Mesh(mesh.devices.reshape(split_shape), split_axes,
                axis_types=(AxisType.Auto,) * len(split_shape))
  local = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
  cores = len(os.sched_getaffinity(0))
  if jax.default_backend() == 'cpu' and local > cores:
    logging.info('%d emulated CPU devices share this process\'s %d core%s: fine for '
                 'correctness and communication volume, not for speed.', local, cores,
                 's' if cores > 1 else '')
  return mesh
