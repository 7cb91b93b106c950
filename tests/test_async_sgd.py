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
from jaxpar.parallel.async_sgd import AsyncServer, Downpour, Ledger
from jaxpar.step import init_state
from runs import (REPLAY_TOLERANCE, TinyResNet, assert_trees_close, downpour_replay,
                  learnable_batches, random_batches, reference_run, version_of)

IMAGE = (1, 16, 16, 3)


def _run(server_kind, devices, tx, batches, steps):
  mesh = make_mesh((devices,), ('data',))
  server = AsyncServer(mesh, server_kind)
  server.make_optimizer(_SGD, optax.constant_schedule(0.0), _abstract_params())
  state = init_state(TinyResNet(), tx, server, mesh, IMAGE, jax.random.key(0))
  loop = Downpour(TinyResNet(), tx, server, iter(batches), steps, jax.random.key(3))
  metrics, versions = [], [version_of(state)]
  for _ in range(steps):
    state, m = loop(state)
    metrics.append(jax.device_get(m))
    versions.append(version_of(state))
  loop.close()
  return server, jax.device_get(state), metrics, loop.log, versions


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
    # eps 1e-4, not 1e-8: Adam divides by √v, so a gradient entry near 0 turns rounding
    # differences between two compiled programs into a 4 % different step (seen unoptimised).
    c.name, c.weight_decay, c.eps = 'adamw', 1e-3, 1e-4
    tx = optim.make_optimizer(c, optax.constant_schedule(0.01))
  batches = random_batches(4, batch=16)
  _, state, metrics, log, _ = _run(server_kind, 1, tx, batches, 4)
  ref, ref_losses = reference_run(TinyResNet(), tx, batches)
  assert [u.staleness for u in log] == [0, 0, 0, 0]
  np.testing.assert_allclose([m['loss'] for m in metrics], ref_losses, rtol=1e-5)
  # Adam divides by √v: a rounding difference between two compiled programs in an entry
  # of small v moves that entry's step, whose size is at most about lr = 0.01, by up to
  # ~1e-4 of it (seen: 7e-5 relative on one BN bias with jaxlib 0.10; 1.3e-6 absolute,
  # 1.3e-4 of lr, on another with jaxlib 0.12, whose programs round in another order).
  # So AdamW's entries are held to 2e-4 · lr per step absolute, SGD's to float rounding.
  assert_trees_close(state.params, ref.params, rtol=1e-4 if name == 'adamw' else 1e-5,
                     atol=2e-4 * 0.01 * 4 if name == 'adamw' else 1e-6)
  # The running statistics of the layers those parameters feed move with them (seen with
  # jaxlib 0.12 on an Intel Xeon: 1.6e-6 absolute in a running mean of 0.02 after AdamW).
  assert_trees_close(state.batch_stats, ref.batch_stats, rtol=1e-5,
                     atol=1e-5 if name == 'adamw' else 1e-6)
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
  batches = learnable_batches(steps, batch=16)
  server, state, metrics, log, versions = _run(server_kind, workers, tx, batches, steps)
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
  replay = downpour_replay(TinyResNet(), tx, lambda u: batches[u.batch], log, IMAGE, versions)
  assert_trees_close(state.params, replay.params, **REPLAY_TOLERANCE)
  # Momentum, gathered from the owners' parts into the order of the parameters.
  by_leaf = {i: m for (_, part), s in zip(server.parts, state.opt_state)
             for i, m in zip(part, jax.tree.leaves(s))}
  assert_trees_close([by_leaf[i] for i in range(len(by_leaf))],
                     jax.tree.leaves(replay.opt_state), **REPLAY_TOLERANCE)
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


