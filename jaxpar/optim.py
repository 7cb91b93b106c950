"""The optimizer: SGD + momentum or LARS, warm-up then cosine or polynomial decay, in steps.

Weight decay (and LARS' trust ratio) apply to kernels only: biases and BN
scale/bias are excluded through optax masks, as in [Y] and MLPerf's ResNet.
"""
import jax
import optax

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
