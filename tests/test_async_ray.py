"""Downpour on Ray (`async_sgd.backend='ray'`): worker and server actors in their own
processes. One worker is sequential SGD exactly; N workers apply every batch once, in
version order, with the weights equal to the sequential replay of the applied updates and
the staleness under its bound; a worker killed with SIGKILL is named, its batch in flight
counted, and the run goes on (a restarted worker rejoins); a worker waiting for CPUs is said
and starts when they free up; a whole `jaxpar.train` run with a killed worker finishes and
evaluates every test example."""
import logging
import os
import signal
import time

import jax
import numpy as np
import optax
import pytest

from jaxpar.mesh import make_mesh
from jaxpar.parallel.async_sgd import AsyncServer
from jaxpar.step import init_state
from runs import (REPLAY_TOLERANCE, TinyResNet, assert_trees_close, downpour_replay,
                  reference_run, shard_batch, shard_batches, version_of)

ray = pytest.importorskip('ray')
from jaxpar.parallel import async_ray  # noqa: E402
from jaxpar.parallel.async_ray import RayDownpour  # noqa: E402

IMAGE = (1, 16, 16, 3)


@pytest.fixture(scope='module', autouse=True)
def local_ray():
  """A local Ray for this module; the workers import the tests' helpers (`runs`) and share
  the tests' compilation cache (the actors of a run compile the same programs, and so do
  the tests' runs: 3 workers compiling one program each on 2 cores was most of a test)."""
  tests = os.path.dirname(os.path.abspath(__file__))
  path = os.pathsep.join(p for p in (tests, os.environ.get('PYTHONPATH', '')) if p)
  with async_ray.ray_forks():  # as a run starts it: without JAX's fork warning
    ray.init(num_cpus=8, include_dashboard=False, logging_level='warning',
             runtime_env={'env_vars': {
                 'PYTHONPATH': path,
                 'JAX_COMPILATION_CACHE_DIR': os.environ['JAXPAR_TEST_XLA_CACHE']}})
  yield
  ray.shutdown()


class _SGD:  # what `make_optimizer` reads for its placement log; the tests pass their own tx
  name, weight_decay, momentum, nesterov = 'sgd', 0.0, 0.0, False


def _loop(server_kind, workers, tx, steps, **kwargs):
  mesh = make_mesh((1,), ('data',), devices=jax.devices()[:1])
  server = AsyncServer(mesh, server_kind, workers)
  from jaxpar.step import init_variables
  abstract = jax.eval_shape(lambda: init_variables(TinyResNet(), IMAGE, jax.random.key(0)))
  server.make_optimizer(_SGD, optax.constant_schedule(0.0), abstract['params'])
  state = init_state(TinyResNet(), tx, server, mesh, IMAGE, jax.random.key(0))
  loop = RayDownpour(TinyResNet(), tx, server, shard_batches, steps, jax.random.key(3),
                     workers=workers, **kwargs)
  return loop, state


def _train(loop, state, steps, each_step=lambda loop: None, until=lambda loop: False,
           versions=None):
  """Steps of `loop`; `versions`, a list: each version's (params, batch_stats) as the
  servers hold it, appended (0 the initial)."""
  metrics = []
  if versions is not None:
    versions.append(version_of(state))
  for _ in range(steps):
    each_step(loop)
    state, m = loop(state)
    metrics.append(m)
    if versions is not None:
      versions.append(version_of(loop.synced(state)))
    if until(loop):
      break
  state = jax.device_get(loop.synced(state))
  loop.close()
  return state, metrics


def _replay(tx, log, versions=None):
  return downpour_replay(TinyResNet(), tx, lambda u: shard_batch(u.worker, u.batch), log, IMAGE,
                         versions)


def test_one_worker_is_sequential_sgd():
  tx = optax.sgd(0.1, momentum=0.9)
  loop, state = _loop('central', 1, tx, 4)
  state, metrics = _train(loop, state, 4)
  ref, losses = reference_run(TinyResNet(), tx, [shard_batch(0, i) for i in range(4)])
  assert [(u.batch, u.staleness) for u in loop.log] == [(i, 0) for i in range(4)]
  np.testing.assert_allclose([m['loss'] for m in metrics], losses, rtol=1e-5)
  assert_trees_close(state.params, ref.params, rtol=1e-5, atol=1e-6)
  assert_trees_close(state.batch_stats, ref.batch_stats, rtol=1e-5, atol=1e-6)
  assert int(state.step) == 4 and int(state.examples_seen) == 32


@pytest.mark.parametrize('server_kind, bound, lr_staleness', [
    ('central', None, 'none'), ('distributed', 2, 'inverse')])
