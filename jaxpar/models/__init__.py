"""The four networks of [T] ch. 2. Each is built as `Net(num_classes=..., dtype=...)` and
called as `model.apply(variables, x, train=...)` on NHWC images."""
from jaxpar.models.googlenet import AUX_LOSS_WEIGHT, GoogLeNet
from jaxpar.models.resnet import ResNet, ResNet34
from jaxpar.models.squeezenet import SqueezeNet
from jaxpar.models.vgg import VGG, VGG16E

# Config name → constructor; `jaxpar.config` validates names against this.
MODELS = {'vgg16e': VGG16E, 'googlenet': GoogLeNet, 'squeezenet': SqueezeNet, 'resnet34': ResNet34}
# Smallest input each network can take: VGG halves the map five times with
# 2×2 pools; SqueezeNet's first convolution is an unpadded 7×7.
MIN_IMAGE_SIZE = {'vgg16e': 32, 'googlenet': 1, 'squeezenet': 7, 'resnet34': 1}


def fc_layers(name: str) -> tuple:
  """The fully connected layers of network `name` (ResNet34 is a partial of ResNet)."""
  constructor = MODELS[name]
  return getattr(constructor, 'func', constructor).FC_LAYERS


__all__ = ['AUX_LOSS_WEIGHT', 'GoogLeNet', 'MIN_IMAGE_SIZE', 'MODELS', 'ResNet', 'ResNet34',
           'SqueezeNet', 'VGG', 'VGG16E', 'fc_layers']
