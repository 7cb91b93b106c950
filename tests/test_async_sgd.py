"""Downpour SGD ([T] §3.2) with a central or a distributed server: one worker is sequential
SGD exactly; with N workers every batch is applied once, and the result is exactly the
sequential replay of the applied updates (each gradient on the version it was computed
on), whatever order the threads produced."""
import collections

import jax
import numpy as np
import optax
import pytest

from jaxpar import config as config_lib
from jaxpar import optim
from jaxpar.mesh import make_mesh
from jaxpar.parallel.async_sgd import AsyncServer, Downpour
from jaxpar.step import init_state
from runs import TinyResNet, assert_trees_close, init_plain, random_batches, reference_run

IMAGE = (1, 16, 16, 3)


def _run(server_kind, devices, tx, batches, steps):
  mesh = make_mesh((devices,), ('data',))
  server = AsyncServer(mesh, server_kind)
  server.make_optimizer(_SGD, optax.constant_schedule(0.0), _abstract_params())
  state = init_state(TinyResNet(), tx, server, mesh, IMAGE, jax.random.key(0))
  loop = Downpour(TinyResNet(), tx, server, iter(batches), steps, jax.random.key(3))
  metrics = []
  for _ in range(steps):
    state, m = loop(state)
    metrics.append(jax.device_get(m))
  loop.close()
  return server, jax.device_get(state), metrics, loop.log


def _abstract_params():
  from jaxpar.step import init_variables
  return jax.eval_shape(lambda: init_variables(TinyResNet(), IMAGE, jax.random.key(0)))['params']


class _SGD:  # what `make_optimizer` reads for its placement log; the tests pass their own tx
  name, weight_decay, momentum, nesterov = 'sgd', 0.0, 0.0, False


@pytest.mark.parametrize('server_kind, name', [('central', 'sgd'), ('distributed', 'sgd'),
                                              ('distributed', 'adamw')])
def test_one_worker_is_sequential_sgd(server_kind, name):
  """One worker applies its pushes in order: sequential training, with SGD + momentum, or
  with AdamW (its moments held with each tensor, by its owner)."""
  tx = optax.sgd(0.1, momentum=0.9)
  if name == 'adamw':
    c = config_lib.defaults().optimizer
    c.name, c.weight_decay = 'adamw', 1e-3
    tx = optim.make_optimizer(c, optax.constant_schedule(0.01))
  batches = random_batches(4, batch=16)
  _, state, metrics, log = _run(server_kind, 1, tx, batches, 4)
  ref, ref_losses = reference_run(TinyResNet(), tx, batches)
  assert [u.staleness for u in log] == [0, 0, 0, 0]
  np.testing.assert_allclose([m['loss'] for m in metrics], ref_losses, rtol=1e-5)
  assert_trees_close(state.params, ref.params, rtol=1e-5, atol=1e-6)
  assert_trees_close(state.batch_stats, ref.batch_stats, rtol=1e-5, atol=1e-6)
  assert int(state.step) == 4 and int(state.examples_seen) == 64
  # A push's gradient up and the weights down, float32.
  assert metrics[0]['sent_bytes'] == 2 * 4 * sum(x.size for x in jax.tree.leaves(ref.params))


@pytest.mark.parametrize('server_kind', ['central', 'distributed'])
def test_four_workers_apply_every_batch_once(server_kind):
  """Free-running Downpour has no staleness bound (a slow worker's gradient meets every
  push made meanwhile); what holds is that each gradient is computed on weights pulled
  after the worker's own previous push was applied, and every batch is applied once."""
  tx = optax.sgd(0.05, momentum=0.5)
  workers, steps = 4, 24
  batches = _learnable_batches(steps, batch=16)
  server, state, metrics, log = _run(server_kind, workers, tx, batches, steps)
  assert sorted(u.batch for u in log) == list(range(steps))
  assert [u.version + u.staleness for u in log] == list(range(steps))  # applied in order
  last_of = {}
  for i, u in enumerate(log):  # a worker's next gradient starts from weights with its last push
    if u.worker in last_of:
      assert u.version >= last_of[u.worker] + 1
    last_of[u.worker] = i
  assert set(last_of) == set(range(workers))
  assert all(u.staleness >= 0 for u in log)
  # The loss falls with the version the gradient was computed on (a straggler's late
  # push carries the loss of the old weights it pulled).
  early = [m['loss'] for u, m in zip(log, metrics) if u.version < 6]
  late = [m['loss'] for u, m in zip(log, metrics) if u.version >= steps - 8]
  assert early and late and np.mean(late) < 0.85 * np.mean(early)
  assert [m['staleness'] for m in metrics] == [u.staleness for u in log]
  replay = _replay(tx, batches, log)
  assert_trees_close(state.params, replay.params, rtol=1e-5, atol=1e-6)
  # Momentum, gathered from the owners' parts into the order of the parameters.
  by_leaf = {i: m for (_, part), s in zip(server.parts, state.opt_state)
             for i, m in zip(part, jax.tree.leaves(s))}
  assert_trees_close([by_leaf[i] for i in range(len(by_leaf))],
                     jax.tree.leaves(replay.opt_state), rtol=1e-5, atol=1e-6)
  if server_kind == 'distributed':  # every tensor lives with its Algorithm 3.7 owner
    counts = collections.Counter(server.owners)
    assert len(counts) == workers


