"""ring_psum and torus2d_psum have psum's contract, on any leaf shape, and the ring moves
1/N of the buffer per step."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxpar.mesh import make_mesh
from jaxpar.parallel.collectives import ring_psum, torus2d_psum

# Awkward on purpose: a scalar, sizes prime to every axis size, an empty leaf, bf16 beside f32.
SHAPES = {'scalar': (), 'odd': (7,), 'cube': (3, 5, 2), 'empty': (0, 4), 'big': (1001,)}


def _per_device_tree(n, seed=0):
  rng = np.random.default_rng(seed)
  tree = {k: rng.normal(size=(n, *s)).astype(np.float32) for k, s in SHAPES.items()}
  tree['bf16'] = rng.normal(size=(n, 3, 3)).astype(jnp.bfloat16)
  return tree


def _compare(mesh, axes, reduce):
  """Runs `reduce` and lax.psum over `axes` on per-device values; returns both."""
  tree = _per_device_tree(mesh.size)
  spec = P(mesh.axis_names)

  def body(t):
    t = jax.tree.map(lambda v: v[0], t)
    return reduce(t), jax.lax.psum(t, axes)
  # out_specs=P(): the result must be typed replicated, as psum's is.
  got, want = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P()))(tree)
  return got, want


def _assert_tree_equal(got, want):
  for k in want:
    assert got[k].shape == want[k].shape and got[k].dtype == want[k].dtype, k
    tol = 2e-2 if want[k].dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(np.asarray(got[k], np.float32), np.asarray(want[k], np.float32),
                               rtol=tol, atol=tol, err_msg=k)


@pytest.mark.parametrize('shape,axes', [((8,), ('d',)), ((2, 4), ('x', 'y')), ((1, 8), ('x', 'y'))])
def test_ring_psum_over_the_whole_mesh_equals_psum(shape, axes):
  got, want = _compare(make_mesh(shape, axes), axes, lambda t: ring_psum(t, axes))
  _assert_tree_equal(got, want)


@pytest.mark.parametrize('shape', [(2, 4), (8, 1)])
def test_ring_psum_along_one_axis_equals_psum(shape):
  """A ring per row of the mesh ('y'); with a size-1 axis each ring is one device."""
  mesh = make_mesh(shape, ('x', 'y'))
  tree = _per_device_tree(mesh.size)

  def body(t):
    t = jax.tree.map(lambda v: v[0], t)
    return jax.tree.map(lambda v: v[None], (ring_psum(t, 'y'), jax.lax.psum(t, 'y')))
  spec = P(('x', 'y'))
  got, want = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=spec))(tree)
  _assert_tree_equal(got, want)


@pytest.mark.parametrize('shape', [(2, 4), (4, 2), (1, 8), (8, 1)])
def test_torus2d_psum_equals_psum(shape):
  mesh = make_mesh(shape, ('x', 'y'))
  got, want = _compare(mesh, ('x', 'y'), lambda t: torus2d_psum(t, ('x', 'y')))
  _assert_tree_equal(got, want)


def test_ring_moves_one_nth_of_the_buffer_per_step():
  """[L]: N−1 neighbour exchanges of 1/N of the fused buffer reduce-scatter it; one
  all-gather of the 1/N chunks (the ring's second half) replicates the result."""
  mesh = make_mesh((8,), ('d',))
  tree = {'w': jnp.zeros((8, 10, 10)), 'b': jnp.zeros((8, 3))}  # 103 floats → chunks of 13
  body = lambda t: ring_psum(jax.tree.map(lambda v: v[0], t), 'd')
  text = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P('d'), out_specs=P())).lower(
      tree).as_text()
  permutes = re.findall(r'stablehlo\.collective_permute.*?\((tensor<[^)]*>)\) ->', text)
  assert permutes == ['tensor<13xf32>'] * 7
  gathers = re.findall(r'stablehlo\.all_gather.*?\((tensor<[^)]*>)\) ->', text)
  assert gathers == ['tensor<1x13xf32>']
  assert 'all_reduce' not in text
