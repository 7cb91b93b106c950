"""The optimizer: SGD + momentum, LARS, Adam or AdamW; warm-up then cosine or polynomial decay, in steps.

Each is a chain of optax transformations (`_chain`), written once for every layout:
SGD  = decay → sgd(lr, momentum);              LARS  = decay → trust → lr → momentum
Adam = decay → adam(β₁, β₂, ε) → lr  (L2 added to the gradient, as `torch.optim.Adam`);
AdamW = adam(β₁, β₂, ε) → decay → lr  (decoupled, Loshchilov & Hutter; `optax.adamw`).
`decay` adds λw and `trust` scales by You et al.'s trust ratio η‖w‖/‖u‖; both apply to
kernels only: biases and BN scale/bias are excluded through masks, as in [Y] and MLPerf's
ResNet. The layouts differ only in those two: whole tensors (optax's), tensors split
into runs over mesh axes (norms summed over them), or packed vectors.
"""
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

OPTIMIZERS = ('sgd', 'lars', 'adam', 'adamw')
SCHEDULES = ('cosine', 'poly', 'constant')
LR_SCALINGS = ('auto', 'linear', 'sqrt', 'none')


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


def lr_scaling(opt_config) -> str:
  """The rule `optimizer.lr_scaling` names; `auto`: linear for SGD and LARS ([Y] §3,
  Goyal et al.), none for Adam and AdamW (their rate is given as is: [T]'s 0.001)."""
  if opt_config.lr_scaling != 'auto':
    return opt_config.lr_scaling
  return 'none' if opt_config.name in ('adam', 'adamw') else 'linear'


def peak_learning_rate(opt_config, global_batch: int) -> float:
  """`base_lr` scaled from `base_batch` to the global batch by `lr_scaling`."""
  ratio = global_batch / opt_config.base_batch
  return opt_config.base_lr * {'linear': ratio, 'sqrt': ratio ** 0.5,
                               'none': 1.0}[lr_scaling(opt_config)]


class WholeTensors:
  """For strategies whose devices update whole tensors (all-reduce, the central server,
  per-device replicas): the optimizer of `config.optimizer`, its masks read from the
  tensors' shapes once, here — a per-device layout updates its tensors with a leading
  dimension of one (`layouts.PerDevice`), where a bias would look like a kernel."""

  def make_optimizer(self, opt_config, schedule, params) -> optax.GradientTransformation:
    """`params`: the model's parameters or their shapes (None: the masks read the tensors
    the update is given, right only for a layout that keeps the tensors' own shapes)."""
    return make_optimizer(opt_config, schedule,
                          mask=decay_mask if params is None else decay_mask(params))


def make_optimizer(opt_config, schedule: optax.Schedule, mask=decay_mask,
                   norm_axes: tuple = ()) -> optax.GradientTransformation:
  """The optimizer of `opt_config` on whole tensors. `mask` says which leaves are kernels
  (weight decay, trust ratio): a function of the parameters or a tree of bools.
  `norm_axes`: mesh axes over which every leaf is split into runs (the distributed
  server's even placement, inside `shard_map`); LARS' trust ratio then takes the norms
  of the whole tensors, summed over them."""
  c = opt_config
  trust = None
  if c.name == 'lars':
    trust = optax.masked(
        optax.scale_by_trust_ratio(trust_coefficient=c.trust_coefficient, eps=0.0)
        if not norm_axes else _trust_ratio_over(norm_axes, c.trust_coefficient), mask)
  return _chain(c, schedule, optax.add_decayed_weights(c.weight_decay, mask=mask), trust)


def _chain(c, schedule, decay, trust) -> optax.GradientTransformation:
  """`optimizer.name`'s chain from its layout's weight decay and (LARS) trust ratio, both
  masked to kernels: the one place each optimizer is written."""
  if c.name == 'sgd':
    return optax.chain(decay, optax.sgd(schedule, momentum=c.momentum, nesterov=c.nesterov))
  if c.name == 'lars':
    # You et al. 2017, as optax.lars: each kernel's step is scaled by
    # trust_coefficient·‖w‖/‖g + λw‖; biases and BN parameters take the plain rate.
    return optax.chain(decay, trust, optax.scale_by_learning_rate(schedule),
                       optax.trace(decay=c.momentum, nesterov=c.nesterov))
  adam = optax.scale_by_adam(b1=c.b1, b2=c.b2, eps=c.eps)
  if c.name == 'adam':
    return optax.chain(decay, adam, optax.scale_by_learning_rate(schedule))
  return optax.chain(adam, decay, optax.scale_by_learning_rate(schedule))


def _trust_ratio_over(axes, trust_coefficient) -> optax.GradientTransformation:
  """`optax.scale_by_trust_ratio` for leaves split over the mesh `axes`, inside
  `shard_map`: the norms of a leaf that varies along `axes` (one run or slice of a tensor
  per device) are summed over them, in one psum of 2 scalars a leaf; a leaf the same on
  every device (hybrid FC's unsplit layers) keeps its own."""
  def update(updates, state, params):
    leaves, treedef = jax.tree.flatten(updates)
    ws = jax.tree.leaves(params)
    sums = [jnp.stack([jnp.sum(jnp.square(w)), jnp.sum(jnp.square(u))])
            for w, u in zip(ws, leaves)]
    split = [i for i, w in enumerate(ws) if set(axes) <= set(jax.typeof(w).mat.varying)]
    if split:
      summed = lax.psum(jnp.stack([sums[i] for i in split]), axes)
      for row, i in enumerate(split):
        sums[i] = summed[row]
    out = []
    for u, (w_sq, u_sq) in zip(leaves, sums):
      w_norm, u_norm = jnp.sqrt(w_sq), jnp.sqrt(u_sq)
      out.append(u * jnp.where((w_norm == 0) | (u_norm == 0), 1.0,
                               trust_coefficient * w_norm / u_norm))
    return jax.tree.unflatten(treedef, out), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class _Empty(NamedTuple):
  pass


def make_packed_optimizer(opt_config, schedule: optax.Schedule, layouts, decayed,
                          axes: tuple) -> optax.GradientTransformation:
  """The optimizer of `opt_config` on packed vectors: each device of the mesh `axes`
  updates one vector holding its share of the elements of many tensors (the distributed
  server's greedy placement: whole tensors, a different set on every device). Momentum
  and Adam's moments are elementwise: only weight decay and the trust ratio need to know
  which elements belong to which tensor.

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

  def add_decayed_weights(u, state, params):
    return (mine(decay, u, params) if c.weight_decay else u), state

  def scale_by_trust_ratio(u, state, params):
    sums = mine(squares, params, u)
    w_norm, u_norm = jnp.sqrt(lax.psum(sums, axes) if axes else sums)
    ratio = jnp.where((w_norm == 0) | (u_norm == 0), 1.0, c.trust_coefficient * w_norm / u_norm)
    return mine(trust, u, ratio), state

  return _chain(c, schedule, *(optax.GradientTransformation(lambda params: _Empty(), fn)
                               for fn in (add_decayed_weights, scale_by_trust_ratio)))
