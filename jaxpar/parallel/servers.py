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

With `even` a device owns one run of every tensor, all devices' runs of equal widths,
and its optimizer state is those runs (one array per tensor); with `greedy` its whole
tensors are packed into one vector, padded to the largest device's load. One step:

1. every device computes the gradient of its share of the batch (the step);
2. gradients are reduce-scattered to their owners: device i receives the mean
   over devices of its packed elements ([T]'s "send each part to its owner");
3. each owner updates its elements; **optimizer state lives only with its owner**,
   so it takes 1/N (even) or the greedy load's share of the replicated layout's
   memory per device (what ZeRO-1 calls optimizer-state sharding); weight decay and
   LARS' trust ratio apply per whole tensor (norms are summed over the owners);
4. the updated elements are all-gathered, so every device holds the new weights
   for the next forward pass ("the owner sends the new values to every worker").

Steps 2 and 4 together move 2(N−1)/N of the (padded) network per device,
eq. 4.12's 2·t_comm·(N−1)/N. On one device there is nothing to send and the step is
the all-reduce step's (docs/performance.md).
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
from jaxpar.collectives import fused, nbytes, replicate, travelling
from jaxpar.step import ReplicatedParams, data_axes

PLACEMENTS = ('even', 'greedy')
CENTRAL_SCHEDULES = ('serial', 'parallel')
SERVER = 0  # the central server's device: index 0 along the mesh's axes


class CentralServer(optim.WholeTensors):
  """Strategy: device 0 gathers the gradients, updates, and sends the weights back,
  in rounds ordered by `schedule` (serial | parallel)."""

  def __init__(self, mesh, dtype=None, schedule: str = 'serial'):
    self.mesh, self.axes = mesh, tuple(mesh.axis_names)
    self.devices = mesh.size
    self.dtype = dtype          # the dtype gradients travel in (None: their own)
    self.serial = schedule == 'serial'
    self.layout = layouts.PerDevice(mesh)
    self._first = jax.jit(lambda tree: self.layout.pick(tree, SERVER),
                          out_shardings=NamedSharding(mesh, P()))

  def describe(self):
    return (f"gradients to the central server (device 0; {'serial' if self.serial else 'parallel'}"
            f" rounds) {travelling(self.dtype)}, the weights back")

  def state_specs(self, state):
    return self.layout.state_specs(state, 'params', 'opt_state')

  def checkpoint_layout(self):
    return {'kind': 'central', 'devices': self.devices}

  def init(self, tx, params, batch_stats):
    params, opt_state = self.layout.copies((params, tx.init(params)))
    return params, batch_stats, opt_state

  def local_variables(self, state):
    return self.layout.own(state.params), state.batch_stats

  def update(self, tx, grads, batch_stats, state):
    # Updated in the layout (`PerDevice.own`): the gradients join it.
    params, opt_state = state.params, state.opt_state
    grads = self.layout.stack(grads)

    def serve(params, opt_state, grads):
      updates, opt_state = tx.update(grads, opt_state, params)
      return optax.apply_updates(params, updates), opt_state
    if self.devices == 1:  # the server is the only worker: no round, no one to skip
      params, opt_state = serve(params, opt_state, grads)
      return params, batch_stats, opt_state, {'sent_bytes': 0.0}
    me = lax.axis_index(self.axes)
    mean = fused(grads, lambda g: self._to_server(g) / self.devices)
    params, opt_state = lax.cond(me == SERVER, serve, lambda p, o, _: (p, o),
                                 params, opt_state, mean)
    params = fused(params, lambda w: self._from_server(w, me))
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
  """Which elements of the raveled tensors each device's packed vector holds, in order.

  `pieces[d]` lists device d's runs `(tensor, start, length, width)`: elements
  `start … start+length` of the tensor, then `width − length` zeros; after its runs
  the vector is padded with zeros to `capacity`, the longest device's.
  `even`: every tensor split into N runs of ⌈size/N⌉ (the last padded), device d
  holding run d of every tensor — so every device's runs have the same widths.
  `greedy`: whole tensors, by Algorithm 3.7. Packing and unpacking are slices, pads
  and concatenations, one per tensor: no element index tables (on XLA's CPU backend a
  gather and a scatter over every element cost more than the rest of the update).
  """
  sizes: tuple
  pieces: tuple        # per device: ((tensor, start, length, width), ...)
  capacity: int
  loads: tuple         # elements each device owns
  even: bool

  @classmethod
  def build(cls, sizes, n: int, placement: str):
    sizes = tuple(int(s) for s in sizes)
    pieces = [[] for _ in range(n)]
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
    loads = tuple(sum(p[2] for p in device) for device in pieces)
    return cls(sizes, tuple(tuple(device) for device in pieces), capacity, loads,
               placement == 'even')

  def layouts(self) -> tuple:
    """Per device, the (tensor, width) of its runs: what the packed optimizer needs."""
    return tuple(tuple((t, width) for t, _, _, width in device) for device in self.pieces)

  def rows(self, flats):
    """(N, capacity): every device's packed vector, from the raveled tensors `flats`."""
    n = len(self.pieces)
    if self.even:
      return jnp.concatenate([_pad(f, n * w).reshape(n, w)
                              for f, (_, _, _, w) in zip(flats, self.pieces[0])], axis=1)
    return jnp.stack([self._row(flats, d) for d in range(n)])

  def row(self, flats, device):
    """The packed vector of `device` (a traced index)."""
    if self.even:
      n = len(self.pieces)
      return jnp.concatenate([lax.dynamic_slice_in_dim(_pad(f, n * w), device * w, w)
                              for f, (_, _, _, w) in zip(flats, self.pieces[0])])
    # Each device builds its own row only (not every device's, to index one).
    return lax.switch(device, [lambda f, d=d: self._row(f, d) for d in range(len(self.pieces))],
                      flats)

  def unpack(self, rows):
    """The raveled tensors, from every device's packed vector (N, capacity)."""
    flats = [None] * len(self.sizes)
    for d, device in enumerate(self.pieces):
      offset = 0
      for t, _, length, width in device:
        if not self.even:
          flats[t] = rows[d, offset:offset + length]
        elif d == 0:  # tensor t's runs: one block of columns, a run in every row
          flats[t] = rows[:, offset:offset + width].reshape(-1)[:self.sizes[t]]
        offset += width
    return flats

  def _row(self, flats, d):
    parts = [_pad(flats[t][start:start + length], width)
             for t, start, length, width in self.pieces[d]]
    return _pad(jnp.concatenate(parts) if parts else jnp.zeros(0, flats[0].dtype), self.capacity)


class DistributedServer(ReplicatedParams):
  """Strategy: weights replicated for the forward pass; the update and the optimizer
  state split among the devices of the mesh by `placement`.

  Even placement keeps the optimizer state as one run per tensor (every device's runs
  have the same widths): the update is per tensor, as the all-reduce step's, and at
  N = 1 it *is* the all-reduce step. `one_buffer` sends all runs in one reduce-scatter
  and one all-gather (across processes, where every call costs a fixed latency, as
  `grad_fusion` does for all-reduce); otherwise each tensor travels alone. Greedy
  placement packs each device's whole tensors into one vector (`Packing`). Equal shares
  are what an SPMD collective sends, so every device's vector is padded to the largest
  load, and the reduce-scatter's input and the all-gather's output hold N × that load
  per device: with one dominant tensor that exceeds the network (VGG16E on 8 devices:
  3.9 ×, its 4096² layer alone being 43 % of it) — a cost of whole tensors, not of
  sharding (docs/performance.md).
  """

  def __init__(self, mesh, dtype=None, placement: str = 'even', one_buffer: bool = False):
    # The axes of more than one device: at N = 1 none, and the step has no collective;
    # an axis of one device would type the optimizer's state, and so the weights,
    # varying along it.
    self.mesh, self.axes = mesh, data_axes(mesh)
    self.devices = mesh.size
    self.dtype = dtype          # the dtype gradients travel in (None: their own)
    self.placement = placement
    self.one_buffer = one_buffer
    self.packing = None         # set by make_optimizer, which sees the parameters

  def describe(self):
    fusion = ', one buffer' if self.one_buffer else ''
    return (f'reduce-scatters gradients {travelling(self.dtype)} to the parts\' owners '
            f'({self.placement} placement{fusion}), all-gathers the weights')

  def make_optimizer(self, opt_config, schedule, params):
    """The optimizer of the owned runs; `params` (shapes suffice) fixes the packing."""
    leaves = jax.tree.leaves(params)
    # On one device both placements hold every tensor whole, in order: the even code.
    self.packing = Packing.build([math.prod(p.shape) for p in leaves], self.devices,
                                 self.placement if self.devices > 1 else 'even')
    loads = self.packing.loads
    logging.info('Distributed server, %s placement: %d-%d elements per device '
                 '(imbalance max/mean %.3f).', self.placement, min(loads), max(loads),
                 max(loads) / (sum(loads) / len(loads)))
    decayed = jax.tree.leaves(optim.decay_mask(params))
    if self.packing.even:
      return optim.make_optimizer(opt_config, schedule, mask=decayed, norm_axes=self.axes)
    return optim.make_packed_optimizer(opt_config, schedule, self.packing.layouts(), decayed,
                                       self.axes)

  def checkpoint_layout(self):
    return {'kind': 'split', 'devices': self.devices,
            'placement': 'even' if self.packing.even else 'greedy'}

  def state_specs(self, state):
    # Optimizer state is split per device (and scalar counters, the same everywhere);
    # everything else is replicated.
    replicated = jax.tree.map(lambda _: P(), state)
    return replicated.replace(opt_state=jax.tree.map(
        lambda x: P(self.axes) if jnp.ndim(x) and self.axes else P(), state.opt_state))

  def init(self, tx, params, batch_stats):
    """The variables, and the optimizer state of every device's runs as global arrays
    (one per tensor of N·width, or one packed vector of N·capacity; device d's shard is
    its own); under jit with `state_specs`."""
    return params, batch_stats, tx.init(self._everyones(self._leaves(params)))

  def update(self, tx, grads, batch_stats, state):
    n = self.devices
    me = lax.axis_index(self.axes) if self.axes else 0
    leaves = self._leaves(grads)
    sent = [g if self.dtype is None else g.astype(self.dtype) for g in leaves]
    dtype = leaves[0].dtype  # the parameters' (float32)
    owned_grads = jax.tree.map(lambda x: x.astype(dtype) / n,
                               self._reduce_scatter(self._everyones(sent)))
    owned = self._mine(self._leaves(state.params), me)
    updates, opt_state = tx.update(owned_grads, state.opt_state, owned)
    new = optax.apply_updates(owned, updates)
    flats = self._all_gather(new)
    # Reduce-scatter (gradients, in the dtype they travel in) and all-gather (weights):
    # N−1 of the N shares each.
    sent_bytes = ((n - 1) * self.packing.capacity
                  * (jnp.dtype(self.dtype or dtype).itemsize + dtype.itemsize))
    return (_unflat(flats, state.params), replicate(batch_stats), opt_state,
            {'sent_bytes': sent_bytes})

  def _leaves(self, tree):
    """The tensors raveled; on one device as they are (its runs are the whole tensors,
    and a raveled copy made XLA copy every 3×3 kernel into the output: +20 % a step)."""
    return [jnp.ravel(x) for x in jax.tree.leaves(tree)] if self.axes else jax.tree.leaves(tree)

  def _widths(self):
    return [width for _, width in self.packing.layouts()[0]]

  def _everyones(self, flats):
    """Every device's share: even, per tensor (N·width,); greedy, one (N·capacity,)."""
    if self.packing.even:
      return [_pad(f, self.devices * w) for f, w in zip(flats, self._widths())]
    return self.packing.rows(flats).reshape(-1)

  def _mine(self, flats, me):
    """This device's share of the raveled tensors `flats` (`me` its traced index)."""
    if not self.packing.even:
      return self.packing.row(flats, me)
    if not self.axes:
      return list(flats)
    return [lax.dynamic_slice_in_dim(_pad(f, self.devices * w), me * w, w)
            for f, w in zip(flats, self._widths())]

  def _reduce_scatter(self, everyones):
    """The sums over the devices of this device's share ([T]: "each part to its owner")."""
    if not self.axes:
      return everyones
    scatter = lambda x: lax.psum_scatter(x, self.axes, scatter_dimension=0, tiled=True)
    if not self.packing.even:
      return scatter(everyones)
    if not self.one_buffer:
      return [scatter(x) for x in everyones]
    return jnp.split(scatter(self.packing.rows(everyones).reshape(-1)),
                     np.cumsum(self._widths())[:-1])

  def _all_gather(self, mine):
    """Every device's updated share on every device ("the owner sends the new values to
    every worker"): the raveled tensors."""
    if not self.axes:  # one device: its runs are the tensors
      return list(mine)
    gather = lambda x: lax.all_gather(x, self.axes, tiled=True, to='invarying')
    if not self.packing.even or self.one_buffer:
      one = mine if not self.packing.even else jnp.concatenate(mine)
      return self.packing.unpack(gather(one).reshape(self.devices, -1))
    return [gather(x)[:size] for x, size in zip(mine, self.packing.sizes)]


def _pad(flat, size: int):
  return jnp.pad(flat, (0, size - flat.size)) if size > flat.size else flat


def _unflat(flats, like):
  leaves, treedef = jax.tree.flatten(like)
  return jax.tree.unflatten(treedef, [f.reshape(x.shape).astype(x.dtype)
                                      for f, x in zip(flats, leaves)])
