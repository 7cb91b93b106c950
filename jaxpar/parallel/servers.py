"""[T]'s parameter servers as strategies of the one train step.

The central server ([T] §3.3.2, eqs. 4.4–4.11): device 0 of the mesh is the server
and also a worker (a mesh has no spare device). One step:

1. every device computes the gradient of its share of the batch (the step);
2. the N−1 other workers send their gradients to the server, one `ppermute` round
   each; the server sums them with its own and averages;
3. the server alone updates: it alone runs the optimizer, so only its optimizer
   state changes (SPMD gives every device a shard of equal shape: the workers'
   shards stay at their initial values and are never read — the memory is that of
   the replicated layout);
4. the server sends the new weights to each of the N−1 workers, one round each.

Config `central_schedule` orders the rounds. `serial`: round k+1 starts only after
round k has arrived (an optimization barrier chains them) — one worker at a time,
the thesis' best case (eq. 4.4) and the semaphore of §7.2. `parallel`: the rounds
are independent, so the runtime may run them all at once into the server's link —
the worst case (eq. 4.7). Both move the same bytes: 2(N−1) copies of the network
through the server's link, each worker sending and receiving one. Collective
permutes give values typed *varying*, so the parameters are kept one copy per
device (`P(axes)` on a leading dimension of size N), every copy equal.

The distributed server ([T] §3.3.3, eq. 4.12): every worker is also the server of
part of the weights. Placement (config `placement`) decides which part:

- `even`: every tensor is split evenly over the N devices (flattened, padded to a
  multiple of N): device i owns slice i of every tensor;
- `greedy`: [T]'s Algorithm 3.7: whole tensors, in order, each to the device with
  the lowest load so far (load = elements owned); the imbalance (largest load over
  the mean) is reported.

Each device's owned elements are packed into one vector (padded to the largest
device's load). One step:

1. every device computes the gradient of its share of the batch (the step);
2. gradients are reduce-scattered to their owners: device i receives the mean
   over devices of its packed elements ([T]'s "send each part to its owner");
3. each owner updates its elements; **optimizer state lives only with its owner**,
   so it takes 1/N (even) or the greedy load's share of the replicated layout's
   memory per device (what ZeRO-1 calls optimizer-state sharding); weight decay and
   LARS' trust ratio apply per whole tensor (norms are summed over the owners);
4. the updated elements are all-gathered, so every device holds the new weights
   for the next forward pass ("the owner sends the new values to every worker").

Steps 2 and 4 together move 2(N−1)/N of the packed network per device,
eq. 4.12's 2·t_comm·(N−1)/N.
"""
import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import optim
from jaxpar.parallel import layouts
from jaxpar.parallel.collectives import fused, nbytes, replicate
from jaxpar.step import ReplicatedParams

PLACEMENTS = ('even', 'greedy')
CENTRAL_SCHEDULES = ('serial', 'parallel')
SERVER = 0  # the central server's device: index 0 along the mesh's axes


