"""The one training step, and the eval step, under `jax.shard_map`.

Every parallel method is a variation of: compute a local loss and gradients on
this device's share of the batch, combine them across devices, update. The step
owns the shared parts; a method is a `Strategy` (see `parallel/`) that combines
the gradients, updates, and lays out the state. The model's BatchNorm axes decide
which devices share batch statistics; the strategy decides what becomes of the
running statistics (replicated strategies average them over the other groups:
`group_batchnorm.py`).

Gradients are taken w.r.t. a *varying* copy of the replicated parameters
(`lax.pcast(..., to='varying')` in `ReplicatedParams.local_variables`), so they
stay per-device and their combination is exactly what the strategy does.
(Differentiating w.r.t. the replicated `P()` parameters would make JAX sum them
across devices implicitly.)
"""
from typing import Any, Callable, Protocol

import flax
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar.models import AUX_LOSS_WEIGHT
from jaxpar.collectives import replicate, spanning


class LossScale(flax.struct.PyTreeNode):
  """Dynamic loss scaling for float16 compute (Micikevicius et al. 2018; PyTorch's
  GradScaler, flax's DynamicScale): the loss is multiplied by `scale` before
  differentiating, so that small gradients of float16 activations do not flush to zero,
  and the gradients are divided by it. A step whose gradients are not finite on some
  device is skipped on every device and the scale halves; after `GROWTH_INTERVAL` finite
  steps in a row it doubles.

  Written here rather than taken from flax's `DynamicScale`: that decides finiteness per
  device (or averages the gradients itself), while every strategy must skip a step on all
  devices together, before its own exchange of the gradients.
  """
  scale: jax.Array
  good_steps: jax.Array   # finite steps since the scale last changed

  INITIAL = 2.0 ** 15
  GROWTH_INTERVAL = 2000

  @classmethod
  def initial(cls) -> 'LossScale':
    return cls(jnp.float32(cls.INITIAL), jnp.int32(0))

  def next(self, finite) -> 'LossScale':
    grow = finite & (self.good_steps + 1 >= self.GROWTH_INTERVAL)
    scale = jnp.where(finite, jnp.where(grow, self.scale * 2, self.scale),
                      jnp.maximum(self.scale / 2, 1.0))
    return LossScale(scale, jnp.where(finite & ~grow, self.good_steps + 1, 0))


class TrainState(flax.struct.PyTreeNode):
  step: jax.Array
  examples_seen: jax.Array  # the data position: where a resumed run continues
  params: Any
  batch_stats: Any
  opt_state: Any
  loss_scale: Any = None    # a LossScale when dynamic loss scaling is on (float16)


def cross_entropy(logits, labels):
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def loss_and_logits(outputs, labels):
  """The training loss; GoogLeNet's auxiliary heads enter it with weight 0.3."""
  if isinstance(outputs, tuple):
    main, *aux = outputs
    return cross_entropy(main, labels) + AUX_LOSS_WEIGHT * sum(
        cross_entropy(a, labels) for a in aux), main
  return cross_entropy(outputs, labels), outputs


def model_loss(model, params, batch_stats, batch, rng):
  """A batch's training loss, with (logits, updated BN statistics): what every scheme
  differentiates, synchronous (`make_train_step`) or not (`parallel/async_sgd.py`)."""
  outputs, new_vars = model.apply({'params': params, 'batch_stats': batch_stats}, batch['image'],
                                  train=True, mutable=['batch_stats'], rngs={'dropout': rng})
  loss, logits = loss_and_logits(outputs, batch['label'])
  return loss, (logits, new_vars.get('batch_stats', {}))


