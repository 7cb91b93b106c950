"""The one-copy-per-device layout shared by strategies whose devices hold different
values of the same tensors (the central server's weights, Local SGD's and gossip's
replicas): each leaf stacked on a leading dimension of size N and sharded over every
mesh axis, so that inside `shard_map` a device sees its own copy with a leading 1."""
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def copies(tree, n: int):
  """`n` equal copies of every leaf, stacked (under jit each device materialises its own)."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), tree)


def specs(tree, axes):
  """Every leaf split over the mesh `axes` on its leading dimension."""
  return jax.tree.map(lambda _: P(axes), tree)


def own(tree):
  """Inside shard_map: this device's copy."""
  return jax.tree.map(lambda x: x[0], tree)


def stack(tree):
  """Inside shard_map: this device's copy, in the layout again."""
  return jax.tree.map(lambda x: x[None], tree)
