"""The optimizer: SGD + momentum, warm-up + cosine schedule in steps, masked weight decay."""
import jax
import optax


def decay_mask(params):
  """Weight decay on kernels only. Biases and BN scale/bias are the 1-D leaves."""
  return jax.tree.map(lambda p: p.ndim > 1, params)


def learning_rate(opt_config, global_batch: int, total_steps: int) -> optax.Schedule:
  """Linear scaling with the batch, gradual warm-up, then cosine decay ([Y] §3)."""
  peak = opt_config.base_lr * global_batch / opt_config.base_batch
  return optax.warmup_cosine_decay_schedule(0.0, peak, opt_config.warmup_steps, total_steps)


def make_optimizer(opt_config, schedule: optax.Schedule) -> optax.GradientTransformation:
  return optax.chain(
      optax.add_decayed_weights(opt_config.weight_decay, mask=decay_mask),
      optax.sgd(schedule, momentum=opt_config.momentum, nesterov=opt_config.nesterov))
