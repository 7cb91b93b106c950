"""Downpour SGD across processes and hosts, on Ray ([T] §3.2–3.3; eqs. 4.13–4.21).

[T] ran Downpour on 8 PCs, one GPU each, for the robustness it argues for (§3.3):
asynchronous training goes on when a worker dies. JAX's multi-controller runtime is
SPMD and has no asynchronous point-to-point channel, so the workers and servers here are
Ray actors (`config.async_sgd.backend='ray'`), each its own process:

  worker w   (one per device: N = prod(mesh.shape), a GPU each with `gpus_per_worker`;
             `cpus_per_worker` CPUs, by default the cluster's / N: Ray sets its
             OMP_NUM_THREADS to them, the team of oneDNN's convolutions in it)
             reads its part w of N of the training data where it runs, and for
             every batch pulls the weights, computes the gradient with the step's loss
             (`step.gradients`) and pushes it, part by part;
  server p   holds a part of the weights and that part's optimizer state, and applies
             that part of every push: `central` = one server with every tensor, `distributed`
             = [T]'s Algorithm 3.7 parts (`servers.greedy_owners`), one server actor per part,
             spread over the nodes. Server 0 also keeps the BN statistics.

The driver is `jaxpar.train`'s loop (logs, TensorBoard, checkpoints, evaluation): it moves
only Ray object references — pull = each server's `pull()` reference handed to the
worker's `compute()`, push = each part of the worker's result handed to its server's
`apply()` — so weights and gradients travel between workers and servers directly. What is
applied when, versions and staleness are the `Ledger`'s, shared with the thread backend;
only the transport differs.

A lost worker (killed, crashed, its node gone) does not stop training: the driver logs
one line naming it, its last applied update and the workers left; its batch in flight is
counted as lost (never applied, never re-read), and with `restart_workers` Ray restarts
the actor, which pulls the current weights and goes on with its shard after the lost
batch. With no worker left the run ends with one line (exit 1). A lost server ends the run
with one line naming it (exit 1): its part of the weights is gone, and the run resumes
from its last checkpoint when started again with the same --workdir.

Resuming: the checkpoint holds the applied count, not each worker's position in its
shard; a resumed run starts every worker at ⌊step / N⌋ batches into its shard (exact when
the workers applied equally many batches; logged).
"""
import collections
import contextlib
import os
import socket
import time
import warnings

import jax
import numpy as np
from absl import logging

from jaxpar.config import RunError
from jaxpar.host_memory import keep_freed_memory
from jaxpar.parallel.async_sgd import Ledger, apply_update, gradient_fn


# How often a run whose workers have not all started says so (`RayDownpour._started`).
STARTING_LOG_S = 30.0


def ray_module():
  try:
    import ray
  except ImportError:
    raise RunError("config.async_sgd.backend='ray' needs Ray: pip install 'jaxpar[ray]' "
                   "(or set config.async_sgd.backend='threads')") from None
  return ray


@contextlib.contextmanager
def ray_forks():
  """Around `ray.init`: JAX warns at every fork once its backend runs ("os.fork() ... will
  likely lead to a deadlock"). Ray starts its own programs (GCS, raylet) by fork and exec,
  with a preexec_fn that only blocks SIGINT and asks to die with this process: the child
  runs none of JAX's code before exec, so the warning, printed by every Ray start, is not
  news. Other warnings pass."""
  with warnings.catch_warnings():
    warnings.filterwarnings('ignore', message=r'os\.fork\(\) was called',
                            category=RuntimeWarning)
    yield


def start(address: str, workers: int, cpus_each: int = 1) -> bool:
  """Connects to the Ray cluster at `address` (or $RAY_ADDRESS), or starts a local Ray for
  this run: as many logical CPUs as the workers reserve (`cpus_each` a worker; they share
  the cores, as threads), so that every worker can start.
  True where it started Ray for this process alone (no cluster, not initialised before):
  the run then stops it when its workers are done (`RayDownpour.close`), before its last
  line, rather than at the interpreter's exit (1.4-2 s idle, 6 s on a busy host — past the
  5 s in which a stopped run must be gone)."""
  ray = ray_module()
  if ray.is_initialized():
    return False
  address = address or os.environ.get('RAY_ADDRESS') or None
  local = {} if address else {'num_cpus': max(workers * cpus_each + 1, os.cpu_count() or 1)}
  token = os.environ.get('RAY_AUTH_TOKEN') or os.path.exists(
      os.environ.get('RAY_AUTH_TOKEN_PATH') or os.path.expanduser('~/.ray/auth_token'))
  if address and 'RAY_AUTH_MODE' not in os.environ and token:
    # `ray start` (Ray ≥ 2.5x) makes a cluster that wants its token; ray.init with an
    # address does not send it unless asked to.
    os.environ['RAY_AUTH_MODE'] = 'token'
    logging.info('Connecting to the Ray cluster with its authentication token (RAY_AUTH_MODE '
                 'unset, a token found): RAY_AUTH_MODE=token.')
  with ray_forks():
    ray.init(address=address, include_dashboard=False, logging_level='warning',
             log_to_driver=True, **local)
  resources = ray.cluster_resources()
  logging.info('Ray %s: %s, %d CPUs, %d GPUs on %d nodes.',
               'cluster at ' + address if address else 'started locally',
               ray.__version__, resources.get('CPU', 0), resources.get('GPU', 0),
               len(ray.nodes()))
  return not address


