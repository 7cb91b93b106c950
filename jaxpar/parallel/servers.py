"""[T]'s parameter servers as strategies of the one train step.

The distributed server ([T] §3.3.3, eq. 4.12): every worker is also the server of
one part of the weights. Here each tensor is split evenly over the N devices
(flattened, padded to a multiple of N): device i owns slice i of every tensor.
One step:

1. every device computes the gradient of its share of the batch (the step);
2. gradients are reduce-scattered to their owners: device i receives the mean
   over devices of slice i of every gradient (per device (N−1)/N of the
   gradients' bytes, [T]'s "send each part to its owner");
3. each owner updates its slices with the optimizer; **optimizer state lives only
   with its owner**, so it takes 1/N of the replicated layout's memory per
   device (what ZeRO-1 calls optimizer-state sharding); LARS' norms are summed
   over the owners so they are those of whole tensors;
4. the updated slices are all-gathered, so every device holds the new weights
   for the next forward pass ((N−1)/N of the weights' bytes: "the owner sends
   the new values to every other worker").

Steps 2 and 4 together move 2(N−1)/N of the network per device, eq. 4.12's
2·t_comm·(N−1)/N.
"""
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P


class DistributedServer:
  """Strategy: weights replicated for the forward pass, optimizer state and the update
  split evenly among the devices of the data `axes`."""

  def __init__(self, mesh, dtype=None):
    self.axes = tuple(mesh.axis_names)
    self.devices = mesh.size
    self.norm_axes = self.axes  # the optimizer sees shards: LARS sums norms over owners
    self.dtype = dtype          # the dtype gradients travel in (None: their own)

  def state_specs(self, state):
    # Optimizer state is a tree of per-slice arrays (and scalar counters, the same
    # everywhere); everything else is replicated.
    opt = jax.tree.map(lambda x: P(self.axes) if jnp.ndim(x) else P(), state.opt_state)
    return state.replace(**{f: jax.tree.map(lambda _: P(), getattr(state, f))
                            for f in ('step', 'examples_seen', 'params', 'batch_stats')},
                         opt_state=opt)

  def init_opt_state(self, tx, params):
    """The optimizer state of every slice, laid out as global arrays of shape (N·k,)
    per tensor (device i's shard is slice i); run under jit with `state_specs`."""
    return tx.init(jax.tree.map(lambda p: _padded(p, self.devices), params))

  def update(self, tx, grads, state):
    n = lax.axis_size(self.axes)
    me = lax.axis_index(self.axes)

    def owned_gradient(g):
      sent = g if self.dtype is None else g.astype(self.dtype)
      part = lax.psum_scatter(_padded(sent, n), self.axes, scatter_dimension=0, tiled=True)
      return part.astype(g.dtype) / n

    def owned_params(p):
      flat = _padded(p, n)
      k = flat.size // n
      return lax.dynamic_slice_in_dim(flat, me * k, k)

    params = jax.tree.map(owned_params, state.params)
    updates, opt_state = tx.update(jax.tree.map(owned_gradient, grads), state.opt_state, params)
    params = optax.apply_updates(params, updates)
    gathered = jax.tree.map(
        lambda part, p: lax.all_gather(part, self.axes, tiled=True, to='invarying')[:p.size]
        .reshape(p.shape), params, state.params)
    return gathered, opt_state


def _padded(x, n):
  flat = jnp.ravel(x)
  return jnp.pad(flat, (0, -flat.size % n))
