"""One cell of [T]'s experiment grid (docs/schemes.md): network × scheme × server × N workers.

  python -m jaxpar.train --workdir /tmp/t \
      --config configs/thesis.py:net=squeezenet,scheme=async,server=central,workers=4

  for n in 1 2 4 8; do python -m jaxpar.train --workdir /tmp/join_$n \
      --config configs/thesis.py:net=resnet34,scheme=sync-join,server=distributed,workers=$n; done

Argument: comma-separated key=value pairs.
  net       vgg16e | googlenet | squeezenet | resnet34          (default resnet34)
  scheme    sync-join | sync-split | async                      (default sync-join)
  server    central | distributed | allreduce                   (default distributed)
  workers   N, the devices of a 1-D mesh                        (default 8)
  batches   D, the batches the run trains on ([T]: 128)         (default 128)
  batch     d, the batch size: one worker's (sync-join, async) or the whole one split
            among the workers (sync-split)                      (default 32)
  schedule  central server: serial | parallel                   (default serial)
  data      digits (bundled, 32×32) | caltech256 (224×224, [T]'s dataset: pass
            --config.dataset.path=.../256_ObjectCategories)     (default digits)

As in [T] ch. 3: sync-join trains D/N iterations of N batches (rounded up when N does
not divide D), sync-split D iterations of one batch split N ways, async D pushes
(D/N per worker). The distributed server places whole tensors by [T]'s Algorithm 3.7
(`placement='greedy'`), as the thesis' `dist.py` does. The run logs its wall time.
[T] ch. 6 states no optimizer: this is SGD + momentum, its rate scaled linearly with the
examples of one update (sync-join: N·d): on the digits each network's recipe of
`jaxpar.config.DIGITS_RECIPES` (its rate, 20 warm-up steps, cosine decay over the run;
SqueezeNet with BatchNorm there, as its config: the published classifier dies on 32²
inputs; docs/training.md), otherwise 0.05 per batch of d at a constant rate.
D = 128 batches is what [T] timed, not enough to learn: docs/schemes.md has a D that
learns for each network, measured.
"""
import math

from jaxpar.config import ConfigError, defaults, use_dataset, use_network

KEYS = {'net': 'resnet34', 'scheme': 'sync-join', 'server': 'distributed', 'workers': '8',
        'batches': '128', 'batch': '32', 'schedule': 'serial', 'data': 'digits'}


def _parse(arg: str) -> dict:
  values = dict(KEYS)
  for pair in filter(None, arg.split(',')):
    key, sep, value = pair.partition('=')
    if not sep or key not in KEYS:
      raise ConfigError(f'configs/thesis.py argument {pair!r} is invalid: expected key=value '
                        f'pairs with keys {list(KEYS)}')
    values[key] = value
  for key in ('workers', 'batches', 'batch'):
    if not values[key].isdigit() or int(values[key]) == 0:
      raise ConfigError(f'configs/thesis.py argument {key}={values[key]!r} is invalid: '
                        f'expected a positive integer')
  if values['data'] not in ('digits', 'caltech256'):
    raise ConfigError(f"configs/thesis.py argument data={values['data']!r} is invalid: choose "
                      f"digits or caltech256")
  return values


def get_config(arg: str = ''):
  v = _parse(arg)
  n, batches, batch = int(v['workers']), int(v['batches']), int(v['batch'])
  c = use_network(use_dataset(defaults(), v['data']), v['net'], v['data'])
  c.scheme, c.server = v['scheme'], v['server']
  c.mesh.shape, c.mesh.axes = (n,), ('data',)
  c.central_schedule = v['schedule']  # an error unless server=central (or left serial)
  if c.server == 'distributed':
    c.placement = 'greedy'
  c.global_batch = c.per_device_batch = batch
  c.total_steps = math.ceil(batches / n) if c.scheme == 'sync-join' else batches
  if v['data'] == 'digits':
    # The digits recipe: 20 warm-up steps (at most a quarter of the run), cosine decay to
    # the run's end. At a constant rate without warm-up VGG16E stayed at ln 10 and
    # GoogLeNet, once off its plateau, swung between 35 and 60 % (docs/schemes.md).
    c.optimizer.warmup_steps = min(20, c.total_steps // 4)
  else:  # [T]'s Caltech-256 runs: 0.05 per batch of d, constant
    c.optimizer.base_lr, c.optimizer.base_batch = 0.05, batch
    c.optimizer.warmup_steps = 0
    c.optimizer.schedule = 'constant'
  c.log_every = max(1, c.total_steps // 8)
  c.checkpoint_every = c.total_steps  # the final state only: checkpoints are not in [T]'s time
  return c
