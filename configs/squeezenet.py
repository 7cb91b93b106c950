"""SqueezeNet v1.0 ([T] ch. 2), data parallel on 8 devices.

  python -m jaxpar.train --config configs/squeezenet.py:cifar10 --workdir /tmp/squeezenet

On the bundled digits (the default) this is a variant: SqueezeNet with BatchNorm after
every convolution, the classifier's included (config.batch_norm=True). The published
network cannot learn 32² digits: its classifier is a 1×1 convolution followed by a ReLU,
and with the 1×1 maps a 32² input leaves, every class's ReLU dies within the first 50
steps, whatever the learning rate (docs/training.md). `--config.batch_norm=False` runs
the published network.

Argument (`configs/squeezenet.py:ARG`): digits (default, 32×32), cifar10, imagenet2012,
caltech256 (with --config.dataset.path).
"""
from jaxpar.config import defaults, use_dataset, use_network


def get_config(arg: str = 'digits'):
  c = use_network(use_dataset(defaults(), arg), 'squeezenet', arg)
  c.mesh.shape = (8,)
  c.mesh.axes = ('data',)
  return c
