"""Asynchronous training, Downpour SGD ([T] §3.2, Dean et al. 2012; [T] eqs. 4.13–4.21).

Asynchronous training does not fit one SPMD step: every worker device runs its own
loop — pull the newest weights, compute the gradient of its own batch, push it —
and the server applies each gradient as it arrives, with no barrier. Gradients may
therefore be computed on stale weights: the staleness of an update is the server's
version when it is applied minus the version the gradient was computed on (0 for
sequential SGD; about N−1 for N equally fast workers, and unbounded for a straggler,
whose gradient meets every push made while it computed: Downpour sets no bound).

Here one Python thread drives each worker device (JAX releases the GIL while a
computation runs) and the training loop of `jaxpar.train` is the server: each call
of `Downpour` applies one push, so logging, evaluation and checkpoints work as for
synchronous runs, between updates. A worker waits until its push is applied before
it pulls again (one gradient in flight per worker, as with [T]'s semaphore, §7.2).

Servers (`AsyncServer`): `central` keeps every weight and its optimizer state on
device 0; `distributed` places whole tensors by [T]'s Algorithm 3.7
(`servers.greedy_owners`), each with its optimizer state on its owner device,
which applies that part of every push — workers pull each part from its owner
and push each part to it. The BN statistics stay with device 0 and are replaced
by each push's (computed from the statistics the worker pulled and its batch).
Workers compute the gradient with the step's own loss (`step.gradients`).
"""
import collections
import dataclasses
import functools
import math
import queue
import threading
from typing import Any, Iterator

import jax
import numpy as np
import optax
from absl import logging
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import optim
from jaxpar.collectives import nbytes
from jaxpar.portable import owner_parts
from jaxpar.step import TrainState, gradients

SERVERS = ('central', 'distributed')


class AsyncServer:
  """Where the weights and the optimizer state live, and who applies each part of a push.

  The state is initialised replicated on the mesh (as every synchronous run's is; so
  are restored checkpoints) and `place`d on the owners when training starts. The
  optimizer state is a tuple with one entry per owner: that owner's tensors' state.
  """

  def __init__(self, mesh, server: str = 'central', workers: int = 0):
    self.mesh = mesh
    self.devices = list(mesh.devices.flat)  # workers; devices[0] is the central server
    self.server = server
    # The parts the distributed server splits the weights in: one per worker (on Ray, the
    # workers are actors, not this process's devices).
    self.workers = workers or len(self.devices)
    self.owners = None  # per parameter leaf, its device's index; set by make_optimizer
    self.parts = None   # (device index, leaf indices) of every device that owns tensors

  def describe(self):
    return f'{self.workers} workers push gradients to the {self.server} server, asynchronously'

  def make_optimizer(self, opt_config, schedule, params):
    sizes = [math.prod(p.shape) for p in jax.tree.leaves(params)]
    self.parts = owner_parts(self.checkpoint_layout(), sizes)
    self.owners = [0] * len(sizes)
    loads = [0] * self.workers
    for owner, part in self.parts:
      for leaf in part:
        self.owners[leaf] = owner
        loads[owner] += sizes[leaf]
    if self.server == 'distributed':
      logging.info('Asynchronous distributed server: %d tensors on %d devices by Algorithm 3.7, '
                   '%d-%d elements per device (imbalance max/mean %.3f).', len(sizes),
                   self.workers, min(loads), max(loads), max(loads) / np.mean(loads))
    return optim.make_optimizer(opt_config, schedule)

  def state_specs(self, state):
    return jax.tree.map(lambda _: P(), state)

  def checkpoint_layout(self):
    return {'kind': 'owners', 'server': self.server, 'workers': self.workers}

  def init(self, tx, params, batch_stats):
    leaves = jax.tree.leaves(params)
    return params, batch_stats, tuple(tx.init([leaves[i] for i in part]) for _, part in self.parts)

  def place(self, state: TrainState) -> TrainState:
    """Each tensor and its optimizer state on its owner; BN statistics on device 0."""
    leaves, treedef = jax.tree.flatten(state.params)
    placed = [jax.device_put(x, self.devices[o]) for x, o in zip(leaves, self.owners)]
    return state.replace(
        params=jax.tree.unflatten(treedef, placed),
        batch_stats=jax.device_put(state.batch_stats, self.devices[0]),
        opt_state=tuple(jax.device_put(s, self.devices[d])
                        for (d, _), s in zip(self.parts, state.opt_state)))

  def variables(self, state):
    return jax.device_put({'params': state.params, 'batch_stats': state.batch_stats},
                          NamedSharding(self.mesh, P()))


@dataclasses.dataclass
class Update:
  worker: int
  batch: int       # the batch's number: in the run's stream (threads), in the worker's shard (Ray)
  version: int     # the server's version the gradient was computed on
  staleness: int   # server version when applied − `version`
  lr_scale: float = 1.0  # the learning rate's factor for this update (`lr_staleness`)