def gradients(model, params, batch_stats, batch, rng, micro_batches: int = 1,
              loss_scale=None):
  """(grads, new batch_stats, {'loss', 'accuracy'}) of `batch`: what every scheme sends
  or applies. `loss_scale`: the gradients are taken of the loss times it, then divided
  by it (`LossScale`).

  Gradient accumulation: with `micro_batches` = k > 1 the batch is split into k equal
  micro-batches taken one after another (`lax.scan`: only one micro-batch's activations
  are alive at a time) and the gradient is the mean of theirs — the whole batch's
  gradient for a network without BatchNorm. BatchNorm normalises each micro-batch by its
  own statistics and updates the running statistics once per micro-batch, k times an
  update (as accumulating in PyTorch does). Dropout draws micro-batch i's masks from
  `fold_in(rng, i)`.
  """
  def scaled_loss(params, batch_stats, micro, rng):
    loss, aux = model_loss(model, params, batch_stats, micro, rng)
    return (loss if loss_scale is None else loss * loss_scale), (loss, aux)
  grad_fn = jax.grad(scaled_loss, has_aux=True)

  def one(batch_stats, micro, rng):
    grads, (loss, (logits, batch_stats)) = grad_fn(params, batch_stats, micro, rng)
    if loss_scale is not None:
      grads = jax.tree.map(lambda g: g / loss_scale, grads)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == micro['label'])
    return grads, batch_stats, {'loss': loss, 'accuracy': accuracy}

  k = micro_batches
  if k == 1:
    return one(batch_stats, batch, rng)
  micro = jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)
  # The first micro-batch outside the loop: its results type the loop's carry.
  first = one(batch_stats, jax.tree.map(lambda x: x[0], micro), jax.random.fold_in(rng, 0))

  def accumulate(carry, xs):
    sums, batch_stats = carry
    grads, batch_stats, metrics = one(batch_stats, xs[0], jax.random.fold_in(rng, xs[1]))
    return (jax.tree.map(jnp.add, sums, (grads, metrics)), batch_stats), None
  (sums, batch_stats), _ = lax.scan(
      accumulate, ((first[0], first[2]), first[1]),
      (jax.tree.map(lambda x: x[1:], micro), jnp.arange(1, k)))
  grads, metrics = jax.tree.map(lambda x: x / k, sums)
  return grads, batch_stats, metrics


def data_axes(mesh) -> tuple:
  """The mesh axes a batch is split over: every axis of more than one device (all are
  data axes; an axis of one device splits nothing, and naming it would make JAX
  all-reduce over a group of one device)."""
  return tuple(a for a, n in mesh.shape.items() if n > 1)


def batch_spec(mesh):
  return P(data_axes(mesh))


class Strategy(Protocol):
  """How a parallel method combines gradients and updates, and how it lays out the state.

  The step computes each device's loss and gradients; the strategy does the rest.
  Layouts: replicated (`P()`), split among owner devices (`P(axes)` on a leading
  dimension), or one copy per device (`P(axes)` on a leading dimension of size N).
  `parallel/allreduce.py: AllReduce` and `parallel/servers.py` implement it.
  """
  def make_optimizer(self, opt_config, schedule, params) -> optax.GradientTransformation:
    """The optimizer of `config.optimizer` for this layout (`params`' shapes suffice)."""

  def state_specs(self, state: TrainState) -> TrainState:
    """A PartitionSpec for every leaf of the (global) state."""

  def init(self, tx, params, batch_stats):
    """(params, batch_stats, optimizer state) in this layout, from the model's freshly
    initialised variables (under jit)."""

  def local_variables(self, state: TrainState):
    """Inside shard_map: this device's whole (params, batch_stats); params typed varying."""

  def update(self, tx, grads, batch_stats, state: TrainState):
    """Inside shard_map: (params, batch_stats, optimizer state, report) after this step,
    from this device's gradients and the running statistics its BatchNorm layers
    computed. `report` holds per-device scalars for the step's metrics, at least
    `sent_bytes`: what this device sent of gradients and weights, by the method's own
    accounting (BN statistics and metrics, a few hundred bytes, not counted)."""

  def variables(self, state: TrainState) -> dict:
    """The model's {'params', 'batch_stats'} as global arrays replicated on the mesh, for
    evaluation and for reading the trained weights whatever the layout."""

  def describe(self) -> str:
    """What the method exchanges, in words, for the run's log (e.g. 'all-reduces gradients
    (psum, one buffer) in float32')."""

  def checkpoint_layout(self) -> dict:
    """How the state is laid out, as checkpoints record it (`jaxpar/portable.py`: its kinds),
    so that a run on another mesh or with another method can convert it."""


