"""[Y]'s distributed batch normalization over sub-groups of devices (docs/sources.md).

Each device computes the mean and mean square of its batch; a sub-group of
`bn_group_size` devices combines them (flax's BatchNorm with `axis_name`:
var = E[x²] − E[x]² over the group's rows, not the mean of per-device
variances) and normalizes with the group's statistics. The group size fixes
the BN batch (per-device batch × group size) independently of the global batch.

`axis_index_groups` cannot express the groups under `shard_map`, so a group is
a set of **trailing mesh axes**: on a mesh (2, 4) with axes ('x', 'y'), group
size 4 normalizes over 'y' (the devices of one row), 8 over ('x', 'y'), and 1
over no axis (per-device BN). A size that is not a product of trailing axes is
a config error listing the valid sizes; reshape the mesh to get others (group
size 2 on 8 devices: mesh (4, 2)).

Running statistics: each group updates them from its own batch, so they differ
between groups; the strategies average them over the axes they vary over
(`parallel/collectives.py: replicate`) after every step, keeping the state
replicated (as MLPerf's JAX ResNet syncs BN state before evaluation). The result is m·old + (1−m)·mean over groups of
the groups' batch statistics.
"""
import math


def group_sizes(mesh_shape) -> list:
  """The valid `bn_group_size` values of a mesh: products of its trailing axes."""
  return sorted({math.prod(mesh_shape[k:]) for k in range(len(mesh_shape) + 1)})


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

