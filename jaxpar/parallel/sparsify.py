"""Sparsified gossip ([L] Algorithm 3; docs/sources.md), with optional error feedback.

Gossip as in `gossip.py`, but each device sends its partners only the entries of its
gradient with |g| > threshold, as (value, index) pairs. Shapes are static under SPMD,
so every tensor's message has a fixed capacity k = ⌈capacity · size⌉: the k entries of
largest magnitude, those not above the threshold zeroed. The receiver adds the values
at their indices; a device updates with the mean of its own sparse gradient and its two
partners' ((ĝ_i + ĝ_r + ĝ_l) / 3), so entries nobody sent get a zero gradient (with
plain SGD, [L]'s setting, they are not updated; momentum and weight decay still act).

Error feedback (Deep Gradient Compression, PowerSGD; beyond [L]): each device keeps
what it did not send, residual ← (g + residual) − sent, and adds it to its next
gradient, so no gradient is ever lost — only delayed (without it, accuracy drops at high
sparsity). The residual is per device, kept with the optimizer state.

Per step the metrics report `sent_fraction` (entries above the threshold that were sent
over all entries) and `sent_bytes`: what the compiled program moves, a message of k values
and k int32 indices per tensor to each partner (one partner where both are one device),
whatever the threshold let through.
"""
import math

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jaxpar.parallel.gossip import (Gossip, distances, exchange_when, mean_with_partners,
                                   ring_partners)


def capacity_of(size: int, capacity: float) -> int:
  """Entries a message of a tensor of `size` entries holds: ⌈capacity · size⌉, at least 1."""
  return max(1, min(size, math.ceil(capacity * size)))


def sparsify(g, threshold: float, k: int):
  """(values, indices, count): the k entries of largest magnitude of `g` (flattened), the
  ones not above `threshold` zeroed, and how many are above it."""
  flat = jnp.ravel(g)
  _, index = lax.top_k(jnp.abs(flat), k)
  values = flat[index]
  kept = jnp.abs(values) > threshold
  return jnp.where(kept, values, 0), index.astype(jnp.int32), jnp.sum(kept)


def densify(values, index, like):
  """The message as a tensor shaped like `like`: values at their indices, zero elsewhere."""
  return jnp.zeros(like.size, values.dtype).at[index].add(values).reshape(like.shape)


def with_error_feedback(g, residual, threshold: float, k: int):
  """(sent values, indices, count, new residual) for gradient `g` plus the `residual`."""
  corrected = g + residual
  values, index, count = sparsify(corrected, threshold, k)
  return values, index, count, corrected - densify(values, index, corrected)


def sparse_gossip_mean(tree, axes, s: int, threshold: float, capacity: float, residuals=None):
  """Inside shard_map: (mixed gradients, new residuals, entries sent, entries) for this
  device; `residuals` None = no error feedback."""
  perms = ring_partners(lax.axis_size(axes), s)
  leaves, treedef = jax.tree.flatten(tree)
  old = jax.tree.leaves(residuals) if residuals is not None else [None] * len(leaves)
  mixed, new, sent, total = [], [], 0, 0
  for g, r in zip(leaves, old):
    k = capacity_of(g.size, capacity)
    if r is None:
      values, index, count = sparsify(g, threshold, k)
    else:
      values, index, count, r = with_error_feedback(g, r, threshold, k)
    received = [densify(lax.ppermute(values, axes, perm), lax.ppermute(index, axes, perm), g)
                for perm in perms]  # one where both partners are one device
    mixed.append(mean_with_partners(densify(values, index, g), received))
    new.append(r)
    sent, total = sent + count, total + g.size
  residuals = None if residuals is None else jax.tree.unflatten(treedef, new)
  return jax.tree.unflatten(treedef, mixed), residuals, sent, total


class SparseGossip(Gossip):
  """Strategy: gossip of sparsified gradients; the optimizer state is (the optimizer's,
  the error-feedback residual — () without it)."""
  TWO_DEVICES_FIX = ('all-reduce (server=allreduce) or Local SGD (sync_every) keep them '
                     'together')

  def __init__(self, mesh, threshold: float, capacity: float, error_feedback: bool = True,
               every: int = 1, warmup: int = 0):
    super().__init__(mesh, every, warmup)
    self.threshold, self.capacity, self.error_feedback = threshold, capacity, error_feedback

  def what(self):
    feedback = ', error feedback' if self.error_feedback else ''
    return (f'sparsified gradients (|g| > {self.threshold}, at most {self.capacity:.0%} of each '
            f'tensor{feedback})')

  def checkpoint_layout(self):  # the optimizer state is (the optimizer's, the residual)
    return {**super().checkpoint_layout(), 'paired': True, 'residual': self.error_feedback}

  def init(self, tx, params, batch_stats):
    residual = jax.tree.map(jnp.zeros_like, params) if self.error_feedback else ()
    return self.layout.copies((params, batch_stats, (tx.init(params), residual)))

  def update(self, tx, grads, batch_stats, state):
    # Updated in the layout (`PerDevice.own`): the gradients and statistics join it.
    params, (opt_state, residual) = state.params, state.opt_state
    grads, batch_stats = self.layout.stack((grads, batch_stats))
    residual = residual if self.error_feedback else None
    cycle = distances(self.devices)
    branches = [lambda g, r, s=s: sparse_gossip_mean(g, self.axes, s, self.threshold,
                                                     self.capacity, r)[:3] for s in cycle]
    # On a step that does not exchange (Local SGD(p) + gossip): its own gradient, whole;
    # the residual waits for the next exchange.
    exchanging = self.exchanges(state.step)
    mixed, residual, sent = exchange_when(
        exchanging,
        lambda g, r: lax.switch(state.step % len(cycle), branches, g, r),
        lambda g, r: (g, r, lax.pcast(jnp.int32(0), self.axes, to='varying')),
        grads, residual)
    updates, opt_state = tx.update(mixed, opt_state, params)
    params = optax.apply_updates(params, updates)
    leaves = jax.tree.leaves(grads)
    entries = sum(g.size for g in leaves)
    wire = self.sent_when(exchanging, self.messages_on(state.step) * jnp.float32(
        sum(capacity_of(g.size, self.capacity) * (g.dtype.itemsize + 4) for g in leaves)))
    report = {'sent_bytes': wire, 'sent_fraction': sent / entries}
    residual = residual if self.error_feedback else ()
    return params, batch_stats, (opt_state, residual), report
