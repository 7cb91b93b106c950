"""Asynchronous training, Downpour SGD ([T] §3.2, Dean et al. 2012), with a central server.

Asynchronous training does not fit one SPMD step: every worker device runs its own
loop — pull the newest weights, compute the gradient of its own batch, push it —
and the server applies each gradient as it arrives, with no barrier. Gradients may
therefore be computed on stale weights: the staleness of an update is the server's
version when it is applied minus the version the gradient was computed on (0 for
sequential SGD; about N−1 for N equally fast workers, and unbounded for a straggler,
whose gradient meets every push made while it computed: Downpour sets no bound).

Here one Python thread drives each worker device (JAX releases the GIL while a
computation runs); the server is one device holding the weights, the BatchNorm
statistics and the optimizer state, and applies pushes one at a time under a lock
(the semaphore of [T] §7.2). Workers reuse the step's loss (`step.loss_and_logits`).
"""
import dataclasses
import threading
from typing import Any, Callable, Iterable, Sequence

import jax
import optax

from jaxpar.step import loss_and_logits


@dataclasses.dataclass
class Update:
  worker: int
  batch: int       # the worker's batch number (0, 1, …)
  version: int     # the server's version the gradient was computed on
  staleness: int   # server version when applied − `version`
  loss: float


class CentralServer:
  """One device's weights, BN statistics and optimizer state; applies pushed gradients."""

  def __init__(self, params, batch_stats, tx: optax.GradientTransformation, device):
    self.device = device
    self.params, self.batch_stats = jax.device_put((params, batch_stats), device)
    self.opt_state = jax.device_put(tx.init(params), device)
    self.version = 0
    self.log: list = []
    self._lock = threading.Lock()

    def apply(params, opt_state, grads):
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state
    self._apply = jax.jit(apply)

  def pull(self):
    """(params, batch_stats, version): the newest weights, as of now."""
    with self._lock:
      return self.params, self.batch_stats, self.version

  def push(self, grads, batch_stats, version: int, worker: int, batch: int, loss):
    """Applies one worker's gradient at once; its BN statistics (computed from the
    statistics it pulled and its batch) replace the server's."""
    grads, batch_stats = jax.device_put((grads, batch_stats), self.device)
    with self._lock:
      self.params, self.opt_state = self._apply(self.params, self.opt_state, grads)
      self.batch_stats = batch_stats
      self.log.append(Update(worker, batch, version, self.version - version, float(loss)))
      self.version += 1


def gradient_fn(model) -> Callable:
  """(params, batch_stats, batch, rng) → (grads, new batch_stats, loss), jitted; it runs
  on the device its inputs are on."""
  def grads(params, batch_stats, batch, rng):
    def loss_fn(params):
      outputs, new_vars = model.apply({'params': params, 'batch_stats': batch_stats},
                                      batch['image'], train=True, mutable=['batch_stats'],
                                      rngs={'dropout': rng})
      return loss_and_logits(outputs, batch['label'])[0], new_vars.get('batch_stats', {})
    (loss, new_stats), g = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return g, new_stats, loss
  return jax.jit(grads)


def train(server: CentralServer, grad_fn: Callable, devices: Sequence[Any],
          batches: Sequence[Iterable], rng) -> list:
  """Runs one worker thread per device over its own batches until each is exhausted;
  returns the server's log of applied updates, in the order they were applied."""
  errors = []

  def worker(index, device, stream):
    try:
      for number, batch in enumerate(stream):
        params, stats, version = server.pull()
        params, stats, batch = jax.device_put((params, stats, batch), device)
        key = jax.random.fold_in(jax.random.fold_in(rng, index), number)
        grads, stats, loss = grad_fn(params, stats, batch, key)
        server.push(grads, stats, version, index, number, loss)
    except Exception as e:  # re-raised in the caller: a worker must not fail silently
      errors.append(e)

  threads = [threading.Thread(target=worker, args=(i, d, s), daemon=True)
             for i, (d, s) in enumerate(zip(devices, batches))]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  if errors:
    raise errors[0]
  return server.log