@dataclasses.dataclass
class Ticket:
  """A batch a worker drew, and the version of the weights it pulled for it."""
  worker: int
  batch: int
  version: int
  order: int       # the run's count of draws before this one


class Ledger:
  """Versions, staleness and the order pushes are applied in: Downpour's logic, shared
  by both transports (threads in this process, `async_ray`'s actors).

  A worker *draws* a batch (pulling the weights of the current version), computes and
  pushes; the push *arrives*, and is *applied* when the bound allows, making the next
  version. Without a bound (`max_staleness=None`, Downpour as published) an arrived
  push is applied at once. With a bound s, a push is held — its worker waits, as in
  stale-synchronous parallel (Ho et al. 2013) — while applying it would let a gradient
  still in flight exceed s: with the gradients outstanding ordered by the version they
  pulled, the k-th oldest (k = 0, 1, …) keeps `version − pulled ≤ s − k`, so every applied
  update has staleness ≤ s, no gradient is ever discarded, and the oldest outstanding
  push can always be applied (no deadlock). N workers that pulled the same version must
  be applied one after the other, so s ≥ N − 1 (`validation` checks it).

  `lr_staleness='inverse'` divides the update's learning rate by its staleness (Zhang et
  al. 2016, "Staleness-aware Async-SGD"; staleness 0 keeps it).
  """

  def __init__(self, count: int, first_version: int, max_staleness=None,
               lr_staleness: str = 'none'):
    self.count, self.version = count, first_version
    self.max_staleness, self.lr_staleness = max_staleness, lr_staleness
    self.outstanding: dict = {}   # worker -> Ticket: drawn, not yet applied nor lost
    self.arrived: dict = {}       # worker -> push, in order of arrival
    self.log: list = []           # one Update per applied push, in order
    self.lost: list = []          # Tickets of batches lost with their worker
    self.drawn = 0

  def may_draw(self) -> bool:
    """Whether another batch is needed: applied + outstanding < count."""
    return len(self.log) + len(self.outstanding) < self.count

  def draw(self, worker: int, batch: int) -> Ticket:
    ticket = Ticket(worker, batch, self.version, self.drawn)
    self.outstanding[worker] = ticket
    self.drawn += 1
    return ticket

  def arrive(self, worker: int, push) -> None:
    self.arrived[worker] = push

  def lose(self, worker: int):
    """The worker is gone: its drawn batch (if any) is lost, counted, never applied."""
    self.arrived.pop(worker, None)
    ticket = self.outstanding.pop(worker, None)
    if ticket is not None:
      self.lost.append(ticket)
    return ticket

  def next(self):
    """The arrived push to apply now (the first in order of arrival the bound allows), or None."""
    if self.max_staleness is None:
      return next(iter(self.arrived.values()), None)
    by_age = sorted(self.outstanding.values(), key=lambda t: (t.version, t.order))
    position = {t.worker: k for k, t in enumerate(by_age)}
    for worker, push in self.arrived.items():
      j = position[worker]
      if all(self.version - by_age[k].version <= self.max_staleness - k - 1 for k in range(j)):
        return push
    return None

  def apply(self, worker: int) -> Update:
    """Records that the arrived push of `worker` is applied (the next version)."""
    self.arrived.pop(worker)
    ticket = self.outstanding.pop(worker)
    staleness = self.version - ticket.version
    assert self.max_staleness is None or staleness <= self.max_staleness, (staleness, ticket)
    scale = 1.0 / max(1, staleness) if self.lr_staleness == 'inverse' else 1.0
    self.version += 1
    self.log.append(Update(worker, ticket.batch, ticket.version, staleness, scale))
    return self.log[-1]

  def staleness_summary(self) -> str:
    counts = collections.Counter(u.staleness for u in self.log)
    return (f"{', '.join(f'{s}: {counts[s]}' for s in sorted(counts))} "
            f"(mean {np.mean([u.staleness for u in self.log]):.2f})")


@dataclasses.dataclass
class _Push:
  worker: int
  batch: int
  version: int
  size: int        # examples in the batch
  grads: Any
  batch_stats: Any
  metrics: dict
  applied: threading.Event


def gradient_fn(model, micro_batches: int = 1):
  """(params, batch_stats, batch, rng) → (grads, new batch_stats, metrics), jitted; it runs
  on the device its inputs are on. BatchNorm normalises over the worker's own batch (or
  micro-batch: `step.gradients`)."""
  return jax.jit(functools.partial(gradients, model.clone(bn_axis_name=None),
                                   micro_batches=micro_batches))


def apply_update(tx, params, opt_state, grads, lr_scale):
  """One part of a push applied by its owner; `lr_scale` multiplies the step (`Ledger`)."""
  updates, opt_state = tx.update(grads, opt_state, params)
  updates = jax.tree.map(lambda u: u * lr_scale.astype(u.dtype), updates)
  return optax.apply_updates(params, updates), opt_state


