"""Local SGD / model averaging ([S], [L] Algorithm 1): τ = 1 is synchronous SGD; with τ = k
the replicas differ between averaging points and are identical right after; warm-up
steps are synchronous; a resumed run equals an uninterrupted one; hierarchical Local SGD
(groups synchronous inside) equals a simulation of the groups."""
import math
import re

import jax
import numpy as np
import optax
import pytest

from jaxpar.checkpoint import Checkpoints
from jaxpar.mesh import make_mesh
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.parallel.averaging import LocalSGD
from jaxpar.parallel.servers import CentralServer
from jaxpar.perfmodel import hlo
from jaxpar.step import init_state, make_train_step, model_loss, to_global
from runs import TinyResNet, assert_trees_close, init_plain, random_batches, sharded_run

IMAGE = (1, 16, 16, 3)
TX = optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.05, momentum=0.9, nesterov=True))


def _states(strategy, mesh, batches):
  """The state after every step (on the host)."""
  model = TinyResNet(bn_axis_name=None)  # each replica normalises over its own batch
  state = init_state(model, TX, strategy, mesh, IMAGE, jax.random.key(0))
  step = make_train_step(model, TX, mesh, strategy)
  states = []
  for b in batches:
    state, _ = step(state, to_global(mesh, b), jax.random.key(7))
    states.append(jax.device_get(state))
  return states


def _replicas_equal(tree):
  return all(np.array_equal(x[0], x[i]) for x in jax.tree.leaves(tree) for i in range(len(x)))


@pytest.mark.parametrize('inner, bn_group_size', [((), 1), (('y',), 4)])
def test_averaging_every_step_is_synchronous_sgd(inner, bn_group_size):
  """With momentum, Nesterov and weight decay: the update is linear in the gradient. With
  groups of 4 (the 'y' axis) synchronous inside (hierarchical), all-reduce training over
  all 8 devices too (BatchNorm within each group of 4 in both)."""
  mesh = make_mesh((2, 4), ('x', 'y'))
  batches = random_batches(3, batch=32)
  local = LocalSGD(mesh, every=1, inner_axes=inner)
  state, losses = sharded_run(TinyResNet(), TX, mesh, batches, local,
                              bn_group_size=bn_group_size)
  ref, ref_losses = sharded_run(TinyResNet(), TX, mesh, batches, AllReduce(mesh.axis_names),
                                bn_group_size=bn_group_size)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert_trees_close(state.params, ref.params, rtol=1e-4, atol=1e-6)
  assert_trees_close(state.batch_stats, ref.batch_stats, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('warmup', [0, 2])
def test_replicas_differ_between_averaging_points_and_agree_after(warmup):
  mesh = make_mesh((8,), ('data',))
  states = _states(LocalSGD(mesh, every=3, warmup=warmup), mesh, random_batches(warmup + 3, batch=32))
  averaged_after = set(range(1, warmup + 1)) | {warmup + 3}  # steps, counted from 1
  for step, state in enumerate(states, 1):
    same = step in averaged_after
    assert _replicas_equal(state.params) == same, step
    assert _replicas_equal(state.batch_stats) == same, step
  # The model that is evaluated is the replicas' mean.
  middle = states[warmup]  # one local step after the last average
  np.testing.assert_allclose(
      jax.tree.leaves(LocalSGD(mesh, 3).variables(middle)['params'])[0],
      np.mean(jax.tree.leaves(middle.params)[0], axis=0), rtol=1e-6)


def test_replica_spread_and_one_replica_read_from_the_per_device_state():
  """`replica_spread` is max_i ‖w_i − w̄‖ / ‖w̄‖ over every parameter (numpy's, on the
  state after 2 local steps; 0 but rounding right after an average); `replica_variables` is
  device i's own copy."""
  mesh = make_mesh((8,), ('data',))
  local = LocalSGD(mesh, every=3)
  states = _states(local, mesh, random_batches(3, batch=32))
  leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(states[1].params)]
  flat = np.concatenate([x.reshape(8, -1) for x in leaves], axis=1)
  mean = flat.mean(0)
  expected = max(np.linalg.norm(r - mean) for r in flat) / np.linalg.norm(mean)
  assert expected > 1e-4
  assert local.replica_spread(states[1]) == pytest.approx(expected, rel=1e-4)
  assert local.replica_spread(states[2]) < 1e-6  # averaged after the third step (rounding)
  own = local.replica_variables(states[1], 5)
  for mine, stacked in zip(jax.tree.leaves(own), jax.tree.leaves(
      {'params': states[1].params, 'batch_stats': states[1].batch_stats})):
    np.testing.assert_array_equal(mine, stacked[5])


