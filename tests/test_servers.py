"""[T]'s central and distributed parameter servers against all-reduce: same training;
the central server alone updates; 1/N of the optimizer state per device with the
distributed one; checkpoints of every layout resume exactly."""
import functools

import jax
import numpy as np
import optax
import pytest

from jaxpar import config as config_lib
from jaxpar.checkpoint import Checkpoints
from jaxpar.mesh import make_mesh
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.perfmodel.hlo import collectives
from jaxpar.parallel.servers import CentralServer, DistributedServer, Packing, greedy_owners
from jaxpar.step import init_state, init_variables, make_train_step, to_global
from runs import TinyResNet, assert_trees_close, random_batches, sharded_run

IMAGE = (1, 16, 16, 3)


def _optimizer(name, strategy):
  c = config_lib.defaults().optimizer
  c.name, c.weight_decay, c.momentum = name, 1e-3, 0.9
  params = jax.eval_shape(lambda: init_variables(TinyResNet(), IMAGE, jax.random.key(0)))['params']
  rate = {'lars': 0.5, 'adamw': 0.01}.get(name, 0.05)
  return strategy.make_optimizer(c, optax.constant_schedule(rate), params)


@functools.cache
def _all_reduce_run(name):
  mesh = make_mesh((2, 4), ('x', 'y'))
  allreduce = AllReduce(mesh.axis_names)
  return sharded_run(TinyResNet(), _optimizer(name, allreduce), mesh,
                     random_batches(3, batch=32), allreduce)


def _assert_trains_like_all_reduce(name, server):
  mesh = server.mesh
  state, losses = sharded_run(TinyResNet(), _optimizer(name, server), mesh,
                              random_batches(3, batch=32), server)
  ref, ref_losses = _all_reduce_run(name)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert losses[2] != losses[0]
  # Adam's step is m/(√v + ε), whatever the gradient's size: for a weight whose gradients
  # are small, the programs' different summation orders (the greedy placement's packed
  # vectors) move it by a few 1e-6 (one element in 576 at 1.5e-4 of its value, compiled with
  # XLA's older CPU emitters, tests/conftest.py): atol 1e-5 is 1e-3 of one step (rate 0.01).
  assert_trees_close(state.params, ref.params, rtol=1e-4, atol=1e-5 if name == 'adamw' else 1e-6)
  assert_trees_close(state.batch_stats, ref.batch_stats, rtol=1e-4, atol=1e-6)
  return state


@pytest.mark.parametrize('placement,one_buffer', [('even', False), ('even', True),
                                                   ('greedy', False)])
@pytest.mark.parametrize('name', ['sgd', 'lars'])
def test_distributed_server_trains_like_all_reduce(name, placement, one_buffer):
  """Three steps of SGD + momentum, or of LARS (whose trust ratios need whole-tensor norms,
  summed over the owners of a tensor's slices), give the all-reduce parameters; the even
  placement's runs travel per tensor or in one buffer (across processes)."""
  _assert_trains_like_all_reduce(
      name, DistributedServer(make_mesh((2, 4), ('x', 'y')), placement=placement,
                              one_buffer=one_buffer))


@pytest.mark.parametrize('server', ['distributed even', 'distributed greedy', 'central'])
def test_adamw_under_every_server_trains_like_all_reduce(server):
  """[T] ch. 3's optimizer: Adam's moments live with the owners of the weights (the greedy
  placement's packed vectors, the central server's device 0) and weight decay is decoupled
  per kernel: three steps give the all-reduce parameters."""
  mesh = make_mesh((2, 4), ('x', 'y'))
  kind, _, placement = server.partition(' ')
  _assert_trains_like_all_reduce('adamw', CentralServer(mesh) if kind == 'central'
                                 else DistributedServer(mesh, placement=placement))


@pytest.mark.parametrize('schedule', ['serial', 'parallel'])
@pytest.mark.parametrize('name', ['sgd', 'lars'])
def test_central_server_trains_like_all_reduce(name, schedule):
  state = _assert_trains_like_all_reduce(
      name, CentralServer(make_mesh((2, 4), ('x', 'y')), schedule=schedule))
  # Only the server (device 0) ran the optimizer: the workers' momentum is still zero.
  momentum = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 1]
  assert all(np.any(m[0] != 0) for m in momentum)
  assert all(np.all(m[1:] == 0) for m in momentum)


@pytest.mark.parametrize('schedule', ['serial', 'parallel'])
def test_central_server_moves_the_network_through_one_device(schedule):
  """The lowered step: N−1 pushes of the gradients to device 0, N−1 pulls of the weights
  from it, each one collective-permute of the whole (fused) network; serial chains
  them with optimization barriers, parallel does not."""
  mesh = make_mesh((4,), ('data',))
  server = CentralServer(mesh, schedule=schedule)
  tx = _optimizer('sgd', server)
  model = TinyResNet(bn_axis_name=mesh.axis_names)
  state = init_state(model, tx, server, mesh, IMAGE, jax.random.key(0))
  text = make_train_step(model, tx, mesh, server).lower(
      state, to_global(mesh, random_batches(1, batch=8)[0]), jax.random.key(0)).as_text()
  size = sum(x.size for x in jax.tree.leaves(server.variables(state)['params']))
  permutes = [c for c in collectives(text) if c.op == 'collective_permute']
  assert [c.shape for c in permutes] == [(size,)] * 6
  assert ('optimization_barrier' in text) == (schedule == 'serial')