def _numpy(tree):
  return jax.tree.map(np.asarray, tree)


class _Worker:
  """One Downpour worker: its shard of the data, the gradient function, a pull's weights in."""

  def __init__(self, index, model, batches, micro_batches, rng_data, treedef, parts,
               host_memory='auto'):
    keep_freed_memory(host_memory)  # before this actor's JAX starts its backend
    self.index, self.batches, self.treedef, self.parts = index, batches, treedef, parts
    self.grad_fn = gradient_fn(model, micro_batches)
    self.rng = jax.random.fold_in(jax.random.wrap_key_data(rng_data), index)
    self.stream, self.position = None, None

  def where(self):
    return socket.gethostname(), os.getpid()

  def threads(self) -> int:
    """The OpenMP threads a oneDNN convolution of this worker takes (0: none run here)."""
    from jaxpar.models import onednn
    return onednn.threads() if jax.default_backend() == 'cpu' else 0

  def compute(self, position, stats, *parts):
    """Gradient of the batch at `position` of this worker's shard on the pulled weights:
    (summary, BN statistics, gradient part for each server)."""
    if self.position != position:  # first call, a restart, or a resumed run
      self.stream, self.position = self.batches(self.index, position), position
    batch = next(self.stream)
    self.position += 1
    leaves = [None] * self.treedef.num_leaves
    for part, values in zip(self.parts, parts):
      for i, x in zip(part, values):
        leaves[i] = x
    params = jax.tree.unflatten(self.treedef, leaves)
    grads, stats, metrics = self.grad_fn(params, stats, batch,
                                         jax.random.fold_in(self.rng, position))
    grads = jax.tree.leaves(grads)
    summary = {'size': len(batch['label']), 'metrics': _numpy(metrics),
               'nbytes': sum(g.nbytes for g in grads)}
    return (summary, _numpy(stats)) + tuple([np.asarray(grads[i]) for i in part]
                                            for part in self.parts)


class _Server:
  """One part of the weights, its optimizer state (and, server 0, the BN statistics)."""

  def __init__(self, tx, leaves, opt_state, stats, host_memory='auto'):
    keep_freed_memory(host_memory)
    self.step = jax.jit(lambda *a: apply_update(tx, *a))
    self.leaves, self.opt_state, self.stats = leaves, opt_state, stats
    self.pulled = None  # the current version as numpy, made once for every worker pulling it

  def pull(self):
    if self.pulled is None:
      self.pulled = [np.asarray(x) for x in self.leaves]
    return self.pulled

  def pull_stats(self):
    return self.stats

  def apply(self, lr_scale, stats, grads):
    self.leaves, self.opt_state = self.step(self.leaves, self.opt_state, grads,
                                            np.float32(lr_scale))
    self.pulled = None
    if stats is not None:
      self.stats = stats
    return True

  def state(self):
    return self.pull(), _numpy(self.opt_state), self.stats

  def where(self):
    return socket.gethostname(), os.getpid()