def test_distributed_server_places_each_part_on_its_owner():
  mesh = make_mesh((4,), ('data',))
  server = AsyncServer(mesh, 'distributed')
  tx = server.make_optimizer(_SGD, optax.constant_schedule(0.1), _abstract_params())
  state = server.place(init_state(TinyResNet(), tx, server, mesh, IMAGE, jax.random.key(0)))
  for leaf, owner in zip(jax.tree.leaves(state.params), server.owners):
    assert leaf.devices() == {server.devices[owner]}
  for (d, _), part in zip(server.parts, state.opt_state):
    assert all(x.devices() == {server.devices[d]} for x in jax.tree.leaves(part))


def _replay(tx, batches, log):
  """Sequential single-device reference: version k+1 = version k updated with the gradient of
  log[k]'s batch at the weights and BN statistics of version log[k].version."""
  model = TinyResNet()
  ref = init_plain(model, tx, IMAGE)
  versions = [(ref.params, ref.batch_stats)]
  params, opt_state = ref.params, tx.init(ref.params)
  for u in log:
    pulled, stats = versions[u.version]
    b = batches[u.batch]

    def loss_fn(p):
      out, new = model.apply({'params': p, 'batch_stats': stats}, b['image'], train=True,
                             mutable=['batch_stats'])
      return optax.softmax_cross_entropy_with_integer_labels(out, b['label']).mean(), new
    grads, new = jax.grad(loss_fn, has_aux=True)(pulled)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    versions.append((params, new['batch_stats']))
  return ref.replace(params=params, opt_state=opt_state)


def _learnable_batches(n, batch, seed=0):
  """Each class is a fixed pattern plus noise: a loss that falls over 24 fresh batches."""
  patterns = np.random.default_rng(99).normal(size=(5, 16, 16, 3)).astype(np.float32)
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    labels = rng.integers(0, 5, batch).astype(np.int32)
    images = patterns[labels] + 0.5 * rng.normal(size=(batch, 16, 16, 3)).astype(np.float32)
    out.append({'image': images, 'label': labels})
  return out


def test_checkpoint_of_the_placed_state_restores_and_training_continues(tmp_path):
  """The state saved mid-run (tensors on their owners) restores (replicated on the mesh, as
  every run starts) to the same values, and a new loop continues the stream from there."""
  from jaxpar.checkpoint import Checkpoints
  mesh = make_mesh((2,), ('data',))
  server = AsyncServer(mesh, 'distributed')
  tx = optax.sgd(0.05, momentum=0.5)
  server.make_optimizer(_SGD, optax.constant_schedule(0.0), _abstract_params())
  fresh = lambda: init_state(TinyResNet(), tx, server, mesh, IMAGE, jax.random.key(0))
  batches = random_batches(4, batch=8)
  loop = Downpour(TinyResNet(), tx, server, iter(batches[:2]), 2, jax.random.key(3))
  state = fresh()
  for _ in range(2):
    state, _ = loop(state)
  loop.close()
  checkpoints = Checkpoints(str(tmp_path), every=2, keep=1)
  checkpoints.save(2, state)
  checkpoints.close()
  restored = Checkpoints(str(tmp_path), every=2, keep=1).restore_latest(fresh())
  assert_trees_close(jax.device_get(restored), jax.device_get(state), rtol=0, atol=0)

  loop = Downpour(TinyResNet(), tx, server, iter(batches[2:]), 2, jax.random.key(3))
  for _ in range(2):
    restored, _ = loop(restored)
  loop.close()
  assert sorted(u.batch for u in loop.log) == [2, 3]
  assert int(restored.step) == 4 and int(restored.examples_seen) == 32