class ReplicatedParams:
  """For strategies whose parameters and BN statistics are replicated (`P()`) on every
  device."""

  def local_variables(self, state):
    # A varying copy: its gradient stays per device (see the module docstring).
    axes = spanning(self.axes)
    return (jax.tree.map(lambda p: lax.pcast(p, axes, to='varying'), state.params),
            state.batch_stats)

  def variables(self, state):
    return {'params': state.params, 'batch_stats': state.batch_stats}


def make_train_step(model, tx: optax.GradientTransformation, mesh, strategy: Strategy,
                    micro_batches: int = 1, gradients_of: Callable = None) -> Callable:
  """Returns jitted `step(state, batch, rng) -> (state, metrics)`.

  `batch` = {'image', 'label'} sharded over the data axes; `rng` a key shared by
  all devices, into which each device folds the step and its own index, so
  dropout draws a different mask on every device and every step. `micro_batches`:
  each device's share is taken in that many pieces (`gradients`), the strategy
  combining and applying their mean once. `gradients_of`: what takes the gradients
  (`gradients`' arguments and results); `jaxpar.plan` times the step without them
  (`probe.update_call`).
  """
  gradients_of = gradients_of or gradients
  axes = data_axes(mesh)

  def local_step(state, batch, rng):
    rng = jax.random.fold_in(rng, state.step)
    if axes:  # one device has no index to fold in: the extra hash slowed GoogLeNet 4 %
      rng = jax.random.fold_in(rng, lax.axis_index(axes))
    params, batch_stats = strategy.local_variables(state)
    scaling = state.loss_scale
    grads, batch_stats, metrics = gradients_of(model, params, batch_stats, batch, rng,
                                               micro_batches,
                                               None if scaling is None else scaling.scale)
    params, batch_stats, opt_state, report = strategy.update(tx, grads, batch_stats, state)
    if scaling is not None:  # a step with a non-finite gradient anywhere changes nothing
      finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(g)) for g in jax.tree.leaves(grads)]))
      if axes:
        finite = lax.psum(jnp.int32(~finite), axes) == 0
      params, batch_stats, opt_state = jax.tree.map(
          lambda new, old: jnp.where(finite, new, old), (params, batch_stats, opt_state),
          (state.params, state.batch_stats, state.opt_state))
      report = {**report, 'loss_scale': scaling.scale, 'skipped': jnp.float32(~finite)}
      scaling = scaling.next(finite)
    local_batch = batch['label'].shape[0]
    new_state = state.replace(
        step=state.step + 1,
        examples_seen=state.examples_seen + local_batch * lax.psum(1, axes),
        params=params, batch_stats=batch_stats, opt_state=opt_state, loss_scale=scaling)
    metrics = {**metrics, **report}
    # Scalar by scalar: the program's collectives of arrays stay the method's alone
    # (what analysis.steptime.volume reads from it).
    return new_state, jax.tree.map(replicate, metrics)

  def step(state, batch, rng):
    specs = strategy.state_specs(state)
    return jax.shard_map(local_step, mesh=mesh, in_specs=(specs, batch_spec(mesh), P()),
                         out_specs=(specs, P()))(state, batch, rng)
  return jax.jit(step, donate_argnums=0)


class Synchronous:
  """The training loop's step for the synchronous schemes: `loop(state) -> (state, metrics)`
  runs the train step on the next batch of the stream (`parallel/async_sgd.py: Downpour`
  is the asynchronous one)."""

  def __init__(self, train_step: Callable, batches, rng):
    self.train_step, self.batches, self.rng = train_step, batches, rng

  def __call__(self, state):
    return self.train_step(state, next(self.batches), self.rng)

  def synced(self, state):
    """The state as of the last step, in this process (a loop whose state lives elsewhere,
    Downpour's on Ray, fetches it here)."""
    return state

  def histograms(self) -> dict:
    return {}

  def close(self):
    pass


