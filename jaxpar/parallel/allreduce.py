"""Synchronous data parallelism's reduction ([T] eq. 3.12): the mean of the devices' gradients.

With sync-split every device holds 1/N of the batch, so the mean of the N local
mean-gradients is the gradient of the whole batch: the step equals sequential
training. With sync-join the same mean is [T]'s ∇W = (1/N) Σ ∇W_i.

How the sum travels is config `grad_reduce`: XLA's all-reduce (`psum`; per
tensor, in one buffer, or the small tensors in one buffer and the large ones alone:
config `grad_fusion`), [L]'s ring or [Y]'s 2-D torus
(`jaxpar/collectives.py`); all three give the same mean. `grad_reduce_dtype`
may send the gradients in bfloat16, halving the bytes moved; they are cast back
to their own dtype (float32) before the division, so the optimizer always sees
float32 ([Y]'s mixed precision keeps the reduction in float32 by default).
"""
import jax
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar import optim
from jaxpar.collectives import (SMALL_TENSOR_BYTES, fused_psum, nbytes, replicate,
                                        ring_psum, sized_psum, spanning, torus2d_psum,
                                        travelling)
from jaxpar.models import live_taps
from jaxpar.step import ReplicatedParams

SUMS = {'psum': lax.psum, 'ring': ring_psum, 'torus2d': torus2d_psum}
GRAD_FUSIONS = ('auto', 'by_size', 'one_buffer', 'per_tensor')
# How psum sends a gradient tree under each `grad_fusion` (auto: by_size, `build.strategy`).
PSUMS = {'per_tensor': lax.psum, 'one_buffer': fused_psum, 'by_size': sized_psum}


def all_reduce_bytes(kind: str, message: int, axes) -> float:
  """Bytes one device sends to all-reduce a `message` of that many bytes over `axes`,
  inside shard_map. psum: XLA chooses the algorithm; counted as the bandwidth-optimal
  2(N−1)/N of the message, what the ring sends (its chunks padded to N equal parts)."""
  if kind == 'torus2d':  # each half: a ring on x (the edges), then 1/X of it on y
    x, y = (lax.axis_size(a) for a in axes)
    return 2 * (x - 1) / x * message + 2 * (y - 1) / (x * y) * message
  n = lax.axis_size(axes)
  return 2 * (n - 1) / n * message


def mean_all_reduce(axes, kind: str = 'psum', dtype=None, fusion: str = 'per_tensor',
                    live=None):
  """The mean over the data `axes` of a gradient tree, inside `shard_map`.

  `kind` names the sum in `SUMS`; `torus2d` needs exactly two axes (where one has a single
  device, the sum is one all-reduce of a buffer over the other). `dtype`
  (e.g. jnp.bfloat16) is the dtype the gradients travel in; None keeps theirs.
  `fusion` (psum only; ring and torus2d always send one buffer): `per_tensor`, one
  all-reduce per gradient; `one_buffer`, every gradient in one (`collectives.fused_psum`);
  `by_size`, those under 64 KiB in one and each larger one alone (`collectives.sized_psum`).
  `live` (`models.live_taps.boxes`): kernels whose taps outside a box read padding only, so
  their gradients there are zero; only the box travels, the zeros are put back after.
  """
  def reduce(grads):
    # Axes of one device sum nothing, and no collective is written over them: a torus with
    # one such axis is one all-reduce of its buffer over the other, as the torus's own
    # middle step would be (its scatter and gather over one device are copies).
    summing = spanning(axes)
    total = (PSUMS[fusion] if kind == 'psum' else fused_psum
             if kind == 'torus2d' and len(summing) < 2 else SUMS[kind])
    cut = live_taps.compact(grads, live) if live and summing else grads
    sent = cut if dtype is None else jax.tree.map(lambda g: g.astype(dtype), cut)
    summed = total(sent, summing) if summing else sent
    n = lax.axis_size(axes)
    mean = jax.tree.map(lambda s, g: s.astype(g.dtype) / n, summed, cut)
    return live_taps.expand(mean, live, grads) if cut is not grads else mean
  return reduce


class AllReduce(ReplicatedParams, optim.WholeTensors):
  """The step's strategy for all-reduce data parallelism: every device holds the whole
  parameters and optimizer state (replicated), averages the gradients with
  `mean_all_reduce` and applies the same update."""
  def __init__(self, axes, kind: str = 'psum', dtype=None, fusion: str = 'per_tensor',
               live=None):
    self.axes, self.kind, self.dtype, self.fusion, self.live = axes, kind, dtype, fusion, live
    self.reduce = mean_all_reduce(axes, kind, dtype, fusion, live)

  def describe(self):
    fusion = {'per_tensor': '', 'one_buffer': ', one buffer',
              'by_size': f', tensors under {SMALL_TENSOR_BYTES // 1024} KiB in one buffer'
              }[self.fusion] if self.kind == 'psum' else ''
    return f'all-reduces gradients ({self.kind}{fusion}) {travelling(self.dtype)}'

  def state_specs(self, state):
    return jax.tree.map(lambda _: P(), state)

  def checkpoint_layout(self):
    return {'kind': 'replicated'}

  def init(self, tx, params, batch_stats):
    return params, batch_stats, tx.init(params)

  def update(self, tx, grads, batch_stats, state):
    updates, opt_state = tx.update(self.reduce(grads), state.opt_state, state.params)
    cut = live_taps.compact(grads, self.live) if self.live else grads
    sent = all_reduce_bytes(self.kind, nbytes(cut, self.dtype), self.axes)
    return (optax.apply_updates(state.params, updates), replicate(batch_stats), opt_state,
            {'sent_bytes': sent})
