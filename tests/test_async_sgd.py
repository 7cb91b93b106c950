"""Downpour SGD ([T] §3.2) with a central server: one worker is sequential SGD exactly;
with N workers every batch is applied once, staleness stays below N, the loss falls."""
import collections

import jax
import numpy as np
import optax

from jaxpar.parallel.async_sgd import CentralServer, gradient_fn, train
from jaxpar.step import init_variables
from test_step import TinyResNet, _assert_trees_close, _batches, _reference_run

IMAGE = (1, 16, 16, 3)


def _server(tx, device):
  variables = init_variables(TinyResNet(), IMAGE, jax.random.key(0))
  return CentralServer(variables['params'], variables['batch_stats'], tx, device)


def test_one_worker_is_sequential_sgd():
  tx = optax.sgd(0.1, momentum=0.9)
  batches = _batches(4, batch=16)
  server = _server(tx, jax.devices()[0])
  log = train(server, gradient_fn(TinyResNet()), [jax.devices()[1]], [batches], jax.random.key(3))
  ref, ref_losses = _reference_run(TinyResNet(), tx, batches)
  assert [u.staleness for u in log] == [0, 0, 0, 0]
  np.testing.assert_allclose([u.loss for u in log], ref_losses, rtol=1e-5)
  _assert_trees_close(jax.device_get(server.params), ref.params, rtol=1e-5, atol=1e-6)
  _assert_trees_close(jax.device_get(server.batch_stats), ref.batch_stats, rtol=1e-5, atol=1e-6)


def test_four_workers_apply_every_batch_once_on_the_newest_weights():
  """Free-running Downpour has no staleness bound (a slow worker's gradient meets every
  push made meanwhile); what holds is that each gradient is computed on weights pulled
  after the worker's own previous push was applied, and every batch is applied once."""
  tx = optax.sgd(0.05)
  workers = 4
  per_worker = [_learnable_batches(6, batch=16, seed=w) for w in range(workers)]
  server = _server(tx, jax.devices()[0])
  log = train(server, gradient_fn(TinyResNet()), jax.devices()[1:1 + workers], per_worker,
              jax.random.key(3))
  applied = collections.Counter((u.worker, u.batch) for u in log)
  assert applied == collections.Counter({(w, b): 1 for w in range(workers) for b in range(6)})
  assert server.version == len(log) == 24
  assert [u.version + u.staleness for u in log] == list(range(24))  # applied in order
  position = {(u.worker, u.batch): i for i, u in enumerate(log)}
  for u in log:
    if u.batch:
      assert u.version >= position[(u.worker, u.batch - 1)] + 1
  assert all(u.staleness >= 0 for u in log)
  losses = [u.loss for u in log]
  assert np.mean(losses[-6:]) < 0.85 * np.mean(losses[:6])


def _learnable_batches(n, batch, seed):
  """Each class is a fixed pattern plus noise: a loss that falls over 24 fresh batches."""
  patterns = np.random.default_rng(99).normal(size=(5, 16, 16, 3)).astype(np.float32)
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    labels = rng.integers(0, 5, batch).astype(np.int32)
    images = patterns[labels] + 0.5 * rng.normal(size=(batch, 16, 16, 3)).astype(np.float32)
    out.append({'image': images, 'label': labels})
  return out
