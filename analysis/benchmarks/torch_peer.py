"""The PyTorch peers of `analysis.benchmarks.bench`: the configured network trained on the same
batch with the same optimizer, in eager mode — what a PyTorch user writes — and, with
`compiled=True`, under `torch.compile` (its default mode: TorchInductor's kernels for the
forward and backward passes, the optimizer's step eager), the anchor a GPU user would pick.

The networks are torchvision's (`torchvision.models`), with the input channels and the
classes of the run, changed where jaxpar's published network differs:
- resnet34: `resnet34` (BasicBlocks [3, 4, 6, 3], 7×7/2 stem, 3×3/2 max-pool, BN after
  every convolution), as jaxpar's;
- vgg16e ([T]'s VGG16 configuration E, Simonyan & Zisserman's 19 weight layers): `vgg19`
  without its adaptive 7×7 average pool, so the first FC layer sees the last map as
  jaxpar's does (512 inputs at 32², 25,088 at 224²; torchvision would upsample a 1×1 map
  to 7×7 and add 102 M weights);
- squeezenet: `squeezenet1_0`, as jaxpar's (ceil-mode max-pools, the classifier a 1×1
  convolution with its ReLU), its max-pools jaxpar's on maps smaller than the window
  (`ceil_max_pool`: torch's refuses them);
- googlenet: written out here (`googlenet`), as jaxpar's and the paper's: torchvision's
  `googlenet` puts BatchNorm after every convolution, uses 3×3 convolutions in the "5×5"
  branches and a 4×4 adaptive pool and a 2048-input FC in its auxiliary heads. Both
  auxiliary losses count 0.3, as in jaxpar's loss.
Kernel shapes and parameter counts equal jaxpar's (tested). FLOPs
(`torch.utils.flop_counter`) count every tap of a kernel, padding included; XLA's cost
analysis counts the taps inside the input only: at small inputs, where the last stages
are 1×1 or 2×2, the two counts differ several-fold.

The compiled peer's model is the eager peer's network from the same seed; its first step
(the compilation: TorchDynamo traces, Inductor generates and compiles kernels) is its
`compile_s`, and its FLOPs are counted on the eager module before compiling.

Optional (`pip install -e '.[bench]'`); `available()` says whether torch and
torchvision are importable. On the device JAX runs on: the CPU, or one CUDA GPU when JAX's
backend is the GPU (`cudnn.benchmark` on, as PyTorch's ImageNet example sets it; the loss's
`.item()` waits for the step). One CPU process: the step uses every core
(`torch.set_num_threads`, as XLA's CPU runtime does). Several processes (a jaxpar run
across processes): each process trains its share of the batch in
`DistributedDataParallel` over the collective library jaxpar's processes use (gloo on CPUs,
NCCL on GPUs), rendezvousing at the coordinator's host. The optimizer is SGD with jaxpar's momentum,
Nesterov flag and weight decay on kernels only; the learning rate is the schedule's peak
(a schedule is a few scalar operations per step: it does not change the time).
"""
import importlib.util
import os
import sys
import time

import numpy as np

from jaxpar.models import AUX_LOSS_WEIGHT


# torch's default (CUDA) wheels import triton from torch._dynamo (reached through
# torchvision and the FLOP counter); imported after TensorFlow, triton 3.8 segfaults on the
# CPU machines jaxpar is tested on, where the peers never need it (torch.compile's CPU
# kernels are C++): where TensorFlow is installed torch finds no triton, unless `_torch`
# is asked for CUDA, whose torch.compile kernels are triton's.
if importlib.util.find_spec('tensorflow') is not None:
  sys.modules.setdefault('triton', None)


def _torch(device: str = 'cpu'):
  """torch, imported for `device`: on a CUDA GPU with triton let in (above)."""
  if device == 'cuda' and 'triton' in sys.modules and sys.modules['triton'] is None:
    del sys.modules['triton']
  import torch
  return torch


def available() -> bool:
  return all(importlib.util.find_spec(m) is not None for m in ('torch', 'torchvision'))


