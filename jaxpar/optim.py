"""The optimizer: SGD + momentum or LARS, warm-up then cosine or polynomial decay, in steps.

Weight decay (and LARS' trust ratio) apply to kernels only: biases and BN
scale/bias are excluded through optax masks, as in [Y] and MLPerf's ResNet.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

OPTIMIZERS = ('sgd', 'lars')
SCHEDULES = ('cosine', 'poly', 'constant')


def decay_mask(params):
  """Kernels only. Biases and BN scale/bias are the 1-D leaves."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def learning_rate(opt_config, global_batch: int, total_steps: int) -> optax.Schedule:
  """Linear scaling with the batch, gradual warm-up from 0, then decay to 0 ([Y] §3).

  `cosine`: half a cosine. `poly`: (1 − t)^poly_power over the steps after the
  warm-up, as [Y] and MLPerf's LARS ResNet (power 2). `constant`: no decay ([T]).
  """
  c = opt_config
  peak = peak_learning_rate(c, global_batch)
  if c.schedule == 'cosine':
    return optax.warmup_cosine_decay_schedule(0.0, peak, c.warmup_steps, total_steps)
  if c.schedule == 'constant':
    return optax.join_schedules([optax.linear_schedule(0.0, peak, c.warmup_steps),
                                 optax.constant_schedule(peak)], [c.warmup_steps])
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, c.warmup_steps),
       optax.polynomial_schedule(peak, 0.0, c.poly_power, total_steps - c.warmup_steps)],
      [c.warmup_steps])


def peak_learning_rate(opt_config, global_batch: int) -> float:
  """`base_lr` scaled linearly from `base_batch` to the global batch ([Y] §3)."""
  return opt_config.base_lr * global_batch / opt_config.base_batch


def make_optimizer(opt_config, schedule: optax.Schedule) -> optax.GradientTransformation:
  c = opt_config
  if c.name == 'lars':
    # You et al. 2017: each kernel's step is scaled by trust_coefficient·‖w‖/‖g + λw‖;
    # biases and BN parameters take the plain learning rate, undecayed.
    return optax.lars(schedule, weight_decay=c.weight_decay, weight_decay_mask=decay_mask,
                      trust_coefficient=c.trust_coefficient, trust_ratio_mask=decay_mask,
                      momentum=c.momentum, nesterov=c.nesterov)
  return optax.chain(
      optax.add_decayed_weights(c.weight_decay, mask=decay_mask),
      optax.sgd(schedule, momentum=c.momentum, nesterov=c.nesterov))


class _Empty(NamedTuple):
  pass


def make_packed_optimizer(opt_config, schedule: optax.Schedule, segments, decayed,
                          axes: tuple) -> optax.GradientTransformation:
  """SGD or LARS on packed vectors: each device of the mesh `axes` updates one vector
  holding its share of the elements of many tensors (a parameter server's slices).

  `segments` (N, capacity) gives each element's tensor on each device and
  `decayed[t]` whether tensor t is a kernel (weight decay and trust ratio); the
  trust ratio's norms are those of whole tensors, summed over the devices holding
  their pieces. Runs inside `shard_map`. Equal, element by element, to
  `make_optimizer` on the unpacked tensors.
  """
  c = opt_config
  table, kernel = jnp.asarray(segments), jnp.asarray(decayed)

  def update(u, state, params):
    segment = lax.dynamic_index_in_dim(table, lax.axis_index(axes), keepdims=False)
    mask = kernel[segment]
    u = u + c.weight_decay * jnp.where(mask, params, 0.0)
    if c.name == 'lars':
      def norms(x):
        squares = jax.ops.segment_sum(jnp.square(x), segment, num_segments=len(decayed))
        return jnp.sqrt(lax.psum(squares, axes))[segment]
      w_norm, u_norm = norms(params), norms(u)
      ratio = jnp.where((w_norm == 0) | (u_norm == 0), 1.0, c.trust_coefficient * w_norm / u_norm)
      u = u * jnp.where(mask, ratio, 1.0)
    return u, state
  decay_and_trust = optax.GradientTransformation(lambda params: _Empty(), update)
  if c.name == 'lars':
    return optax.chain(decay_and_trust, optax.scale_by_learning_rate(schedule),
                       optax.trace(decay=c.momentum, nesterov=c.nesterov))
  return optax.chain(decay_and_trust,
                     optax.sgd(schedule, momentum=c.momentum, nesterov=c.nesterov))
