"""[Y]'s sub-group batch norm: each device normalizes with its group's statistics, and the
replicated running statistics are the mean over groups of single-group updates."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxpar.mesh import make_mesh
from jaxpar.models.layers import batch_norm
from jaxpar.parallel.collectives import replicate
from jaxpar.parallel.group_batchnorm import group_axes, group_sizes

SHAPE, AXES = (2, 2, 2), ('a', 'b', 'c')
ROWS, FEATURES, EPS, MOMENTUM = 4, 3, 1e-5, 0.9


class BN(nn.Module):
  axis_name: object = None

  @nn.compact
  def __call__(self, x):
    return batch_norm(True, self.axis_name, jnp.float32)()(x)


def _device_batches():
  # Each device's rows have their own offset, so the group's variance (E[x²] − E[x]²
  # over all its rows) differs from the mean of the per-device variances.
  rng = np.random.default_rng(0)
  offsets = np.arange(8, dtype=np.float32)[:, None, None] * np.array([1.0, -2.0, 0.5], np.float32)
  return rng.normal(size=(8, ROWS, FEATURES)).astype(np.float32) + offsets


@pytest.mark.parametrize('group_size', [1, 2, 4, 8])
def test_sub_group_batch_norm_equals_numpy_per_group(group_size):
  mesh = make_mesh(SHAPE, AXES)
  bn_axes = group_axes(SHAPE, AXES, group_size)
  x = _device_batches()
  variables = BN().init(jax.random.key(0), x[0])

  def body(x):
    y, new = BN(bn_axes).apply(variables, x[0], mutable=['batch_stats'])
    return y[None], replicate(new['batch_stats'])
  y, stats = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(AXES),
                                   out_specs=(P(AXES), P())))(x)

  groups = x.reshape(8 // group_size, group_size * ROWS, FEATURES)  # consecutive devices
  mean, var = groups.mean(1), groups.var(1)
  expected = (groups - mean[:, None]) / np.sqrt(var[:, None] + EPS)
  np.testing.assert_allclose(np.asarray(y).reshape(groups.shape), expected, rtol=1e-4, atol=1e-4)
  bn = stats['BatchNorm_0']
  np.testing.assert_allclose(bn['mean'], ((1 - MOMENTUM) * mean).mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bn['var'], (MOMENTUM + (1 - MOMENTUM) * var).mean(0), rtol=1e-5)


def test_groups_are_trailing_mesh_axes():
  assert group_sizes((2, 4)) == [1, 4, 8]
  assert group_axes((2, 4), ('x', 'y'), 4) == ('y',)
  assert group_axes((2, 4), ('x', 'y'), 8) == ('x', 'y')
  assert group_axes((2, 4), ('x', 'y'), 0) == ('x', 'y')  # 0 = every device
  assert group_axes((2, 4), ('x', 'y'), 1) is None        # per-device statistics
  with pytest.raises(ValueError, match=r'valid: \[1, 4, 8\]'):
    group_axes((2, 4), ('x', 'y'), 2)
  # Axes of one device share nothing: BN never all-reduces over a group of one.
  assert group_axes((1, 4), ('x', 'y'), 0) == ('y',)
  assert group_axes((1,), ('data',), 0) is None
