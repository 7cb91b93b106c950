"""GoogLeNet with its two auxiliary classifiers ([T] ch. 2), data parallel on 8 devices.

  python -m jaxpar.train --config configs/googlenet.py:cifar10 --workdir /tmp/googlenet

Argument (`configs/googlenet.py:ARG`): digits (default, 32×32), cifar10, imagenet2012,
caltech256 (with --config.dataset.path).
"""
from jaxpar.config import defaults, use_dataset, use_network


def get_config(arg: str = 'digits'):
  c = use_network(use_dataset(defaults(), arg), 'googlenet', arg)
  c.mesh.shape = (8,)
  c.mesh.axes = ('data',)
  return c
