"""What `jaxpar.plan` measures on the devices at hand, and the measuring helpers
`analysis/` shares with it.

  serial_run     one device at batch b trained until the target (or a step or time cap):
                 its curve of the target's metric, K_b (the step the target is reached,
                 `steps_model.reached`), the time of each step (t_step at N = 1), and
                 along it the gradient noise scale B_noise (`noise_probe`,
                 `noise_scale.device_norms` of several gradients at the same weights).
  save_seconds   t_save: what one checkpoint save costs a run (its steps after the save
                 while orbax writes, less the same steps without).
  gradient_call  t_grad: one device, one batch's gradients ([T]'s definition).
  input_seconds  t_in: the CPU seconds this process spends making one batch of the
                 training stream (tf.data's threads and the copy to the device).
  step_call      a candidate's train step on its N devices: the collectives of its
                 lowered program (`hlo.collectives`) to cost, and a call to time it.
  initial_variables  the network's initial weights, made once for all of the above.
  machine, versions  what a measurement ran on (versions: jaxpar's with its code's digest,
                 `source_digest`), recorded beside it.
"""
import functools
import hashlib
import math
import os
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxpar import config as config_lib
from jaxpar.perfmodel import noise_scale, steps_model


# =============================================================================== the machine
def _vector_isa(flags: set) -> str:
  """The widest x86 vector instructions among /proc/cpuinfo's flags, with bfloat16's: two
  hosts both named "AMD EPYC" (Zen 3: AVX2; Zen 4: AVX-512 with bfloat16) differ in what
  oneDNN computes (bfloat16 convolutions: jaxpar/models/onednn.py) and in speed."""
  if 'avx512f' in flags:
    return 'AVX-512' + (' with bfloat16' if 'avx512_bf16' in flags else '')
  return 'AVX2' if 'avx2' in flags else ''


def machine() -> dict:
  model, flags = '', set()
  if os.path.exists('/proc/cpuinfo'):
    with open('/proc/cpuinfo') as f:
      lines = f.read().splitlines()
    model = next((line.split(':', 1)[1].strip() for line in lines
                  if line.startswith('model name')), '')
    flags = set(next((line.split(':', 1)[1].split() for line in lines
                      if line.startswith('flags')), []))
  memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') if hasattr(os, 'sysconf') \
      else None
  accelerators = sorted({d.device_kind for d in jax.devices()}) if jax.default_backend() != 'cpu' \
      else []
  return {'host': platform.node(), 'system': platform.platform(), 'cpu': model,
          'cpu_isa': _vector_isa(flags), 'cores': os.cpu_count(), 'memory_bytes': memory,
          'python': platform.python_version(),
          **({'accelerators': accelerators} if accelerators else {})}


def versions() -> dict:
  """The versions a measurement depends on: the libraries', and jaxpar's own with a digest
  of the code that writes its programs (`source_digest`), so that a measurement of the
  programs before a change to that code (BatchNorm's statistics gathered, say) is not taken
  for one after it: jaxpar's version number does not move with its code."""
  from importlib import metadata
  return {**{name: metadata.version(name)
             for name in ('jax', 'jaxlib', 'flax', 'optax', 'numpy')},
          'jaxpar': f"{metadata.version('jaxpar')}+{source_digest()}"}


@functools.cache
def source_digest(folder: str = os.path.dirname(os.path.dirname(__file__))) -> str:
  """12 hex digits of SHA-256 over the package's source files under `folder` (Python, C++,
  and the JSON tables its programs read: `models/conv_auto.json`), their paths and
  contents, in path order."""
  digest = hashlib.sha256()
  for root, _, files in sorted(os.walk(folder)):  # the whole walk, ordered by folder
    for name in sorted(files):
      if name.endswith(('.py', '.cc', '.json')):
        path = os.path.join(root, name)
        digest.update(os.path.relpath(path, folder).encode() + b'\0')
        with open(path, 'rb') as f:
          digest.update(f.read() + b'\0')
  return digest.hexdigest()[:12]