def test_resumed_local_sgd_equals_the_uninterrupted_run(tmp_path):
  """Checkpointed between averaging points, where every replica is its own."""
  mesh = make_mesh((8,), ('data',))
  local = LocalSGD(mesh, every=2)
  model = TinyResNet(bn_axis_name=None)
  step = make_train_step(model, TX, mesh, local)
  fresh = lambda: init_state(model, TX, local, mesh, IMAGE, jax.random.key(0))
  batches = [to_global(mesh, b) for b in random_batches(4, batch=32)]
  whole = fresh()
  for b in batches:
    whole, _ = step(whole, b, jax.random.key(7))
  state = fresh()
  for b in batches[:3]:
    state, _ = step(state, b, jax.random.key(7))
  assert not _replicas_equal(jax.device_get(state.params))
  checkpoints = Checkpoints(str(tmp_path), every=3, keep=1)
  checkpoints.save(3, state)
  checkpoints.close()
  restored = Checkpoints(str(tmp_path), every=3, keep=1).restore_latest(fresh())
  restored, _ = step(restored, batches[3], jax.random.key(7))
  assert_trees_close(jax.device_get(restored), jax.device_get(whole), rtol=1e-6, atol=1e-7)


def test_hierarchical_local_sgd_equals_a_simulation_of_the_groups():
  """Mesh 2×4, groups of 4 ('y'), τ = 2, 3 steps: every device holds its group's replica,
  which equals one device training on the group's 16 rows (BatchNorm over them), the two
  groups' replicas averaged after step 2 only."""
  mesh = make_mesh((2, 4), ('x', 'y'))
  batches = random_batches(3, batch=32)
  local = LocalSGD(mesh, every=2, inner_axes=('y',))
  model = TinyResNet(bn_axis_name=('y',))
  state = init_state(model, TX, local, mesh, IMAGE, jax.random.key(0))
  step = make_train_step(model, TX, mesh, local)
  sent = []
  for b in batches:
    state, metrics = step(state, to_global(mesh, b), jax.random.key(7))
    sent.append(float(metrics['sent_bytes']))
  state = jax.device_get(state)

  plain = TinyResNet(bn_axis_name=None)
  init = init_plain(plain, TX, IMAGE)
  groups = [(init.params, init.batch_stats, init.opt_state)] * 2
  grad_fn = jax.jit(jax.value_and_grad(
      lambda p, stats, rows: model_loss(plain, p, stats, rows, jax.random.key(0)),
      has_aux=True))
  for k, b in enumerate(batches):
    new = []
    for g, (params, stats, opt_state) in enumerate(groups):
      rows = {key: v[16 * g:16 * (g + 1)] for key, v in b.items()}
      (_, (_, stats)), grads = grad_fn(params, stats, rows)
      updates, opt_state = TX.update(grads, opt_state, params)
      new.append((optax.apply_updates(params, updates), stats, opt_state))
    if (k + 1) % 2 == 0:
      mean = jax.tree.map(lambda a, b: (a + b) / 2, (new[0][0], new[0][1]), (new[1][0], new[1][1]))
      new = [(*mean, opt_state) for _, _, opt_state in new]
    groups = new
  for d in range(8):
    params, stats, _ = groups[d // 4]
    assert_trees_close(jax.tree.map(lambda x: x[d], state.params), params, rtol=1e-4, atol=1e-6)
    assert_trees_close(jax.tree.map(lambda x: x[d], state.batch_stats), stats, rtol=1e-4,
                       atol=1e-6)
  # Every step all-reduces the gradients within the group (3/4 of them out of each
  # device, twice); step 2 also averages the model over all 8 devices.
  assert sent[0] == sent[2] < sent[1]


def _copied_state_bytes(compiled_text: str) -> int:
  """Bytes of the program's parameters (its inputs: the donated state, the batch) that its
  entry computation copies whole."""
  entry = compiled_text[compiled_text.index('\nENTRY'):]
  shapes = {name: (dtype, dims) for name, dtype, dims in
            re.findall(r'%(param[\w.]*) = (\w+)\[([\d,]*)\]\S* parameter\(', entry)}
  copied = 0
  for name in re.findall(r' copy\(%(param[\w.]*)\)', entry):
    dtype, dims = shapes[name]
    copied += hlo.BYTES[dtype] * math.prod(int(d) for d in dims.split(',') if d)
  return copied


@pytest.mark.parametrize('make', [lambda mesh: LocalSGD(mesh, every=4),
                                  lambda mesh: CentralServer(mesh)], ids=['local_sgd', 'central'])
def test_a_per_device_state_is_updated_where_it_lies(make):
  """A state with a copy per device (`layouts.PerDevice`: a leading dimension of one on each
  device) is updated as it lies: the compiled step copies none of its donated parameter
  or optimizer buffers. Reshaped to the tensors' own shapes for the update and back, XLA
  copied every one of them every step (ResNet34 32²'s Local SGD step on 2 processes
  1.2-1.3 x the all-reduce step's time, sending nothing). Gossip's step still copies
  part of its state (its exchange's branches)."""
  mesh = make_mesh((2,), ('data',))
  strategy = make(mesh)
  model = TinyResNet(bn_axis_name=None)
  state = init_state(model, TX, strategy, mesh, IMAGE, jax.random.key(0))
  step = make_train_step(model, TX, mesh, strategy)
  batch = to_global(mesh, random_batches(1, batch=8)[0])
  text = step.lower(state, batch, jax.random.key(7)).compile().as_text()
  kernels = sum(x.nbytes for x in jax.tree.leaves(state.params) if x.ndim > 2)
  assert _copied_state_bytes(text) < 0.01 * kernels
