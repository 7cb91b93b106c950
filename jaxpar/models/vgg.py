"""VGG16E: VGG configuration E, 16 convolutions + 3 FC layers ([T] ch. 2, docs/sources.md)."""
import functools
from typing import Any, Sequence

import flax.linen as nn
import jax.numpy as jnp

from jaxpar.models.layers import ConvReLU, Dropout, batch_norm, dense, max_pool

# Channels per 3×3 convolution; 'M' is a 2×2/2 max-pool.
CONFIG_E = (64, 64, 'M', 128, 128, 'M', 256, 256, 256, 256, 'M',
            512, 512, 512, 512, 'M', 512, 512, 512, 512, 'M')


class VGG(nn.Module):
  layers: Sequence[Any]
  num_classes: int
  dtype: Any = jnp.float32
  batch_norm: bool = False  # the published VGG has none; True adds BN after each conv
  bn_axis_name: Any = None
  dropout_rate: float = 0.5
  fc_features: int = 4096   # the two hidden FC layers' width
  fc_axis: Any = None       # [H]: the mesh axis FC layers named in `fc_split` are split over
  fc_split: Sequence[str] = ()
  conv: Any = nn.Conv       # nn.Conv, or a partial of it with another lowering (models/conv.py)
  pool: Any = max_pool     # pooling.max_pool, or a partial of it with another formulation

  FC_LAYERS = ('Dense_0', 'Dense_1', 'Dense_2')

  @nn.compact
  def __call__(self, x, train: bool = True):
    norm = batch_norm(train, self.bn_axis_name, self.dtype) if self.batch_norm else None
    x = x.astype(self.dtype)
    for layer in self.layers:
      if layer == 'M':
        x = self.pool(x, (2, 2), (2, 2))
      else:
        x = ConvReLU(layer, 3, norm=norm, dtype=self.dtype, conv=self.conv)(x)
    x = x.reshape((x.shape[0], -1))
    fc = functools.partial(dense, dtype=self.dtype, fc_axis=self.fc_axis, fc_split=self.fc_split)
    for name in self.FC_LAYERS[:2]:  # FC 4096 → ReLU → dropout, twice, as in the VGG paper
      x = nn.relu(fc(self.fc_features, name)(x))
      x = Dropout(self.dropout_rate, deterministic=not train)(x)
    x = fc(self.num_classes, self.FC_LAYERS[2])(x)
    return x.astype(jnp.float32)


VGG16E = functools.partial(VGG, layers=CONFIG_E)
