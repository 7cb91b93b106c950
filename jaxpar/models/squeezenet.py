"""SqueezeNet v1.0 ([T] ch. 2, docs/sources.md; the thesis numbers the fire modules 1..8)."""
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jaxpar.models.layers import (ConvReLU, Dropout, batch_norm, global_avg_pool, max_pool,
                                  max_pool_ceil, together)

# (squeeze, expand 1×1, expand 3×3) for fire2..fire9; 'M' is a 3×3/2 max-pool.
FIRES = ((16, 64, 64), (16, 64, 64), (32, 128, 128), 'M',
         (32, 128, 128), (48, 192, 192), (48, 192, 192), (64, 256, 256), 'M',
         (64, 256, 256))


class Fire(nn.Module):
  squeeze: int
  expand1: int
  expand3: int
  norm: Any = None
  dtype: Any = jnp.float32
  conv: Any = nn.Conv

  @nn.compact
  def __call__(self, x):
    conv = functools.partial(ConvReLU, norm=self.norm, dtype=self.dtype, conv=self.conv)
    x = conv(self.squeeze, 1)(x)
    # The two expand layers read the same input: their BatchNorm statistics travel together.
    return jnp.concatenate(together(self, [conv(self.expand1, 1), conv(self.expand3, 3)],
                                    [x, x]), axis=-1)


class SqueezeNet(nn.Module):
  num_classes: int
  dtype: Any = jnp.float32
  batch_norm: bool = False
  bn_axis_name: Any = None
  dropout_rate: float = 0.5
  fc_axis: Any = None       # no FC layer: the classifier is a 1×1 convolution
  fc_split: Sequence[str] = ()
  conv: Any = nn.Conv       # nn.Conv, or a partial of it with another lowering (models/conv.py)
  pool: Any = max_pool     # pooling.max_pool, or a partial of it with another formulation

  FC_LAYERS = ()

  @nn.compact
  def __call__(self, x, train: bool = True):
    norm = batch_norm(train, self.bn_axis_name, self.dtype) if self.batch_norm else None
    x = ConvReLU(96, 7, strides=2, padding='VALID', norm=norm, dtype=self.dtype,
                 conv=self.conv)(x.astype(self.dtype))
    x = max_pool_ceil(x, 3, 2, self.pool)
    for fire in FIRES:
      x = (max_pool_ceil(x, 3, 2, self.pool) if fire == 'M'
           else Fire(*fire, norm=norm, dtype=self.dtype, conv=self.conv)(x))
    x = Dropout(self.dropout_rate, deterministic=not train)(x)
    # conv10 keeps its bias and ReLU as in the original; the BatchNorm variant normalises
    # it too (docs/training.md: without it, class units dead at init never revive).
    x = self.conv(self.num_classes, (1, 1), use_bias=norm is None, dtype=self.dtype,
                  kernel_init=nn.initializers.normal(0.01))(x)
    x = nn.relu(norm()(x) if norm is not None else x)
    return global_avg_pool(x).astype(jnp.float32)