class CentralServer:
  """Strategy: device 0 gathers the gradients, updates, and sends the weights back,
  in rounds ordered by `schedule` (serial | parallel)."""

  def __init__(self, mesh, dtype=None, schedule: str = 'serial'):
    self.mesh, self.axes = mesh, tuple(mesh.axis_names)
    self.devices = mesh.size
    self.dtype = dtype          # the dtype gradients travel in (None: their own)
    self.serial = schedule == 'serial'
    self._first = jax.jit(lambda tree: jax.tree.map(lambda x: x[SERVER], tree),
                          out_shardings=NamedSharding(mesh, P()))

  def make_optimizer(self, opt_config, schedule, params):
    del params  # the server updates whole tensors
    return optim.make_optimizer(opt_config, schedule)

  def state_specs(self, state):
    return jax.tree.map(lambda _: P(), state).replace(
        params=layouts.specs(state.params, self.axes),
        opt_state=layouts.specs(state.opt_state, self.axes))

  def init(self, tx, params, batch_stats):
    params, opt_state = layouts.copies((params, tx.init(params)), self.devices)
    return params, batch_stats, opt_state

  def local_variables(self, state):
    return layouts.own(state.params), state.batch_stats

  def update(self, tx, grads, batch_stats, state):
    me = lax.axis_index(self.axes)
    params, opt_state = layouts.own((state.params, state.opt_state))
    mean = fused(grads, lambda g: self._to_server(g) / self.devices)

    def serve(params, opt_state, grads):
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state
    params, opt_state = lax.cond(me == SERVER, serve, lambda p, o, _: (p, o),
                                 params, opt_state, mean)
    params = fused(params, lambda w: self._from_server(w, me))
    params, opt_state = layouts.stack((params, opt_state))
    # A worker sends its gradients once; the server sends the weights N−1 times.
    grads_bytes, weights_bytes = nbytes(grads, self.dtype), nbytes(grads)
    sent = jnp.where(me == SERVER, (self.devices - 1) * weights_bytes, grads_bytes)
    return params, replicate(batch_stats), opt_state, {'sent_bytes': sent}

  def _to_server(self, grads):
    """The sum of every device's `grads`, on the server (elsewhere: meaningless)."""
    sent = grads if self.dtype is None else grads.astype(self.dtype)
    total = grads
    for worker in range(1, self.devices):
      if self.serial:  # this round waits for the previous one to arrive
        sent, total = lax.optimization_barrier((sent, total))
      total = total + lax.ppermute(sent, self.axes, [(worker, SERVER)]).astype(grads.dtype)
    return total

  def _from_server(self, weights, me):
    """The server's `weights` on every device."""
    out = weights
    for worker in range(1, self.devices):
      sent = lax.optimization_barrier((weights, out))[0] if self.serial else weights
      out = jnp.where(me == worker, lax.ppermute(sent, self.axes, [(SERVER, worker)]), out)
    return out

  def variables(self, state):
    return {'params': self._first(state.params), 'batch_stats': state.batch_stats}


def greedy_owners(sizes, n: int):
  """[T] Algorithm 3.7: each tensor in turn to the least-loaded of `n` units (the lowest
  index on ties). Returns (owner of each tensor, load of each unit)."""
  loads = [0] * n
  owners = []
  for size in sizes:
    unit = loads.index(min(loads))
    owners.append(unit)
    loads[unit] += size
  return owners, loads


