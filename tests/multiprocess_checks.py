"""One process of the cross-process checks in test_multiprocess.py, and the checks
themselves (the test runs the same functions on one process with 8 devices).

  SLURM_JOB_ID=1 SLURM_STEP_NODELIST=127.0.0.1 SLURM_NTASKS=2 SLURM_PROCID=I \
  SLURM_LOCALID=I JAX_COORDINATOR_PORT=PORT python tests/multiprocess_checks.py OUT.npz

Joins a jax.distributed run on loopback the way a SLURM job step does (JAX's cluster
detection reads the variables above), emulates 8 / processes CPU devices and, on
a 2×4 mesh spanning all processes (this process feeding its rows of each global batch):
reduces multi-megabyte buffers, and trains TinyResNet for 3 steps with each landed
strategy. Process 0 saves every result.
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax import lax  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxpar import config as config_lib  # noqa: E402
from jaxpar import mesh as mesh_lib  # noqa: E402
from jaxpar import multihost  # noqa: E402
from jaxpar import collectives  # noqa: E402
from jaxpar.parallel.allreduce import AllReduce  # noqa: E402
from jaxpar.parallel.averaging import LocalSGD  # noqa: E402
from jaxpar.parallel.gossip import Gossip  # noqa: E402
from jaxpar.parallel.servers import CentralServer, DistributedServer  # noqa: E402
from jaxpar.step import init_state, init_variables, make_train_step, to_global  # noqa: E402
from runs import TinyResNet, random_batches  # noqa: E402

# Odd, so no collective's chunks divide it evenly; 16 MB of float32 per device.
REDUCED_SIZE = 4_000_037
STRATEGIES = ('allreduce', 'torus2d', 'ring', 'central', 'distributed', 'local_sgd', 'gossip')


def _host(tree):
  """Global arrays → numpy on every process (gathered if sharded across processes)."""
  return jax.tree.map(lambda x: np.asarray(
      x if x.is_fully_replicated else multihost_utils.process_allgather(x, tiled=True)), tree)


def reductions(mesh) -> dict:
  """psum (one buffer, as gradients cross processes), the ring and the 2-D torus, and the
  reduce-scatter and all-gather of the distributed server, of a buffer per device whose
  values are integers: any order of summation gives the exact sum."""
  axes = mesh.axis_names
  rng = np.random.default_rng(0)
  data = rng.integers(-1000, 1000, (mesh.size, REDUCED_SIZE)).astype(np.float32)
  sharding = NamedSharding(mesh, P(axes))
  x = jax.make_array_from_callback(data.shape, sharding, lambda index: data[index])

  # One program per collective: several large gloo collectives in one program ran
  # 100× slower here (16-33 s instead of 0.1-0.2 s each).
  ops = {'psum': (lambda v: collectives.fused_psum(v, axes), P()),
         'ring': (lambda v: collectives.ring_psum(v, axes), P()),
         'torus2d': (lambda v: collectives.torus2d_psum(v, axes), P()),
         'reduce_scatter': (lambda v: lax.psum_scatter(v[:mesh.size * 1000], axes, tiled=True),
                            P(axes)),
         'all_gather': (lambda v: lax.all_gather(v[:1000], axes, tiled=True, to='invarying'),
                        P())}
  results = {'expected_sum': data.sum(axis=0)}
  for name, (op, spec) in ops.items():
    program = jax.jit(jax.shard_map(lambda v: op(v[0]), mesh=mesh, in_specs=P(axes),
                                    out_specs=spec))
    results[name] = _host(program(x))
  return results


def strategy(name, mesh):
  axes = mesh.axis_names
  return {'allreduce': lambda: AllReduce(axes, fusion='one_buffer'),
          'torus2d': lambda: AllReduce(axes, 'torus2d'),
          'ring': lambda: AllReduce(axes, 'ring'),
          'central': lambda: CentralServer(mesh),
          'distributed': lambda: DistributedServer(mesh, one_buffer=True),
          'local_sgd': lambda: LocalSGD(mesh, every=2),
          'gossip': lambda: Gossip(mesh, fusion='one_buffer')}[name]()


def train(name, mesh, batches) -> dict:
  """3 steps of SGD + momentum with strategy `name`: losses and the model's variables.
  `batches` are this process's rows of each global batch."""
  replicas = name in ('local_sgd', 'gossip')  # each replica normalises over its own batch
  model = TinyResNet(bn_axis_name=None if replicas else mesh.axis_names)
  method = strategy(name, mesh)
  opt = config_lib.defaults().optimizer
  opt.weight_decay, opt.momentum = 1e-3, 0.9
  image = (1,) + batches[0]['image'].shape[1:]
  params = jax.eval_shape(lambda: init_variables(model, image, jax.random.key(0)))['params']
  tx = method.make_optimizer(opt, optax.constant_schedule(0.05), params)
  state = init_state(model, tx, method, mesh, image, jax.random.key(0))
  step = make_train_step(model, tx, mesh, method)
  losses = []
  for batch in batches:
    state, metrics = step(state, to_global(mesh, batch), jax.random.key(7))
    losses.append(float(metrics['loss']))
  return {'losses': np.array(losses), **{
      f'{jax.tree_util.keystr(path)}': leaf
      for path, leaf in jax.tree_util.tree_leaves_with_path(_host(method.variables(state)))}}


def local_rows(batches, process_id, num_processes):
  rows = len(batches[0]['label']) // num_processes
  return [{k: v[process_id * rows:(process_id + 1) * rows] for k, v in b.items()}
          for b in batches]


def main(out):
  num_processes = multihost.join('', 1, 0, 'auto', 120, 60)
  mesh_lib.emulate_cpu_devices(8 // num_processes)
  process_id = jax.process_index()
  assert jax.process_count() == num_processes > 1 and jax.device_count() == 8
  mesh = mesh_lib.make_mesh((2, 4), ('x', 'y'))
  results = {f'reduce/{k}': v for k, v in reductions(mesh).items()}
  batches = local_rows(random_batches(3, batch=32), process_id, num_processes)
  for name in STRATEGIES:
    results.update({f'{name}/{k}': v for k, v in train(name, mesh, batches).items()})
  # gloo's TCP loop thread(s), found by their system call (read while they wait: a few tries),
  # and their scheduling policy: multihost.join set them to SCHED_IDLE.
  loops = []
  for _ in range(50):
    loops = multihost.gloo_loop_threads()
    if loops:
      break
    time.sleep(0.1)
  results['bn_gathered'] = np.array(collectives.gathers_small_sums())
  results['gloo_loops_idle'] = np.array(multihost.wait_for_idle_gloo_loops(10.0))
  results['gloo_loop_ids'] = np.array(loops, np.int64)
  results['gloo_loop_policies'] = np.array([os.sched_getscheduler(t) for t in loops], np.int64)
  results['gloo_loop_history'] = np.array(json.dumps(multihost.gloo_loop_history()))
  if process_id == 0:
    np.savez(out, **results)


if __name__ == '__main__':
  main(sys.argv[1])
