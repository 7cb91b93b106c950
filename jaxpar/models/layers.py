"""Building blocks shared by the networks of [T] ch. 2 (docs/sources.md)."""
import functools
from typing import Any, Optional

import flax.linen as nn
import jax.numpy as jnp

ModuleDef = Any


class ConvReLU(nn.Module):
  """Convolution (+ optional norm) + ReLU: [T] puts a ReLU after every convolution.

  `norm` is injected (a `functools.partial` of `nn.BatchNorm`, or None for the
  published VGG/GoogLeNet/SqueezeNet, which had no normalization). With a norm
  the convolution drops its bias, which the norm's shift makes redundant.
  """
  features: int
  kernel: int
  strides: int = 1
  padding: Any = None  # None: symmetric, as published (see `same_padding`)
  norm: Optional[ModuleDef] = None
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x):
    x = nn.Conv(self.features, (self.kernel, self.kernel), (self.strides, self.strides),
                padding=same_padding(self.kernel) if self.padding is None else self.padding,
                use_bias=self.norm is None, dtype=self.dtype,
                kernel_init=nn.initializers.kaiming_normal())(x)
    if self.norm is not None:
      x = self.norm()(x)
    return nn.relu(x)


def same_padding(kernel: int):
  """`kernel // 2` on every side: the padding of the published ResNet and GoogLeNet.

  flax's 'SAME' pads a strided convolution asymmetrically at even input sizes
  (a 3×3/2 conv on 56² gets 0 before and 1 after), shifting every window by one
  pixel against the original networks; at stride 1 both agree.
  """
  return ((kernel // 2, kernel // 2),) * 2


def max_pool_ceil(x, window: int, stride: int):
  """Max-pool with Caffe's ceil rounding of the output size (GoogLeNet, SqueezeNet).

  Padding the bottom/right edge with -inf reproduces ceil((n - window) / stride) + 1;
  a map smaller than the window (small inputs) pools to a single position.
  """
  def pad(n):
    out = max(1, -(-(n - window) // stride) + 1)
    return (0, max(0, (out - 1) * stride + window - n))
  return nn.max_pool(x, (window, window), (stride, stride),
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
  return functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                           epsilon=1e-5, dtype=dtype, axis_name=axis_name)
