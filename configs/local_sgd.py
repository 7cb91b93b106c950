"""Local SGD / model averaging ([S], [L]; docs/communication.md): one replica per device,
parameters and BN statistics averaged every τ steps — or, with gossip, gradients
exchanged with two ring partners every τ-th step.

  python -m jaxpar.train --config configs/local_sgd.py:post_local --workdir /tmp/local_sgd
  python -m jaxpar.train --config configs/local_sgd.py:sparknet --workdir /tmp/sparknet
  python -m jaxpar.train --config configs/local_sgd.py:gossip_sparse --workdir /tmp/lsg

Argument (`configs/local_sgd.py:ARG`), on the bundled digits, ResNet34 on 8 devices:
  post_local     τ = 4 after 20 synchronous warm-up steps (post-local SGD, Lin et al.)
  sparknet       SparkNet's setting: τ = 50 from the first step, 5 workers ([S] §4)
  gossip_sparse  [L]'s best: Local SGD(16) + gossip + sparsification (each tensor's 5 %
                 largest gradient entries sent — [L]'s threshold dropped ~95 % — with
                 error feedback)
Each replica's BatchNorm normalises over its own batch (`bn_group_size`, auto: 1).
"""
from jaxpar.config import ConfigError, defaults, use_dataset

VARIANTS = ('post_local', 'sparknet', 'gossip_sparse')


def get_config(arg: str = 'post_local'):
  if arg not in VARIANTS:
    raise ConfigError(f'config file argument {arg!r} is invalid: choose one of {list(VARIANTS)}')
  c = use_dataset(defaults(), 'digits')
  c.model = 'resnet34'
  c.image_size, c.augment.crop_padding = 16, 2
  c.scheme = 'sync-join'
  c.per_device_batch = 8
  if arg == 'post_local':
    c.mesh.shape = (8,)
    c.sync_every, c.local_sgd_warmup = 4, 20
  elif arg == 'gossip_sparse':
    c.mesh.shape = (8,)
    c.server, c.sync_every = 'gossip', 16
    c.sparsify.capacity = 0.05
  else:
    c.mesh.shape = (5,)
    c.sync_every = 50
  c.mesh.axes = ('data',)
  return c
