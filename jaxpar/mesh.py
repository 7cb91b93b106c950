"""Named device meshes from config, with CPU-device emulation."""
import math
import os

import jax
from absl import logging
from jax.sharding import AxisType, Mesh


def initialize_distributed(coordinator: str, num_processes: int, process_id: int) -> None:
  """Joins this process to a multi-process run (jax.distributed; gloo collectives on CPU).

  Must run before JAX starts its backend. A no-op for a single process.
  """
  if coordinator:
    jax.distributed.initialize(coordinator, num_processes, process_id)
    logging.info('Process %d of %d (coordinator %s).', process_id, num_processes, coordinator)


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
  if jax.default_backend() == 'cpu' and math.prod(shape) > (os.cpu_count() or 1):
    logging.info('Emulating %d CPU devices on %d cores: fine for correctness and '
                 'communication volume, not for speed.', math.prod(shape), os.cpu_count())
  return mesh
