"""SqueezeNet v1.0 ([T] ch. 2), data parallel on 8 devices.

  python -m jaxpar.train --config configs/squeezenet.py:cifar10 --workdir /tmp/squeezenet

Argument (`configs/squeezenet.py:ARG`): digits (default, 32×32), cifar10, imagenet2012,
caltech256 (with --config.dataset.path).
"""
from jaxpar.config import defaults, use_dataset


def get_config(arg: str = 'digits'):
  c = use_dataset(defaults(), arg)
  c.model = 'squeezenet'
  c.mesh.shape = (8,)
  c.mesh.axes = ('data',)
  return c