# =============================================================================== the targets
class Target:
  """What a run must reach: a training-set loss (evaluated on the whole training split,
  unaugmented) at or below `value`, or a test top-1 at or above it. `metric` maps an
  evaluation to a number that falls to `threshold` (the loss; for accuracy 1 − top-1)."""

  def __init__(self, kind: str, value: float):
    self.kind, self.value = kind, float(value)
    self.split = 'train' if kind == 'loss' else 'test'
    self.threshold = self.value if kind == 'loss' else 1.0 - self.value

  def metric(self, evaluation: dict) -> float:
    return float(evaluation['loss']) if self.kind == 'loss' else 1.0 - float(evaluation['top1'])

  def chance(self, num_classes: int) -> float:
    """The metric of a uniform guess over `num_classes`: ln C, or 1 − 1/C."""
    return math.log(num_classes) if self.kind == 'loss' else 1.0 - 1.0 / num_classes

  def standard_error(self, evaluation: dict):
    """The metric's standard error over the examples evaluated (None where unknown)."""
    if self.kind == 'loss':
      return evaluation.get('loss_se')
    p, n = float(evaluation['top1']), float(evaluation['count'])
    return math.sqrt(p * (1 - p) / max(n - 1, 1))

  def describe(self) -> str:
    return (f'training-set loss ≤ {self.value:g}' if self.kind == 'loss'
            else f'test top-1 ≥ {self.value:.1%}')

  def shown(self, metric: float) -> str:
    """A reading of `metric` as the target is set: the loss, or the top-1 (not 1 − top-1)."""
    return f'loss {metric:.4f}' if self.kind == 'loss' else f'top-1 {1.0 - metric:.2%}'

  def measures(self) -> str:
    """What `metric` is, in words."""
    return 'the loss' if self.kind == 'loss' else '1 − top-1'

  def to_dict(self) -> dict:
    return {'kind': self.kind, 'value': self.value}


# =============================================================================== the serial run
# A run of this process alone: a one-device candidate's, and Downpour's on Ray's actors.
ONE_PROCESS = {'distributed.coordinator': '', 'distributed.num_processes': 1,
               'distributed.process_id': 0}


def one_device_overrides(cfg, batch: int) -> dict:
  """sync-join on one device at `batch` with the config's optimizer at a constant rate after
  its warm-up (K must not depend on a run length the plan does not know yet); one process
  (the plan's own processes are joined already)."""
  return {'scheme': 'sync-join', 'server': 'allreduce', 'mesh.shape': (1,), 'mesh.axes': ('data',),
          'per_device_batch': batch, 'bn_group_size': None, 'sync_every': 0,
          'local_sgd_warmup': 0, 'fc_parallel': 'data', 'sparsify.capacity': 0.0,
          'placement': 'auto', 'central_schedule': 'serial', 'grad_reduce': 'psum',
          'optimizer.schedule': 'constant', 'eval_every': 0, 'stop_after_steps': 0,
          **ONE_PROCESS}


def initial_variables(cfg, meta) -> dict:
  """The network's initial {'params', 'batch_stats'?} at `cfg.seed`, as training starts
  from them (`jaxpar.train`), on the host: the serial run, t_grad and every timed step
  start from these, initialised once (a compiled program of its own: SqueezeNet at 16²,
  2 s; in a state with the optimizer's on 2 emulated devices, 3-4 s a candidate)."""
  from jaxpar import build
  from jaxpar.mesh import make_mesh
  from jaxpar.step import init_compiler_options, init_variables

  device = jax.local_devices()[0]  # this process's: across processes, each makes its own
  model = build.model(cfg, meta['num_classes'], meta['channels'],
                      make_mesh((1,), ('data',), [device]))
  rng_init, _ = build.seed_keys(cfg.seed)
  # One program, not an op at a time (ResNet34: 180 small compiles, 6 s).
  return jax.device_get(jax.jit(
      lambda: init_variables(model, (1, cfg.image_size, cfg.image_size, meta['channels']),
                             rng_init),
      out_shardings=jax.sharding.SingleDeviceSharding(device),
      compiler_options=init_compiler_options())())


def serial_run(cfg, source, target: Target, *, eval_every: int, max_steps: int,
               deadline: float, noise_batches: int, log=print, variables=None,
               eval_share: float = 0.0, time_saves: bool = True, name: str = 'serial',
               agree=None, stall_steps: int = 0) -> dict:
  """Trains `cfg` (a one-device config, `one_device_overrides`; or a candidate's on its
  mesh's devices, every process's) from its initial weights (`variables`, made already, or
  made here: `initial_variables`) until the target, `max_steps`, `deadline`
  (time.perf_counter(), or a callable: past it), a curve that has stalled
  (`steps_model.progress`; an initial plateau goes on) or gradients that vanished
  (`vanished`): {'curve': [(step, metric)], 'K': steps to the target or None,
  'step_seconds': the mean step time of each window between evaluations (steps dispatched
  as training does, evaluations excluded, the first step's compilation too), 'noise':
  [{'step', 'b_noise', 'g2', 's', 'batch_g2'}], 'stopped': why ('reached', 'max_steps',
  'time', 'stalled', 'no_gradient'), 'progress': the curve's last verdict (or
  'no_gradient'), 'save_seconds': what a checkpoint save costs it (`save_seconds`, after the
  run; None without `time_saves`), 'metric': how the target's metric was measured
  (`_MetricCost`)}.

  With `eval_share`, the metric costs at most that share of the training (`_MetricCost`):
  step 0's evaluation of the whole split timed batch by batch, then the readings on the
  split's first examples (whole evaluation batches, at least one; the same examples every
  time) within half of the share — where one batch costs more, evaluations spaced
  further apart; a subset's reading at the target is read again on as much of the split as
  the rest fits (`_MetricCost.confirming`), the subset's readings put on that scale. `agree`: on
  the devices of several processes, process 0's value of a measurement in every process
  (`planner._Agree`), so that every process evaluates the same examples at the same steps."""
  from jaxpar import build
  from jaxpar import config as config_lib
  from jaxpar.mesh import make_mesh

  mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axes,
                   jax.devices()[:config_lib.num_devices(cfg)], cfg.bn_group_size)
  model = build.model(cfg, source.num_classes, source.channels, mesh)
  method = build.strategy(cfg, mesh, model)
  tx, _ = build.optimizer(cfg, model, source.channels, method, config_lib.global_batch(cfg),
                          max_steps)
  rng_init, rng_dropout = build.seed_keys(cfg.seed)
  state = build.initial_state(cfg, model, tx, method, source.channels, mesh, rng_init,
                              variables=variables)
  noise = noise_probe(cfg, model, source, noise_batches) if noise_batches >= 2 else None
  loop = build.loop(cfg, model, tx, mesh, method, source, state, max_steps, rng_dropout)
  run = _to_target(cfg, source, target, model, mesh, loop, state, method.variables,
                   eval_every=eval_every, max_steps=max_steps, deadline=deadline, noise=noise,
                   log=log, eval_share=eval_share, name=name, agree=agree,
                   stall_steps=stall_steps)
  # After the run: its steps go on, not on its curve.
  run['save_seconds'] = save_seconds(run.pop('state'), loop) if time_saves else None
  loop.close()
  return run


