"""Gossip ([L] Algorithm 2; docs/sources.md): each device mixes gradients with two ring
neighbours only, instead of all-reducing them.

The devices form a ring of P (all mesh axes, in mesh order). At step k device i
exchanges its gradient with r = (i + s) mod P and l = (i − s + P) mod P and updates its
own replica with the mean of the three (weights 1/3 each); the distance s runs
1, 2, …, ⌊P/2⌋ and wraps, so information crosses the ring in a few steps. In matrix
form the step applies W_s = (I + S^s + S^−s)/3 (S the cyclic shift) to the stacked
per-device gradients. When both partners are the same device — P = 2, or s = P/2 for
even P — its gradient counts twice (2/3), as the formula says, but travels once: one
`ppermute` brings it (XLA merged the two identical permutes anyway; the program now says
so, and the accounting and the parts model count one message); for P = 1 the device is
its own partner and the step is plain SGD.

Each device keeps its own replica (parameters, BN statistics, optimizer state: `P(axes)`
on a leading dimension of size N), which the mixing keeps close but not equal;
evaluation reads their average. Per step a device sends its gradient to r and to l:
2·|g| values (|g| where r = l), against the ring all-reduce's 2(N−1)/N·|g| — less only
in the number of partners, which is the point on a slow or irregular network.

Local SGD(p) with gossip ([L]'s best configuration, with sparsification:
`sparsify.py`): config `sync_every` = p > 1 makes the exchange happen only on every
p-th step (after `local_sgd_warmup` steps that all exchange); on the other steps each
replica takes its own gradient, sending nothing — communication falls by p, as Local
SGD's does. p = 1 is gossip. The distance s advances with the step count.

Mixing gradients leaves the replicas' differences to the loss's curvature alone: along an
eigenvector of W_s with eigenvalue λ they shrink as (1 − ηλh) a step for curvature h, and
W_s's eigenvalues reach −1/3 — on 2 devices the difference mode has λ = −1/3 on every step
and the replicas climb apart (analysis/accuracy/gossip_sim.py; docs/accuracy.md). Config
`gossip_mix='parameters'` mixes the models instead (decentralised SGD, Lian et al. 2017,
"adapt then combine"): each replica steps on its own gradient, then takes W_s's mean of its
own and its partners' weights and BN statistics; a difference then shrinks by λ itself,
|λ| ≤ 1/3, on every exchange. Its optimizer state stays its own.
"""
import jax.numpy as jnp
import optax
from absl import logging
from jax import lax

from jaxpar.parallel.averaging import Replicas
from jaxpar.collectives import fused_as, nbytes

# What the neighbours mix (config `gossip_mix`): [L]'s gradients, or the replicas' weights.
GOSSIP_MIXES = ('gradients', 'parameters')


def ring_partners(n: int, s: int) -> tuple:
  """The permutations bringing device i the values of i + s and of i − s on a ring of n:
  two, one where both partners are the same device (n = 2, or s = n/2), none for n = 1
  (the device is its own partner)."""
  if n == 1:
    return ()
  from_right = [(j, (j - s) % n) for j in range(n)]  # device i receives from i + s
  from_left = [(j, (j + s) % n) for j in range(n)]   # device i receives from i − s
  return (from_right,) if from_right == from_left else (from_right, from_left)


def messages(n: int, s: int) -> int:
  """Messages a device sends in one exchange at distance s on a ring of n."""
  return len(ring_partners(n, s))


def mean_with_partners(own, received: list):
  """(own + right + left) / 3, `received` holding one value per distinct partner: a partner
  that is both counts twice; with none the device is its own partner, and the mean is own."""
  if not received:
    return own
  partners = received[0] * 2 if len(received) == 1 else received[0] + received[1]
  return (own + partners) / 3


def gossip_mean(tree, axes, s: int, fusion: str = 'per_tensor'):
  """(g_i + g_{i+s} + g_{i−s}) / 3 on every device i of the ring over `axes`, inside
  shard_map; `s` a Python int. One permute per partner: where both partners are one
  device, its values arrive once and count twice. `fusion` (config `grad_fusion`):
  `per_tensor`, one or two permutes per tensor; `one_buffer`, every leaf in one buffer per
  dtype, one or two permutes a step; `by_size`, the leaves under 64 KiB in one buffer and
  each larger one alone (each call costs a latency and is a rendezvous of the partners, a
  buffer a copy of every byte in it; docs/performance.md#gradients-by-size-grad_fusion)."""
  perms = ring_partners(lax.axis_size(axes), s)

  def mix(g):
    return mean_with_partners(g, [lax.ppermute(g, axes, perm) for perm in perms])
  return fused_as(fusion, tree, mix)


