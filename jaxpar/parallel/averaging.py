"""Model averaging / Local SGD ([S] §3, [L] Algorithm 1; docs/sources.md): one replica per
device, averaged every τ steps (config `sync_every`).

Every device trains its own copy of the parameters, BatchNorm statistics and optimizer
state on its own batches (no gradient is sent); after every τ-th local update the
parameters and BN statistics are averaged over all devices (an all-reduce of the model:
communication falls by τ, [S]). The optimizer state stays each device's own, as with
PyTorch's `PostLocalSGDOptimizer`.

Averaging comes *after* the local update: τ = 1 is then exactly synchronous SGD, with
momentum and weight decay too (the update is linear in the gradient, so the mean of the
replicas' updates is the update of the mean gradient), and the replicas are identical
right after each average. [L]'s literal order (average, then apply the local gradient)
would leave them one local step apart even at τ = 1. LARS is not linear: its τ = 1 run is
close to, not equal to, synchronous LARS.

`local_sgd_warmup` steps of fully synchronous training come first (gradients averaged
every step, as post-local SGD, Lin et al. 2020: replicas drift apart most early on).

Hierarchical Local SGD (config `local_sgd_group_size` = G > 1; SparkNet's and PyTorch's
`HierarchicalModelAverager`: synchronous within a node, averaging across nodes): the
devices of each group of G — trailing mesh axes, e.g. one host's — all-reduce their
gradients every step and so train one replica together; the groups' replicas are
averaged every τ steps. τ = 1 is synchronous SGD over the whole mesh.
Evaluation reads the average of the replicas (`variables`), and replica 0 alone where
they have drifted apart (`replica_spread`, `evaluation.evaluate_model`); checkpoints keep
every replica, so a resumed run continues exactly.
"""
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import optim
from jaxpar.parallel import layouts
from jaxpar.parallel.allreduce import all_reduce_bytes
from jaxpar.collectives import nbytes


class Replicas(optim.WholeTensors):
  """The layout of one replica per device: parameters, BN statistics and optimizer state
  stacked on a leading dimension of size N, sharded over every mesh axis (`P(axes)`).
  Evaluation reads the replicas' mean. Strategies add `update`."""

  def __init__(self, mesh):
    self.axes = tuple(mesh.axis_names)
    self.devices = mesh.size
    self.layout = layouts.PerDevice(mesh)
    self._mean = jax.jit(self.layout.mean, out_shardings=NamedSharding(mesh, P()))
    self._spread = jax.jit(self.layout.spread, out_shardings=NamedSharding(mesh, P()))
    self._pick = jax.jit(self.layout.pick, static_argnums=1,
                         out_shardings=NamedSharding(mesh, P()))

  def state_specs(self, state):
    return self.layout.state_specs(state, 'params', 'batch_stats', 'opt_state')

  def checkpoint_layout(self):
    return {'kind': 'replicas', 'devices': self.devices}

  def init(self, tx, params, batch_stats):
    return self.layout.copies((params, batch_stats, tx.init(params)))

  def local_variables(self, state):
    return self.layout.own((state.params, state.batch_stats))

  def variables(self, state):
    """The average of the replicas (what they would be averaged to now)."""
    return self._mean({'params': state.params, 'batch_stats': state.batch_stats})

  def replica_spread(self, state) -> float:
    """How far apart the replicas' parameters are: their largest distance from their mean,
    relative to its norm (`layouts.PerDevice.spread`). Right after an average 0; where it
    is large their average is a model none of them trained (`evaluation.evaluate_model`)."""
    return float(self._spread(state.params))

  def replica_variables(self, state, index: int) -> dict:
    """Replica `index`'s own {'params', 'batch_stats'}, replicated on the mesh."""
    return self._pick({'params': state.params, 'batch_stats': state.batch_stats}, index)


class LocalSGD(Replicas):
  """Strategy: replicas averaged after every `every`-th local step, after `warmup`
  synchronous steps; the devices of `inner_axes` (trailing mesh axes) train one replica
  synchronously (hierarchical Local SGD)."""

  def __init__(self, mesh, every: int, warmup: int = 0, inner_axes: tuple = ()):
    super().__init__(mesh)
    self.every, self.warmup, self.inner = every, warmup, tuple(inner_axes or ())

  def describe(self):
    inner = f', one replica per group over {self.inner}' if self.inner else ''
    return (f'averages the replicas every {self.every} steps after {self.warmup} synchronous'
            f'{inner}')

  def update(self, tx, grads, batch_stats, state):
    # Updated in the layout (`PerDevice.own`): the gradients and statistics join it.
    params, opt_state = state.params, state.opt_state
    grads, batch_stats = self.layout.stack((grads, batch_stats))
    if self.devices == 1:  # one replica: every average is the identity
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), batch_stats, opt_state, {'sent_bytes': 0.0}
    # Without warm-up no step is synchronous: the program then has no gradient all-reduce.
    synchronous = state.step < self.warmup if self.warmup else False
    if self.warmup:
      grads = lax.cond(synchronous, self._average, lambda g: g, grads)
    inner_bytes = 0.0
    if self.inner:  # the group's devices train one replica: their gradients' mean
      grads = self._average(grads, self.inner)
      inner_bytes = all_reduce_bytes('psum', nbytes(grads), self.inner)
    updates, opt_state = tx.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    average = synchronous | ((state.step + 1 - self.warmup) % self.every == 0)
    params, batch_stats = lax.cond(average, self._average, lambda t: t, (params, batch_stats))
    # An all-reduce of the gradients while synchronous, of the model when averaging.
    sent = jnp.where(synchronous, all_reduce_bytes('psum', nbytes(grads), self.axes),
                     jnp.where(average, all_reduce_bytes('psum', nbytes((params, batch_stats)),
                                                         self.axes), 0.0) + inner_bytes)
    return params, batch_stats, opt_state, {'sent_bytes': sent}

  def _average(self, tree, axes=None):
    """The mean over `axes` (all devices), kept typed per device (as the other branch is)."""
    axes = axes or self.axes
    return jax.tree.map(lambda x: lax.pcast(lax.pmean(x, axes), axes, to='varying'), tree)
