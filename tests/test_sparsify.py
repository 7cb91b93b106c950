"""Sparsified gossip ([L] Algorithm 3) with error feedback: one exchange equals a numpy
reference; threshold 0 with room for every entry is plain gossip; with error feedback
the values sent over the steps plus the residual are the sum of the gradients."""
import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxpar.mesh import make_mesh
from jaxpar.parallel.gossip import Gossip, gossip_mean
from jaxpar.parallel.sparsify import (SparseGossip, capacity_of, densify, sparse_gossip_mean,
                                      with_error_feedback)
from jaxpar.step import init_state, make_train_step, to_global
from test_accounting import LINE, Tiny


def _numpy_sparse(g, threshold, k):
  flat = g.ravel()
  top = np.argsort(-np.abs(flat), kind='stable')[:k]
  out = np.zeros_like(flat)
  keep = top[np.abs(flat[top]) > threshold]
  out[keep] = flat[keep]
  return out.reshape(g.shape), len(keep)


@pytest.mark.parametrize('n, s', [(4, 1), (4, 2), (5, 2), (2, 1)])
def test_one_exchange_equals_numpy(n, s):
  mesh = make_mesh((n,), ('data',))
  rng = np.random.default_rng(n + s)
  grads = {'w': rng.normal(size=(n, 6, 5)).astype(np.float32),
           'b': rng.normal(size=(n, 7)).astype(np.float32)}
  threshold, capacity = 0.5, 0.2  # k = 6 of 30 entries, 2 of 7
  def local(g):
    mixed, _, sent, _ = sparse_gossip_mean(jax.tree.map(lambda x: x[0], g), 'data', s,
                                           threshold, capacity)
    return jax.tree.map(lambda x: x[None], mixed), sent[None]
  mixed, sent = jax.shard_map(local, mesh=mesh, in_specs=P('data'),
                              out_specs=(P('data'), P('data')))(grads)
  for key, k in (('w', 6), ('b', 2)):
    assert capacity_of(grads[key][0].size, capacity) == k
  sparse = {key: [_numpy_sparse(grads[key][i], threshold, capacity_of(grads[key][0].size,
                                                                       capacity))
                  for i in range(n)] for key in grads}
  for key in grads:
    for i in range(n):
      expected = (sparse[key][i][0] + sparse[key][(i + s) % n][0]
                  + sparse[key][(i - s) % n][0]) / 3
      np.testing.assert_allclose(mixed[key][i], expected, rtol=1e-6, atol=1e-7)
  for i in range(n):
    assert int(sent[i]) == sum(sparse[key][i][1] for key in grads)


def test_threshold_zero_and_full_capacity_is_plain_gossip():
  mesh = make_mesh((8,), ('data',))
  grads = np.random.default_rng(0).normal(size=(8, 4, 9)).astype(np.float32)
  run = lambda f: jax.shard_map(lambda g: f(g[0])[None], mesh=mesh, in_specs=P('data'),
                                out_specs=P('data'))(grads)
  for s in (1, 3):
    np.testing.assert_array_equal(
        run(lambda g: sparse_gossip_mean(g, 'data', s, 0.0, 1.0)[0]),
        run(lambda g: gossip_mean(g, 'data', s)))
  # The same for whole training steps (SGD + momentum, 3 steps, s = 1, 2, 3).
  tx = optax.sgd(0.1, momentum=0.9)
  states = []
  for strategy in (Gossip(LINE), SparseGossip(LINE, 0.0, 1.0, error_feedback=False)):
    state = init_state(Tiny(), tx, strategy, LINE, (1, 4, 4, 3), jax.random.key(0))
    step = make_train_step(Tiny(), tx, LINE, strategy)
    rng = np.random.default_rng(0)
    for _ in range(3):
      batch = {'image': rng.normal(size=(16, 4, 4, 3)).astype(np.float32),
               'label': rng.integers(0, 5, 16).astype(np.int32)}
      state, metrics = step(state, to_global(LINE, batch), jax.random.key(0))
    states.append(jax.device_get(state.params))
  for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
  # Every nonzero entry went out (exact zeros, e.g. behind dead ReLUs, are not above 0).
  assert 0.5 < float(metrics['sent_fraction']) <= 1.0


def test_error_feedback_loses_nothing():
  """Σ sent + residual = Σ gradients after every step, at 5 % capacity."""
  rng = np.random.default_rng(1)
  residual = np.zeros((20, 10), np.float32)
  total_grads, total_sent = np.zeros_like(residual), np.zeros_like(residual)
  k = capacity_of(residual.size, 0.05)
  for _ in range(6):
    g = rng.normal(size=residual.shape).astype(np.float32)
    values, index, count, residual = with_error_feedback(g, residual, 0.1, k)
    total_grads += g
    total_sent += np.asarray(densify(values, index, g))
    assert int(count) <= k
    np.testing.assert_allclose(total_sent + residual, total_grads, rtol=1e-5, atol=1e-5)
  assert np.abs(residual).sum() > 0  # something was held back


def test_sparse_gossip_reports_the_fraction_sent_and_keeps_a_residual():
  tx = optax.sgd(0.1)
  strategy = SparseGossip(LINE, threshold=0.0, capacity=0.1)
  state = init_state(Tiny(), tx, strategy, LINE, (1, 4, 4, 3), jax.random.key(0))
  step = make_train_step(Tiny(), tx, LINE, strategy)
  rng = np.random.default_rng(0)
  batch = {'image': rng.normal(size=(16, 4, 4, 3)).astype(np.float32),
           'label': rng.integers(0, 5, 16).astype(np.int32)}
  state, metrics = step(state, to_global(LINE, batch), jax.random.key(0))
  # ⌈0.1·336⌉ + ⌈0.1·7⌉ + ⌈0.1·35⌉ + ⌈0.1·5⌉ = 34 + 1 + 4 + 1 = 40 of 383 entries.
  assert float(metrics['sent_fraction']) == pytest.approx(40 / 383)
  assert float(metrics['sent_bytes']) == 2 * 40 * 8
  residual = jax.device_get(state.opt_state[1])
  nonzero = sum(int((x != 0).sum()) for x in jax.tree.leaves(residual)) / 8
  # What was not sent stays behind: never the 40 sent entries (the zero-gradient ones,
  # behind dead ReLUs, leave nothing either).
  assert 100 < nonzero <= 383 - 40
