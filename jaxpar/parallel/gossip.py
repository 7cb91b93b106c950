"""Gossip ([L] Algorithm 2; docs/sources.md): each device mixes gradients with two ring
neighbours only, instead of all-reducing them.

The devices form a ring of P (all mesh axes, in mesh order). At step k device i
exchanges its gradient with r = (i + s) mod P and l = (i − s + P) mod P and updates its
own replica with the mean of the three (weights 1/3 each); the distance s runs
1, 2, …, ⌊P/2⌋ and wraps, so information crosses the ring in a few steps. In matrix
form the step applies W_s = (I + S^s + S^−s)/3 (S the cyclic shift) to the stacked
per-device gradients. When both partners are the same device — P = 2, or s = P/2 for
even P — its gradient is received twice and counts twice (2/3), as the formula says;
for P = 1 the device is its own partner and the step is plain SGD.

Each device keeps its own replica (parameters, BN statistics, optimizer state: `P(axes)`
on a leading dimension of size N), which the mixing keeps close but not equal;
evaluation reads their average. Per step a device sends its gradient twice (to r and
l): 2·|g| values, against the ring all-reduce's 2(N−1)/N·|g| — less only in the number
of partners, which is the point on a slow or irregular network.
"""
import jax
import optax
from jax import lax

from jaxpar.parallel.averaging import Replicas
from jaxpar.parallel.collectives import nbytes


def gossip_mean(tree, axes, s: int):
  """(g_i + g_{i+s} + g_{i−s}) / 3 on every device i of the ring over `axes`, inside
  shard_map; `s` a Python int."""
  n = lax.axis_size(axes)
  from_right = [(j, (j - s) % n) for j in range(n)]  # device i receives g_{i+s}
  from_left = [(j, (j + s) % n) for j in range(n)]   # device i receives g_{i−s}
  return jax.tree.map(
      lambda g: (g + lax.ppermute(g, axes, from_right) + lax.ppermute(g, axes, from_left)) / 3,
      tree)


def distances(n: int) -> list:
  """The cycle of s over the steps: 1, 2, …, ⌊n/2⌋ (just 1 for n ≤ 3)."""
  return list(range(1, max(1, n // 2) + 1))


class Gossip(Replicas):
  """Strategy: one replica per device, updated with its gossip-mixed gradient."""

  def update(self, tx, grads, batch_stats, state):
    params, opt_state = self.layout.own((state.params, state.opt_state))
    cycle = distances(self.devices)
    branches = [lambda g, s=s: gossip_mean(g, self.axes, s) for s in cycle]
    if self.devices == 1:  # its own partner twice: (g + g + g)/3 = g, with nothing sent
      mixed = grads
    elif len(cycle) == 1:
      mixed = branches[0](grads)
    else:
      mixed = lax.switch(state.step % len(cycle), branches, grads)
    updates, opt_state = tx.update(mixed, opt_state, params)
    params = optax.apply_updates(params, updates)
    # The gradient to each of the two partners.
    sent = 2 * nbytes(grads) if self.devices > 1 else 0
    return (*self.layout.stack((params, batch_stats, opt_state)), {'sent_bytes': sent})
