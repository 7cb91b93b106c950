"""Local SGD / model averaging ([S], [L] Algorithm 1): τ = 1 is synchronous SGD; with τ = k
the replicas differ between averaging points and are identical right after; warm-up
steps are synchronous; a resumed run equals an uninterrupted one."""
import jax
import numpy as np
import optax
import pytest

from jaxpar.checkpoint import Checkpoints
from jaxpar.mesh import make_mesh
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.parallel.averaging import LocalSGD
from jaxpar.step import init_state, make_train_step, to_global
from test_step import TinyResNet, _assert_trees_close, _batches, _sharded_run

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


def test_averaging_every_step_is_synchronous_sgd():
  """With momentum, Nesterov and weight decay: the update is linear in the gradient."""
  mesh = make_mesh((2, 4), ('x', 'y'))
  batches = _batches(3, batch=32)
  local = LocalSGD(mesh, every=1)
  state, losses = _sharded_run(TinyResNet(), TX, mesh, batches, local, bn_group_size=1)
  ref, ref_losses = _sharded_run(TinyResNet(), TX, mesh, batches, AllReduce(mesh.axis_names),
                                 bn_group_size=1)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  _assert_trees_close(state.params, ref.params, rtol=1e-4, atol=1e-6)
  _assert_trees_close(state.batch_stats, ref.batch_stats, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('warmup', [0, 2])
def test_replicas_differ_between_averaging_points_and_agree_after(warmup):
  mesh = make_mesh((8,), ('data',))
  states = _states(LocalSGD(mesh, every=3, warmup=warmup), mesh, _batches(warmup + 3, batch=32))
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


def test_resumed_local_sgd_equals_the_uninterrupted_run(tmp_path):
  """Checkpointed between averaging points, where every replica is its own."""
  mesh = make_mesh((8,), ('data',))
  local = LocalSGD(mesh, every=2)
  model = TinyResNet(bn_axis_name=None)
  step = make_train_step(model, TX, mesh, local)
  fresh = lambda: init_state(model, TX, local, mesh, IMAGE, jax.random.key(0))
  batches = [to_global(mesh, b) for b in _batches(4, batch=32)]
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
  _assert_trees_close(jax.device_get(restored), jax.device_get(whole), rtol=1e-6, atol=1e-7)