class Downpour:
  """The asynchronous training loop on threads: `loop(state) -> (state, metrics)` applies
  the next push of any worker, like a synchronous step applies the next batch.

  Worker threads start at the first call, from that state; between them they take
  exactly `count` batches from `batches` (numpy, one worker's batch each), so when
  `count` pushes are applied every batch handed out has been applied exactly once
  and the stream's position (`examples_seen`) is exact for a resumed run.
  """

  def __init__(self, model, tx, server: AsyncServer, batches: Iterator, count: int, rng,
               micro_batches: int = 1, max_staleness=None, lr_staleness: str = 'none'):
    self.server, self.batches, self.count, self.rng = server, batches, count, rng
    self.max_staleness, self.lr_staleness = max_staleness, lr_staleness
    self.grad_fn = gradient_fn(model, micro_batches)
    self.apply = jax.jit(functools.partial(apply_update, tx))
    self.ledger = None
    self.pushes: queue.Queue = queue.Queue()
    self.lock = threading.Lock()     # guards the data stream, the ledger and the weights
    self.stopping = False
    self.threads = []

  @property
  def log(self) -> list:
    return self.ledger.log if self.ledger else []

  def __call__(self, state):
    if not self.threads:
      state = self._start(state)
    while True:
      with self.lock:
        push = self.ledger.next()
      if push is not None:
        break
      item = self.pushes.get()
      if isinstance(item, BaseException):
        self.close()
        raise item
      with self.lock:
        self.ledger.arrive(item.worker, item)
    with self.lock:  # a worker pulls the new version's number and weights together
      update = self.ledger.apply(push.worker)
      state = self._apply(state, push, update.lr_scale)
    push.applied.set()
    # The worker pushed its gradient and pulls the weights for its next batch.
    return state, {**push.metrics, 'staleness': update.staleness,
                   'sent_bytes': 2 * nbytes(push.grads)}

  def synced(self, state):
    """The state is this process's already."""
    return state

  def histograms(self) -> dict:
    """Per-update values of this run whose distribution is worth seeing."""
    return {'staleness': np.array([u.staleness for u in self.log])}

  def close(self):
    """Releases every worker (waiting or not) and joins them."""
    self.stopping = True
    while True:
      try:
        push = self.pushes.get_nowait()
      except queue.Empty:
        break
      if isinstance(push, _Push):
        push.applied.set()
    if self.ledger:
      for push in self.ledger.arrived.values():
        push.applied.set()
    for t in self.threads:
      t.join()
    if self.log:
      logging.info('Staleness over %d updates: %s.', len(self.log),
                   self.ledger.staleness_summary())

  def _start(self, state):
    state = self.server.place(state)
    self.first_batch = int(state.step)
    self.ledger = Ledger(self.count, self.first_batch, self.max_staleness, self.lr_staleness)
    self.published = (state.params, state.batch_stats)
    self.threads = [threading.Thread(target=self._worker, args=(i, d), daemon=True)
                    for i, d in enumerate(self.server.devices)]
    for t in self.threads:
      t.start()
    return state

  def _apply(self, state, push, lr_scale):
    """The server's part: every owner applies its tensors' part of the push."""
    leaves, treedef = jax.tree.flatten(state.params)
    grads = jax.tree.leaves(push.grads)
    new_leaves, opt_states = list(leaves), []
    for (d, part), opt_state in zip(self.server.parts, state.opt_state):
      device = self.server.devices[d]
      mine = jax.device_put([grads[i] for i in part], device)  # the worker pushes each part
      updated, opt_state = self.apply([leaves[i] for i in part], opt_state, mine,
                                      np.float32(lr_scale))
      for i, x in zip(part, updated):
        new_leaves[i] = x
      opt_states.append(opt_state)
    state = state.replace(
        step=state.step + 1,
        examples_seen=state.examples_seen + push.size,
        params=jax.tree.unflatten(treedef, new_leaves),
        batch_stats=jax.device_put(push.batch_stats, self.server.devices[0]),
        opt_state=tuple(opt_states))
    self.published = (state.params, state.batch_stats)
    return state

  def _worker(self, index, device):
    try:
      while True:
        with self.lock:
          if self.stopping or not self.ledger.may_draw():
            return
          ticket = self.ledger.draw(index, self.first_batch + self.ledger.drawn)
          batch = next(self.batches)
          params, stats = self.published
        # Pull: each part from its owner to this worker.
        params, stats, batch = jax.device_put((params, stats, batch), device)
        grads, stats, metrics = self.grad_fn(params, stats, batch,
                                             jax.random.fold_in(self.rng, ticket.batch))
        push = _Push(index, ticket.batch, ticket.version, len(batch['label']), grads, stats,
                     metrics, threading.Event())
        self.pushes.put(push)
        while not push.applied.wait(0.1):
          if self.stopping:
            return
    except Exception as e:  # re-raised by the loop: a worker must not fail silently
      self.pushes.put(e)