def distances(n: int) -> list:
  """The cycle of s over the steps: 1, 2, …, ⌊n/2⌋ (just 1 for n ≤ 3)."""
  return list(range(1, max(1, n // 2) + 1))


class Gossip(Replicas):
  """Strategy: one replica per device, updated with its gossip-mixed gradient on every
  `every`-th step after `warmup` steps that all mix (Local SGD(p) + gossip), with its own
  gradient on the others."""
  # What the 2-device warning suggests instead (SparseGossip mixes gradients only).
  TWO_DEVICES_FIX = '--config.gossip_mix=parameters mixes the models instead'

  def __init__(self, mesh, every: int = 1, warmup: int = 0, fusion: str = 'per_tensor',
               mix: str = 'gradients'):
    super().__init__(mesh)
    self.every, self.warmup, self.fusion, self.mix = every, warmup, fusion, mix
    if mix == 'gradients' and self.devices == 2:
      logging.warning("%s on 2 devices mixing gradients ([L] as written): each replica takes "
                      "2/3 of its partner's gradient and the two climb apart "
                      "(docs/accuracy.md); %s.", type(self).__name__, self.TWO_DEVICES_FIX)

  def describe(self):
    every = (f', exchanging every {self.every} steps after {self.warmup}' if self.every > 1
             else '')
    return f'mixes {self.what()} with two ring neighbours{every}'

  def what(self) -> str:
    """What the neighbours mix, in words."""
    return self.mix

  def exchanges(self, step):
    """Whether `step` (traced) exchanges; None when every step does."""
    if self.every == 1:
      return None
    return (step < self.warmup) | ((step + 1 - self.warmup) % self.every == 0)

  @staticmethod
  def sent_when(exchanging, sent):
    """`sent` bytes on a step that exchanges, 0 on the others."""
    return sent if exchanging is None else jnp.where(exchanging, sent, 0.0)

  def update(self, tx, grads, batch_stats, state):
    # Updated in the layout (`PerDevice.own`): the gradients and statistics join it.
    params, opt_state = state.params, state.opt_state
    grads, batch_stats = self.layout.stack((grads, batch_stats))
    cycle = distances(self.devices)
    branches = [lambda g, s=s: gossip_mean(g, self.axes, s, self.fusion) for s in cycle]
    exchanging = self.exchanges(state.step)

    def mixed(tree):  # its own partner twice on one device: (t + t + t)/3 = t, nothing sent
      if self.devices == 1:
        return tree
      return exchange_when(exchanging, lambda t: lax.switch(
          state.step % len(cycle), branches, t), lambda t: t, tree)
    if self.mix == 'gradients':  # [L]: the mean of the three gradients updates each replica
      updates, opt_state = tx.update(mixed(grads), opt_state, params)
      params = optax.apply_updates(params, updates)
      sent = nbytes(grads)
    else:  # each replica steps on its own gradient, then takes the mean of the three models
      updates, opt_state = tx.update(grads, opt_state, params)
      params, batch_stats = mixed((optax.apply_updates(params, updates), batch_stats))
      sent = nbytes((params, batch_stats))
    # What is mixed, to each partner, on a step that exchanges.
    sent = self.sent_when(exchanging, self.messages_on(state.step) * sent)
    return params, batch_stats, opt_state, {'sent_bytes': sent}

  def messages_on(self, step):
    """Messages a device sends on `step` (traced) if it exchanges: one per partner, by the
    step's ring distance."""
    counts = [messages(self.devices, s) for s in distances(self.devices)]
    if len(set(counts)) == 1:
      return float(counts[0])
    return jnp.asarray(counts, jnp.float32)[step % len(counts)]


def exchange_when(condition, exchange, keep, *args):
  """exchange(*args) on a step where `condition` (traced) holds, keep(*args) on the
  others; exchange(*args) when `condition` is None (every step exchanges)."""
  if condition is None:
    return exchange(*args)
  return lax.cond(condition, exchange, keep, *args)