def test_workers_apply_every_batch_once_as_the_replay(server_kind, bound, lr_staleness):
  """Three worker processes, the weights on one server actor or on three (Algorithm 3.7's
  parts): each batch of each shard applied once, in version order; staleness within the
  bound; the weights and momentum those of the sequential replay."""
  tx = optax.sgd(0.05, momentum=0.5)
  steps = 15
  loop, state = _loop(server_kind, 3, tx, steps, max_staleness=bound, lr_staleness=lr_staleness)
  versions = []
  state, metrics = _train(loop, state, steps, versions=versions)
  log = loop.log
  for w in range(3):  # each worker's shard in order, no batch twice
    mine = [u.batch for u in log if u.worker == w]
    assert mine == list(range(len(mine)))
  assert [u.version + u.staleness for u in log] == list(range(steps))
  assert [m['staleness'] for m in metrics] == [u.staleness for u in log]
  if bound is not None:
    assert max(u.staleness for u in log) <= bound
  if lr_staleness == 'inverse':
    assert [u.lr_scale for u in log] == [1 / max(1, u.staleness) for u in log]
  assert len(loop.server.parts) == (3 if server_kind == 'distributed' else 1)
  replay = _replay(tx, log, versions)
  assert_trees_close(state.params, replay.params, **REPLAY_TOLERANCE)
  by_leaf = {i: m for (_, part), s in zip(loop.server.parts, state.opt_state)
             for i, m in zip(part, jax.tree.leaves(s))}
  assert_trees_close([by_leaf[i] for i in range(len(by_leaf))],
                     jax.tree.leaves(replay.opt_state), **REPLAY_TOLERANCE)


@pytest.mark.parametrize('cpus, expected', [(0, 2), (1, 1)])
def test_each_worker_reserves_its_cpus_and_runs_onednn_on_as_many_threads(cpus, expected,
                                                                          caplog):
  """A worker reserves `cpus_per_worker` CPUs (0: the cluster's 8 / 3 workers = 2), and Ray's
  OMP_NUM_THREADS makes them its oneDNN convolutions' OpenMP team: before the setting, every
  worker reserved one CPU and so ran its convolutions on one thread, however many cores its
  node had."""
  loop, state = _loop('central', 3, optax.sgd(0.05), 1, cpus_per_worker=cpus)
  with caplog.at_level(logging.INFO):
    loop(state)
  try:
    threads = ray.get([a.threads.remote() for a in loop.actors.values()])
  finally:
    loop.close()
  assert threads == [expected] * 3
  said = [r.getMessage() for r in caplog.records if 'Downpour on Ray' in r.getMessage()]
  assert len(said) == 1 and f'{expected} CPU' in said[0]
  assert ("the cluster's 8 CPUs / 3 workers" in said[0]) == (cpus == 0)


def test_a_worker_waiting_for_cpus_is_said_and_starts_when_they_free_up(monkeypatch, caplog):
  """Another holder of 6 of the cluster's 8 CPUs leaves one of two 2-CPU workers unplaced:
  the run says, every `STARTING_LOG_S`, how many have started and what a worker Ray cannot
  place waits for, naming the field (it had waited without a word); once the holder is gone
  the worker starts and the step runs."""
  import threading
  monkeypatch.setattr(async_ray, 'STARTING_LOG_S', 0.5)
  holder = ray.remote(num_cpus=6)(_Holder).remote()
  ray.get(holder.ready.remote())
  loop, state = _loop('central', 2, optax.sgd(0.05), 1, cpus_per_worker=2)
  said = lambda: [r.getMessage() for r in caplog.records
                  if '1 of 2 workers started after' in r.getMessage()]

  def free_when_said():
    deadline = time.monotonic() + 120
    while not said() and time.monotonic() < deadline:
      time.sleep(0.1)
    ray.kill(holder)
  freeing = threading.Thread(target=free_when_said)
  freeing.start()
  try:
    with caplog.at_level(logging.INFO):
      loop(state)
  finally:
    freeing.join()
    loop.close()
  assert said(), 'the wait was not said'
  assert ('each reserves 2 CPUs' in said()[0] and 'the cluster has 0 of 8 CPUs free' in said()[0]
          and 'Lower async_sgd.cpus_per_worker' in said()[0]), said()[0]
  assert len(loop.where) == 2


def test_a_local_ray_has_a_cpu_for_every_cpu_the_workers_reserve(monkeypatch):
  """Started for the run (no cluster), Ray counts enough logical CPUs for every worker's
  reservation (3 × 4 on a 2-core host: 13, the driver's one with them), so none waits for a
  CPU that will never come; without a reservation, one a worker."""
  asked = []
  monkeypatch.setattr(ray, 'is_initialized', lambda: False)
  monkeypatch.setattr(ray, 'init', lambda **kw: asked.append(kw))
  monkeypatch.setattr(ray, 'cluster_resources', lambda: {})
  monkeypatch.setattr(ray, 'nodes', lambda: [])
  monkeypatch.setattr(os, 'cpu_count', lambda: 2)
  monkeypatch.delenv('RAY_ADDRESS', raising=False)
  assert async_ray.start('', 3, 4) and async_ray.start('', 3)
  assert [kw['num_cpus'] for kw in asked] == [13, 4]


class _Holder:
  def ready(self):
    return True


def _kill_worker(worker, after):
  """A step hook: SIGKILL of `worker`'s process once `after` updates are applied."""
  def hook(loop):
    if len(loop.log) == after and worker not in hook.killed:
      hook.killed.add(worker)
      os.kill(loop.where[worker][1], signal.SIGKILL)
  hook.killed = set()
  return hook


