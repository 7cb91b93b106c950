"""The optimizer: SGD + momentum or LARS, warm-up then cosine or polynomial decay, in steps.

Weight decay (and LARS' trust ratio) apply to kernels only: biases and BN
scale/bias are excluded through optax masks, as in [Y] and MLPerf's ResNet.
"""
import functools
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


def make_optimizer(opt_config, schedule: optax.Schedule, mask=decay_mask,
                   norm_axes: tuple = ()) -> optax.GradientTransformation:
  """SGD + momentum or LARS. `mask` says which leaves are kernels (weight decay, trust
  ratio): a function of the parameters or a tree of bools. `norm_axes`: mesh axes over
  which every leaf is split into runs (the distributed server's even placement, inside
  `shard_map`); LARS' trust ratio then takes the norms of the whole tensors, summed
  over them."""
  c = opt_config
  if c.name == 'lars':
    # You et al. 2017: each kernel's step is scaled by trust_coefficient·‖w‖/‖g + λw‖;
    # biases and BN parameters take the plain learning rate, undecayed.
    if not norm_axes:
      return optax.lars(schedule, weight_decay=c.weight_decay, weight_decay_mask=mask,
                        trust_coefficient=c.trust_coefficient, trust_ratio_mask=mask,
                        momentum=c.momentum, nesterov=c.nesterov)
    return optax.chain(
        optax.add_decayed_weights(c.weight_decay, mask=mask),
        optax.masked(_trust_ratio_over(norm_axes, c.trust_coefficient), mask),
        optax.scale_by_learning_rate(schedule),
        optax.trace(decay=c.momentum, nesterov=c.nesterov))
  return optax.chain(
      optax.add_decayed_weights(c.weight_decay, mask=mask),
      optax.sgd(schedule, momentum=c.momentum, nesterov=c.nesterov))


def _trust_ratio_over(axes, trust_coefficient) -> optax.GradientTransformation:
  """`optax.scale_by_trust_ratio` for leaves split over the mesh `axes`: every leaf's
  norms are summed over the devices holding its runs (one psum of 2 scalars a leaf)."""
  def update(updates, state, params):
    leaves, treedef = jax.tree.flatten(updates)
    ws = jax.tree.leaves(params)
    sums = lax.psum(jnp.array([[jnp.sum(jnp.square(w)) for w in ws],
                               [jnp.sum(jnp.square(u)) for u in leaves]]), axes)
    w_norm, u_norm = jnp.sqrt(sums)
    ratio = jnp.where((w_norm == 0) | (u_norm == 0), 1.0, trust_coefficient * w_norm / u_norm)
    return jax.tree.unflatten(treedef, [u * ratio[i] for i, u in enumerate(leaves)]), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class _Empty(NamedTuple):
  pass


def make_packed_optimizer(opt_config, schedule: optax.Schedule, layouts, decayed,
                          axes: tuple) -> optax.GradientTransformation:
  """SGD or LARS on packed vectors: each device of the mesh `axes` updates one vector
  holding its share of the elements of many tensors (the distributed server's greedy
  placement: whole tensors, a different set on every device).

  `axes` are the mesh axes of more than one device (none on one device).
  `layouts[d]` lists device d's runs in its vector, `(tensor, width)`, in order (the
  rest of the vector is padding); `decayed[t]` says whether tensor t is a kernel
  (weight decay and trust ratio). The trust ratio's norms are those of whole tensors,
  summed over the devices holding their runs. Where every device's runs have the same
  tensors and widths the code is one; otherwise each device takes its
  own branch of a `lax.switch`. Runs inside `shard_map`. Equal, element by element, to
  `make_optimizer` on the unpacked tensors.
  """
  c = opt_config
  tensors = len(decayed)

  def mine(fn, *rows):
    """fn(layout, *rows) with this device's layout."""
    if all(layout == layouts[0] for layout in layouts):
      return fn(layouts[0], *rows)
    return lax.switch(lax.axis_index(axes), [functools.partial(fn, l) for l in layouts], *rows)

  def runs(layout, row):
    """(tensor, run) for each run of `row`, then (None, padding)."""
    out, offset = [], 0
    for t, width in layout:
      out.append((t, row[offset:offset + width]))
      offset += width
    return out + [(None, row[offset:])]

  def decay(layout, u, params):
    return jnp.concatenate([
        x + c.weight_decay * w if t is not None and decayed[t] else x
        for (t, x), (_, w) in zip(runs(layout, u), runs(layout, params))])

  def squares(layout, params, u):
    """Per tensor, the sums of squares of its runs here: (2, tensors)."""
    sums = [[jnp.float32(0)] * tensors for _ in range(2)]
    for (t, w), (_, x) in zip(runs(layout, params), runs(layout, u)):
      if t is not None:
        sums[0][t], sums[1][t] = jnp.sum(jnp.square(w)), jnp.sum(jnp.square(x))
    return jnp.array(sums)

  def trust(layout, u, ratio):
    return jnp.concatenate([x * ratio[t] if t is not None and decayed[t] else x
                            for t, x in runs(layout, u)])

  def update(u, state, params):
    if c.weight_decay:
      u = mine(decay, u, params)
    if c.name == 'lars':
      sums = mine(squares, params, u)
      w_norm, u_norm = jnp.sqrt(lax.psum(sums, axes) if axes else sums)
      ratio = jnp.where((w_norm == 0) | (u_norm == 0), 1.0, c.trust_coefficient * w_norm / u_norm)
      u = mine(trust, u, ratio)
    return u, state
  decay_and_trust = optax.GradientTransformation(lambda params: _Empty(), update)
  if c.name == 'lars':
    return optax.chain(decay_and_trust, optax.scale_by_learning_rate(schedule),
                       optax.trace(decay=c.momentum, nesterov=c.nesterov))
  return optax.chain(decay_and_trust,
                     optax.sgd(schedule, momentum=c.momentum, nesterov=c.nesterov))
