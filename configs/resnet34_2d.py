"""ResNet34 ([T] ch. 2) data parallel on a 2×4 mesh: the default demo.

  python -m jaxpar.train --config configs/resnet34_2d.py --workdir /tmp/resnet34_2d

Argument (`configs/resnet34_2d.py:ARG`): digits (default: the bundled dataset at
16×16, about four minutes on a 2-core CPU), cifar10, imagenet2012, caltech256.
"""
from jaxpar.config import defaults, use_dataset


def get_config(arg: str = 'digits'):
  c = use_dataset(defaults(), arg)
  c.model = 'resnet34'
  c.mesh.shape = (2, 4)
  c.mesh.axes = ('x', 'y')
  if arg == 'digits':
    # The 8×8 digits upsampled to 16×16: the stem and all four stages still apply
    # (16 → 8 → 4 → 4, 2, 1, 1) at a quarter of the cost of 32×32.
    c.image_size = 16
    c.augment.crop_padding = 2
    c.optimizer.base_lr = 0.4
  return c