# ----------------------------------------------------------------------------- the ledger
def _simulate(workers, count, max_staleness, seed, lose=None):
  """Random arrival orders against the Ledger: workers draw, arrive in random order, the
  ledger applies what its bound allows (a held worker waits); `lose` = (at, worker)."""
  rng = np.random.default_rng(seed)
  ledger = Ledger(count, 0, max_staleness)
  computing, position = [], collections.Counter()
  alive = set(range(workers))

  def draw(w):
    if w in alive and ledger.may_draw():
      ledger.draw(w, position[w])
      position[w] += 1
      computing.append(w)
  for w in range(workers):
    draw(w)
  while len(ledger.log) < count:
    if lose and len(ledger.log) == lose[0] and lose[1] in alive:
      alive.discard(lose[1])
      ledger.lose(lose[1])
      if lose[1] in computing:
        computing.remove(lose[1])
    push = ledger.next()
    if push is None:
      assert computing, 'deadlock: nothing computing and nothing the bound allows'
      w = computing.pop(int(rng.integers(len(computing))))
      ledger.arrive(w, w)
      continue
    ledger.apply(push)
    draw(push)
  return ledger


@pytest.mark.parametrize('workers, bound', [(2, 1), (4, 3), (4, 5), (8, 7)])
def test_the_bound_holds_for_any_arrival_order_and_never_deadlocks(workers, bound):
  for seed in range(20):
    ledger = _simulate(workers, 60, bound, seed)
    assert max(u.staleness for u in ledger.log) <= bound
    assert sorted((u.worker, u.batch) for u in ledger.log) == sorted(
        {(u.worker, u.batch) for u in ledger.log})  # each batch once
    assert [u.version + u.staleness for u in ledger.log] == list(range(60))


def test_without_a_bound_stragglers_exceed_it_and_with_one_they_do_not():
  unbounded = [max(u.staleness for u in _simulate(4, 60, None, s).log) for s in range(20)]
  assert max(unbounded) > 3   # random arrivals make stragglers: the bound has work to do
  bounded = [max(u.staleness for u in _simulate(4, 60, 3, s).log) for s in range(20)]
  assert max(bounded) <= 3


def test_a_lost_worker_is_accounted_and_the_others_go_on():
  ledger = _simulate(4, 40, 3, seed=1, lose=(10, 2))
  assert len(ledger.log) == 40 and ledger.drawn == 40 + len(ledger.lost)
  assert [t.worker for t in ledger.lost] == [2]
  assert all(u.worker != 2 for u in ledger.log[10:])
  applied = {(u.worker, u.batch) for u in ledger.log}
  assert (2, ledger.lost[0].batch) not in applied


def test_inverse_learning_rate_divides_by_the_staleness():
  ledger = Ledger(10, 0, None, 'inverse')
  for w in range(3):
    ledger.draw(w, 0)
  for w in (2, 0, 1):
    ledger.arrive(w, w)
    ledger.apply(ledger.next())
  assert [(u.staleness, u.lr_scale) for u in ledger.log] == [(0, 1.0), (1, 1.0), (2, 0.5)]


@pytest.mark.parametrize('lr_staleness', ['none', 'inverse'])
def test_threads_with_a_bound_and_inverse_rate_replay_exactly(lr_staleness):
  """The thread backend under the bound: no applied staleness above it, and the weights
  are the sequential replay of the applied updates, each step scaled as the ledger said."""
  tx = optax.sgd(0.05, momentum=0.5)
  workers, steps, bound = 4, 16, 3
  batches = learnable_batches(steps, batch=8)
  mesh = make_mesh((workers,), ('data',))
  server = AsyncServer(mesh, 'central')
  server.make_optimizer(_SGD, optax.constant_schedule(0.0), _abstract_params())
  state = init_state(TinyResNet(), tx, server, mesh, IMAGE, jax.random.key(0))
  loop = Downpour(TinyResNet(), tx, server, iter(batches), steps, jax.random.key(3),
                  max_staleness=bound, lr_staleness=lr_staleness)
  versions = [version_of(state)]
  for _ in range(steps):
    state, _ = loop(state)
    versions.append(version_of(state))
  loop.close()
  assert max(u.staleness for u in loop.log) <= bound
  if lr_staleness == 'inverse':
    assert [u.lr_scale for u in loop.log] == [1 / max(1, u.staleness) for u in loop.log]
    assert any(u.lr_scale < 1 for u in loop.log)
  replay = downpour_replay(TinyResNet(), tx, lambda u: batches[u.batch], loop.log, IMAGE,
                           versions)
  assert_trees_close(jax.device_get(state.params), replay.params, **REPLAY_TOLERANCE)