@dataclasses.dataclass(frozen=True)
class Packing:
  """Where every element of the flattened parameters lives in the devices' packed vectors.

  `index[d, j]` is the position, in all tensors raveled and concatenated, of device
  d's j-th element (`total` for padding); `segment[d, j]` its tensor (`len(sizes)`
  for padding).
  """
  index: np.ndarray    # (N, capacity) int32
  segment: np.ndarray  # (N, capacity) int32
  loads: tuple         # elements each device owns
  total: int

  @classmethod
  def build(cls, sizes, n: int, placement: str):
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    pieces = [[] for _ in range(n)]  # per device: (tensor, start, length, padded length)
    if placement == 'even':
      for t, size in enumerate(sizes):
        k = -(-size // n)
        for d in range(n):
          start = min(d * k, size)
          pieces[d].append((t, start, min(k, size - start), k))
    else:
      owners, _ = greedy_owners(sizes, n)
      for t, (size, d) in enumerate(zip(sizes, owners)):
        pieces[d].append((t, 0, size, size))
    capacity = max(1, max(sum(p[3] for p in device) for device in pieces))
    total = int(offsets[-1])
    index = np.full((n, capacity), total, np.int32)
    segment = np.full((n, capacity), len(sizes), np.int32)
    for d, device in enumerate(pieces):
      j = 0
      for t, start, length, padded in device:
        index[d, j:j + length] = offsets[t] + start + np.arange(length)
        segment[d, j:j + length] = t
        j += padded
    loads = tuple(int(sum(p[2] for p in device)) for device in pieces)
    return cls(index, segment, loads, total)


class DistributedServer(ReplicatedParams):
  """Strategy: weights replicated for the forward pass; the update and the optimizer
  state split among the devices of the mesh by `placement`."""

  def __init__(self, mesh, dtype=None, placement: str = 'even'):
    self.mesh, self.axes = mesh, tuple(mesh.axis_names)
    self.devices = mesh.size
    self.dtype = dtype          # the dtype gradients travel in (None: their own)
    self.placement = placement
    self.packing = None         # set by make_optimizer, which sees the parameters

  def make_optimizer(self, opt_config, schedule, params):
    """The optimizer of the packed vectors; `params` (shapes suffice) fixes the packing."""
    leaves = jax.tree.leaves(params)
    self.packing = Packing.build([math.prod(p.shape) for p in leaves], self.devices,
                                 self.placement)
    loads = self.packing.loads
    logging.info('Distributed server, %s placement: %d-%d elements per device '
                 '(imbalance max/mean %.3f).', self.placement, min(loads), max(loads),
                 max(loads) / (sum(loads) / len(loads)))
    decayed = np.array(jax.tree.leaves(optim.decay_mask(params)) + [False])  # padding: never
    return optim.make_packed_optimizer(opt_config, schedule, self.packing.segment, decayed,
                                       self.axes)

  def state_specs(self, state):
    # Optimizer state is packed per device (and scalar counters, the same everywhere);
    # everything else is replicated.
    replicated = jax.tree.map(lambda _: P(), state)
    return replicated.replace(opt_state=jax.tree.map(
        lambda x: P(self.axes) if jnp.ndim(x) else P(), state.opt_state))

  def init(self, tx, params, batch_stats):
    """The variables, and the optimizer state of every device's packed vector as global
    arrays of shape (N·capacity,) (device d's shard is its own); under jit with `state_specs`."""
    return params, batch_stats, tx.init(self._pack(_flat(params),
                                                   jnp.asarray(self.packing.index.reshape(-1))))

  def update(self, tx, grads, batch_stats, state):
    n = lax.axis_size(self.axes)
    everyone = jnp.asarray(self.packing.index.reshape(-1))
    mine = lax.dynamic_index_in_dim(jnp.asarray(self.packing.index), lax.axis_index(self.axes),
                                    keepdims=False)
    flat_grads = _flat(grads)
    sent = flat_grads if self.dtype is None else flat_grads.astype(self.dtype)
    owned_grads = lax.psum_scatter(self._pack(sent, everyone), self.axes, scatter_dimension=0,
                                   tiled=True).astype(flat_grads.dtype) / n
    owned = self._pack(_flat(state.params), mine)
    updates, opt_state = tx.update(owned_grads, state.opt_state, owned)
    gathered = lax.all_gather(owned + updates, self.axes, tiled=True, to='invarying')
    flat = jnp.zeros(self.packing.total + 1, gathered.dtype).at[everyone].set(gathered)
    # Reduce-scatter (gradients, in the dtype they travel in) and all-gather (weights):
    # N−1 of the N packed slices each.
    sent_bytes = (n - 1) * owned.size * (sent.dtype.itemsize + owned.dtype.itemsize)
    return (_unflat(flat[:-1], state.params), replicate(batch_stats), opt_state,
            {'sent_bytes': sent_bytes})

  @staticmethod
  def _pack(flat, index):
    return jnp.concatenate([flat, jnp.zeros(1, flat.dtype)])[index]


def _flat(tree):
  return jnp.concatenate([jnp.ravel(x) for x in jax.tree.leaves(tree)])


def _unflat(flat, like):
  leaves, treedef = jax.tree.flatten(like)
  sizes = [math.prod(x.shape) for x in leaves]
  parts = jnp.split(flat, np.cumsum(sizes)[:-1])
  return jax.tree.unflatten(treedef, [p.reshape(x.shape).astype(x.dtype)
                                      for p, x in zip(parts, leaves)])
