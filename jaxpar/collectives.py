"""Hand-written all-reduces for use inside `jax.shard_map`: [L]'s ring and [Y]'s 2-D torus.

Both have the contract of `jax.lax.psum` on a pytree: every device gets the sum
over the named axes of every leaf, typed invariant over those axes. Leaves of any
shape are fused into one flat buffer per dtype (as Horovod and PyTorch DDP bucket
gradients), padded internally to what the algorithm divides by, and cut back:
no element is dropped or counted twice, whatever the sizes.
"""
import math
from collections import defaultdict

import jax
import jax.numpy as jnp
from jax import lax


def ring_psum(tree, axis_name):
  """All-reduce along a ring of the devices of `axis_name` (a name or a tuple of names).

  [L]'s ring all-reduce (docs/sources.md): the buffer is cut into N chunks and in
  N−1 `ppermute` steps each device passes one chunk, accumulated so far, to its
  right neighbour; after them device i holds the complete sum of chunk i+1
  (reduce-scatter, each step moving 1/N of the buffer). The reduced chunks are
  then all-gathered with `all_gather(to='invarying')`, which moves the same
  N−1 chunks per device as the ring's second half would, and is the one
  collective whose result JAX types as replicated: the same N−1 steps written
  with `ppermute` leave values typed *varying* (though equal everywhere), which
  a replicated output (`out_specs=P()`) rejects. α-β cost:
  `jaxpar.perfmodel.alpha_beta.ring_all_reduce`, 2(N−1)/N of the buffer per device.
  """
  n = lax.axis_size(axis_name)
  right = [(i, (i + 1) % n) for i in range(n)]

  def reduce(buffer):
    chunks = _pad_to(buffer, n).reshape(n, -1)
    me = lax.axis_index(axis_name)
    chunk = lambda k: lax.dynamic_index_in_dim(chunks, (me - k) % n, keepdims=False)
    acc = chunk(0)
    for k in range(1, n):  # unrolled: the program shows every step of the ring
      acc = lax.ppermute(acc, axis_name, right) + chunk(k)
    # Device i now holds chunk (i + 1) mod n: gather, then rotate chunk 0 to the front.
    gathered = lax.all_gather(acc, axis_name, tiled=False, to='invarying')
    return jnp.roll(gathered, 1, axis=0).reshape(-1)[:buffer.size]
  return fused(tree, reduce)


def torus2d_psum(tree, axis_names):
  """All-reduce over two mesh axes (x, y) by [Y]'s 2-D torus algorithm (docs/sources.md).

  Each buffer is split in two halves. Half A is reduced along x, then y; half B
  along y, then x; both in the same step, so the two directions' links work at
  once. Each phase is written in its bandwidth-optimal form: reduce-scatter on
  the first axis, all-reduce of the 1/|first| part on the second, all-gather on
  the first. Per device that moves 2(X−1)/X + 2(Y−1)/(XY) of a half along
  x (resp. y): less than a single ring over all X·Y devices needs, in fewer
  steps (latency 2(X−1) + 2(Y−1) hops instead of 2(XY−1)).
  """
  x, y = axis_names

  def reduce(buffer):
    half = (buffer.size + 1) // 2
    return jnp.concatenate([_scatter_reduce_gather(buffer[:half], x, y),
                            _scatter_reduce_gather(buffer[half:], y, x)])
  return fused(tree, reduce)


def _scatter_reduce_gather(v, first, second):
  n = lax.axis_size(first)
  part = lax.psum_scatter(_pad_to(v, n), first, scatter_dimension=0, tiled=True)
  part = lax.psum(part, second)
  return lax.all_gather(part, first, tiled=True, to='invarying')[:v.size]


