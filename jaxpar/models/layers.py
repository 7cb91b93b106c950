"""Building blocks shared by the networks of [T] ch. 2 (docs/sources.md)."""
import functools
from typing import Any, Optional

import flax.linen as nn
from flax.linen import normalization
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen.dtypes import promote_dtype
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from jaxpar import collectives
from jaxpar.models import explicit
from jaxpar.models.pooling import max_pool

ModuleDef = Any


class Dropout(nn.Dropout):
  """flax's `nn.Dropout`, whose mask is drawn split as its input is where the input's type
  says how it is split (Explicit mesh axes, `models/explicit.py`): flax's linen Dropout
  (0.12.8–0.12.12) draws an unsplit mask there and its `lax.select` refuses the mix. The
  same key draws the same mask either way (threefry's bits do not depend on the split)."""

  def __call__(self, inputs, deterministic: bool | None = None, rng=None):
    if not explicit.sharded(inputs):
      return super().__call__(inputs, deterministic, rng)
    deterministic = nn.merge_param('deterministic', self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:
      return jnp.zeros_like(inputs)
    keep = 1.0 - self.rate
    rng = self.make_rng(self.rng_collection) if rng is None else rng
    sharding = jax.typeof(inputs).sharding
    spec = list(sharding.spec) + [None] * (inputs.ndim - len(sharding.spec))
    shape = list(inputs.shape)
    for d in self.broadcast_dims:  # one mask entry along d, and so no split of it
      spec[d], shape[d] = None, 1
    mask = jax.random.bernoulli(rng, keep, shape,
                                out_sharding=NamedSharding(sharding.mesh, PartitionSpec(*spec)))
    mask = jnp.broadcast_to(mask, inputs.shape)
    return lax.select(mask, inputs / keep, jnp.zeros_like(inputs))


class ConvReLU(nn.Module):
  """Convolution (+ optional norm) + ReLU: [T] puts a ReLU after every convolution.

  `norm` is injected (a `functools.partial` of `nn.BatchNorm`, or None for the
  published VGG/GoogLeNet/SqueezeNet, which had no normalization). With a norm
  the convolution drops its bias, which the norm's shift makes redundant. `conv` is
  injected too: `nn.Conv`, or a partial of it with another lowering (`models/conv.py`).
  """
  features: int
  kernel: int
  strides: int = 1
  padding: Any = None  # None: symmetric, as published (see `same_padding`)
  norm: Optional[ModuleDef] = None
  dtype: Any = jnp.float32
  conv: ModuleDef = nn.Conv

  @nn.compact
  def __call__(self, x, stage: str = 'all', shared=None):
    """`stage` 'all': the layer. `together` runs it in three: 'conv' (the convolution),
    'stats' (the norm's per-device statistics of the convolution's output `x`) and 'norm'
    (norm, with the group's statistics `shared`, then ReLU); each call makes only its own
    sub-modules, so the variables are named as in one call."""
    if stage in ('all', 'conv'):
      x = self.conv(self.features, (self.kernel, self.kernel), (self.strides, self.strides),
                    padding=same_padding(self.kernel) if self.padding is None else self.padding,
                    use_bias=self.norm is None, dtype=self.dtype,
                    kernel_init=nn.initializers.kaiming_normal())(x)
      if stage == 'conv':
        return x
    if stage == 'stats':
      return self.norm()(x, local_stats=True)
    if self.norm is not None:
      x = self.norm()(x, shared=shared) if stage == 'norm' else self.norm()(x)
    return nn.relu(x)


def together(parent: nn.Module, layers: list, inputs: list) -> list:
  """`[layer(x) for layer, x in zip(layers, inputs)]` for `ConvReLU` layers that do not
  depend on each other (an Inception module's or a fire module's parallel branches), made
  by `parent`: with BatchNorm over devices their statistics are all-reduced together, one
  collective each way for all of them instead of one each. The same numbers: a channel's
  statistics are its own wherever they travel (tests/test_group_batchnorm.py)."""
  norm = layers[0].norm
  keywords = getattr(norm, 'keywords', {})
  if (norm is None or keywords.get('axis_name') is None or keywords.get('use_running_average')
      or parent.is_initializing() or len(layers) == 1):
    return [layer(x) for layer, x in zip(layers, inputs)]
  convolved = [layer(x, 'conv') for layer, x in zip(layers, inputs)]
  local = [layer(y, 'stats') for layer, y in zip(layers, convolved)]
  axis = keywords['axis_name']
  shared, converted = collectives.group_mean(jnp.concatenate(local, axis=-1), axis)
  ends = [int(n) for n in np.cumsum([s.shape[-1] for s in local])[:-1]]
  parts = zip(jnp.split(shared, ends, axis=-1), jnp.split(converted, ends, axis=-1))
  return [layer(y, 'norm', part) for layer, y, part in zip(layers, convolved, parts)]


def same_padding(kernel: int):
  """`kernel // 2` on every side: the padding of the published ResNet and GoogLeNet.

  flax's 'SAME' pads a strided convolution asymmetrically at even input sizes
  (a 3×3/2 conv on 56² gets 0 before and 1 after), shifting every window by one
  pixel against the original networks; at stride 1 both agree.
  """
  return ((kernel // 2, kernel // 2),) * 2


def max_pool_ceil(x, window: int, stride: int, pool=max_pool):
  """Max-pool with Caffe's ceil rounding of the output size (GoogLeNet, SqueezeNet).

  Padding the bottom/right edge with -inf reproduces ceil((n - window) / stride) + 1;
  a map smaller than the window (small inputs) pools to a single position. `pool`: the
  network's max-pool (`pooling.max_pool` or a partial of it).
  """
  def pad(n):
    out = max(1, -(-(n - window) // stride) + 1)
    return (0, max(0, (out - 1) * stride + window - n))
  return pool(x, (window, window), (stride, stride),
                  padding=(pad(x.shape[1]), pad(x.shape[2])))


def global_avg_pool(x):
  return jnp.mean(x, axis=(1, 2))


def dense_init():
  return nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')


def batch_norm(train: bool, axis_name, dtype):
  """BatchNorm as [Y] uses it: statistics in float32, combined over `axis_name`.

  `axis_name` is the mesh axis (or tuple of axes) whose devices share batch
  statistics: all data axes for plain synchronized BN, an inner axis for [Y]'s
  sub-group BN. None keeps statistics per device.
  """
  return functools.partial(BatchNorm, use_running_average=not train, momentum=0.9,
                           epsilon=1e-5, dtype=dtype, axis_name=axis_name)


class BatchNorm(nn.BatchNorm):
  """flax's BatchNorm, its statistics over `axis_name` in one collective each way.

  Over the group's examples, per channel, μ = E[x] and σ² = max(0, E[x²] − μ²) (flax's
  fast variance, the same float32 sums); the forward pass all-reduces the stacked pair
  (μ_local, E[x²]_local) once, as flax does. Under `shard_map` the result is invariant
  over the group, and flax then uses μ and σ² in per-device (varying) arithmetic at two
  places, (x − μ) and the scale·(σ² + ε)^−½, each an implicit conversion whose transpose
  is a psum: two all-reduces per layer in the backward pass (ResNet34 across 2 processes:
  72 of a step's 111 collectives). Here the stacked pair is converted once
  (`lax.pcast(..., to='varying')`) before it is split, so the backward pass sums one
  stacked cotangent (∂L/∂μ, ∂L/∂E[x²]) per layer: one call each way, the same numbers (a
  conversion changes no value; its transpose sums what the two psums summed). Layers that
  do not depend on each other share that one call each way (`together`). The running
  averages take the invariant statistics, as flax's do. Across processes on CPU each call is
  an all-gather and a sum instead of an all-reduce (`collectives.group_mean`: one exchange
  of gloo's where its all-reduce takes two). Without `axis_name`, during `init`
  and with running averages it is flax's module unchanged; variables and names are
  flax's, so checkpoints are interchangeable.
  """

  @nn.compact
  def __call__(self, x, use_running_average=None, *, mask=None, local_stats=False,
               shared=None):
    """`local_stats`: return this device's stacked (E[x], E[x²]) only (`together`
    all-reduces several layers' at once); `shared`: the group's, all-reduced already, and
    the same converted to per-device values (converted once for all the layers: one
    backward all-reduce)."""
    running = nn.merge_param('use_running_average', self.use_running_average,
                             use_running_average)
    if (self.axis_name is None or running or self.is_initializing() or mask is not None
        or not self.use_fast_variance or self.axis_index_groups is not None):
      if local_stats or shared is not None:
        raise ValueError('local_stats and shared are for BatchNorm over devices in training '
                         '(layers.together)')
      return super().__call__(x, use_running_average, mask=mask)
    feature_axes = normalization._canonicalize_axes(x.ndim, self.axis)
    reduction_axes = tuple(i for i in range(x.ndim) if i not in feature_axes)
    feature_shape = [x.shape[ax] for ax in feature_axes]
    stats_dtype = jnp.float32 if self.force_float32_reductions else self.param_dtype
    ra_mean = self.variable('batch_stats', 'mean', lambda s: jnp.zeros(s, stats_dtype),
                            feature_shape)
    ra_var = self.variable('batch_stats', 'var', lambda s: jnp.ones(s, stats_dtype),
                           feature_shape)
    dtype = self.dtype or jnp.result_type(x)
    if self.force_float32_reductions:
      dtype = jnp.promote_types(dtype, jnp.float32)
    x32 = x.astype(dtype)
    local = jnp.stack([x32.mean(reduction_axes),
                       normalization._abs_sq(x32).mean(reduction_axes)])
    if local_stats:
      return local
    if shared is None:  # invariant over the group, and converted to per-device values
      shared, converted = collectives.group_mean(local, self.axis_name)
    else:
      shared, converted = shared

    def mean_var(stats):
      return stats[0], jnp.maximum(0.0, stats[1] - normalization._abs_sq(stats[0]))
    mean, var = mean_var(shared)
    ra_mean.value = self.momentum * ra_mean.value + (1 - self.momentum) * mean
    ra_var.value = self.momentum * ra_var.value + (1 - self.momentum) * var
    mean, var = mean_var(converted)
    return normalization._normalize(
        self, x, mean, var, reduction_axes, feature_axes, self.dtype, self.param_dtype,
        self.epsilon, self.use_bias, self.use_scale, self.bias_init, self.scale_init,
        self.force_float32_reductions)


class ModelParallelDense(nn.Module):
  """[H]'s model-parallel FC layer (docs/communication.md), inside `shard_map`.

  The kernel (K, N) and bias (N) are split along the output dimension over the mesh
  axis `axis` (R devices: each holds (K, N/R) and N/R). Forward: all-gather the R
  devices' inputs (R·M, K), multiply by the local slice, add the bias slice, and
  exchange the (R·M, N/R) result with an all-to-all so each device gets its own M
  samples' N outputs. Backward (by JAX's transposes): the output gradients come back
  through an all-to-all, each device's weight gradient comes from the gathered inputs,
  and the input gradients are reduce-scattered. At initialisation (outside shard_map)
  it is an ordinary `nn.Dense` with the same parameters.
  """
  features: int
  axis: str
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    # Created whole; inside shard_map each device holds (and flax checks) its slice.
    r = 1 if self.is_initializing() else lax.axis_size(self.axis)
    kernel = self.param('kernel', dense_init(), (x.shape[-1], self.features // r))
    bias = self.param('bias', nn.initializers.zeros_init(), (self.features // r,))
    x, kernel, bias = promote_dtype(x, kernel, bias, dtype=self.dtype)
    if self.is_initializing():
      return x @ kernel + bias
    gathered = lax.all_gather(x, self.axis, tiled=True)
    return lax.all_to_all(gathered @ kernel + bias, self.axis, 0, 1, tiled=True)


def dense(features: int, name: str, dtype, fc_axis=None, fc_split=()):
  """An FC layer named `name`: model-parallel over `fc_axis` if `name` is in `fc_split`
  ([H]), else `nn.Dense` (data-parallel). Both have the same parameters."""
  if fc_axis is not None and name in fc_split:
    return ModelParallelDense(features, fc_axis, dtype, name=name)
  return nn.Dense(features, dtype=dtype, kernel_init=dense_init(), name=name)
