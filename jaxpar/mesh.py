"""Named device meshes from config, with CPU-device emulation."""
import os

import jax
from absl import logging
from jax.sharding import AxisType, Mesh


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


def make_mesh(shape, axes, devices=None) -> Mesh:
  """A mesh of all devices, or of `devices` (e.g. the first N, to time N of them)."""
  # Auto axes: shard_map and NamedSharding place the data; Explicit axes (the
  # default of jax.make_mesh) would reject replicated inputs.
  mesh = jax.make_mesh(tuple(shape), tuple(axes), axis_types=(AxisType.Auto,) * len(shape),
                       devices=devices)
  local = sum(d.process_index == jax.process_index() for d in mesh.devices.flat)
  cores = len(os.sched_getaffinity(0))
  if jax.default_backend() == 'cpu' and local > cores:
    logging.info('%d emulated CPU devices share this process\'s %d core%s: fine for '
                 'correctness and communication volume, not for speed.', local, cores,
                 's' if cores > 1 else '')
  return mesh
