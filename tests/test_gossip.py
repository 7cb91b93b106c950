"""Gossip ([L] Algorithm 2): one exchange equals the mixing matrix (1/3 on the diagonal and
at ±s) applied to the stacked per-device gradients; a few steps of the strategy — alone,
with Local SGD(p), with sparsification — equal a single-device simulation of every
replica."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from analysis.accuracy.gossip_sim import mixing  # numpy W_s: a partner met twice counts twice
from jaxpar.mesh import make_mesh
from jaxpar.parallel.gossip import Gossip, distances, gossip_mean, messages
from jaxpar.parallel.sparsify import SparseGossip, capacity_of
from jaxpar.step import init_state, make_train_step, model_loss, to_global
from runs import TinyResNet, assert_trees_close, init_plain, random_batches

IMAGE = (1, 16, 16, 3)


@pytest.mark.parametrize('fusion', ['per_tensor', 'one_buffer', 'by_size'])
@pytest.mark.parametrize('n, s', [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2), (8, 1), (8, 3),
                                  (8, 4)])
def test_one_exchange_applies_the_mixing_matrix(n, s, fusion):
  mesh = make_mesh((n,), ('data',))
  rng = np.random.default_rng(n * 10 + s)
  grads = {'w': rng.normal(size=(n, 3, 2)).astype(np.float32),
           'b': rng.normal(size=(n, 5)).astype(np.float32),
           'large': rng.normal(size=(n, 128, 130)).astype(np.float32)}  # over 64 KiB
  exchange = jax.jit(jax.shard_map(lambda g: gossip_mean(g, 'data', s, fusion), mesh=mesh,
                                   in_specs=P('data'), out_specs=P('data')))
  mixed = exchange(grads)
  # One permute per partner and tensor, per partner for the whole buffer, or per partner for
  # the small tensors' buffer and the large one; one partner where both are the same device.
  permutes = exchange.lower(grads).as_text().count('stablehlo.collective_permute')
  partners = 0 if n == 1 else 1 if (n, s) in ((2, 1), (4, 2), (8, 4)) else 2
  assert messages(n, s) == partners
  assert permutes == partners * {'per_tensor': 3, 'one_buffer': 1, 'by_size': 2}[fusion]
  w = mixing(n, s)
  for key in grads:
    expected = np.einsum('ij,j...->i...', w, grads[key])
    np.testing.assert_allclose(mixed[key], expected, rtol=1e-6, atol=1e-6)
  if n == 2:  # both partners are the other device: 1/3 own, 2/3 the other's
    np.testing.assert_allclose(w, [[1 / 3, 2 / 3], [2 / 3, 1 / 3]])


def test_distances_cycle_to_half_the_ring():
  assert distances(8) == [1, 2, 3, 4] and distances(4) == [1, 2]
  assert distances(3) == [1] and distances(2) == [1] and distances(1) == [1]


@pytest.mark.parametrize('every, warmup, capacity, fusion, mix', [
    (1, 0, 0.0, 'per_tensor', 'gradients'),  # gossip
    (1, 0, 0.0, 'one_buffer', 'gradients'),  # gossip, every tensor in one buffer
    (1, 0, 0.0, 'by_size', 'gradients'),     # gossip, the small tensors in one buffer
    (2, 1, 0.0, 'per_tensor', 'gradients'),  # Local SGD(2) + gossip after one exchanging step
    (2, 0, 0.3, 'per_tensor', 'gradients'),  # Local SGD(2) + sparsified gossip (30 %, EF)
    (1, 0, 0.0, 'per_tensor', 'parameters'),  # the models mixed (decentralised SGD)
    (2, 1, 0.0, 'one_buffer', 'parameters'),  # … every other step after one, in one buffer
])
def test_gossip_steps_equal_a_simulation_of_every_replica(every, warmup, capacity, fusion,
                                                          mix):
  """4 devices, 3 steps (s = 1, 2, 1), SGD + momentum: each replica's weights equal those
  of a single-device loop that computes every replica's gradient on its own rows and, on
  a step that exchanges, mixes them with W_s (sparsified in numpy first: each tensor's
  largest entries of gradient + residual, the rest kept as the residual) — or, mixing
  parameters, steps every replica on its own gradient and then mixes the replicas' weights
  and BN statistics with W_s; on the other steps each replica applies its own gradient."""
  n, steps = 4, 3
  tx = optax.sgd(0.1, momentum=0.9)
  mesh = make_mesh((n,), ('data',))
  model = TinyResNet(bn_axis_name=None)
  gossip = (SparseGossip(mesh, 0.0, capacity, True, every, warmup) if capacity
            else Gossip(mesh, every, warmup, fusion, mix))
  state = init_state(model, tx, gossip, mesh, IMAGE, jax.random.key(0))
  step = make_train_step(model, tx, mesh, gossip)
  batches = random_batches(steps, batch=8 * n)
  sent = []
  for b in batches:
    state, metrics = step(state, to_global(mesh, b), jax.random.key(7))
    sent.append(float(metrics['sent_bytes']))
  state = jax.device_get(state)

  init = init_plain(model, tx, IMAGE)
  replicas = [(init.params, init.batch_stats, init.opt_state)] * n
  residuals = [jax.tree.map(np.zeros_like, init.params)] * n
  grad_fn = jax.jit(jax.value_and_grad(
      lambda p, stats, rows: model_loss(model, p, stats, rows, jax.random.key(0)),
      has_aux=True))

  @jax.jit
  def update(grads, opt_state, params):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
  for k, b in enumerate(batches):
    grads, stats = [], []
    for i, (params, batch_stats, _) in enumerate(replicas):
      rows = {key: v[8 * i:8 * (i + 1)] for key, v in b.items()}
      (_, (_, new_stats)), g = grad_fn(params, batch_stats, rows)
      grads.append(g)
      stats.append(new_stats)
    exchanges = k < warmup or (k + 1 - warmup) % every == 0
    w = mixing(n, distances(n)[k % len(distances(n))]) if exchanges else np.eye(n)
    if exchanges and capacity:
      corrected = [jax.tree.map(lambda g, r: np.asarray(g) + r, g, r)
                   for g, r in zip(grads, residuals)]
      grads = [jax.tree.map(lambda c: _top(c, capacity), c) for c in corrected]
      residuals = [jax.tree.map(lambda c, g: c - g, c, g) for c, g in zip(corrected, grads)]
    mix_with = lambda i, trees: jax.tree.map(lambda *t: sum(w[i, j] * t[j] for j in range(n)),
                                             *trees)
    new = []
    for i, (params, _, opt_state) in enumerate(replicas):
      params, opt_state = update(mix_with(i, grads) if mix == 'gradients' else grads[i],
                                 opt_state, params)
      new.append((params, stats[i], opt_state))
    if mix == 'parameters':  # then each replica takes the mean of its partners' models
      models = [(params, batch_stats) for params, batch_stats, _ in new]
      new = [(*mix_with(i, models), opt_state) for i, (_, _, opt_state) in enumerate(new)]
    replicas = new
    assert (sent[k] > 0) == exchanges
  for i, (params, batch_stats, _) in enumerate(replicas):
    assert_trees_close(jax.tree.map(lambda x: x[i], state.params), params, rtol=1e-4, atol=1e-6)
    assert_trees_close(jax.tree.map(lambda x: x[i], state.batch_stats), batch_stats,
                       rtol=1e-4, atol=1e-6)
  # The replicas are close but not equal; evaluation reads their mean.
  kernel = jax.tree.leaves(state.params)[-1]
  assert not np.array_equal(kernel[0], kernel[1])
  np.testing.assert_allclose(jax.tree.leaves(gossip.variables(state)['params'])[-1],
                             jnp.mean(kernel, axis=0), rtol=1e-6)


def _top(x, capacity):
  """x with all but its ⌈capacity·size⌉ largest-magnitude entries zeroed (numpy)."""
  flat = np.asarray(x).ravel()
  keep = np.argsort(-np.abs(flat), kind='stable')[:capacity_of(flat.size, capacity)]
  out = np.zeros_like(flat)
  out[keep] = flat[keep]
  return out.reshape(x.shape)
