"""float16 with dynamic loss scaling (config `loss_scaling`, `step.LossScale`)."""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxpar.mesh import make_mesh
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.step import LossScale, init_state, make_train_step, to_global
from runs import random_batches

SMALL = 2.0 ** -24  # the logits' factor, float16's smallest subnormal: a gradient times it
                    # flushes to zero in float16 unless scaled up first


class Faint(nn.Module):
  """Two Dense layers whose logits are scaled by SMALL: the gradients that reach the
  layers are ~1e-9, below half float16's smallest subnormal (6e-8), so they round to 0."""
  dtype: Any = jnp.float32
  bn_axis_name: Any = None   # the step's models take it; this one has no BatchNorm

  @nn.compact
  def __call__(self, x, train=True):
    x = x.reshape(x.shape[0], -1).astype(self.dtype)
    x = nn.relu(nn.Dense(16, dtype=self.dtype)(x))
    return nn.Dense(5, dtype=self.dtype)(x) * jnp.asarray(SMALL, self.dtype)


TX = optax.sgd(1e6)  # large enough that gradients of ~1e-9 move the weights visibly


def _steps(dtype, loss_scaling, batches, mesh):
  model, strategy = Faint(dtype=dtype), AllReduce(mesh.axis_names)
  state = init_state(model, TX, strategy, mesh, (1, 16, 16, 3), jax.random.key(0),
                     loss_scaling=loss_scaling)
  first = jax.device_get(state.params)  # the step donates the state
  step = make_train_step(model, TX, mesh, strategy)
  metrics = []
  for b in batches:
    state, m = step(state, to_global(mesh, b), jax.random.key(1))
    metrics.append(jax.device_get(m))
  return first, jax.device_get(state), metrics


def test_float16_gradients_that_underflow_train_with_scaling():
  """Unscaled, float16 gradients flush to zero and nothing moves; scaled by 2^15 they are
  the float32 ones (to float16's precision)."""
  mesh = make_mesh((8,), ('data',))
  batches = random_batches(1, batch=32)
  first, unscaled, _ = _steps(jnp.float16, False, batches, mesh)
  _, scaled, metrics = _steps(jnp.float16, True, batches, mesh)
  _, exact, _ = _steps(jnp.float32, False, batches, mesh)
  kernel = lambda s: np.asarray(s['Dense_0']['kernel'])
  np.testing.assert_array_equal(kernel(unscaled.params), kernel(first))
  moved, expected = kernel(scaled.params) - kernel(first), kernel(exact.params) - kernel(first)
  assert np.abs(expected).max() > 1e-3
  # float16's forward pass flips a few ReLUs near zero (11 % off here): the whole update.
  assert np.linalg.norm(moved - expected) < 0.2 * np.linalg.norm(expected)  # unscaled: 1.0
  assert metrics[0]['skipped'] == 0 and metrics[0]['loss_scale'] == LossScale.INITIAL
  assert float(scaled.loss_scale.scale) == LossScale.INITIAL
  assert int(scaled.loss_scale.good_steps) == 1


def test_a_non_finite_step_is_skipped_everywhere_and_the_scale_halves():
  """One device's batch holds an infinity: every device keeps its weights and optimizer
  state (the all-reduce would spread the NaN), the scale halves, and the next finite step
  trains."""
  mesh = make_mesh((8,), ('data',))
  bad, good = random_batches(2, batch=32)
  bad['image'][5, 0, 0, 0] = np.inf     # row 5: device 1's share
  first, state, metrics = _steps(jnp.float16, True, [bad], mesh)
  assert metrics[0]['skipped'] == 1
  for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(first)):
    np.testing.assert_array_equal(a, b)
  assert float(state.loss_scale.scale) == LossScale.INITIAL / 2
  assert int(state.step) == 1 and int(state.loss_scale.good_steps) == 0
  _, state, metrics = _steps(jnp.float16, True, [bad, good], mesh)
  assert [m['skipped'] for m in metrics] == [1, 0]
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state.params))
  assert float(state.loss_scale.scale) == LossScale.INITIAL / 2


def test_the_scale_grows_after_an_interval_of_finite_steps():
  scale = LossScale(jnp.float32(8.0), jnp.int32(LossScale.GROWTH_INTERVAL - 2))
  scale = scale.next(jnp.bool_(True))
  assert float(scale.scale) == 8 and int(scale.good_steps) == LossScale.GROWTH_INTERVAL - 1
  scale = scale.next(jnp.bool_(True))
  assert float(scale.scale) == 16 and int(scale.good_steps) == 0
  scale = LossScale(jnp.float32(1.0), jnp.int32(5)).next(jnp.bool_(False))
  assert float(scale.scale) == 1 and int(scale.good_steps) == 0  # never below 1