class RayDownpour:
  """`loop(state) -> (state, metrics)` applies the next push of any worker, as `Downpour`
  does with threads; the weights live on the server actors (`synced` brings them here).

  `batches(worker, position)` yields worker `worker`'s shard's batches from batch
  `position` on (numpy), in the worker's process. `workers` actors are started at the
  first call; `count` pushes are applied in all. `host_memory`: the driver's malloc setting;
  `compile_cache`: its folder for compiled programs (`jaxpar.compile_cache`; '' none, None
  the environment's), both the workers' too.
  """

  def __init__(self, model, tx, server, batches, count: int, rng, *, workers: int,
               micro_batches: int = 1, max_staleness=None, lr_staleness: str = 'none',
               restart_workers: int = 0, gpus_per_worker: float = 0.0, cpus_per_worker: int = 0,
               address: str = '', host_memory: str = 'auto', compile_cache: str | None = None):
    self.model, self.tx, self.server, self.batches = model, tx, server, batches
    self.count, self.rng, self.workers = count, rng, workers
    self.micro_batches, self.restart_workers = micro_batches, restart_workers
    self.max_staleness, self.lr_staleness = max_staleness, lr_staleness
    self.gpus_per_worker, self.cpus_per_worker, self.address = (gpus_per_worker,
                                                                 cpus_per_worker, address)
    self.host_memory, self.compile_cache = host_memory, compile_cache
    self.ledger = None
    self.owns_ray = False  # `start` started Ray for this run: `close` stops it
    self.actors, self.servers = {}, []
    self.in_flight = {}   # the reference of a worker's `compute` summary -> (worker, its refs)
    self.applying = []    # references of the servers' `apply` results not yet checked
    self.restarts = collections.Counter()
    self.last_applied = {}  # worker -> (step, batch) of its last applied push
    self.where = {}       # worker -> (host, pid)
    self.restarting = {}  # the reference of a restarting worker's `where` call -> worker

  @property
  def log(self) -> list:
    return self.ledger.log if self.ledger else []

  # ---------------------------------------------------------------- the loop
  def __call__(self, state):
    if self.ledger is None:
      self._start(state)
    ray = ray_module()
    while (push := self.ledger.next()) is None:
      if not self.actors:
        raise RunError(f'all {self.workers} asynchronous workers are lost '
                       f'({self._lost_summary()}); run again with the same --workdir to '
                       f'resume from the last checkpoint')
      ready, _ = ray.wait(list(self.in_flight) + list(self.restarting) + self.applying,
                          num_returns=1)
      ref = ready[0]
      if ref in self.restarting:
        self._restarted(self.restarting.pop(ref), ref, state)
        continue
      if ref not in self.in_flight:
        self._applied([ref])
        continue
      worker, refs = self.in_flight.pop(ref)
      try:
        summary = ray.get(ref)
      except ray.exceptions.RayActorError:
        # The worker died, or a server did (its pulled weights then fail the worker's call).
        self._check_servers()
        self._lost(worker, state)
        continue
      except ray.exceptions.RayError:
        self._check_servers()
        raise
      self.ledger.arrive(worker, (worker, summary, refs))
    worker, summary, refs = push
    update = self.ledger.apply(worker)
    stats, parts = refs[0], refs[1:]
    self.applying += [s.apply.remote(update.lr_scale, stats if p == 0 else None, part)
                      for p, (s, part) in enumerate(zip(self.servers, parts))]
    self._applied(ray.wait(self.applying, num_returns=len(self.applying), timeout=0)[0])
    step = int(state.step) + 1
    self.last_applied[worker] = (step, update.batch)
    self._draw(worker)  # the worker pulls the new version (Ray runs actor calls in order)
    state = state.replace(step=state.step + 1, examples_seen=state.examples_seen + summary['size'])
    return state, {**summary['metrics'], 'staleness': update.staleness,
                   'sent_bytes': 2 * summary['nbytes']}

  def synced(self, state):
    """The state with the servers' weights, optimizer state and BN statistics."""
    ray = ray_module()
    if not self.servers:
      return state
    try:
      parts = ray.get([s.state.remote() for s in self.servers])
    except ray.exceptions.RayActorError:
      self._check_servers()
      raise
    leaves, treedef = jax.tree.flatten(state.params)
    leaves = list(leaves)
    for (_, part), (values, _, _) in zip(self.server.parts, parts):
      for i, x in zip(part, values):
        leaves[i] = x
    put = lambda tree, like: jax.device_put(tree, jax.tree.map(lambda x: x.sharding, like))
    return state.replace(
        params=put(jax.tree.unflatten(treedef, leaves), state.params),
        opt_state=put(tuple(o for _, o, _ in parts), state.opt_state),
        batch_stats=put(parts[0][2], state.batch_stats))

  def histograms(self) -> dict:
    return {'staleness': np.array([u.staleness for u in self.log])}

  def close(self):
    if self.ledger is None:
      return
    ray = ray_module()
    for actor in list(self.actors.values()) + self.servers:
      ray.kill(actor, no_restart=True)
    self.actors, self.servers, self.in_flight = {}, [], {}
    if self.owns_ray:
      self.owns_ray = False
      ray.shutdown()
    if self.log:
      logging.info('Staleness over %d updates: %s.', len(self.log),
                   self.ledger.staleness_summary())
    logging.info('Asynchronous workers on Ray: %d batches drawn = %d applied + %d lost with '
                 'their workers%s + %d in flight at the end.', self.ledger.drawn,
                 len(self.log), len(self.ledger.lost),
                 f' ({self._lost_summary()})' if self.ledger.lost else '',
                 self.ledger.drawn - len(self.log) - len(self.ledger.lost))

  # ---------------------------------------------------------------- start, pull, loss
  def _start(self, state):
    ray = ray_module()
    self.owns_ray = start(self.address, self.workers, max(1, self.cpus_per_worker))
    resources = ray.cluster_resources()
    cluster_cpus = int(resources.get('CPU', 0))
    cpus = self.cpus_per_worker or max(1, cluster_cpus // self.workers)
    for kind, each in (('GPU', self.gpus_per_worker), ('CPU', cpus)):
      if each and resources.get(kind, 0) < self.workers * each:
        logging.warning('%d asynchronous workers reserve %g %ss each but the Ray cluster has '
                        '%g: training starts once every worker has (as the cluster frees '
                        'them or its autoscaler adds nodes).', self.workers, each, kind,
                        resources.get(kind, 0))
    first = int(state.step)
    self.ledger = Ledger(self.count, first, self.max_staleness, self.lr_staleness)
    leaves, treedef = jax.tree.flatten(jax.device_get(state.params))
    parts = [part for _, part in self.server.parts]
    opt_states = jax.device_get(state.opt_state)
    stats = _numpy(jax.device_get(state.batch_stats))
    server_actor = ray.remote(num_cpus=0, max_restarts=0)(_Server)
    self.servers = [
        server_actor.options(scheduling_strategy='SPREAD').remote(
            self.tx, [np.asarray(leaves[i]) for i in part], opt_states[p],
            stats if p == 0 else None, self.host_memory)
        for p, part in enumerate(parts)]
    env = {'TF_CPP_MIN_LOG_LEVEL': '2'}
    if self.compile_cache is not None:  # the driver's folder ('' none): a restart loads there
      env.update({'JAX_COMPILATION_CACHE_DIR': self.compile_cache} if self.compile_cache
                 else {'JAX_ENABLE_COMPILATION_CACHE': 'false'})
    if not self.gpus_per_worker:
      env['JAX_PLATFORMS'] = 'cpu'
    else:  # a GPU's memory as needed: the driver may evaluate on the same GPU
      env['XLA_PYTHON_CLIENT_PREALLOCATE'] = 'false'
    # Ray sets a worker's OMP_NUM_THREADS to its CPUs: the team of oneDNN's convolutions.
    worker_actor = ray.remote(_Worker).options(
        num_cpus=cpus, num_gpus=self.gpus_per_worker, max_restarts=self.restart_workers,
        max_task_retries=0, scheduling_strategy='SPREAD', runtime_env={'env_vars': env})
    rng_data = np.asarray(jax.random.key_data(self.rng))
    self.actors = {w: worker_actor.remote(w, self.model, self.batches, self.micro_batches,
                                          rng_data, treedef, parts, self.host_memory)
                   for w in range(self.workers)}
    self.where = dict(zip(self.actors, self._started([a.where.remote()
                                                      for a in self.actors.values()], cpus)))
    self.position = {w: first // self.workers for w in self.actors}
    if first % self.workers:
      logging.info('Resumed at step %d: each worker starts at batch %d of its shard (the '
                   'checkpoint holds the applied count, not each worker\'s position).', first,
                   first // self.workers)
    plural = lambda n, what: f"{n} {what}{'' if n == 1 else 's'}"
    logging.info('Downpour on Ray: %s (%s), %s each%s, %s (%s).',
                 plural(self.workers, 'worker'),
                 ', '.join(f'{w}: {self._where(w)}' for w in self.actors), plural(cpus, 'CPU'),
                 '' if self.cpus_per_worker else
                 f" (async_sgd.cpus_per_worker=0: the cluster's {cluster_cpus} CPUs / "
                 f"{plural(self.workers, 'worker')})",
                 plural(len(self.servers), 'server actor'), self.server.server)
    for w in self.actors:
      self._draw(w)

  def _started(self, refs, cpus: int) -> list:
    """`ray.get(refs)` of the workers' first answers, saying every `STARTING_LOG_S` seconds
    how many have started and what the rest wait for: a worker Ray cannot place yet (its
    CPUs or GPU taken) starts only when they free up or an autoscaler adds a node, and
    until then the run would wait without a word."""
    ray = ray_module()
    begun = time.monotonic()
    while True:
      ready, waiting = ray.wait(refs, num_returns=len(refs), timeout=STARTING_LOG_S)
      if not waiting:
        return ray.get(refs)
      free = ray.available_resources()
      logging.warning(
          'Downpour on Ray: %d of %d workers started after %.0f s (each reserves %d CPU%s%s; '
          'the cluster has %g of %g CPUs free%s): a worker Ray cannot place waits until they '
          'free up or an autoscaler adds a node. Lower async_sgd.cpus_per_worker (0: the '
          'cluster\'s / N) or the mesh\'s devices, or free the cluster.',
          len(ready), len(refs), time.monotonic() - begun, cpus, '' if cpus == 1 else 's',
          f' and {self.gpus_per_worker:g} GPU' if self.gpus_per_worker else '',
          free.get('CPU', 0), ray.cluster_resources().get('CPU', 0),
          f", {free.get('GPU', 0):g} GPUs" if self.gpus_per_worker else '')

  def _draw(self, worker):
    """The worker draws its next batch and pulls the current version from every server."""
    if worker not in self.actors or not self.ledger.may_draw():
      return
    position = self.position[worker]
    self.position[worker] += 1
    self.ledger.draw(worker, position)
    pulls = [s.pull.remote() for s in self.servers]
    refs = self.actors[worker].compute.options(num_returns=2 + len(self.servers)).remote(
        position, self.servers[0].pull_stats.remote(), *pulls)
    self.in_flight[refs[0]] = (worker, refs[1:])

  def _where(self, worker) -> str:
    host, pid = self.where[worker]
    return f'pid {pid} on {host}'

  def _lost(self, worker, state):
    ticket = self.ledger.lose(worker)
    step, batch = self.last_applied.get(worker, (None, None))
    last = (f'its last applied update was step {step} (batch {batch} of its shard)'
            if step else 'none of its updates was applied')
    restart = self.restarts[worker] < self.restart_workers
    if not restart:
      del self.actors[worker]
    logging.warning('Asynchronous worker %d (%s) lost at step %d: %s; its batch %s in flight '
                    'is lost; %s.', worker, self._where(worker), int(state.step), last,
                    ticket.batch if ticket else '-',
                    f'restarting it ({self.restarts[worker] + 1} of {self.restart_workers})'
                    if restart else f'{len(self.actors)} worker(s) left')
    if restart:
      self.restarts[worker] += 1
      self.restarting[self.actors[worker].where.remote()] = worker
    self._draw_idle()  # another worker takes the lost batch's place in the count

  def _restarted(self, worker, ref, state):
    """A restarting worker answered: it rejoins (pulling the current weights), is still
    restarting (asked again), or could not be restarted (gone)."""
    ray = ray_module()
    try:
      self.where[worker] = ray.get(ref)
    except ray.exceptions.ActorUnavailableError:  # Ray is still bringing it back
      time.sleep(0.2)
      self.restarting[self.actors[worker].where.remote()] = worker
      return
    except ray.exceptions.RayActorError:
      del self.actors[worker]
      logging.warning('Asynchronous worker %d could not be restarted; %d worker(s) left.',
                      worker, len(self.actors))
      return
    logging.info('Asynchronous worker %d rejoined at step %d (%s), from batch %d of its shard.',
                 worker, int(state.step), self._where(worker), self.position[worker])
    self._draw(worker)

  def _draw_idle(self):
    for w in self.actors:
      if w not in self.ledger.outstanding and w not in self.restarting.values():
        self._draw(w)

  def _applied(self, refs):
    """Servers' `apply` calls that finished: a lost server ends the run."""
    ray = ray_module()
    for ref in refs:
      self.applying.remove(ref)
      try:
        ray.get(ref)
      except ray.exceptions.RayError:
        self._check_servers()
        raise

  def _check_servers(self):
    ray = ray_module()
    for p, s in enumerate(self.servers):
      try:
        ray.get(s.where.remote(), timeout=60)
      except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
        _, part = self.server.parts[p]
        raise RunError(f'asynchronous server {p} of {len(self.servers)} (it held {len(part)} '
                       f'tensors of the weights and their optimizer state) is lost; run again '
                       f'with the same --workdir to resume from the last checkpoint') from None

  def _lost_summary(self) -> str:
    return ', '.join(f'worker {t.worker}: batch {t.batch}' for t in self.ledger.lost)

