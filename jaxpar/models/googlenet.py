"""GoogLeNet (Inception v1) with its two auxiliary classifiers ([T] ch. 2, docs/sources.md)."""
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jaxpar.models.layers import (ConvReLU, Dropout, batch_norm, dense, dense_init,
                                  global_avg_pool, max_pool, max_pool_ceil, together)

# Module name → (1×1, 3×3 reduce, 3×3, 5×5 reduce, 5×5, pool proj); 'M' is a 3×3/2 max-pool.
INCEPTIONS = (
    ('3a', (64, 96, 128, 16, 32, 32)), ('3b', (128, 128, 192, 32, 96, 64)), 'M',
    ('4a', (192, 96, 208, 16, 48, 64)), ('4b', (160, 112, 224, 24, 64, 64)),
    ('4c', (128, 128, 256, 24, 64, 64)), ('4d', (112, 144, 288, 32, 64, 64)),
    ('4e', (256, 160, 320, 32, 128, 128)), 'M',
    ('5a', (256, 160, 320, 32, 128, 128)), ('5b', (384, 192, 384, 48, 128, 128)))
AUX_AFTER = ('4a', '4d')
AUX_LOSS_WEIGHT = 0.3  # weight of each auxiliary loss in training (Szegedy et al.)


class Inception(nn.Module):
  widths: tuple
  norm: Any = None
  dtype: Any = jnp.float32
  conv: Any = nn.Conv
  pool: Any = max_pool

  @nn.compact
  def __call__(self, x):
    c1, r3, c3, r5, c5, pp = self.widths
    conv = functools.partial(ConvReLU, norm=self.norm, dtype=self.dtype, conv=self.conv)
    # Made in the published order (their names); run as two sets of independent layers,
    # whose BatchNorm statistics travel together (`together`): 2 collectives, not 6.
    one, reduce3, three, reduce5, five, proj = (
        conv(c1, 1), conv(r3, 1), conv(c3, 3), conv(r5, 1), conv(c5, 5), conv(pp, 1))
    b1, b3, b5, bp = together(self, [one, reduce3, reduce5, proj],
                              [x, x, x, self.pool(x, (3, 3), (1, 1), padding='SAME')])
    b3, b5 = together(self, [three, five], [b3, b5])
    return jnp.concatenate([b1, b3, b5, bp], axis=-1)


class AuxClassifier(nn.Module):
  """avgpool 5×5/3 → conv 1×1 128 → FC 1024 → ReLU → dropout 70 % → FC classes.

  On maps smaller than 5×5 (inputs below ~160 px) the 5×5/3 pooling has no
  valid window, so the map is averaged globally instead; at 224 px the map is
  14×14 and the head is exactly the published one.
  """
  num_classes: int
  norm: Any = None
  dtype: Any = jnp.float32
  conv: Any = nn.Conv

  @nn.compact
  def __call__(self, x, train: bool):
    if min(x.shape[1:3]) >= 5:
      x = nn.avg_pool(x, (5, 5), (3, 3))
    else:
      x = jnp.mean(x, axis=(1, 2), keepdims=True)
    x = ConvReLU(128, 1, norm=self.norm, dtype=self.dtype, conv=self.conv)(x)
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(1024, dtype=self.dtype, kernel_init=dense_init())(x))
    x = Dropout(0.7, deterministic=not train)(x)
    return nn.Dense(self.num_classes, dtype=self.dtype, kernel_init=dense_init())(x)


class GoogLeNet(nn.Module):
  """Returns (main, aux_4a, aux_4d) logits when `train`, the main logits otherwise."""
  num_classes: int
  dtype: Any = jnp.float32
  batch_norm: bool = False
  bn_axis_name: Any = None
  dropout_rate: float = 0.4
  fc_axis: Any = None       # [H]: the mesh axis FC layers named in `fc_split` are split over
  fc_split: Sequence[str] = ()
  conv: Any = nn.Conv       # nn.Conv, or a partial of it with another lowering (models/conv.py)
  pool: Any = max_pool     # pooling.max_pool, or a partial of it with another formulation

  FC_LAYERS = ('Dense_0',)  # the main classifier; the auxiliary heads stay data-parallel

  @nn.compact
  def __call__(self, x, train: bool = True):
    norm = batch_norm(train, self.bn_axis_name, self.dtype) if self.batch_norm else None
    conv = functools.partial(ConvReLU, norm=norm, dtype=self.dtype, conv=self.conv)
    x = conv(64, 7, strides=2)(x.astype(self.dtype))
    x = max_pool_ceil(x, 3, 2, self.pool)
    x = conv(192, 3)(conv(64, 1)(x))
    x = max_pool_ceil(x, 3, 2, self.pool)
    aux = []
    for item in INCEPTIONS:
      if item == 'M':
        x = max_pool_ceil(x, 3, 2, self.pool)
        continue
      name, widths = item
      x = Inception(widths, norm=norm, dtype=self.dtype, conv=self.conv, pool=self.pool,
                    name=f'inception_{name}')(x)
      if train and name in AUX_AFTER:
        aux.append(AuxClassifier(self.num_classes, norm=norm, dtype=self.dtype, conv=self.conv,
                                 name=f'aux_{name}')(x, train))
    x = Dropout(self.dropout_rate, deterministic=not train)(global_avg_pool(x))
    x = dense(self.num_classes, 'Dense_0', self.dtype, self.fc_axis, self.fc_split)(x)
    if train:
      return tuple(y.astype(jnp.float32) for y in (x, *aux))
    return x.astype(jnp.float32)
