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
# The step's temporaries above which host_memory='auto' keeps freed memory in one malloc
# heap for every thread ('keep') rather than in each thread's own arena ('mapped'), where it
# is not glibc's HEAP_MAX (64 MiB: jaxpar/host_memory.py). GoogLeNet's inception modules run
# many small operations side by side, and under 'keep' their allocations search the one heap
# the compiler's freed memory is left in: its one-device training step, compiled in the
# process as a first run's is (2 cores, Intel Xeon, 2026-12-05/06), took 1.80x as long under
# 'keep' at 36 MiB of temporaries, 1.14-1.5x at 70-112, 1.05x at 208, 1.18x at 371 (64²) and
# 0.91x at 571 (224²) (analysis/report/host_memory/networks*.json, programs.json).
KEEP_ABOVE = {'googlenet': 400 * 2**20}


def fc_layers(name: str) -> tuple:
  """The fully connected layers of network `name` (ResNet34 is a partial of ResNet)."""
  constructor = MODELS[name]
  return getattr(constructor, 'func', constructor).FC_LAYERS


__all__ = ['AUX_LOSS_WEIGHT', 'GoogLeNet', 'MIN_IMAGE_SIZE', 'MODELS', 'ResNet', 'ResNet34',
           'SqueezeNet', 'VGG', 'VGG16E', 'fc_layers']
