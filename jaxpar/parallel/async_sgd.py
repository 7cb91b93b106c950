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
from jaxpar.parallel.collectives import nbytes
from jaxpar.parallel.servers import greedy_owners
from jaxpar.step import TrainState, gradients

SERVERS = ('central', 'distributed')


class AsyncServer:
  """Where the weights and the optimizer state live, and who applies each part of a push.

  The state is initialised replicated on the mesh (as every synchronous run's is; so
  are restored checkpoints) and `place`d on the owners when training starts. The
  optimizer state is a tuple with one entry per owner: that owner's tensors' state.
  """

  def __init__(self, mesh, server: str = 'central'):
    self.mesh = mesh
    self.devices = list(mesh.devices.flat)  # workers; devices[0] is the central server
    self.server = server
    self.owners = None  # per parameter leaf, its device's index; set by make_optimizer
    self.parts = None   # (device index, leaf indices) of every device that owns tensors

  def make_optimizer(self, opt_config, schedule, params):
    leaves = jax.tree.leaves(params)
    if self.server == 'central':
      self.owners = [0] * len(leaves)
    else:
      self.owners, loads = greedy_owners([math.prod(p.shape) for p in leaves], len(self.devices))
      logging.info('Asynchronous distributed server: %d tensors on %d devices by Algorithm 3.7, '
                   '%d-%d elements per device (imbalance max/mean %.3f).', len(leaves),
                   len(self.devices), min(loads), max(loads), max(loads) / np.mean(loads))
    by_owner = collections.defaultdict(list)
    for leaf, owner in enumerate(self.owners):
      by_owner[owner].append(leaf)
    self.parts = sorted(by_owner.items())
    return optim.make_optimizer(opt_config, schedule)

  def state_specs(self, state):
    return jax.tree.map(lambda _: P(), state)

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
  batch: int       # the batch's number in the run's stream (0, 1, …)
  version: int     # the server's version the gradient was computed on
  staleness: int   # server version when applied − `version`


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


def _apply(tx, params, opt_state, grads):
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state


class Downpour:
  """The asynchronous training loop: `loop(state) -> (state, metrics)` applies the next
  push of any worker, like a synchronous step applies the next batch.

  Worker threads start at the first call, from that state; between them they take
  exactly `count` batches from `batches` (numpy, one worker's batch each), so when
  `count` pushes are applied every batch handed out has been applied exactly once
  and the stream's position (`examples_seen`) is exact for a resumed run.
  """

  def __init__(self, model, tx, server: AsyncServer, batches: Iterator, count: int, rng,
               micro_batches: int = 1):
    self.server, self.batches, self.count, self.rng = server, batches, count, rng
    self.grad_fn = gradient_fn(model, micro_batches)
    self.apply = jax.jit(functools.partial(_apply, tx))
    self.log: list = []              # one Update per applied push, in order
    self.pushes: queue.Queue = queue.Queue()
    self.lock = threading.Lock()     # guards the data stream and the published weights
    self.handed_out = 0
    self.stopping = False
    self.threads = []

  def __call__(self, state):
    if not self.threads:
      state = self._start(state)
    push = self.pushes.get()
    if isinstance(push, BaseException):
      self.close()
      raise push
    self.log.append(Update(push.worker, push.batch, push.version,
                           self.published[2] - push.version))
    state = self._apply(state, push)
    push.applied.set()
    # The worker pushed its gradient and pulls the weights for its next batch.
    return state, {**push.metrics, 'staleness': self.log[-1].staleness,
                   'sent_bytes': 2 * nbytes(push.grads)}

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
    for t in self.threads:
      t.join()
    if self.log:
      counts = collections.Counter(u.staleness for u in self.log)
      logging.info('Staleness over %d updates: %s (mean %.2f).', len(self.log),
                   ', '.join(f'{s}: {counts[s]}' for s in sorted(counts)),
                   np.mean([u.staleness for u in self.log]))

  def _start(self, state):
    state = self.server.place(state)
    self.first_step = int(state.step)
    self.published = (state.params, state.batch_stats, self.first_step)
    self.threads = [threading.Thread(target=self._worker, args=(i, d), daemon=True)
                    for i, d in enumerate(self.server.devices)]
    for t in self.threads:
      t.start()
    return state

  def _apply(self, state, push):
    """The server's part: every owner applies its tensors' part of the push."""
    leaves, treedef = jax.tree.flatten(state.params)
    grads = jax.tree.leaves(push.grads)
    new_leaves, opt_states = list(leaves), []
    for (d, part), opt_state in zip(self.server.parts, state.opt_state):
      device = self.server.devices[d]
      mine = jax.device_put([grads[i] for i in part], device)  # the worker pushes each part
      updated, opt_state = self.apply([leaves[i] for i in part], opt_state, mine)
      for i, x in zip(part, updated):
        new_leaves[i] = x
      opt_states.append(opt_state)
    state = state.replace(
        step=state.step + 1,
        examples_seen=state.examples_seen + push.size,
        params=jax.tree.unflatten(treedef, new_leaves),
        batch_stats=jax.device_put(push.batch_stats, self.server.devices[0]),
        opt_state=tuple(opt_states))
    with self.lock:
      self.published = (state.params, state.batch_stats, self.published[2] + 1)
    return state

  def _worker(self, index, device):
    try:
      while True:
        with self.lock:
          if self.stopping or self.handed_out == self.count:
            return
          number = self.first_step + self.handed_out
          self.handed_out += 1
          batch = next(self.batches)
          params, stats, version = self.published
        # Pull: each part from its owner to this worker.
        params, stats, batch = jax.device_put((params, stats, batch), device)
        grads, stats, metrics = self.grad_fn(params, stats, batch,
                                             jax.random.fold_in(self.rng, number))
        push = _Push(index, number, version, len(batch['label']), grads, stats, metrics,
                     threading.Event())
        self.pushes.put(push)
        while not push.applied.wait(0.1):
          if self.stopping:
            return
    except Exception as e:  # re-raised by the loop: a worker must not fail silently
      self.pushes.put(e)