def stale_run(cfg, source, target: Target, staleness: int, *, eval_every: int,
              max_steps: int, deadline: float, log=print, variables=None,
              eval_share: float = 0.0) -> dict:
  """Downpour's steps to the target as `serial_run` measures the serial run's (its dict,
  without saves or B_noise): the one-device config `cfg` trained by the staleness
  simulator (`staleness.Delayed`) with every update's gradient taken `staleness` versions
  back — N equally fast workers settle at s = N − 1 ([T] §3.2) — from the same initial
  weights, batches, dropout keys and optimizer (at s = 0 the serial run's maths)."""
  from jaxpar import build
  from jaxpar.mesh import make_mesh
  from jaxpar.plan.staleness import Delayed

  mesh = make_mesh((1,), ('data',), jax.devices()[:1])
  model = build.model(cfg, source.num_classes, source.channels, mesh)
  _, rng_dropout = build.seed_keys(cfg.seed)
  if variables is None:
    variables = initial_variables(cfg, {'num_classes': source.num_classes,
                                        'channels': source.channels})
  grad_fn, tx, items = delayed_inputs(cfg, model, source, max_steps, rng_dropout)
  step = Delayed(grad_fn, tx, staleness + 1)

  class Loop:  # `build.loop`'s shape: one update a call
    def __call__(self, state):
      return step(state, next(items), staleness)

    def close(self):
      pass

  state = step.init(variables['params'], variables.get('batch_stats', {}))
  run = _to_target(cfg, source, target, model, mesh, Loop(), state,
                   lambda s: {'params': s['params'], 'batch_stats': s['aux']},
                   eval_every=eval_every, max_steps=max_steps, deadline=deadline, noise=None,
                   log=log, eval_share=eval_share, name=f'staleness {staleness}')
  run.pop('state')
  return {**run, 'staleness': staleness}


def delayed_inputs(cfg, model, source, steps: int, rng) -> tuple:
  """What the staleness simulator (`staleness.Delayed`, `staleness.train`) trains one device
  with, as the serial run does: (grad_fn(params, batch_stats, (batch, key)) → (gradients,
  batch_stats, loss) of `model` without cross-device BN, the config's optimizer and rate
  over `steps`, the training stream's (batch, key) items — dropout keyed as the train step
  keys it, `rng` folded with the update's number)."""
  from jaxpar import build, optim
  from jaxpar import config as config_lib
  from jaxpar.step import gradients

  one = model.clone(bn_axis_name=None)
  batch = config_lib.global_batch(cfg)
  tx = optim.make_optimizer(cfg.optimizer, optim.learning_rate(cfg.optimizer, batch, steps))

  def grad_fn(params, batch_stats, item):
    data, key = item
    grads, batch_stats, metrics = gradients(one, params, batch_stats, data, key)
    return grads, batch_stats, metrics['loss']

  items = ((data, jax.random.fold_in(rng, k))
           for k, data in enumerate(build.train_batches(cfg, source, batch, 0)))
  return grad_fn, tx, items


