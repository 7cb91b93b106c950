"""Timing the collectives' calls inside compiled programs, the measurement behind
`jaxpar.perfmodel.calibrate`: programs of k = 1, 2, 8, 32 chained calls of each kind on two
devices (`time_calls`), whose per-call slope `calibrate.per_call` reads; and `timed`, the
repeated timing every measurement of the planner uses.
"""
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar import multihost
from jaxpar.mesh import make_mesh
from jaxpar.perfmodel.calibrate import ONE_WAY, SCALAR


def timed(fn, repeats: int, warmup: int) -> list:
  """Seconds of each of `repeats` calls of `fn` (which blocks), after `warmup` calls."""
  for _ in range(warmup):
    fn()
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    samples.append(time.perf_counter() - start)
  return samples


CALIBRATED = ('collective_permute', ONE_WAY, 'all_reduce', 'all_gather',
              'reduce_scatter', SCALAR)
# The least calibration that costs every program (a plan past its budget): the other kinds
# fall back to all-reduce's cost (`CallCosts.cost`).
LEAST = ('collective_permute', 'all_reduce', SCALAR)
CHAINS = (1, 2, 8, 32)
CHAIN_BUDGET = 0.3  # seconds: the next chain is timed only while its k·t(1) stays under this


def _chain(op: str, k: int):
  """k calls of collective `op` on axis 'pair', each on the previous one's result, so that
  none can merge with or overlap another. Between calls only what keeps the buffer's size:
  all-reduce ×½ (a scalar's too); all-gather's two pieces summed; reduce-scatter's half
  repeated. A permute is an exchange (both devices send); a one-way permute sends from one
  device, the direction alternating (a central server's transfers)."""
  def body(x):
    for i in range(k):
      if op == 'collective_permute':
        x = lax.ppermute(x, 'pair', [(0, 1), (1, 0)])
      elif op == 'collective_permute_one_way':
        x = lax.ppermute(x, 'pair', [(0, 1)] if i % 2 == 0 else [(1, 0)])
      elif op in ('all_reduce', SCALAR):
        x = lax.psum(x, 'pair') * 0.5
      elif op == 'all_gather':
        x = lax.all_gather(x, 'pair', tiled=True).reshape(2, -1).sum(0)
      else:
        half = lax.psum_scatter(x, 'pair', scatter_dimension=1, tiled=True)
        x = jnp.concatenate([half, half], axis=1)
    return x
  return body


def _agreed(value: float) -> float:
  """Process 0's value on every process: decisions that shape the programs must agree."""
  if jax.process_count() == 1:
    return value
  return float(multihost_utils.broadcast_one_to_all(np.float64(value)))


def time_calls(sizes, repeats: int, warmup: int, ops=CALIBRATED) -> dict:
  """{op: [{'bytes': b, 'chains': {k: samples}}]}: the programs of k chained calls of each
  collective kind on devices 0 and 1, for each size b (the buffer an all-reduce or permute
  moves, an all-gather's result, a reduce-scatter's input; `SCALAR`: one float32 only, the
  loss's and metrics' all-reduces, which gloo reduces in one exchange). Chains grow 1, 2,
  8, 32 while the next k times the single call's mean time stays under CHAIN_BUDGET (at
  least 1, 2)."""
  mesh = make_mesh((2,), ('pair',), jax.devices()[:2])
  results = {}
  for op in ops:
    results[op] = []
    for size in ([4] if op == SCALAR else sizes):
      # float32; even (a reduce-scatter halves it) but the scalar
      elements = 1 if op == SCALAR else max(2, size // 4 // 2 * 2)
      per_device = elements // 2 if op == 'all_gather' else elements
      buffer = jax.jit(lambda n=per_device: jnp.ones((2, n), jnp.float32),
                       out_shardings=NamedSharding(mesh, P('pair')))()
      chains = {}
      for k in CHAINS:
        fn = jax.jit(jax.shard_map(_chain(op, k), mesh=mesh, in_specs=P('pair'),
                                   out_specs=P('pair'), check_vma=False))
        multihost.barrier(f'calls {op} {size} {k}')  # each compiles (or loads) at its pace
        chains[k] = timed(lambda b=buffer, f=fn: jax.block_until_ready(f(b)), repeats, warmup)
        if k == 1:
          single = _agreed(float(np.mean(chains[1])))
        following = CHAINS[CHAINS.index(k) + 1:]
        if k > 1 and (not following or following[0] * single > CHAIN_BUDGET):
          break
      results[op].append({'bytes': elements * 4, 'chains': {str(k): v for k, v in chains.items()}})
  return results
