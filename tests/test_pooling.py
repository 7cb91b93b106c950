"""`jaxpar.models.pooling.max_pool` equals flax's `nn.max_pool`, forward and gradient, for
every max-pool geometry of the four networks (and 'SAME' padding as GoogLeNet's inception
asks), ties included: the gradient goes to the same element of each window as JAX's own —
in each formulation of each pass (the default: the maximum of strided slices, the gradient
per stride phase, its phases interleaved or selected by parity; and those before, kept for
the A/B: `reduce_window`, taps at full size)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import flax.linen as nn

from jaxpar.models.pooling import max_pool

# (map, window, stride, padding): ResNet34's 3×3/2 stem pool, VGG16E's 2×2/2, GoogLeNet's and
# SqueezeNet's 3×3/2 with Caffe's ceil padding (bottom/right), GoogLeNet's inception 3×3/1;
# then pools none of them has: a window smaller than the stride (phases no tap reaches),
# unequal strides, a stride equal to an odd window.
GEOMETRIES = [((9, 9), (3, 3), (2, 2), ((1, 1), (1, 1))),
              ((8, 8), (2, 2), (2, 2), ((0, 0), (0, 0))),
              ((8, 8), (3, 3), (2, 2), ((0, 1), (0, 1))),
              ((7, 7), (3, 3), (2, 2), ((0, 0), (0, 0))),
              ((6, 5), (3, 3), (1, 1), 'SAME'),
              ((1, 1), (3, 3), (2, 2), ((0, 2), (0, 2))),
              ((9, 8), (2, 2), (3, 3), ((0, 0), (0, 1))),
              ((10, 9), (3, 2), (2, 1), ((1, 0), (0, 1))),
              ((9, 9), (3, 3), (3, 3), ((0, 0), (0, 0)))]


def _grads(pool, x, dy, window, strides, padding):
  y, vjp = jax.vjp(lambda x: pool(x, window, strides, padding), x)
  return y, vjp(dy)[0]


@pytest.mark.parametrize('hw,window,strides,padding', GEOMETRIES)
@pytest.mark.parametrize('ties', [False, True])
@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize('forward,gradient,assembly', [
    ('slices', 'phases', 'interleave'), ('slices', 'phases', 'parity'),
    ('reduce_window', 'full', 'auto')])
def test_max_pool_equals_flax_forward_and_gradient(hw, window, strides, padding, ties, dtype,
                                                   forward, gradient, assembly):
  pool = functools.partial(max_pool, forward=forward, gradient=gradient, assembly=assembly)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, *hw, 3))
  if ties:  # after a ReLU most windows hold several equal zeros, some all zeros
    x = np.maximum(np.round(x), 0)
  x = jnp.asarray(x, dtype)
  # Integer cotangents: every sum of them is exact in any order, so the gradients must be
  # equal, not close — the same element of every window receives each cotangent.
  y = nn.max_pool(x, window, strides, padding)
  dy = jnp.asarray(rng.integers(-4, 5, size=y.shape), dtype)
  got = jax.jit(lambda x, dy: _grads(pool, x, dy, window, strides, padding))(x, dy)
  want = jax.jit(lambda x, dy: _grads(nn.max_pool, x, dy, window, strides, padding))(x, dy)
  for g, w in zip(got, want):
    assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))


def test_the_program_has_no_select_and_scatter_or_reduce_window_on_cpu():
  x = jnp.ones((2, 8, 8, 3))
  grad = jax.grad(lambda x: jnp.sum(max_pool(x, (3, 3), (2, 2), ((0, 1), (0, 1)))))
  text = jax.jit(grad).lower(x).as_text()
  assert 'select_and_scatter' not in text and 'reduce_window' not in text
  flax_grad = jax.grad(lambda x: jnp.sum(nn.max_pool(x, (3, 3), (2, 2), ((0, 1), (0, 1)))))
  assert 'select_and_scatter' in jax.jit(flax_grad).lower(x).as_text()


def test_other_shapes_are_flaxs():
  x = jnp.arange(2 * 9 * 3, dtype=jnp.float32).reshape(2, 9, 3)  # one spatial dim
  np.testing.assert_array_equal(max_pool(x, (3,), (2,)), nn.max_pool(x, (3,), (2,)))


def test_pool_bench_finds_a_networks_pools_and_times_each_formulation():
  """`analysis.benchmarks.pool_bench`: SqueezeNet's three 3×3/2 pools at 224² (Caffe's
  ceil rounding: 109² → 54², 54² → 27², 27² → 13²), and each formulation's program is
  its own (`reduce_window` in `flax` and `before` only)."""
  from analysis.benchmarks import pool_bench
  found = pool_bench.pools('squeezenet', 224, 2, jnp.float32)
  assert sorted(p.shape for p in found) == [(2, 27, 27, 512), (2, 54, 54, 256),
                                            (2, 109, 109, 96)]
  assert {(p.window, p.strides) for p in found} == {((3, 3), (2, 2))}
  assert all(count == 1 for count in found.values())
  p = pool_bench.Pool((2, 9, 9, 3), (3, 3), (2, 2), ((0, 0), (0, 0)))
  for formulation, reduce_window in (('flax', True), ('before', True), ('jaxpar', False)):
    for f, args in pool_bench.programs(formulation, p, jnp.float32).values():
      assert ('reduce_window' in f.lower(*args).as_text()) == reduce_window, formulation


def test_auto_assembles_unpadded_overlapping_pools_by_parity():
  """`assembly='auto'` (analysis/report/pool/): the phases selected by parity where the
  windows overlap and the pool is unpadded (SqueezeNet's 3×3/2 on 109², 27², 13²),
  interleaved where it is padded or the windows do not overlap (VGG16E's 2×2/2)."""
  x = jnp.ones((2, 10, 10, 3))

  def parity(window, strides, padding):
    text = jax.jit(jax.grad(lambda x: jnp.sum(max_pool(x, window, strides, padding)))).lower(
        x).as_text()
    assert ('iota' in text) != ('concatenate' in text)
    return 'iota' in text
  assert parity((3, 3), (2, 2), ((0, 0), (0, 0)))
  assert not parity((3, 3), (2, 2), ((1, 1), (1, 1)))
  assert not parity((3, 3), (2, 2), ((0, 1), (0, 1)))
  assert not parity((2, 2), (2, 2), ((0, 0), (0, 0)))


def test_a_network_pools_as_its_pool_field_says_and_a_bad_formulation_is_refused():
  """The formulations are `max_pool`'s arguments, and a network takes its pool as a field:
  SqueezeNet built with `forward='reduce_window'` traces XLA's reduce_window, by default not;
  an unknown formulation is a ValueError naming the argument."""
  from jaxpar.models import MODELS
  x = jnp.ones((1, 32, 32, 1))

  def program(**pool):
    model = MODELS['squeezenet'](num_classes=10, pool=functools.partial(max_pool, **pool))
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))
    return jax.jit(lambda v: model.apply(v, x, train=False)).lower(variables).as_text()
  assert 'reduce_window' in program(forward='reduce_window')
  assert 'reduce_window' not in program()
  with pytest.raises(ValueError, match="forward='reduce-window'"):
    max_pool(x, (3, 3), (2, 2), forward='reduce-window')
