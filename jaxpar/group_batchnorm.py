"""[Y]'s distributed batch normalization over sub-groups of devices (docs/sources.md).

Each device computes the mean and mean square of its batch; a sub-group of
`bn_group_size` devices combines them (flax's BatchNorm with `axis_name`:
var = E[x²] − E[x]² over the group's rows, not the mean of per-device
variances) and normalizes with the group's statistics. The group size fixes
the BN batch (per-device batch × group size) independently of the global batch.

`axis_index_groups` cannot express the groups under `shard_map`, so a group is
a set of **trailing mesh axes**: on a mesh (2, 4) with axes ('x', 'y'), group
size 4 normalizes over 'y' (the devices of one row), 8 over ('x', 'y'), and 1
over no axis (per-device BN). Any other size g that divides the devices is made
one by splitting a mesh axis (`split_for_groups`): group 2 on (2, 4) splits 'y'
into ('y', 'y_bn') of (2, 2), the same devices in the same order, and normalizes
over 'y_bn'; the strategies see a mesh of three data axes and compute exactly what
they would on (2, 4) (the batch is split over all axes in order). Groups are
consecutive devices in mesh order; a size no split can make (6 on (3, 4)) is a
config error listing the valid ones.

Running statistics: each group updates them from its own batch, so they differ
between groups; the strategies average them over the axes they vary over
(`jaxpar/collectives.py: replicate`) after every step, keeping the state
replicated (as MLPerf's JAX ResNet syncs BN state before evaluation). The result is m·old + (1−m)·mean over groups of
the groups' batch statistics.
"""
import math


SPLIT_SUFFIX = '_bn'


def group_sizes(mesh_shape) -> list:
  """The group sizes that are products of a mesh's trailing axes."""
  return sorted({math.prod(mesh_shape[k:]) for k in range(len(mesh_shape) + 1)})


def _split(mesh_shape, group_size: int):
  """(axis k, inner size) such that splitting axis k into (n_k / inner, inner) makes
  `group_size` a product of trailing axes; None if it already is one or none does."""
  if group_size in group_sizes(mesh_shape):
    return None
  for k in range(len(mesh_shape) - 1, -1, -1):
    tail = math.prod(mesh_shape[k + 1:])
    if group_size % tail == 0 and mesh_shape[k] % (group_size // tail) == 0:
      return k, group_size // tail
  return None


def bn_group_sizes(mesh_shape) -> list:
  """The valid `bn_group_size` values of a mesh: products of trailing axes, and the sizes
  one split of an axis makes so."""
  n = math.prod(mesh_shape)
  return [g for g in range(1, n + 1)
          if n % g == 0 and (g in group_sizes(mesh_shape) or _split(mesh_shape, g))]


def split_for_groups(mesh_shape, mesh_axes, group_size: int):
  """(shape, axes, split axis name or None): the mesh on which BN groups of `group_size`
  (0 = all) are trailing axes; the axis split keeps its name for the outer part, the
  inner part is named with `SPLIT_SUFFIX`."""
  shape, axes = tuple(mesh_shape), tuple(mesh_axes)
  where = _split(shape, group_size) if group_size else None
  if where is None:
    return shape, axes, None
  k, inner = where
  return (shape[:k] + (shape[k] // inner, inner) + shape[k + 1:],
          axes[:k + 1] + (axes[k] + SPLIT_SUFFIX,) + axes[k + 1:], axes[k])


def group_axes(mesh_shape, mesh_axes, group_size: int):
  """The trailing mesh axes whose devices form one BN group (None for per-device BN).

  `group_size` 0 means every device (one global group). Axes of one device are left
  out (a group over them is the device itself, and naming them would all-reduce its
  statistics over a group of one). Raises ValueError for a size that is not in
  `group_sizes(mesh_shape)`.
  """
  size = group_size or math.prod(mesh_shape)
  for k in range(len(mesh_shape) + 1):
    if math.prod(mesh_shape[k:]) == size:
      return tuple(a for a, n in zip(mesh_axes[k:], mesh_shape[k:]) if n > 1) or None
  raise ValueError(f'{group_size} is not a product of trailing mesh axes {tuple(mesh_shape)}; '
                   f'valid: {group_sizes(mesh_shape)}')