def network(name: str, num_classes: int, channels: int, image_size: int, device: str = 'cpu'):
  """The PyTorch peer of jaxpar's network `name` (see the module docstring), built on the
  CPU; `device` is where it will run (`_torch`)."""
  _torch(device)
  from torch import nn
  from torchvision import models
  if name == 'googlenet':
    return googlenet(num_classes, channels)
  if name == 'resnet34':
    model = models.resnet34(num_classes=num_classes)
    model.conv1 = nn.Conv2d(channels, 64, 7, 2, 3, bias=False)
  elif name == 'vgg16e':
    model = models.vgg19(num_classes=num_classes)
    model.features[0] = nn.Conv2d(channels, 64, 3, padding=1)
    model.avgpool = nn.Identity()
    model.classifier[0] = nn.Linear(512 * (image_size // 32) ** 2, 4096)
  else:
    model = models.squeezenet1_0(num_classes=num_classes)
    model.features[0] = nn.Conv2d(channels, 96, 7, 2)
    for i, layer in enumerate(model.features):
      if isinstance(layer, nn.MaxPool2d):
        model.features[i] = ceil_max_pool()
  return model


def ceil_max_pool(window: int = 3, stride: int = 2):
  """Caffe's ceil-rounded max-pool as jaxpar's (`layers.max_pool_ceil`): torch's
  `ceil_mode=True` on maps at least `window` wide, and a map smaller than the window pooled
  to one position (torch refuses it: SqueezeNet and GoogLeNet at 16² end in 1×1 maps)."""
  import torch  # after `network`, which imported it for its device
  from torch import nn

  class CeilMaxPool(nn.MaxPool2d):
    def forward(self, x):
      short_h, short_w = (max(0, window - n) for n in x.shape[2:])
      if short_h or short_w:
        x = nn.functional.pad(x, (0, short_w, 0, short_h), value=-torch.inf)
      return super().forward(x)

  return CeilMaxPool(window, stride, ceil_mode=True)


def materialise(model, channels: int, image_size: int):
  """Gives lazy layers (GoogLeNet's auxiliary FC inputs) their shapes: one forward pass."""
  import torch  # after `network`, which imported it for its device
  if any(isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) for m in model.modules()):
    with torch.no_grad():
      model.train()(torch.zeros(2, channels, image_size, image_size))
  return model


def googlenet(num_classes: int, channels: int):
  """GoogLeNet as published and as jaxpar's (`jaxpar.models.googlenet`): no BatchNorm,
  5×5 branches, auxiliary heads after 4a and 4d (training mode returns all three)."""
  import torch  # after `network`, which imported it for its device
  from torch import nn

  from jaxpar.models.googlenet import AUX_AFTER, INCEPTIONS

  def conv(cin, cout, k, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2), nn.ReLU())

  class Inception(nn.Module):
    def __init__(self, cin, widths):
      super().__init__()
      c1, r3, c3, r5, c5, pp = widths
      self.b1 = conv(cin, c1, 1)
      self.b3 = nn.Sequential(conv(cin, r3, 1), conv(r3, c3, 3))
      self.b5 = nn.Sequential(conv(cin, r5, 1), conv(r5, c5, 5))
      self.bp = nn.Sequential(nn.MaxPool2d(3, 1, 1), conv(cin, pp, 1))

    def forward(self, x):
      return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.bp(x)], 1)

  class Aux(nn.Module):
    def __init__(self, cin):
      super().__init__()
      self.conv = conv(cin, 128, 1)
      self.fc1, self.fc2 = nn.LazyLinear(1024), nn.Linear(1024, num_classes)
      self.dropout = nn.Dropout(0.7)

    def forward(self, x):  # 5×5/3 average pool, or the global mean on maps below 5×5
      x = (nn.functional.avg_pool2d(x, 5, 3) if min(x.shape[2:]) >= 5
           else x.mean((2, 3), keepdim=True))
      x = torch.flatten(self.conv(x), 1)
      return self.fc2(self.dropout(nn.functional.relu(self.fc1(x))))

  class GoogLeNet(nn.Module):
    def __init__(self):
      super().__init__()
      self.stem = nn.Sequential(conv(channels, 64, 7, 2), ceil_max_pool(), conv(64, 64, 1),
                                conv(64, 192, 3), ceil_max_pool())
      self.blocks, self.heads, cin = nn.ModuleList(), nn.ModuleDict(), 192
      for item in INCEPTIONS:
        if item == 'M':
          self.blocks.append(ceil_max_pool())
          continue
        name, widths = item
        self.blocks.append(Inception(cin, widths))
        cin = widths[0] + widths[2] + widths[4] + widths[5]
        if name in AUX_AFTER:
          self.heads[str(len(self.blocks) - 1)] = Aux(cin)
      self.dropout, self.fc = nn.Dropout(0.4), nn.Linear(cin, num_classes)

    def forward(self, x):
      x, aux = self.stem(x), []
      for i, block in enumerate(self.blocks):
        x = block(x)
        if self.training and str(i) in self.heads:
          aux.append(self.heads[str(i)](x))
      x = self.fc(self.dropout(x.mean((2, 3))))
      return (x, *aux) if self.training else x

  return GoogLeNet()