def _to_target(cfg, source, target, model, mesh, loop, state, variables_of, *,
               eval_every, max_steps, deadline, noise, log, eval_share, name,
               agree=None, stall_steps: int = 0) -> dict:
  """`loop(state)` → (state, metrics) called until the target (`serial_run`'s dict, with
  the last 'state' and without 'save_seconds'); the metric's subset and spacing from
  `agree`'s (process 0's) timings where given. `stall_steps`: a stall judged over at least
  that many steps (`steps_model.progress`'s patience in evaluations at the spacing used; 0:
  its own 5), for a run evaluated more often than the serial run."""
  from jaxpar.evaluation import evaluate
  from jaxpar.step import make_eval_step

  eval_step = make_eval_step(model, mesh)
  cost = _MetricCost(source, target, config_lib.eval_batch(cfg), eval_every, eval_share)
  # Across processes a callable, so that every process stops at the same evaluation.
  past = deadline if callable(deadline) else lambda: time.perf_counter() > deadline

  def measured(state, clock=None):
    start = time.perf_counter()
    evaluation = evaluate(eval_step, variables_of(state), mesh, source, cfg,
                          split=target.split, examples=cost.examples, clock=clock)
    cost.evaluated(time.perf_counter() - start, target.standard_error(evaluation))
    return target.metric(evaluation)

  def reading(state):  # the metric, subset readings on the confirmed scale
    value = measured(state)
    if cost.on_subset():
      subset.add(len(curve))
      value *= cost.scale
    return value

  subset = set()  # indices of the curve's readings on the subset
  clock = []  # step 0's batches, timed
  curve, seconds, track, stopped = [(0, measured(state, clock))], [], [], 'max_steps'
  cost.clocked(clock)
  mark, since, verdict, first = None, 0, 'plateau', None

  def confirm(step, state):
    """A subset's reading at the target read again on more of the split (`_MetricCost.
    confirming`): the subset's readings put on that one's scale, the step's its own."""
    examples = cost.confirming()
    if agree:
      examples = agree(examples)
    if not examples:
      return
    own = curve[-1][1] / cost.scale  # the subset's reading as read
    start = time.perf_counter()
    wider = target.metric(evaluate(eval_step, variables_of(state), mesh, source, cfg,
                                   split=target.split, examples=examples))
    rescale = cost.confirmed(step, own, wider, examples, time.perf_counter() - start)
    curve[:] = [(s, v * rescale if i in subset else v) for i, (s, v) in enumerate(curve)]
    curve[-1] = (step, wider)
    subset.discard(len(curve) - 1)
    log(f'  {name} step {step}: {target.shown(wider)} on the first {examples} examples, the '
        f'subset\'s {target.shown(own)}: its readings of {target.measures()} × {cost.scale:.3f}')

  def settle():  # the subset, every process's alike (once; never with no share to keep)
    if cost.settled or not cost.share:
      return
    if agree:
      batch_seconds, seconds[0] = agree((cost.batch_seconds, seconds[0]))
      cost.batch_seconds = batch_seconds
      if batch_seconds is None:
        cost.eval_seconds[-1] = agree(cost.eval_seconds[-1])
    if cost.settle(seconds[0]):
      log(f'  {name} run: {cost.describe()}.')

  begun = time.perf_counter()
  for step in range(1, max_steps + 1):
    state, metrics = loop(state)
    since += 1
    if step == 1:  # compiles: the clock starts after it
      jax.block_until_ready(metrics)
      mark, since = time.perf_counter(), 0
      first = mark - begun
    if step % cost.every == 0 or step == max_steps:
      jax.block_until_ready(metrics)
      if since:  # steps as training runs them, dispatched ahead, blocked once a window
        seconds.append((time.perf_counter() - mark) / since)
        cost.trained(seconds[-1] * since)
      if len(seconds) == 1 and cost.batch_seconds is not None:
        settle()  # timed at step 0: this reading is the subset's already
      curve.append((step, reading(state)))
      if noise:
        track.append({'step': step, **noise(variables_of(state))})
      verdict = steps_model.progress(curve, target.chance(source.num_classes),
                                     patience=max(5, math.ceil(stall_steps / cost.every)))
      if verdict != 'falling' and vanished(track):
        verdict = 'no_gradient'
      log(f'  {name} step {step}: {target.shown(curve[-1][1])}'
          + (f", B_noise {_reading(track[-1]['b_noise'])}" if track else '')
          + {'plateau': ' (initial plateau)', 'no_gradient': ' (no gradient)'}.get(verdict, ''))
      if len(seconds) == 1:
        settle()  # after the whole split, timed (step 0's was a single batch)
      if curve[-1][1] <= target.threshold and len(curve) - 1 in subset:
        confirm(step, state)
      if curve[-1][1] <= target.threshold:
        stopped = 'reached'
        break
      if verdict in ('stalled', 'no_gradient'):
        stopped = verdict
        break
      if past():
        stopped = 'time'
        break
      mark, since = time.perf_counter(), 0
  return {'curve': curve, 'K': steps_model.reached(curve, target.threshold),
          'step_seconds': seconds, 'noise': track, 'stopped': stopped, 'progress': verdict,
          'metric': cost.to_dict(), 'state': state,
          'first_step_s': first}  # its first step: compiling it, and the loop's start