def gathers_small_sums() -> bool:
  """Whether `group_mean` sums by gathering: on CPU across processes, where XLA's
  collectives are gloo's over TCP. gloo's ring all-reduce takes two exchanges one after the
  other (reduce-scatter, then all-gather), its all-gather one: in a chain of sums on 2
  processes over loopback, 256 floats, 152 µs a psum and 81 µs an `all_gather` and a sum.
  Within one process XLA's all-reduce is not the slower, and on accelerators the collective
  libraries reduce small buffers in one pass (docs/performance.md#batchnorm-across-devices)."""
  return jax.process_count() > 1 and jax.default_backend() == 'cpu'


def group_mean(local, axis_name):
  """The mean of `local` over the devices of `axis_name`, inside `shard_map`, as the pair
  (typed invariant, typed varying): `lax.pmean` and its `pcast(..., to='varying')`, whose
  transpose sums the varying copy's cotangent over the group (one call each way).

  For small buffers — a BatchNorm layer's statistics — where `gathers_small_sums`, each
  way is one `all_gather` and a sum in the gathered order instead of an all-reduce: y =
  (1/n)·Σⱼ xⱼ on every device, and ∂L/∂xⱼ = (1/n)·Σᵢ ∂L/∂yᵢ, the same sum of the
  cotangents. Every device sums the same gathered rows in the same order, so the result is
  the same on all of them; bytes sent are n times the buffer's instead of 2(n−1)/n times."""
  if not gathers_small_sums():
    shared = lax.pmean(local, axis_name)
    return shared, lax.pcast(shared, axis_name, to='varying')

  @jax.custom_vjp
  def mean(x):
    shared = lax.all_gather(x, axis_name, to='invarying').mean(0)
    return shared, lax.pcast(shared, axis_name, to='varying')

  def forward(x):
    return mean(x), None

  def backward(_, cotangents):  # the invariant copy feeds running averages only
    return (lax.all_gather(cotangents[1], axis_name).mean(0),)

  mean.defvjp(forward, backward)
  return mean(local)


def spanning(axes):
  """The axes of `axes` (a name or a tuple of names) with more than one device, inside
  `shard_map`. Reducing over an axis of one device is the identity, but JAX still emits
  an all-reduce for it (XLA's CPU backend keeps it, and it fences fusion): the step
  names only these axes, so a one-device run holds no collective at all."""
  names = (axes,) if isinstance(axes, str) else tuple(axes)
  return tuple(a for a in names if lax.axis_size(a) > 1)


def replicate(tree):
  """The mean of every leaf over the mesh axes it varies over, inside `shard_map`: after
  this the tree is the same on every device and typed so; a leaf that already is stays
  as it is. Leaves varying over the same axes travel fused (`fused`): BN's running
  statistics are two small vectors per layer, and across processes every all-reduce
  call costs a fixed latency whatever its size (gloo on loopback: ~0.05–0.1 ms)."""
  leaves, treedef = jax.tree.flatten(tree)
  by_axes = defaultdict(list)
  for i, leaf in enumerate(leaves):
    by_axes[tuple(sorted(jax.typeof(leaf).mat.varying))].append(i)
  out = list(leaves)
  for axes, indices in by_axes.items():
    if not axes:
      continue
    group = [leaves[i] for i in indices]
    # A lone leaf travels as it is: no buffer to build (an empty one not at all: `fused`).
    averaged = ([lax.pmean(group[0], axes)] if len(group) == 1 and jnp.size(group[0])
                else fused(group, lambda b, axes=axes: lax.pmean(b, axes)))
    for i, leaf in zip(indices, averaged):
      out[i] = leaf
  return jax.tree.unflatten(treedef, out)


def fused_psum(tree, axis_name):
  """`lax.psum` of a pytree as one all-reduce per dtype (`fused`), as PyTorch DDP and
  Horovod bucket gradients: across processes each all-reduce call costs a fixed latency
  (docs/performance.md), and a step of one call per tensor (ResNet34: 110) pays it 110
  times."""
  return fused(tree, lambda buffer: lax.psum(buffer, axis_name))