@pytest.mark.parametrize('restart', [0, 1])
def test_a_killed_worker_is_counted_and_training_goes_on(restart, caplog):
  """SIGKILL of worker 1 after 4 updates: named in the log, its batch in flight lost and
  counted, never applied; the others go on; restarted (restart=1), it rejoins with the
  current weights after its lost batch (the run then stops once it has pushed again: the
  others have applied hundreds of updates meanwhile, too many to replay in a test)."""
  tx = optax.sgd(0.05, momentum=0.5)
  steps = 14 if not restart else 1000
  # Rejoined: worker 1 pushed a batch after the one lost with it. (Not "any push of worker 1
  # after update 5": its batch in flight when the kill was sent may still arrive first.)
  rejoined = lambda loop: bool(restart and loop.ledger.lost and any(
      u.worker == 1 and u.batch > loop.ledger.lost[0].batch for u in loop.log))
  loop, state = _loop('distributed', 3, tx, steps, restart_workers=restart)
  versions = None if restart else []
  with caplog.at_level(logging.INFO):
    state, _ = _train(loop, state, steps, _kill_worker(1, after=4), until=rejoined,
                      versions=versions)
  log, ledger = loop.log, loop.ledger
  assert int(state.step) == len(log) and (restart or len(log) == steps)
  assert [t.worker for t in ledger.lost] == [1]
  lost = ledger.lost[0]
  applied = [(u.worker, u.batch) for u in log]
  assert len(set(applied)) == len(log) and (1, lost.batch) not in applied
  # Every batch drawn is applied, lost with its worker, or (stopped early) in flight.
  assert ledger.drawn == len(log) + 1 + len(ledger.outstanding)
  assert any('Asynchronous worker 1 (pid' in r.getMessage() and 'lost' in r.getMessage()
             for r in caplog.records)
  after_kill = [u for u in log if u.worker == 1 and u.batch > lost.batch]
  if restart:  # the replacement pulls the current weights and goes on after the lost batch
    assert after_kill and after_kill[0].batch == lost.batch + 1
    assert any('worker 1 rejoined at step' in r.getMessage() for r in caplog.records)
  else:  # and the updates applied around the loss are exactly the replay's
    assert not after_kill
    replay = _replay(tx, log, versions)
    assert_trees_close(state.params, replay.params, **REPLAY_TOLERANCE)


def test_a_lost_server_ends_the_run_with_one_line_naming_it():
  """The distributed server's part 1 is gone with its actor: no state to go on from."""
  from jaxpar.config import RunError
  tx = optax.sgd(0.05, momentum=0.5)
  loop, state = _loop('distributed', 3, tx, 40)

  def kill_server(loop):
    if len(loop.log) == 3 and not kill_server.done:
      kill_server.done = True
      os.kill(ray.get(loop.servers[1].where.remote())[1], signal.SIGKILL)
  kill_server.done = False
  with pytest.raises(RunError, match=r'asynchronous server 1 of 3 \(it held \d+ tensors'):
    _train(loop, state, 40, kill_server)
  loop.close()


def test_no_worker_left_ends_the_run_with_one_line():
  from jaxpar.config import RunError
  tx = optax.sgd(0.05, momentum=0.5)
  loop, state = _loop('central', 2, tx, 40)
  kill_0, kill_1 = _kill_worker(0, after=2), _kill_worker(1, after=2)

  def both(loop):
    kill_0(loop)
    kill_1(loop)
  with pytest.raises(RunError, match=r'all 2 asynchronous workers are lost \(worker \d: batch'):
    _train(loop, state, 40, both)
  loop.close()


def test_train_with_a_killed_worker_finishes_and_evaluates_every_example(data_dir, monkeypatch,
                                                                          tmp_path, caplog):
  """`jaxpar.train` end to end on Ray: SqueezeNet on the digits at 16², two workers, one
  killed after 3 updates; the run finishes on the other, evaluates all 360 test
  examples, and its log names the lost worker."""
  from jaxpar import build, train
  from jaxpar.config import defaults
  hook = _kill_worker(1, after=3)

  class Killing(RayDownpour):
    def __call__(self, state):
      hook(self)
      return super().__call__(state)
  monkeypatch.setattr(build, 'RayDownpour', Killing)
  c = defaults()
  c.dataset.data_dir = data_dir
  c.model, c.image_size, c.mesh.shape = 'squeezenet', 16, (2,)
  c.scheme, c.server, c.per_device_batch = 'async', 'central', 8
  c.async_sgd.backend = 'ray'
  c.total_steps, c.optimizer.warmup_steps, c.eval_batch = 8, 1, 120
  with caplog.at_level(logging.INFO):
    result = train.train_and_evaluate(c, str(tmp_path))
  assert result.step == 8 and result.eval['count'] == 360
  messages = [r.getMessage() for r in caplog.records]
  assert any(m.startswith('Asynchronous worker 1 (pid') and '1 worker(s) left' in m
             for m in messages)
  assert any('batches drawn = 8 applied + 1 lost' in m for m in messages)