class _MetricCost:
  """How the serial run measures the target's metric, and what that costs: at most `share` of
  its training, every evaluation after step 0's counted (step 0's compiles the evaluation,
  reads the split and starts the curve on all of it).

  Step 0's evaluation is timed batch by batch: `batch_seconds`, the median of its batches
  after the first (which compiles). At the end of the first window of `every` steps, where
  the whole split costs more than `READINGS` of the share of a window, the readings take the
  split's first whole evaluation batches that fit (at least one; the same examples every
  time), and where one batch costs more, evaluations that much further apart. The rest of
  the share is what a subset's reading at the target may be read again on more of the split
  with (`confirming`). Where step 0 read a single batch (no time after the compiling one),
  the first window's evaluation reads the whole split, timed, and the subset follows it."""

  READINGS = 1 / 2  # of the share, the readings'; the rest confirms a subset's at the target
  MARGIN = 0.1  # a confirmation's estimated cost × (1 + MARGIN) fits in what is left

  def __init__(self, source, target, batch: int, every: int, share: float):
    from jaxpar.evaluation import split_size
    self.total = split_size(source, target.split)
    self.batch, self.every, self.share = min(batch, self.total), every, share
    self.examples = 0  # 0: the whole split
    self.eval_seconds, self.train_seconds, self.last_se, self.settled = [], 0.0, None, False
    self.batch_seconds = None  # an evaluation batch's time, from step 0's evaluation
    # The subset's readings × scale: its bias against more of the split, read where the
    # subset first reads the target (`confirming`).
    self.scale, self.confirmations, self.confirm_seconds = 1.0, [], 0.0

  def batches(self, examples: int) -> int:
    return math.ceil(examples / self.batch)

  def evaluated(self, seconds: float, standard_error) -> None:
    self.eval_seconds.append(seconds)
    self.last_se = standard_error

  def clocked(self, clock: list) -> None:
    """Step 0's evaluation's clock (`evaluation.evaluate`'s): `batch_seconds` where it read
    a batch after the first."""
    times = np.diff(clock)[1:]
    if len(times):
      self.batch_seconds = float(np.median(times))

  def trained(self, seconds: float) -> None:
    self.train_seconds += seconds

  def settle(self, step_seconds: float) -> bool:
    """At the end of the first window of steps (`step_seconds` a step): the subset and
    spacing that keep the readings within `READINGS` × `share`; True where they changed."""
    if self.settled or not self.share:
      return False
    self.settled = True
    if self.batch_seconds is None:  # the whole split, timed just now
      self.batch_seconds = self.eval_seconds[-1] / self.batches(self.total)
    allowed = self.READINGS * self.share * self.every * step_seconds
    if self.batch_seconds * self.batches(self.total) <= allowed:
      return False
    batches = max(1, int(allowed / self.batch_seconds + 1e-9))
    self.examples = min(self.total, batches * self.batch)
    over = self.batch_seconds * batches / allowed
    if over > 1:
      self.every = math.ceil(self.every * over - 1e-9)
    return True

  def on_subset(self) -> bool:
    return 0 < self.examples < self.total

  def spent(self) -> float:
    """Seconds the metric has cost: the evaluations after step 0's, and the confirmations."""
    return sum(self.eval_seconds[1:]) + self.confirm_seconds

  def confirming(self) -> int:
    """The examples a subset's reading at the target is read again on: as many of the
    split's first as fit in what is left of `share` of the training so far, with `MARGIN` in
    hand (whole evaluation batches, the whole split where it fits); 0 where that is under
    twice the subset (no wider view) or no subset is read. The subset is the same examples
    every time: its error is a bias, not noise — the seed whose whole split read 0.581 and
    0.474 at steps 160 and 200 read 0.533 and 0.404 on its first 256 examples, K 169
    against 195."""
    if not self.on_subset():
      return 0
    # What is left, less a tenth kept in hand for the clock's noise; a confirmation costs a
    # reading (its call's own time included) and a batch's time for each further batch.
    left = (self.share * self.train_seconds - self.spent()) / (1 + self.MARGIN)
    own = self.batches(self.examples)
    # The readings after the first window's (which read the whole split where step 0 had
    # no batch to time).
    reading = (float(np.median(self.eval_seconds[2:])) if len(self.eval_seconds) > 2
               else self.batch_seconds * own)
    if left < reading:
      return 0
    batches = min(self.batches(self.total),
                  own + int((left - reading) / self.batch_seconds + 1e-9))
    examples = min(self.total, batches * self.batch)
    return examples if examples >= 2 * self.examples else 0

  def confirmed(self, step: int, own: float, wider: float, examples: int,
                seconds: float) -> float:
    """Records a confirmation (the subset read `own`, `examples` read `wider`); the scale
    becomes wider / own. Returns the factor the readings so far change by."""
    self.confirm_seconds += seconds
    self.confirmations.append({'step': step, 'subset': own, 'examples': examples,
                               'value': wider})
    scale = wider / own if own > 0 else 1.0
    rescale, self.scale = scale / self.scale, scale
    return rescale

  def describe(self) -> str:
    whole = self.batch_seconds * self.batches(self.total)
    return (f'the metric on the first {self.examples} of {self.total} examples every '
            f'{self.every} steps (the whole split {whole:.2f} s, {self.batches(self.total)} '
            f'batches of {self.batch_seconds:.3f} s; its readings within '
            f'{self.READINGS * self.share:.0%} of the steps, the rest of the budget of '
            f'{self.share:.0%} for reading again at the target)')

  def to_dict(self) -> dict:
    timed = self.eval_seconds[1:]  # the first compiles and reads the split
    return {'examples': self.examples or self.total, 'of': self.total, 'every': self.every,
            'eval_seconds': float(np.median(timed)) if timed else None,
            'batch_seconds': self.batch_seconds,
            'share': self.spent() / self.train_seconds if self.train_seconds else None,
            'budget': self.share,
            'standard_error': self.last_se, 'confirmed': self.confirmations}