def init_variables(model, input_shape, rng):
  """The model's freshly initialised {'params', 'batch_stats'?}."""
  # BN's axis name is bound only inside shard_map; the parameters do not depend on it.
  return model.clone(bn_axis_name=None).init({'params': rng, 'dropout': rng},
                                             jnp.zeros(input_shape), train=True)


def init_state(model, tx, strategy: Strategy, mesh, input_shape, rng,
               loss_scaling: bool = False, abstract: bool = False,
               variables=None) -> TrainState:
  """Freshly initialised parameters, BN statistics and optimizer state, placed on the
  mesh in the strategy's layout; with `loss_scaling`, the initial `LossScale`. `abstract`:
  their shapes, dtypes and shardings only (nothing compiled or computed), enough to lower
  a step. `variables`: the model's initial {'params', 'batch_stats'?} (`init_variables`'s,
  on the host or any device) to start from instead of `rng`'s — a tool that builds many
  states of one network initialises it once (`jaxpar.plan`: SqueezeNet at 16² on 2
  emulated devices compiles its initialisation in 3-4 s, the strategy's part of it in 0.1 s)."""
  def init(variables):
    if variables is None:
      variables = init_variables(model, input_shape, rng)
    params, batch_stats, opt_state = strategy.init(tx, variables['params'],
                                                   variables.get('batch_stats', {}))
    return TrainState(step=jnp.int32(0), examples_seen=jnp.int32(0), params=params,
                      batch_stats=batch_stats, opt_state=opt_state,
                      loss_scale=LossScale.initial() if loss_scaling else None)
  shapes = jax.eval_shape(init, variables)
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), strategy.state_specs(shapes))
  if abstract:  # init traced once, not again under jit
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        shapes, shardings)
  return jax.jit(init, out_shardings=shardings,
                 compiler_options=init_compiler_options())(variables)


def init_compiler_options():
  """XLA options for a program that runs once, initialising: on CPU, LLVM's optimiser would
  spend seconds on the random-number code (TinyResNet: 5.4 s to compile, 0.7 s without;
  values differ in the last bit)."""
  return {'xla_backend_optimization_level': 0} if jax.default_backend() == 'cpu' else None


def make_eval_step(model, mesh) -> Callable:
  """Returns jitted `step(variables, batch) -> sums` of correct top-1/top-5, of the loss and
  its square (its standard error, `evaluation.evaluate`) and of the mask, over the whole
  global batch; padding rows (mask 0) count nowhere. `variables` are a strategy's
  `variables(state)`: a sharded optimizer state never moves."""
  axes = data_axes(mesh)

  model = model.clone(fc_axis=None)  # whole FC layers: `variables` are the whole weights

  def local_eval(variables, batch):
    logits = model.apply(variables, batch['image'], train=False)
    k = min(5, logits.shape[-1])
    top_k = lax.top_k(logits, k)[1]
    labels, mask = batch['label'], batch['mask']
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    sums = {'top1': jnp.sum((top_k[:, 0] == labels) * mask),
            'top5': jnp.sum(jnp.any(top_k == labels[:, None], -1) * mask),
            'loss': jnp.sum(losses * mask), 'loss_sq': jnp.sum(losses ** 2 * mask),
            'count': jnp.sum(mask)}
    return lax.psum(sums, axes)

  return jax.jit(jax.shard_map(local_eval, mesh=mesh, in_specs=(P(), batch_spec(mesh)),
                               out_specs=P()))


def to_global(mesh, local_batch):
  """This process's numpy batch → a global array split over the data axes."""
  sharding = NamedSharding(mesh, batch_spec(mesh))
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), local_batch)
