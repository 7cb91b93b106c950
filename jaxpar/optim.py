"""The optimizer: SGD + momentum or LARS, warm-up then cosine or polynomial decay, in steps.

Weight decay (and LARS' trust ratio) apply to kernels only: biases and BN
scale/bias are excluded through optax masks, as in [Y] and MLPerf's ResNet.
"""
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import optax
from jax import lax

OPTIMIZERS = ('sgd', 'lars')
SCHEDULES = ('cosine', 'poly')


def decay_mask(params):
  """Kernels only. Biases and BN scale/bias are the 1-D leaves."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def learning_rate(opt_config, global_batch: int, total_steps: int) -> optax.Schedule:
  """Linear scaling with the batch, gradual warm-up from 0, then decay to 0 ([Y] §3).

  `cosine`: half a cosine. `poly`: (1 − t)^poly_power over the steps after the
  warm-up, as [Y] and MLPerf's LARS ResNet (power 2).
  """
  c = opt_config
  peak = c.base_lr * global_batch / c.base_batch
  if c.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, peak, c.warmup_steps, total_steps)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, c.warmup_steps),
       optax.polynomial_schedule(peak, 0.0, c.poly_power, total_steps - c.warmup_steps)],
      [c.warmup_steps])


def make_optimizer(opt_config, schedule: optax.Schedule, mask: Any = decay_mask,
                   norm_axes: Optional[tuple] = None) -> optax.GradientTransformation:
  """SGD or LARS from config.

  `mask` selects the leaves that get weight decay and LARS' trust ratio: a
  callable on the parameters or a tree of bools. A strategy that hands the
  optimizer shards of the parameters passes the tree computed from the whole
  parameters, and in `norm_axes` the mesh axes the shards are spread over, so
  that LARS' norms are those of whole tensors.
  """
  c = opt_config
  if c.name == 'lars':
    # optax.lars, with norms that may span the devices holding a tensor's shards.
    return optax.chain(
        optax.add_decayed_weights(c.weight_decay, mask=mask),
        optax.masked(scale_by_trust_ratio(c.trust_coefficient, norm_axes), mask),
        optax.scale_by_learning_rate(schedule),
        optax.trace(decay=c.momentum, nesterov=c.nesterov))
  return optax.chain(
      optax.add_decayed_weights(c.weight_decay, mask=mask),
      optax.sgd(schedule, momentum=c.momentum, nesterov=c.nesterov))


class _Empty(NamedTuple):
  pass


def scale_by_trust_ratio(trust_coefficient: float, norm_axes: Optional[tuple] = None):
  """LARS' trust ratio (You et al. 2017): scales each update u of a tensor w by
  η·‖w‖/‖u‖ (u is the decayed gradient g + λw), or by 1 where either norm is 0,
  as `optax.scale_by_trust_ratio`. With `norm_axes` (inside `shard_map`) each
  device holds a shard of every tensor and the squared norms are summed over
  those axes first."""
  def norm(x):
    squares = jnp.sum(jnp.square(x))
    return jnp.sqrt(lax.psum(squares, norm_axes) if norm_axes else squares)

  def update(updates, state, params):
    def scale(u, w):
      w_norm, u_norm = norm(w), norm(u)
      ratio = trust_coefficient * w_norm / u_norm
      return u * jnp.where((w_norm == 0) | (u_norm == 0), 1.0, ratio).astype(u.dtype)
    return jax.tree.map(scale, updates, params), state
  return optax.GradientTransformation(lambda params: _Empty(), update)