def loss(outputs, labels):
  """jaxpar's training loss (`step.loss_and_logits`): auxiliary heads weighted 0.3."""
  from torch.nn.functional import cross_entropy
  if isinstance(outputs, tuple):
    main, *aux = outputs
    return cross_entropy(main, labels) + AUX_LOSS_WEIGHT * sum(cross_entropy(a, labels)
                                                               for a in aux)
  return cross_entropy(outputs, labels)


class TorchRunner:
  """`analysis.benchmarks.bench.Runner`'s interface for a PyTorch train step: eager, or with
  `compiled=True` the model under `torch.compile`."""

  def __init__(self, cfg, num_classes: int, batch: dict, peak_lr: float, process_count: int,
               process_index: int, device: str = 'cpu', compiled: bool = False):
    torch = _torch(device)

    torch.manual_seed(0)
    self.device = torch.device(device)
    if self.device.type == 'cuda':
      torch.backends.cudnn.benchmark = True
    else:
      torch.set_num_threads(os.cpu_count() if process_count == 1 else 1)
    image = batch['image']
    model = network(cfg.model, num_classes, image.shape[-1], image.shape[1], device)
    materialise(model, image.shape[-1], image.shape[1])
    self.parameters = sum(p.numel() for p in model.parameters())
    model = model.to(self.device)
    suffix = ' (CUDA)' if self.device.type == 'cuda' else ''
    kind = 'torch.compile' if compiled else 'PyTorch eager'
    if process_count > 1:
      backend = 'nccl' if self.device.type == 'cuda' else 'gloo'
      if not torch.distributed.is_initialized():  # the eager and the compiled peer share it
        host = cfg.distributed.coordinator.rsplit(':', 1)[0]
        port = int(cfg.distributed.coordinator.rsplit(':', 1)[1]) + 1
        torch.distributed.init_process_group(backend, init_method=f'tcp://{host}:{port}',
                                             world_size=process_count, rank=process_index)
      model = torch.nn.parallel.DistributedDataParallel(model)
      self.name = f"{'torch.compile' if compiled else 'PyTorch'} DDP ({backend})"
    else:
      self.name = kind + suffix
    c = cfg.optimizer
    kernels = [p for p in model.parameters() if p.ndim > 1]
    others = [p for p in model.parameters() if p.ndim <= 1]
    self.optimizer = torch.optim.SGD(
        [{'params': kernels, 'weight_decay': c.weight_decay},
         {'params': others, 'weight_decay': 0.0}],
        lr=peak_lr, momentum=c.momentum, nesterov=c.nesterov)
    self.model, self.torch = model.train(), torch
    self.autocast = cfg.dtype == 'bfloat16'
    self.images = torch.from_numpy(
        np.ascontiguousarray(batch['image'].transpose(0, 3, 1, 2))).to(self.device)
    self.labels = torch.from_numpy(batch['label'].astype(np.int64)).to(self.device)
    self.flops = self._count_flops()  # this process's share of the batch, eagerly
    if compiled:
      self.model = torch.compile(self.model)
    self.compile_time = None if compiled else 0.0  # the compiled peer's first step
    self.times = []

  def _step(self):
    torch = self.torch
    self.optimizer.zero_grad(set_to_none=True)
    with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
      value = loss(self.model(self.images), self.labels)
    value.backward()
    self.optimizer.step()
    return value

  def _count_flops(self) -> float:
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
      self._step()
    return float(counter.get_total_flops())

  def __call__(self, timed: bool = True):
    start = time.perf_counter()
    self._step().item()  # the loss is ready when the step has run
    if self.compile_time is None:
      self.compile_time = time.perf_counter() - start
    elif timed:
      self.times.append(time.perf_counter() - start)

  def result(self, images: int) -> dict:
    median = float(np.median(self.times))
    return {'step': self.name, 'compile_s': self.compile_time, 'median_s': median, 'min_s': min(self.times),
            'max_s': max(self.times), 'samples': self.times, 'images_per_s': images / median,
            'flops_per_device': self.flops, 'flop_per_s_per_device': self.flops / median,
            'peak_memory_bytes_per_device': None, 'collectives': None,
            'collective_bytes_per_device': None, 'parameters': self.parameters}

  def close(self):
    if self.torch.distributed.is_initialized():
      self.torch.distributed.destroy_process_group()