def _reading(b_noise) -> str:
  return f'{b_noise:.1f}' if b_noise is not None else 'not estimable (|G|² estimate ≤ 0)'


def save_seconds(state, step=None, repeats: int = 3) -> float:
  """What a checkpoint save of `state` costs a run, in seconds: the median of `repeats`
  saves made as training makes them (`checkpoint.Checkpoints`, into a temporary folder),
  after a first one that sets orbax up.

  orbax writes in the background while training goes on, so with `step` (the run's loop:
  state -> (state, metrics)) the cost is the one a run pays: m steps after a save, its
  writing waited for, less m steps without one, m the steps the writing lasts (where every
  core trains, the writing takes its time from those steps; where one is free, little).
  Without `step`, a save written and waited for alone."""
  import tempfile

  from jaxpar.checkpoint import Checkpoints

  def run(state, n):  # n steps dispatched as training dispatches them, then waited for
    for _ in range(n):
      state, metrics = step(state)
    jax.block_until_ready((state, metrics))
    return state

  with tempfile.TemporaryDirectory(prefix='jaxpar-plan-save-') as folder:
    checkpoints = Checkpoints(folder, every=1, keep=1)
    written = []
    for i in range(repeats + 1):
      start = time.perf_counter()
      checkpoints.save(i, state, force=True)
      checkpoints.manager.wait_until_finished()
      written.append(time.perf_counter() - start)
    cost = float(np.median(written[1:]))
    if step is not None:
      start = time.perf_counter()
      state = run(state, 5)
      steps = max(1, math.ceil(cost / ((time.perf_counter() - start) / 5)))
      costs = []
      for i in range(repeats + 1, 2 * repeats + 1):
        start = time.perf_counter()
        state = run(state, steps)
        plain = time.perf_counter() - start
        start = time.perf_counter()
        checkpoints.save(i, state, force=True)
        state = run(state, steps)
        checkpoints.manager.wait_until_finished()
        costs.append(time.perf_counter() - start - plain)
      cost = max(0.0, float(np.median(costs)))
    checkpoints.close()
  return cost


def noise_probe(cfg, model, source, count: int):
  """variables → {'b_noise', 'g2', 's', 'batch_g2'}: `count` gradients of batch b at those
  weights, from a stream apart from training's (`noise_scale.device_norms` of them).
  'b_noise' is None where the estimate of |G|² is not positive (the gradients' noise swamps
  their mean: no reading at those weights; JSON has no NaN); 'batch_g2' is |G_s|², the mean
  squared norm of one batch's gradient (`vanished`)."""
  from jaxpar import build
  from jaxpar.step import gradients
  one = model.clone(bn_axis_name=None)
  b = cfg.per_device_batch
  stream = build.train_batches(cfg, source, b, 0)
  grad = jax.jit(lambda v, batch: gradients(one, v['params'], v['batch_stats'], batch,
                                            jax.random.key(0))[0])

  def probe(variables):
    variables = jax.device_get(variables)
    variables = {'params': variables['params'], 'batch_stats': variables.get('batch_stats', {})}
    grads = [grad(variables, next(stream)) for _ in range(count)]
    stacked = jax.tree.map(lambda *g: np.stack(g), *grads)
    small, big = noise_scale.device_norms(stacked)
    g2, trace = noise_scale.two_batch_estimates(small, big, b, count * b)
    return {'g2': g2, 's': trace, 'b_noise': trace / g2 if g2 > 0 else None, 'batch_g2': small}
  return probe


# Readings in a row of every batch's gradient exactly zero that stop a run (`vanished`).
VANISHED_READINGS = 2


def vanished(track: list, readings: int = VANISHED_READINGS) -> bool:
  """The noise probe's last `readings` readings (`noise_probe`, along a run) found every
  batch's gradient exactly zero: no unit passes a gradient back to any weight (ReLUs that
  every example leaves negative: SqueezeNet as published, at 32², whose classifier's ReLUs
  die in its first 50 steps), so no number of steps moves the loss. A curve on its initial
  plateau still has gradients (GoogLeNet at ln 10 for its first ~60 steps: |G_s|² > 0),
  and a curve that falls is never judged so."""
  recent = track[-readings:]
  return len(recent) == readings and all(t.get('batch_g2') == 0 for t in recent)


