"""ResNet34 ([T] ch. 2, docs/sources.md), in the style of flax's examples/imagenet."""
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jaxpar.models.layers import batch_norm, dense, global_avg_pool, max_pool, same_padding

SHORTCUTS = ('projection', 'zero_pad')


class BasicBlock(nn.Module):
  """conv3×3 → BN → ReLU → conv3×3 → BN → (+ shortcut) → ReLU.

  Where the block changes shape, the shortcut is the thesis' 1×1 projection
  (+ BN) or its zero-padding option: subsample, then pad the new channels with zeros.
  """
  features: int
  strides: int
  norm: Any
  shortcut: str
  dtype: Any = jnp.float32
  conv: Any = nn.Conv

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(self.conv, use_bias=False, dtype=self.dtype,
                             kernel_init=nn.initializers.kaiming_normal())
    y = conv(self.features, (3, 3), (self.strides, self.strides), padding=same_padding(3))(x)
    y = nn.relu(self.norm()(y))
    y = conv(self.features, (3, 3), padding=same_padding(3))(y)
    # Zero-initialised last scale: each block starts as the identity (Goyal et al. 2017).
    y = self.norm(scale_init=nn.initializers.zeros_init())(y)
    if x.shape != y.shape:
      if self.shortcut == 'projection':
        x = self.norm()(conv(self.features, (1, 1), (self.strides, self.strides),
                             padding='VALID')(x))
      else:
        x = x[:, ::self.strides, ::self.strides, :]
        x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, self.features - x.shape[-1])))
    return nn.relu(x + y)


class ResNet(nn.Module):
  stage_sizes: Sequence[int]
  num_classes: int
  num_filters: int = 64
  dtype: Any = jnp.float32
  shortcut: str = 'projection'
  bn_axis_name: Any = None
  fc_axis: Any = None       # [H]: the mesh axis FC layers named in `fc_split` are split over
  fc_split: Sequence[str] = ()
  conv: Any = nn.Conv       # nn.Conv, or a partial of it with another lowering (models/conv.py)
  pool: Any = max_pool     # pooling.max_pool, or a partial of it with another formulation

  FC_LAYERS = ('Dense_0',)

  @nn.compact
  def __call__(self, x, train: bool = True):
    if self.shortcut not in SHORTCUTS:
      raise ValueError(f'shortcut={self.shortcut!r}; valid: {SHORTCUTS}')
    norm = batch_norm(train, self.bn_axis_name, self.dtype)
    x = self.conv(self.num_filters, (7, 7), (2, 2), padding=same_padding(7), use_bias=False,
                dtype=self.dtype, kernel_init=nn.initializers.kaiming_normal(),
                name='conv_init')(x.astype(self.dtype))
    x = nn.relu(norm(name='bn_init')(x))
    x = self.pool(x, (3, 3), (2, 2), padding=((1, 1), (1, 1)))
    for i, size in enumerate(self.stage_sizes):
      for j in range(size):
        strides = 2 if i > 0 and j == 0 else 1
        x = BasicBlock(self.num_filters * 2**i, strides, norm, self.shortcut, self.dtype,
                       self.conv)(x)
    x = dense(self.num_classes, 'Dense_0', self.dtype, self.fc_axis, self.fc_split)(
        global_avg_pool(x))
    return x.astype(jnp.float32)


ResNet34 = functools.partial(ResNet, stage_sizes=(3, 4, 6, 3))
