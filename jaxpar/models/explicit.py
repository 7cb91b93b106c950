"""Explicit mesh axes (sharding in types, the default of `jax.make_mesh`): under them every
operation's result type says how it is split, and an operation whose result's split JAX
cannot infer (a reshape that merges dimensions, an FFI call, a `select` between a sharded
and an unsharded operand) is refused. These helpers say it for the networks' own code;
inside `shard_map` and over Auto axes types carry no split and they do nothing."""
import jax
from jax.sharding import NamedSharding, PartitionSpec


def sharded(x) -> bool:
  """Whether `x`'s type says how it is split over a mesh (only Explicit axes are named
  in a type's spec)."""
  sharding = getattr(jax.typeof(x), 'sharding', None)
  return any(s is not None for s in getattr(sharding, 'spec', ()))


def batch_split(x):
  """`x`'s type's split of its first (batch) dimension alone, for a result of another
  shape that keeps the batch (None where types carry no split)."""
  if not sharded(x):
    return None
  sharding = jax.typeof(x).sharding
  return NamedSharding(sharding.mesh, PartitionSpec(sharding.spec[0]))


def reshape(x, shape):
  """`x.reshape(shape)` for a reshape that keeps the batch dimension and merges or splits
  the others: the result is split over the batch as `x` is."""
  return jax.lax.reshape(x, tuple(shape), out_sharding=batch_split(x))