# =============================================================================== steps and gradients
def synthetic_batch(rows: int, cfg, meta, seed=0):
  rng = np.random.default_rng(seed)
  return {'image': rng.normal(size=(rows, cfg.image_size, cfg.image_size, meta['channels']))
          .astype(np.float32),
          'label': rng.integers(0, meta['num_classes'], rows).astype(np.int32)}


def gradient_call(cfg, meta, batch: int, devices: int = 1, variables=None):
  """t_grad's call: a function computing the gradients of one batch on this process's first
  device, blocking until they are ready (stacked on a leading device axis). With `devices`
  > 1, each of the first `devices` computes its own batch at once, as one program on all
  of them (its own gradients on each, nothing exchanged; one compile, not one a device):
  t_grad under the contention of an N-device step (emulated CPU devices share the cores).
  The weights: `variables` (the network's initial ones, `initial_variables`; made here
  without them)."""
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxpar import build
  from jaxpar.mesh import make_mesh
  from jaxpar.step import gradients

  targets = jax.local_devices()[:devices]
  model = build.model(cfg, meta['num_classes'], meta['channels'],
                      make_mesh(cfg.mesh.shape, cfg.mesh.axes, targets[:1], cfg.bn_group_size))
  model = model.clone(bn_axis_name=None)  # BatchNorm over the device's own batch
  if variables is None:
    variables = initial_variables(cfg, meta)
  variables = {'params': variables['params'], 'batch_stats': variables.get('batch_stats', {})}
  data = synthetic_batch(batch, cfg, meta)
  rng = jax.random.key(1)
  # Each device its own copy of the weights and its own batch, stacked on a device axis.
  mesh = jax.sharding.Mesh(np.array(targets), ('device',))
  stack = lambda tree: jax.tree.map(lambda x: np.stack([np.asarray(x)] * devices), tree)
  each = lambda tree: jax.tree.map(lambda x: x[0], tree)
  grads = jax.jit(jax.shard_map(
      lambda v, x: jax.tree.map(lambda y: y[None], gradients(model, *each(
          (v['params'], v['batch_stats'], x)), rng)),
      mesh=mesh, in_specs=P('device'), out_specs=P('device')))
  placed = jax.device_put(stack((variables, data)), NamedSharding(mesh, P('device')))

  def call():
    return jax.block_until_ready(grads(*placed))
  return call


def stand_in_gradients(model, params, batch_stats, batch, rng, micro_batches=1,
                       loss_scale=None):
  """`step.gradients`' results without the network: the weights × a small factor read from
  the batch (nothing XLA can fold away), typed per device as real gradients are, the BN
  statistics as they were, and a loss and accuracy per device."""
  del model, rng, micro_batches, loss_scale
  label = batch['label'].astype(jnp.float32)
  factor = 1e-6 * (1.0 + jnp.mean(label))
  grads = jax.tree.map(lambda p: p * factor.astype(p.dtype), params)
  return grads, batch_stats, {'loss': jnp.mean(label), 'accuracy': jnp.mean(label)}


def update_call(cfg, meta, variables, devices=None, repeats: int = 1, gradients: bool = False):
  """(collectives of the lowered program, `call()`): the candidate's step with its gradients
  stood in for (`stand_in_gradients`): what its strategy does beside the network — the
  exchange, packing and unpacking, the update, conditionals — on the config's mesh of
  `devices` (default the first N of every process's), or on one device of this process
  (`devices=jax.local_devices()[:1]`: each process alone, at once); with `gradients`, the
  real step (the network's gradients computed), on a synthetic batch. `call()` runs
  `repeats` steps and blocks."""
  from jaxpar import build
  from jaxpar import config as config_lib
  from jaxpar.mesh import make_mesh
  from jaxpar.perfmodel import hlo
  from jaxpar.step import make_train_step, to_global

  n = config_lib.num_devices(cfg)
  devices = devices if devices is not None else jax.devices()[:n]
  mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axes, devices, cfg.bn_group_size)
  model, strategy, tx, state = build.for_timing(cfg, meta['num_classes'], meta['channels'],
                                               mesh, variables=variables)
  step = make_train_step(model, tx, mesh, strategy, cfg.grad_accum_steps,
                         gradients_of=None if gradients else stand_in_gradients)
  local = len([d for d in devices if d.process_index == jax.process_index()])
  rows = config_lib.global_batch(cfg) * local // len(devices)
  batch = to_global(mesh, synthetic_batch(rows, cfg, meta))
  rng = jax.random.key(1)
  collectives = hlo.collectives(step.lower(state, batch, rng).as_text())
  box = {'state': state}

  def call():
    for _ in range(repeats):
      box['state'], metrics = step(box['state'], batch, rng)
    jax.block_until_ready(metrics)
  return collectives, call


