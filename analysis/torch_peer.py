"""The PyTorch peer of `analysis.bench`: ResNet34 trained on the same batch with the same
optimizer, on the CPU, in eager mode — what a PyTorch user writes.

The network is torchvision's `resnet34` (BasicBlocks [3, 4, 6, 3], 7×7/2 stem, 3×3/2
max-pool, BN after every convolution, as published), written out here in
`resnet34`: torchvision's wheels are built against CUDA builds of torch and do not load
against the CPU-only wheel. Its kernels' shapes and parameter count equal jaxpar's ResNet34 (tested).
Its FLOPs (`torch.utils.flop_counter`) count every tap of a kernel, padding included;
XLA's cost analysis counts the taps inside the input only: at small inputs, where the
last stages are 1×1 or 2×2, the two counts differ several-fold.

Optional (`pip install -e '.[bench]'`); `available()` says whether torch is importable. One process: the step uses every core (`torch.set_num_threads`,
as XLA's CPU runtime does). Several processes (a jaxpar run across processes): each
process trains its share of the batch in `DistributedDataParallel` over gloo, the
collective library jaxpar's CPU processes use, rendezvousing at the coordinator's host.
The optimizer is SGD with jaxpar's momentum, Nesterov flag and weight decay on kernels
only; the learning rate is the schedule's peak (a schedule is a few scalar operations
per step: it does not change the time).
"""
import importlib.util
import os
import time

import numpy as np

NETWORKS = ('resnet34',)


def available() -> bool:
  return importlib.util.find_spec('torch') is not None


def resnet34(num_classes: int, channels: int):
  """torchvision's `resnet34(num_classes)` with a stem for `channels` input channels."""
  from torch import nn

  class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
      super().__init__()
      self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
      self.bn1 = nn.BatchNorm2d(cout)
      self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
      self.bn2 = nn.BatchNorm2d(cout)
      self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

    def forward(self, x):
      y = self.bn2(self.conv2(nn.functional.relu(self.bn1(self.conv1(x)))))
      return nn.functional.relu(y + self.downsample(x))

  layers, cin = [nn.Conv2d(channels, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                 nn.ReLU(), nn.MaxPool2d(3, 2, 1)], 64
  for cout, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
    for b in range(blocks):
      layers.append(BasicBlock(cin, cout, stride if b == 0 else 1))
      cin = cout
  layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
  return nn.Sequential(*layers)


class TorchRunner:
  """`analysis.bench.Runner`'s interface for a PyTorch train step."""

  def __init__(self, cfg, num_classes: int, batch: dict, peak_lr: float, process_count: int,
               process_index: int):
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() if process_count == 1 else 1)
    model = resnet34(num_classes, batch['image'].shape[-1])
    self.parameters = sum(p.numel() for p in model.parameters())
    if process_count > 1:
      host = cfg.distributed.coordinator.rsplit(':', 1)[0]
      port = int(cfg.distributed.coordinator.rsplit(':', 1)[1]) + 1
      torch.distributed.init_process_group('gloo', init_method=f'tcp://{host}:{port}',
                                           world_size=process_count, rank=process_index)
      model = torch.nn.parallel.DistributedDataParallel(model)
    self.name = 'PyTorch DDP (gloo)' if process_count > 1 else 'PyTorch eager'
    c = cfg.optimizer
    kernels = [p for p in model.parameters() if p.ndim > 1]
    others = [p for p in model.parameters() if p.ndim <= 1]
    self.optimizer = torch.optim.SGD(
        [{'params': kernels, 'weight_decay': c.weight_decay},
         {'params': others, 'weight_decay': 0.0}],
        lr=peak_lr, momentum=c.momentum, nesterov=c.nesterov)
    self.model, self.torch = model.train(), torch
    self.autocast = cfg.dtype == 'bfloat16'
    self.images = torch.from_numpy(np.ascontiguousarray(batch['image'].transpose(0, 3, 1, 2)))
    self.labels = torch.from_numpy(batch['label'].astype(np.int64))
    self.flops = self._count_flops()  # this process's share of the batch
    self.times = []

  def _step(self):
    torch = self.torch
    self.optimizer.zero_grad(set_to_none=True)
    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=self.autocast):
      loss = torch.nn.functional.cross_entropy(self.model(self.images), self.labels)
    loss.backward()
    self.optimizer.step()
    return loss

  def _count_flops(self) -> float:
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
      self._step()
    return float(counter.get_total_flops())

  def __call__(self, timed: bool = True):
    start = time.perf_counter()
    self._step().item()  # eager: the loss is ready when the step has run
    if timed:
      self.times.append(time.perf_counter() - start)

  def result(self, images: int) -> dict:
    median = float(np.median(self.times))
    return {'step': self.name, 'compile_s': 0.0, 'median_s': median, 'min_s': min(self.times),
            'max_s': max(self.times), 'samples': self.times, 'images_per_s': images / median,
            'flops_per_device': self.flops, 'flop_per_s_per_device': self.flops / median,
            'peak_memory_bytes_per_device': None, 'collectives': None,
            'collective_bytes_per_device': None, 'parameters': self.parameters}

  def close(self):
    if self.torch.distributed.is_initialized():
      self.torch.distributed.destroy_process_group()
