"""VGG16E (VGG configuration E: 16 convolutions + 3 FC layers, [T] ch. 2), data parallel on 8 devices.

  python -m jaxpar.train --config configs/vgg16e.py:cifar10 --workdir /tmp/vgg16e

Argument (`configs/vgg16e.py:ARG`): digits (default, 32×32), cifar10, imagenet2012,
caltech256 (with --config.dataset.path).
"""
from jaxpar.config import defaults, use_dataset, use_network


def get_config(arg: str = 'digits'):
  c = use_network(use_dataset(defaults(), arg), 'vgg16e', arg)
  c.mesh.shape = (8,)
  c.mesh.axes = ('data',)
  return c
