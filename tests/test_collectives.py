"""ring_psum, torus2d_psum, fused_psum and sized_psum have psum's contract, on any leaf
shape, and the ring moves 1/N of the buffer per step; replicate averages each leaf over the axes it
varies over, and skips axes of one device."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxpar.mesh import make_mesh
from jaxpar.perfmodel.hlo import collectives
from jaxpar.collectives import (SMALL_TENSOR_BYTES, fused_psum, replicate, ring_psum,
                                        sized_psum, spanning, torus2d_psum)

# Awkward on purpose: a scalar, sizes prime to every axis size, an empty leaf, bf16 beside f32.
SHAPES = {'scalar': (), 'odd': (7,), 'cube': (3, 5, 2), 'empty': (0, 4), 'big': (1001,)}


def _per_device_tree(n, seed=0):
  rng = np.random.default_rng(seed)
  tree = {k: rng.normal(size=(n, *s)).astype(np.float32) for k, s in SHAPES.items()}
  tree['bf16'] = rng.normal(size=(n, 3, 3)).astype(jnp.bfloat16)
  return tree


def _psum(tree, axes):
  """lax.psum of every leaf but the empty ones, whose sum is an empty array: jaxlib 0.11.2
  crashes compiling a psum of an empty array under shard_map (Shardy's
  ManualComputationUnusedInputsPattern; 0.10 and 0.12 compile it)."""
  return jax.tree.map(lambda v: jax.lax.psum(v, axes) if v.size else jnp.zeros(v.shape, v.dtype),
                      tree)


def _compare(mesh, axes, reduce):
  """Runs `reduce` and lax.psum over `axes` on per-device values; returns both."""
  tree = _per_device_tree(mesh.size)
  spec = P(mesh.axis_names)

  def body(t):
    t = jax.tree.map(lambda v: v[0], t)
    return reduce(t), _psum(t, axes)
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
    return jax.tree.map(lambda v: v[None], (ring_psum(t, 'y'), _psum(t, 'y')))
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


def test_fused_psum_equals_psum_in_one_all_reduce_per_dtype():
  mesh = make_mesh((2, 4), ('x', 'y'))
  reduce = lambda t: fused_psum(t, ('x', 'y'))
  _assert_tree_equal(*_compare(mesh, ('x', 'y'), reduce))
  body = lambda t: reduce(jax.tree.map(lambda v: v[0], t))
  lowered = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(mesh.axis_names),
                                  out_specs=P())).lower(_per_device_tree(8)).as_text()
  assert lowered.count('stablehlo.all_reduce') == 2  # float32 and bfloat16


def test_sized_psum_sends_small_leaves_in_one_buffer_and_large_ones_alone():
  """Leaves under SMALL_TENSOR_BYTES share one all-reduce per dtype; each larger one has its
  own, of its own shape (copied into no buffer)."""
  mesh = make_mesh((2, 4), ('x', 'y'))
  words = SMALL_TENSOR_BYTES // 4  # float32 elements at the threshold
  large = {'at': (words,), 'above': (2, words // 2 + 1)}  # exactly the threshold: alone

  def tree_of(n):
    rng = np.random.default_rng(2)
    tree = _per_device_tree(n)
    tree.update({k: rng.normal(size=(n, *s)).astype(np.float32) for k, s in large.items()})
    tree['under'] = rng.normal(size=(n, words - 1)).astype(np.float32)
    return tree
  reduce = lambda t: sized_psum(t, ('x', 'y'))
  spec = P(mesh.axis_names)
  body = lambda t: (reduce(t), _psum(t, ('x', 'y')))
  unstack = lambda t: jax.tree.map(lambda v: v[0], t)
  got, want = jax.jit(jax.shard_map(lambda t: body(unstack(t)), mesh=mesh, in_specs=spec,
                                    out_specs=P()))(tree_of(8))
  _assert_tree_equal(got, want)
  lowered = jax.jit(jax.shard_map(lambda t: reduce(unstack(t)), mesh=mesh, in_specs=spec,
                                  out_specs=P())).lower(tree_of(8)).as_text()
  sent = sorted((c.op, c.shape, c.dtype) for c in collectives(lowered))
  small_floats = sum(int(np.prod(s)) for s in SHAPES.values()) + words - 1
  assert sent == sorted([('all_reduce', (small_floats,), 'f32'), ('all_reduce', (9,), 'bf16'),
                         ('all_reduce', (words,), 'f32'),
                         ('all_reduce', (2, words // 2 + 1), 'f32')])


def test_replicate_averages_each_leaf_over_its_own_axes():
  mesh = make_mesh((2, 4), ('x', 'y'))
  rng = np.random.default_rng(1)
  per_device = {'both': rng.normal(size=(2, 4, 3)).astype(np.float32),
                'x_only': rng.normal(size=(2, 1, 5)).astype(np.float32),
                'neither': rng.normal(size=(1, 1, 2)).astype(np.float32)}
  specs = {'both': P('x', 'y'), 'x_only': P('x', None), 'neither': P()}

  def body(t):
    assert spanning(('x', 'y')) == ('x', 'y') and spanning('x') == ('x',)
    return replicate(jax.tree.map(lambda v: v[0, 0], t))
  got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(specs,), out_specs=P()))(per_device)
  np.testing.assert_allclose(got['both'], per_device['both'].mean((0, 1)), rtol=1e-6)
  np.testing.assert_allclose(got['x_only'], per_device['x_only'].mean((0, 1)), rtol=1e-6)
  np.testing.assert_array_equal(got['neither'], per_device['neither'][0, 0])


def test_spanning_skips_axes_of_one_device():
  mesh = make_mesh((1, 8), ('x', 'y'))
  axes = jax.jit(jax.shard_map(lambda: jnp.int32(len(spanning(('x', 'y')))), mesh=mesh,
                               in_specs=(), out_specs=P()))()
  assert axes == 1


def test_empty_leaves_alone_are_returned_empty_and_replicated():
  """A dtype whose every leaf is empty sends nothing; the leaves come back with their shapes,
  typed replicated as psum's are (out_specs=P())."""
  mesh = make_mesh((8,), ('d',))

  def body(t):
    t = jax.tree.map(lambda v: v[0], t)
    return fused_psum(t, 'd'), replicate(t), ring_psum(t, 'd')
  tree = {'empty': np.zeros((8, 0, 4), np.float32), 'f': np.ones((8, 3), np.int32),
          'b': np.zeros((8, 2, 0), jnp.bfloat16)}
  summed, averaged, ring = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P('d'),
                                                 out_specs=P()))(tree)
  for out in (summed, averaged, ring):
    assert out['empty'].shape == (0, 4) and out['b'].shape == (2, 0)
    assert out['b'].dtype == jnp.bfloat16
  np.testing.assert_array_equal(summed['f'], 8)
  np.testing.assert_array_equal(ring['f'], 8)
