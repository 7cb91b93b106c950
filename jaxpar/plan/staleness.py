"""Asynchronous SGD as a delay, with everything else held equal.

Downpour ([T] §3.2) applies each push to the newest weights, but the push's gradient was
taken at the weights its worker pulled: update k applies the gradient of weights s_k
versions old,

    w_{k+1} = U(w_k, ∇L(w_{k−s_k}; batch_k))         (U: the optimizer's update, optax)

With N equally fast workers s_k settles at N − 1; s_k = 0 is synchronous SGD exactly.
Running the real scheme measures the staleness as it occurs (and its step counts carry
thread timing); this simulator fixes it — s_k = s for every k, or any sequence, e.g.
the staleness a Downpour run logged — so that steps to a target can be measured against
s alone (Mitliagkas et al. 2016, "Asynchrony begets momentum": s acts as extra momentum,
so a tuned rate falls with s; `steps_model.STALENESS`).

State the network carries besides its weights (BatchNorm statistics) follows Downpour:
the worker computes the new statistics from the (stale) statistics it pulled and its
batch; the server replaces its statistics with them.
"""
import collections
from typing import Any, Callable, Iterable

import jax
import optax

# grad_fn(params, aux, batch) -> (gradients, aux after the batch, loss)
GradFn = Callable[[Any, Any, Any], tuple[Any, Any, Any]]


class Delayed:
  """One update at a time: `state = Delayed(grad_fn, tx, keep).init(params, aux)`, then
  `state, loss = step(state, batch, s)` applies the gradient of the weights (and aux) s
  versions old (clipped at version 0) to the newest weights; `keep` ≥ the largest s + 1
  versions are kept. `state['params']`, `state['aux']`: the newest."""

  def __init__(self, grad_fn: GradFn, tx: optax.GradientTransformation, keep: int):
    self.grad_fn, self.update = jax.jit(grad_fn), jax.jit(_update(tx))
    self.tx, self.keep = tx, keep

  def init(self, params, aux) -> dict:
    # versions k − len + 1 … k, newest last
    return {'params': params, 'aux': aux, 'opt_state': self.tx.init(params),
            'history': collections.deque([(params, aux)])}

  def __call__(self, state: dict, batch, s: int):
    history = state['history']
    old_params, old_aux = history[max(0, len(history) - 1 - s)]
    grads, aux, loss = self.grad_fn(old_params, old_aux, batch)
    params, opt_state = self.update(state['params'], state['opt_state'], grads)
    history.append((params, aux))
    if len(history) > self.keep:
      history.popleft()
    return {'params': params, 'aux': aux, 'opt_state': opt_state, 'history': history}, loss


def train(grad_fn: GradFn, tx: optax.GradientTransformation, params, aux,
          batches: Iterable, delays, steps: int, on_step: Callable | None = None):
  """`steps` updates from `batches`, update k using the gradient at the weights (and aux)
  of version k − s_k (clipped at version 0): `delays` is one int s for every update or
  an iterable of s_k. Returns (params, aux, [loss of every update's batch]). `on_step(k,
  params, aux)` runs after update k (k = 1 … steps) with the newest weights."""
  delays = [delays] * steps if isinstance(delays, int) else list(delays)[:steps]
  if len(delays) < steps:
    raise ValueError(f'{len(delays)} delays for {steps} updates')
  if min(delays, default=0) < 0:
    raise ValueError(f'staleness must be ≥ 0, got {min(delays)}')
  step = Delayed(grad_fn, tx, max(delays, default=0) + 1)
  state = step.init(params, aux)
  losses = []
  batches = iter(batches)
  for k, s in enumerate(delays):
    state, loss = step(state, next(batches), s)
    losses.append(float(loss))
    if on_step is not None:
      on_step(k + 1, state['params'], state['aux'])
  return state['params'], state['aux'], losses


def _update(tx):
  def update(params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
  return update