def _bytes_per_device(tree):
  """Bytes of the per-element state (momentum) on one device; scalar counters aside."""
  return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree) if x.ndim)


def test_distributed_optimizer_state_is_one_nth_per_device():
  """Read from the arrays' shards on device 0, not from a formula."""
  mesh = make_mesh((8,), ('data',))
  sizes, servers = {}, {}
  for name, strategy in [('replicated', AllReduce(mesh.axis_names)),
                         ('even', DistributedServer(mesh, placement='even')),
                         ('greedy', DistributedServer(mesh, placement='greedy'))]:
    tx = _optimizer('sgd', strategy)
    state = init_state(TinyResNet(), tx, strategy, mesh, IMAGE, jax.random.key(0))
    sizes[name], servers[name] = _bytes_per_device(state.opt_state), strategy
  # Even: each tensor's slice is ⌈size/8⌉, a little over 1/8 for the small tensors.
  assert 1 / 8 <= sizes['even'] / sizes['replicated'] < 1 / 8 * 1.05, sizes
  # Greedy: whole tensors; every device's vector is as long as the largest load.
  loads = servers['greedy'].packing.loads
  assert sum(loads) * 4 == sizes['replicated']
  assert sizes['greedy'] == max(loads) * 4 < sizes['replicated'] / 2


def test_greedy_placement_is_algorithm_3_7():
  """Each tensor in turn to the least-loaded unit, the lowest index on ties."""
  assert greedy_owners([5, 3, 3, 2, 2], 2) == ([0, 1, 1, 0, 1], [7, 8])
  assert greedy_owners([1, 1, 1], 4) == ([0, 1, 2], [1, 1, 1, 0])
  packing = Packing.build([5, 3, 3, 2, 2], 2, 'greedy')
  flats = np.split(np.arange(1, 16, dtype=np.float32), [5, 8, 11, 13])  # 0 marks padding
  rows = np.asarray(packing.rows(flats))
  # Device 1 holds tensors 1, 2, 4 whole (elements 6..11 and 14..15); device 0 is padded.
  assert rows[1].tolist() == [6, 7, 8, 9, 10, 11, 14, 15]
  assert rows[0].tolist() == [1, 2, 3, 4, 5, 12, 13, 0]
  for d in range(2):
    assert np.asarray(packing.row(flats, d)).tolist() == rows[d].tolist()
  assert [f.tolist() for f in packing.unpack(rows)] == [f.tolist() for f in flats]
  assert packing.layouts() == (((0, 5), (3, 2)), ((1, 3), (2, 3), (4, 2)))


def test_even_placement_splits_every_tensor():
  """Device d holds run d of every tensor, ⌈size/N⌉ long, the last run padded."""
  packing = Packing.build([5, 3], 2, 'even')
  flats = [np.arange(1, 6, dtype=np.float32), np.arange(6, 9, dtype=np.float32)]
  rows = np.asarray(packing.rows(flats))
  assert rows.tolist() == [[1, 2, 3, 6, 7], [4, 5, 0, 8, 0]]
  for d in range(2):
    assert np.asarray(packing.row(flats, d)).tolist() == rows[d].tolist()
  assert [f.tolist() for f in packing.unpack(rows)] == [f.tolist() for f in flats]
  assert packing.loads == (5, 3)


@pytest.mark.parametrize('kind', [DistributedServer, CentralServer])
def test_server_checkpoint_resumes_exactly(tmp_path, kind):
  """The owner-sharded and the one-copy-per-device layouts save and restore as laid out."""
  mesh = make_mesh((2, 4), ('x', 'y'))
  server = kind(mesh)
  tx = _optimizer('sgd', server)
  model = TinyResNet(bn_axis_name=mesh.axis_names)
  step = make_train_step(model, tx, mesh, server)
  fresh = lambda: init_state(model, tx, server, mesh, IMAGE, jax.random.key(0))
  batches = [to_global(mesh, b) for b in random_batches(4, batch=32)]

  state = fresh()
  for b in batches:
    state, _ = step(state, b, jax.random.key(7))
  whole = jax.device_get(state)

  checkpoints = Checkpoints(str(tmp_path), every=2, keep=1)
  state = fresh()
  for i, b in enumerate(batches[:2]):
    state, _ = step(state, b, jax.random.key(7))
  checkpoints.save(2, state)
  checkpoints.close()
  restored = Checkpoints(str(tmp_path), every=2, keep=1).restore_latest(fresh())
  assert int(restored.step) == 2
  opt_leaf = next(x for x in jax.tree.leaves(restored.opt_state) if x.ndim)
  assert opt_leaf.sharding.spec == jax.sharding.PartitionSpec(('x', 'y'))  # still laid out
  for b in batches[2:]:
    restored, _ = step(restored, b, jax.random.key(7))
  assert_trees_close(jax.device_get(restored.params), whole.params, rtol=1e-6, atol=1e-7)
  assert_trees_close(jax.device_get(restored.opt_state), whole.opt_state, rtol=1e-6, atol=1e-7)