def input_seconds(cfg, source, rows: int, batches: int = 20, seconds: float = 2.0) -> float:
  """t_in(rows): the CPU seconds this process spends (every thread: tf.data's map and batch
  threads, the loop's own) producing one batch of `rows` examples of `cfg`'s training
  stream and placing it on its first local device, as the loop does
  (`pipeline.prefetch_to_device`), in steady state: 3 batches first (the pipeline starts,
  the shuffle buffer fills) and a pause (its prefetch buffers fill, so that the batches
  counted are the batches made), then `batches` batches or `seconds` (at least 3), nothing
  else running. On the CPU backend this work shares the cores with the step's."""
  from jaxpar import build
  from jaxpar.data import pipeline
  from jaxpar.mesh import make_mesh

  mesh = make_mesh((1,), ('data',), jax.local_devices()[:1])
  stream = pipeline.prefetch_to_device(
      build.train_batches(cfg, source, rows * jax.process_count(), 0), mesh)
  try:
    for _ in range(3):
      jax.block_until_ready(next(stream))
    time.sleep(0.2)
    cpu, wall, n = time.process_time(), time.perf_counter(), 0
    while n < batches and (n < 3 or time.perf_counter() - wall < seconds):
      jax.block_until_ready(next(stream))
      n += 1
    return (time.process_time() - cpu) / n
  finally:
    stream.close()


def step_call(cfg, meta, source, variables, lower: bool = True):
  """A candidate's step on the first N devices (Downpour: one applied push; on Ray's
  actors, with the driver's one device: `build.driver_mesh`): (the collectives of its lowered
  program — None without `lower`, for a candidate whose twin's were read: `Candidate.
  exchange` —, `window(k)`: the mean time of k steps of the training loop on `source`'s
  batches — dispatched ahead as training does, blocked at the end; its first call compiles
  the program (lowered here, or traced then) and starts from `variables`, the network's
  initial weights, made once for every candidate: `initial_variables`; each window after
  one step untimed). `window.close()`
  ends its loop; a later window starts another from the initial weights, with the program
  compiled."""
  from jaxpar import build
  from jaxpar import config as config_lib
  from jaxpar.mesh import make_mesh
  from jaxpar.perfmodel import hlo
  from jaxpar.step import make_train_step, to_global

  if config_lib.on_ray(cfg):
    mesh = build.driver_mesh(cfg)
  else:
    n = config_lib.num_devices(cfg)
    mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axes, jax.devices()[:n], cfg.bn_group_size)
  box = {}

  def program():
    # Lowered from the state's shapes (taken from `variables`, not traced again): most
    # candidates are never timed, and making a state compiles and runs the initialisation
    # (SqueezeNet at 16² on 2 emulated devices: 2.3-2.7 s of a candidate's 4-5 s; the
    # lowered program is the same text).
    if 'step' not in box:
      box['model'], box['strategy'], box['tx'], box['shapes'] = build.for_timing(
          cfg, meta['num_classes'], meta['channels'], mesh, abstract=True, variables=variables)
      # Downpour is no one program: its loop (`build.loop`) runs the workers' pushes.
      box['step'] = None if cfg.scheme == 'async' else make_train_step(
          box['model'], box['tx'], mesh, box['strategy'], cfg.grad_accum_steps)
    return box

  collectives = None
  if lower:
    batch = to_global(mesh, synthetic_batch(config_lib.global_batch(cfg) // jax.process_count(),
                                             cfg, meta))
    # The loop calls this `step`: jit keeps its trace (1.3-2.4 s for that SqueezeNet) and,
    # once called, its compiled program for the next loop.
    collectives = hlo.collectives(
        program()['step'].lower(box['shapes'], batch, jax.random.key(1)).as_text())

  def window(k: int) -> float:
    if 'loop' not in box:  # from the latest state (the step donates the one it is given)
      made = program()
      state = build.timing_state(cfg, made['model'], made['tx'], made['strategy'],
                                 meta['channels'], mesh, variables=variables)
      box['loop'] = build.loop(cfg, made['model'], made['tx'], mesh, made['strategy'], source,
                               state, 10**6, jax.random.key(1), train_step=made['step'])
      box['state'], metrics = box['loop'](state)
      jax.block_until_ready(metrics)
    # One step untimed: a loop left waiting while other rows took their windows wakes, and
    # across processes the next step starts with every process in step (the first waits in
    # its collectives for a process still waking). k consecutive steps hold k/τ of Local
    # SGD's averages wherever they start.
    box['state'], metrics = box['loop'](box['state'])
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(k):
      box['state'], metrics = box['loop'](box['state'])
    jax.block_until_ready(metrics)
    return (time.perf_counter() - start) / k

  def close():
    if 'loop' in box:
      box.pop('loop').close()
      box.pop('state')

  window.close = close
  return collectives, window