# A gradient under this many bytes travels in the shared buffer of `by_size`; larger ones alone.
SMALL_TENSOR_BYTES = 64 * 1024


def by_size(tree, reduce, small: int | None = None):
  """`reduce` applied to one buffer per dtype holding the leaves under `small` bytes
  (`fused`; default `SMALL_TENSOR_BYTES`) and to each larger leaf alone; `reduce` must act
  elementwise (a sum over devices), so a leaf's shape does not matter to it.

  Between one call per tensor and one buffer, as PyTorch DDP's buckets are: the many small
  tensors (biases, BatchNorm's scales, 1×1 convolutions) cost one call instead of one each,
  and the large ones, which a call's fixed cost does not weigh on, are not copied into a
  buffer and out again. Measured at or ahead of the faster of the two on 2 processes and on
  emulated devices (docs/performance.md#gradients-by-size-grad_fusion)."""
  small = SMALL_TENSOR_BYTES if small is None else small
  leaves, treedef = jax.tree.flatten(tree)
  little = [nbytes(leaf) < small for leaf in leaves]
  out = [leaf if s else reduce(leaf) for leaf, s in zip(leaves, little)]  # the large first
  together = iter(fused([leaf for leaf, s in zip(leaves, little) if s], reduce))
  return jax.tree.unflatten(treedef, [next(together) if s else x for x, s in zip(out, little)])


def fused_as(fusion: str, tree, reduce):
  """`reduce` (elementwise) over `tree` as config `grad_fusion` says: each leaf alone
  (`per_tensor`), one buffer per dtype (`one_buffer`, `fused`) or by size (`by_size`)."""
  if fusion == 'one_buffer':
    return fused(tree, reduce)
  if fusion == 'by_size':
    return by_size(tree, reduce)
  return jax.tree.map(reduce, tree)


def sized_psum(tree, axis_name):
  """`lax.psum` of a pytree with the small leaves in one all-reduce per dtype and each
  large one in its own (`by_size`)."""
  return by_size(tree, lambda x: lax.psum(x, axis_name))


def nbytes(tree, dtype=None) -> int:
  """Bytes of every leaf of `tree` (in `dtype` if given): a message's size."""
  return sum(math.prod(jnp.shape(x)) * jnp.dtype(dtype or jnp.result_type(x)).itemsize
             for x in jax.tree.leaves(tree))


def travelling(dtype) -> str:
  """'in bfloat16', or 'in their own dtype' (`dtype` None): what a strategy's description
  says its gradients travel in."""
  return f'in {jnp.dtype(dtype).name}' if dtype is not None else 'in their own dtype'


def _pad_to(v, multiple):
  return jnp.pad(v, (0, -v.size % multiple))


def fused(tree, reduce):
  """Applies `reduce` (flat buffer → flat buffer of equal size) to one buffer per dtype
  holding every leaf of `tree`, and restores the leaves' shapes."""
  leaves, treedef = jax.tree.flatten(tree)
  out = list(leaves)
  by_dtype = defaultdict(list)
  for i, leaf in enumerate(leaves):
    if math.prod(jnp.shape(leaf)):
      by_dtype[jnp.result_type(leaf)].append(i)
    else:
      # An empty leaf: nothing to reduce, typed replicated as a reduction's result is, and
      # kept out of the buffer (jaxlib 0.11.2 crashes compiling a shard_map whose empty input
      # reaches a psum, even through a concatenation).
      out[i] = jnp.zeros(jnp.shape(leaf), jnp.result_type(leaf))
  for indices in by_dtype.values():
    reduced = reduce(jnp.concatenate([jnp.ravel(leaves[i]) for i in indices]))
    offset = 0
    for i in indices:
      shape = jnp.shape(leaves[i])
      size = math.prod(shape)
      out[i] = reduced[offset:offset + size].reshape(shape)
      offset += size
  return jax.tree.unflatten(treedef, out)
