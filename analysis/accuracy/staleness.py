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
  keep = max(delays, default=0) + 1  # the versions an update may reach back to
  grad_fn, update = jax.jit(grad_fn), jax.jit(_update(tx))
  opt_state = tx.init(params)
  history = collections.deque([(params, aux)])  # versions k − len + 1 … k, newest last
  losses = []
  batches = iter(batches)
  for k, s in enumerate(delays):
    old_params, old_aux = history[max(0, len(history) - 1 - s)]
    grads, aux, loss = grad_fn(old_params, old_aux, next(batches))
    params, opt_state = update(params, opt_state, grads)
    history.append((params, aux))
    if len(history) > keep:
      history.popleft()
    losses.append(float(loss))
    if on_step is not None:
      on_step(k + 1, params, aux)
  return params, aux, losses


def _update(tx):
  def update(params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state
  return update
