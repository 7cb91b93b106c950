"""ResNet34 ([T] ch. 2) on a 2×4 mesh with [Y]'s supercomputer-scale techniques: the default demo.

  python -m jaxpar.train --config configs/resnet34_2d.py --workdir /tmp/resnet34_2d

Gradients are summed by the 2-D torus algorithm over the mesh axes ('x', 'y'),
BatchNorm statistics are shared within groups of 4 devices (one row, 'y'),
convolutions compute in bfloat16 on float32 master weights, and LARS with
warm-up and polynomial decay drives the updates (docs/techniques.md).

Argument (`configs/resnet34_2d.py:ARG`): digits (default: the bundled dataset at
16×16, a few minutes on a 2-core CPU), cifar10, imagenet2012, caltech256.
"""
from jaxpar.config import defaults, use_dataset


def get_config(arg: str = 'digits'):
  c = use_dataset(defaults(), arg)
  c.model = 'resnet34'
  c.mesh.shape = (2, 4)
  c.mesh.axes = ('x', 'y')
  c.grad_reduce = 'torus2d'
  c.bn_group_size = 4
  c.dtype = 'bfloat16'
  c.optimizer.name = 'lars'
  c.optimizer.schedule = 'poly'
  c.optimizer.base_lr = 4.0  # LARS scales each kernel's step by its trust ratio
  if arg == 'digits':
    # The 8×8 digits upsampled to 16×16: the stem and all four stages still apply
    # (16 → 8 → 4 → 4, 2, 1, 1) at a quarter of the cost of 32×32.
    c.image_size = 16
    c.augment.crop_padding = 2
    c.num_epochs = 6.2  # 140 steps: LARS gets there sooner than the preset's 8 epochs
  return c
