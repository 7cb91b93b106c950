"""Time to accuracy: the steps K each scheme needs to reach a target training loss, a model
of K fitted on some settings and judged on the others, and K × t_step per scheme and N.

  python -m analysis.accuracy.tta --config configs/squeezenet.py --config.image_size=16 \\
      --out squeezenet16.json --report report/ [--steps_json squeezenet.json]

Each case trains from the same initial weights on emulated devices (the updates are
exactly the scheme's; only their timing is not real, and none is used) until the loss on
the whole training set (unaugmented, every example once) reaches --target_loss,
evaluated every --eval_every steps; K is the step it is first reached (interpolated in
log-loss from the evaluation before; capped runs are reported as not reached). At K the
test top-1 is recorded with its binomial standard error. The families:

  batch      sync-join (all-reduce) at global batch B: N = B/b devices of b = --batch
             each (B < b: one device at B). B = b is the serial run, and sync-split's K
             at any N (it computes the serial maths).
  staleness  the staleness simulator (`staleness`), one device, batch b: each update
             applies the gradient of the weights s versions old.
  async      Downpour on N worker devices (threads), staleness as it occurs.
  period     Local SGD on --workers devices averaging every τ steps (τ = 1: synchronous).
  capacity   sparsified gossip on --workers devices sending a fraction q (q = 1: dense).

Every case runs at the config's learning rate (scaled by its rule to the case's batch)
times each of --lr_factors, for --seeds seeds; a case's K is the best factor's mean over
seeds (which factor: in the JSON and the report). Along the serial run the gradient noise
scale B_noise is measured at every evaluation from --noise_batches gradients of batch b
at the current weights (`noise_scale`). `steps_model` fits each family on its --fit_*
settings and is judged on the others; the batch model also with the measured B_noise, K_min
fitted on the serial run alone. With --steps_json (an `analysis.steptime.measure` JSON) the
time to the target is K × the measured step time for every scheme × server × N measured
there, and the fastest is recommended; `end_to_end` checks that prediction on real
processes.
"""
import copy
import datetime
import json
import math
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402
import numpy as np  # noqa: E402
import tqdm  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxpar.perfmodel import steps_model  # noqa: E402
from jaxpar.plan import probe, staleness  # noqa: E402

FAMILIES = ('batch', 'staleness', 'async', 'period', 'capacity')
FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].', lock_config=False)
  flags.DEFINE_string('out', None, 'The JSON file to write.')
  flags.DEFINE_string('report', '', 'A folder for report.md and the plots (empty: none).')
  flags.DEFINE_string('steps_json', '', "An analysis.steptime.measure JSON: time to the "
                      "target = K × its measured step times.")
  flags.DEFINE_float('target_loss', 0.3, 'The training-set loss to reach.')
  flags.DEFINE_integer('max_steps', 1500, 'Steps after which a run counts as not reaching it.')
  flags.DEFINE_integer('eval_every', 20, 'Steps between evaluations of the training-set loss.')
  flags.DEFINE_integer('seeds', 2, 'Seeds of every case and learning rate.')
  flags.DEFINE_list('lr_factors', ['0.5', '1', '2'], "Factors on the config's learning rate.")
  flags.DEFINE_list('families', list(FAMILIES), 'Families of cases to run.')
  flags.DEFINE_integer('batch', 16, 'b: one device\'s batch.')
  flags.DEFINE_integer('devices', 8, 'Emulated CPU devices (the largest N).')
  flags.DEFINE_integer('workers', 4, 'N of the period and capacity families.')
  flags.DEFINE_list('batch_sizes', ['8', '16', '32', '64', '128'], 'B of the batch family.')
  flags.DEFINE_list('fit_batch', ['16', '32'], 'B the batch model is fitted on.')
  flags.DEFINE_list('staleness', ['0', '1', '3', '7'], 's of the staleness family.')
  flags.DEFINE_list('fit_staleness', ['0', '1'], 's the staleness model is fitted on.')
  flags.DEFINE_list('async_workers', ['2', '4'], 'N of the async family.')
  flags.DEFINE_list('periods', ['1', '2', '4', '8', '16'], 'τ of the period family.')
  flags.DEFINE_list('fit_periods', ['1', '4'], 'τ the period model is fitted on.')
  flags.DEFINE_list('capacities', ['1', '0.1', '0.01'], 'q of the capacity family.')
  flags.DEFINE_list('fit_capacities', ['1', '0.1'], 'q the capacity model is fitted on.')
  flags.DEFINE_integer('noise_batches', 8, 'Gradients per noise-scale measurement (0: none).')


# =============================================================================== the cases
def _numbers(values, kind=float):
  return [kind(v) for v in values]


def plan(args) -> list[dict]:
  """Every case as {'family', 'x', 'overrides'} (config paths → values), from the flags;
  bad flags raise app.UsageError naming the flag, before anything compiles."""
  families = list(args.families)
  unknown = sorted(set(families) - set(FAMILIES))
  if unknown:
    raise app.UsageError(f'--families: {unknown} unknown; choose from {list(FAMILIES)}.')
  b, devices = args.batch, args.devices
  for name in ('batch', 'devices', 'workers', 'max_steps', 'eval_every', 'seeds'):
    if getattr(args, name) < 1:
      raise app.UsageError(f'--{name}={getattr(args, name)}: must be at least 1.')
  if args.target_loss <= 0:
    raise app.UsageError(f'--target_loss={args.target_loss}: must be positive.')
  if args.workers > devices and {'period', 'capacity'} & set(families):
    raise app.UsageError(f'--workers={args.workers}: more than --devices={devices}.')
  cases = []
  sync = {'scheme': 'sync-join', 'server': 'allreduce'}
  if 'batch' in families:
    for big in _numbers(args.batch_sizes, int):
      n = max(1, big // b)
      if big < 1 or (big > b and (big % b or n > devices)):
        raise app.UsageError(f'--batch_sizes: {big} is not below --batch={b} nor a multiple '
                             f'of it on at most --devices={devices} devices.')
      cases.append({'family': 'batch', 'x': big, 'devices': n,
                    'overrides': {**sync, 'per_device_batch': big // n}})
  if 'staleness' in families:
    for s in _numbers(args.staleness, int):
      if s < 0:
        raise app.UsageError(f'--staleness: {s} is negative.')
      cases.append({'family': 'staleness', 'x': s, 'devices': 1,
                    'overrides': {**sync, 'per_device_batch': b}})
  if 'async' in families:
    for n in _numbers(args.async_workers, int):
      if not 1 <= n <= devices:
        raise app.UsageError(f'--async_workers: {n} is not within 1..--devices={devices}.')
      cases.append({'family': 'async', 'x': n, 'devices': n,
                    'overrides': {'scheme': 'async', 'server': 'central', 'per_device_batch': b,
                                  'async_sgd.backend': 'threads'}})
  if 'period' in families:
    for tau in _numbers(args.periods, int):
      if tau < 1:
        raise app.UsageError(f'--periods: {tau} is below 1.')
      cases.append({'family': 'period', 'x': tau, 'devices': args.workers,
                    'overrides': {**sync, 'per_device_batch': b, 'sync_every': tau}})
  if 'capacity' in families:
    for q in _numbers(args.capacities):
      if not 0 < q <= 1:
        raise app.UsageError(f'--capacities: {q} is not within (0, 1].')
      cases.append({'family': 'capacity', 'x': q, 'devices': args.workers,
                    'overrides': {'scheme': 'sync-join', 'server': 'gossip', 'per_device_batch': b,
                                  'sparsify.capacity': 0.0 if q == 1 else q}})
  for family, fit_flag, values in (('batch', 'fit_batch', args.batch_sizes),
                                   ('staleness', 'fit_staleness', args.staleness),
                                   ('period', 'fit_periods', args.periods),
                                   ('capacity', 'fit_capacities', args.capacities)):
    fit = set(_numbers(getattr(args, fit_flag)))
    if family in families and not (len(fit) >= 2 and fit <= set(_numbers(values))):
      raise app.UsageError(f'--{fit_flag}: give two or more of the measured settings '
                           f'{list(values)}; the others are held out.')
  if not cases:
    raise app.UsageError('--families: no case to run.')
  return cases


def case_config(base, case: dict, seed: int, lr_factor: float, max_steps: int):
  """The base config with the case's method, its mesh of `case['devices']` devices, the
  seed, the learning rate × factor at a constant schedule (K must not depend on the run's
  length) and nothing but training (no checkpoints, no periodic evaluation)."""
  from analysis.steptime.measure import grid_overrides
  from jaxpar import validation
  c = copy.deepcopy(base)
  c.unlock()
  # What belongs to another server or method is reset as in `measure`'s grid (e.g.
  # configs/thesis.py's placement for the distributed server), then the case's own.
  overrides = case['overrides']
  c.update_from_flattened_dict({**grid_overrides(base, overrides['scheme'], overrides['server'],
                                                 case['devices']), **overrides})
  c.global_batch = case['devices'] * c.per_device_batch
  c.seed = seed
  c.optimizer.base_lr = base.optimizer.base_lr * lr_factor
  c.optimizer.schedule = 'constant'
  c.total_steps = max_steps
  c.eval_every = 0
  c.checkpoint_every = max_steps
  if c.scheme != 'async':
    c.async_sgd.backend = 'threads'
  validation.validate(c)
  return c


# =============================================================================== one case
def run_case(cfg, case: dict, source, target: float, eval_every: int, noise_batches: int = 0):
  """Trains `cfg` until the training-set loss reaches `target` or `cfg.total_steps`:
  {'curve': [(step, loss)], 'clock': [(step, seconds)], 'K', 'top1', 'top1_stderr',
  'staleness'?, 'noise'?}. The clock is the training time from the end of step 1 (whose
  call compiles) to each evaluation, the evaluations themselves excluded; on a device mesh
  of real processes it is the wall time a run pays (`end_to_end`)."""
  from jaxpar import build
  from jaxpar import config as config_lib
  from jaxpar.evaluation import evaluate
  from jaxpar.mesh import make_mesh
  from jaxpar.step import make_eval_step

  # Downpour on Ray: this process is the driver, the workers are Ray's actors.
  devices = jax.devices()[:1 if config_lib.on_ray(cfg) else case['devices']]
  mesh = make_mesh((len(devices),), ('data',), devices)
  model = build.model(cfg, source.num_classes, source.channels, mesh)
  method = build.strategy(cfg, mesh, model)
  tx, _ = build.optimizer(cfg, model, source.channels, method, config_lib.global_batch(cfg),
                          cfg.total_steps)
  rng_init, rng_dropout = build.seed_keys(cfg.seed)
  state = build.initial_state(cfg, model, tx, method, source.channels, mesh, rng_init)
  eval_step = make_eval_step(model, mesh)
  noise = probe.noise_probe(cfg, model, source, noise_batches) if noise_batches else None

  def train_loss(variables):
    return evaluate(eval_step, variables, mesh, source, cfg, split='train')['loss']

  curve, noise_track, stale = [(0, train_loss(method.variables(state)))], [], []
  clock = []
  if case['family'] == 'staleness':
    initial = jax.device_get(method.variables(state))
    initial = {'params': initial['params'], 'batch_stats': initial.get('batch_stats', {})}
    variables = _simulate(cfg, model, initial, rng_dropout, source, case['x'], eval_every, curve,
                          train_loss, target)
  else:
    loop = build.loop(cfg, model, tx, mesh, method, source, state, cfg.total_steps, rng_dropout)
    elapsed, mark = 0.0, None
    for step in range(1, cfg.total_steps + 1):
      state, metrics = loop(state)
      if step == 1:
        jax.block_until_ready((state, metrics))
        mark = time.perf_counter()
      if 'staleness' in metrics:
        stale.append(int(metrics['staleness']))
      if step % eval_every == 0:
        state = jax.block_until_ready(loop.synced(state))
        elapsed += time.perf_counter() - mark
        clock.append((step, elapsed))
        variables = method.variables(state)
        curve.append((step, train_loss(variables)))
        if noise:
          noise_track.append({'step': step, 'loss': curve[-1][1], **noise(variables)})
        if curve[-1][1] <= target:
          break
        mark = time.perf_counter()
    state = loop.synced(state)
    loop.close()
    variables = method.variables(state)
  test = evaluate(eval_step, variables, mesh, source, cfg)
  p, count = test['top1'], test['count']
  out = {'curve': curve, 'clock': clock, 'K': steps_model.reached(curve, target), 'top1': p,
         'top1_stderr': math.sqrt(max(p * (1 - p), 0.0) / count)}
  if stale:
    out['staleness'] = {'mean': float(np.mean(stale)), 'max': int(max(stale))}
  if noise_track:
    out['noise'] = noise_track
  return out


def _simulate(cfg, model, variables, rng, source, s, eval_every, curve, train_loss, target):
  """The staleness family: `staleness.train` on one device from `variables`, at the
  config's optimizer, dropout keyed as the train step keys it (`probe.delayed_inputs`): at
  s = 0 exactly the serial run."""
  grad_fn, tx, items = probe.delayed_inputs(cfg, model, source, cfg.total_steps, rng)
  box = {'variables': variables}

  class Reached(Exception):
    pass

  def on_step(k, params, batch_stats):
    box['variables'] = {'params': params, 'batch_stats': batch_stats}
    if k % eval_every == 0:
      curve.append((k, train_loss(box['variables'])))
      if curve[-1][1] <= target:
        raise Reached
  try:
    staleness.train(grad_fn, tx, variables['params'], variables['batch_stats'], items, s,
                    cfg.total_steps, on_step)
  except Reached:
    pass
  return box['variables']


# =============================================================================== the whole run
def measure(base, args, argv) -> dict:
  from analysis.steptime.measure import machine, versions
  from jaxpar import config as config_lib
  from jaxpar import optim
  from jaxpar.data import sources
  cases = plan(args)
  factors = _numbers(args.lr_factors)
  configs = [(case, seed, f, case_config(base, case, seed, f, args.max_steps))
             for case in cases for seed in range(args.seeds) for f in factors]
  source = sources.open_source(base.dataset)
  runs = []
  serial = {'family': 'batch', 'x': args.batch}
  noise_factor = 1.0 if 1.0 in factors else factors[0]
  with tqdm.tqdm(total=len(configs), unit='run', dynamic_ncols=True) as bar:
    for case, seed, factor, cfg in configs:
      bar.set_description(f"{case['family']} {case['x']} lr×{factor:g} seed {seed}")
      # B_noise along one serial run: the first seed, at the config's own rate if run
      probe = args.noise_batches if ((case['family'], case['x']) == tuple(serial.values())
                                     and seed == 0 and factor == noise_factor) else 0
      started = time.perf_counter()
      result = run_case(cfg, case, source, args.target_loss, args.eval_every, probe)
      runs.append({'family': case['family'], 'x': case['x'], 'devices': case['devices'],
                   'seed': seed, 'lr_factor': factor,
                   'lr': optim.peak_learning_rate(cfg.optimizer, config_lib.global_batch(cfg)),
                   'seconds': time.perf_counter() - started, **result})
      bar.update()
  return {'tool': 'analysis.accuracy.tta',
      'created': datetime.datetime.now().isoformat(timespec='seconds'),
      'command': ' '.join(['python -m analysis.accuracy.tta', *argv[1:]]),
      'machine': machine(), 'versions': versions(), 'config': base.to_dict(), 'network': base.model,
      'image_size': base.image_size, 'target_loss': args.target_loss,
      'max_steps': args.max_steps, 'eval_every': args.eval_every, 'batch': args.batch,
      'workers': args.workers, 'lr_factors': factors, 'seeds': args.seeds,
      'fit_on': {'batch': _numbers(args.fit_batch), 'staleness': _numbers(args.fit_staleness),
                 'period': _numbers(args.fit_periods),
                 'capacity': _numbers(args.fit_capacities)},
      'runs': runs}


# =============================================================================== analysis
def steps_by_case(result) -> dict:
  """{(family, x): {'K': mean over seeds at the best factor (None: not reached by every
  seed at any), 'lr_factor', 'Ks': every seed's K at it, 'by_factor': {f: [K…]}}}."""
  table = {}
  for run in result['runs']:
    entry = table.setdefault((run['family'], run['x']), {'by_factor': {}})
    entry['by_factor'].setdefault(run['lr_factor'], []).append(run['K'])
  for entry in table.values():
    complete = {f: ks for f, ks in entry['by_factor'].items() if None not in ks}
    if complete:
      best = min(complete, key=lambda f: np.mean(complete[f]))
      entry.update(K=float(np.mean(complete[best])), lr_factor=best, Ks=complete[best])
    else:
      entry.update(K=None, lr_factor=None, Ks=[])
  return table


_FAMILIES = (  # family → (the scheme it stands for, the setting's name)
    ('batch', 'sync-join (serial at b)', 'global batch B'),
    ('async', 'async (Downpour)', 'workers N'),
    ('period', 'Local SGD', 'averaging period τ'),
    ('staleness', 'staleness simulator', 'staleness s'),
    ('capacity', 'gossip', 'fraction sent q'),
)


def summary_table(results) -> str:
  """One row per family of cases: each setting's steps K to the target (the mean over seeds
  at the best rate factor; — where not every seed reached it). A family measured in several
  results is taken from the last (e.g. a longer staleness run) — the README's table."""
  families = {}
  for result in results:
    cases = steps_by_case(result)
    for family in {f for f, _ in cases}:
      families[family] = (result, {x: e for (f, x), e in cases.items() if f == family})
  lines = ['| scheme | setting | steps K to the target, by setting |', '|---|---|---|']
  for family, scheme, setting in _FAMILIES:
    if family not in families:
      continue
    result, cases = families[family]
    cells = ' · '.join(f"{x:g}: {'—' if e['K'] is None else round(e['K'])}"
                       for x, e in sorted(cases.items()))
    across = f", N = {result['workers']}" if family in ('period', 'capacity') else ''
    lines.append(f'| {scheme}{across} | {setting} | {cells} |')
  return '\n'.join(lines)


def fits(result) -> list[dict]:
  """Each family's model fitted on its fit_on settings (every seed's K at each setting's
  best factor) and judged on the others."""
  table = steps_by_case(result)
  out = []
  for family, model in steps_model.MODELS.items():
    points = [(x, k) for (f, x), e in sorted(table.items()) if f == family for k in e['Ks']]
    fit_on = set(result['fit_on'].get(family, ()))
    if len({x for x, _ in points if x in fit_on}) < 2:
      continue
    out.append(steps_model.held_out(model, points, fit_on))
  # The batch model again with B_noise as measured along the serial run, K_min fitted on
  # that run's batch alone: every other batch size held out.
  measured = [p['b_noise'] for p in noise_track(result) if _estimated(p['b_noise'])]
  points = [(x, k) for (f, x), e in sorted(table.items()) if f == 'batch' for k in e['Ks']]
  if measured and result['batch'] in {x for x, _ in points}:
    model = steps_model.batch_with_noise_scale(float(np.median(measured)))
    out.append(steps_model.held_out(model, points, [result['batch']]))
  return out


def _estimated(b_noise) -> bool:
  """A reading of B_noise: None (NaN in results written before) where |G|² was not."""
  return b_noise is not None and math.isfinite(b_noise)


def noise_track(result) -> list[dict]:
  return [point for run in result['runs'] if 'noise' in run for point in run['noise']]


def measured_batch(measured: dict):
  """The b of an `analysis.steptime.measure` JSON: its batch per scheme ({'sync-split':
  whole, 'sync-join': per device, 'async': per push}) when all are one number, else them."""
  sizes = set(measured.get('batch', {}).values())
  return sizes.pop() if len(sizes) == 1 else measured.get('batch')


def time_to_target(result, measured: dict) -> list[dict]:
  """K × the measured step time of every scheme × server × N of an
  `analysis.steptime.measure` JSON at the same batch b (its processes and link settings):
  sync-split computes the serial
  maths at any N (K of batch b), sync-join the K of batch N·b (measured, else the batch
  model's prediction), async on N workers the async family's K at N (else the staleness
  model's at s = N − 1), counted in pushes, each push taking the run's time ÷ D."""
  other = measured_batch(measured)
  if other != result['batch']:
    raise ValueError(f"the measurement's batch is {other}, not this run's "
                     f"--batch={result['batch']}: its steps are not these steps")
  table = steps_by_case(result)
  b = result['batch']
  fitted = {f['model']: f for f in fits(result)}

  def k_of(family, x):
    entry = table.get((family, x))
    if entry and entry['K'] is not None:
      return entry['K'], 'measured'
    if family in fitted:
      return steps_model.MODELS[family].predict(fitted[family]['coefficients'], x), 'predicted'
    return None, None

  rows = []
  for setting, data in measured['settings'].items():
    if setting == 'emulated':
      continue
    for step in data.get('steps', []):
      n = step['n']
      k, how = k_of('batch', b if step['scheme'] == 'sync-split' else n * b)
      if k is not None:
        t = float(np.median(step['samples']))
        rows.append({'setting': setting, 'scheme': step['scheme'], 'server': step['server'],
                     'n': n, 'K': k, 'K_from': how, 't_step': t, 'time': k * t,
                     'examples_per_second': b * (1 if step['scheme'] == 'sync-split' else n) / t})
    for run in data.get('async', []):
      n = run['n']
      k, how = k_of('async', n)
      if k is None:
        k, how = k_of('staleness', n - 1)
      if k is not None:
        t = float(np.median(run['samples'])) / measured['batches']
        rows.append({'setting': setting, 'scheme': 'async', 'server': run['server'], 'n': n,
                     'K': k, 'K_from': how, 't_step': t, 'time': k * t,
                     'examples_per_second': b / t})
  return rows


def seed_spread(result) -> float:
  """The noise floor of K: the median |log(K_seed / K_mean)| over the seeds of the cases
  run with more than one, at their best factor (nan without)."""
  spreads = [abs(math.log(k / e['K'])) for e in steps_by_case(result).values()
             if e['K'] and len(e['Ks']) > 1 for k in e['Ks']]
  return float(np.median(spreads)) if spreads else math.nan


def recommend(rows: list[dict]) -> dict:
  """Per setting: the fastest to the target and the fastest per example (the per-step
  answer), with one sentence each way."""
  out = {}
  for setting in dict.fromkeys(r['setting'] for r in rows):
    mine = [r for r in rows if r['setting'] == setting]
    best = min(mine, key=lambda r: r['time'])
    fastest = max(mine, key=lambda r: r['examples_per_second'])
    name = lambda r: f"{r['scheme']} {r['server']} N={r['n']}"  # noqa: E731
    sentence = (f"{name(best)} reaches the target soonest ({best['K']:.0f} steps × "
                f"{best['t_step'] * 1e3:.0f} ms = {best['time']:.1f} s)")
    if fastest is not best:
      sentence += (f"; the per-step answer, {name(fastest)} (most examples per second), "
                   f"needs {fastest['K']:.0f} steps: {fastest['time']:.1f} s, "
                   f"{fastest['time'] / best['time']:.2f}× longer")
    out[setting] = {'best': best, 'per_step_best': fastest, 'sentence': sentence + '.'}
  return out


# =============================================================================== the report
LABELS = {'batch': 'B (global batch)', 'staleness': 's (staleness, simulated)',
          'async': 'N (async workers)', 'period': 'τ (Local SGD period)',
          'capacity': 'q (sparsified gossip: fraction sent)'}


def _pct(x: float) -> str:
  """An unsigned |log| as the percentage it multiplies by (as `analysis.steptime.compare`)."""
  return '–' if math.isnan(x) else f'{(math.exp(x) - 1) * 100:.0f} %'


def report(result, measured: dict | None = None) -> str:
  table = steps_by_case(result)
  lines = [f"# Time to accuracy: {result['network']} at {result['image_size']}²",
           '', f"Target: training-set loss ≤ {result['target_loss']} (every training example, "
           f"evaluated every {result['eval_every']} steps; at most {result['max_steps']}); "
           f"batch b = {result['batch']}; {result['seeds']} seeds; learning rate × "
           f"{', '.join(f'{f:g}' for f in result['lr_factors'])} of the config's scaled rate. "
           f"Command: `{result['command']}`; {result['created']}.", '',
           '| family | setting | K (seeds) | rate factor (lr) | K at each factor | test top-1 |',
           '|---|---:|---|---|---|---|']
  runs = result['runs']
  for (family, x), e in table.items():
    lr = next((r['lr'] for r in runs if (r['family'], r['x'], r['lr_factor']) ==
               (family, x, e['lr_factor'])), None)
    at = [r for r in runs if (r['family'], r['x'], r['lr_factor']) == (family, x, e['lr_factor'])]
    top1 = (f"{np.mean([r['top1'] for r in at]) * 100:.1f} ± "
            f"{np.mean([r['top1_stderr'] for r in at]) * 100:.1f} %") if at else '–'
    ks = ', '.join(f'{k:.0f}' for k in e['Ks']) or 'not reached'
    factors = '; '.join(f"×{f:g}: " + ', '.join('–' if k is None else f'{k:.0f}' for k in v)
                        for f, v in sorted(e['by_factor'].items()))
    lines.append(f"| {family} | {x:g} | {ks} | "
                 + (f"×{e['lr_factor']:g} ({lr:.3g})" if lr is not None else '–')
                 + f" | {factors} | {top1} |")
  track = noise_track(result)
  if track:
    lines += ['', '## Gradient noise scale along the serial run', '',
              '| step | training loss | B_noise |', '|---:|---:|---:|']
    lines += [f"| {p['step']} | {p['loss']:.3f} | "
              + (f"{p['b_noise']:.1f} |" if _estimated(p['b_noise']) else '– (\\|G\\|² ≤ 0) |')
              for p in track]
  lines += ['', '## Models of K, judged on settings no fit saw', '',
            f"Noise floor (median spread of K over seeds): {_pct(seed_spread(result))}.", '',
            '| model | fitted on | parameters | held out: predicted / measured | median error |',
            '|---|---|---|---|---:|']
  fitted = fits(result)
  for f in fitted:
    params = ', '.join(f'{k} = {v:.3g}' if math.isfinite(v) else f'{k} = ∞'
                       for k, v in f['fitted'].items())
    held = '; '.join(f"{p['x']:g}: {p['predicted']:.0f} / {p['measured']:.0f}"
                     for p in f['predictions'])
    lines.append(f"| {f['formula']} | {', '.join(f'{x:g}' for x in f['fit_on'])} | {params} "
                 f"| {held} | {_pct(f['median_error'])} |")
  done = {f['model'] for f in fitted}
  for family, model in steps_model.MODELS.items():
    if family not in done and any(f == family for f, _ in table):
      fit_on = ', '.join(f'{x:g}' for x in result['fit_on'][family])
      lines.append(f"\n{family}: not fitted (fewer than two of {model.variable} ∈ {{{fit_on}}} "
                   f"reached the target).")
  if measured is not None:
    lines += ['', '## Time to the target: K × measured step time', '',
              time_table(result, measured)]
  return '\n'.join(lines) + '\n'


def time_table(result, measured: dict) -> str:
  """Every measured case's K × step, by setting and time, then each setting's recommendation
  (the report's section; docs/accuracy.md shows it too)."""
  rows = time_to_target(result, measured)
  lines = ['| setting | scheme | server | N | K (from) | step | time |',
           '|---|---|---|---:|---|---:|---:|']
  for r in sorted(rows, key=lambda r: (r['setting'], r['time'])):
    lines.append(f"| {r['setting']} | {r['scheme']} | {r['server']} | {r['n']} | "
                 f"{r['K']:.0f} ({r['K_from']}) | {r['t_step'] * 1e3:.1f} ms | "
                 f"{r['time']:.1f} s |")
  lines += [''] + [f"- **{s}**: {v['sentence']}" for s, v in recommend(rows).items()]
  return '\n'.join(lines)


def plots(result, folder: str, measured: dict | None = None) -> list[str]:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  table = steps_by_case(result)
  fitted = {f['model']: f for f in fits(result)}
  stem = f"{result['network']}_{result['image_size']}"
  written = []
  for family in FAMILIES:
    points = [(x, k) for (f, x), e in table.items() if f == family for k in e['Ks']]
    if not points:
      continue
    fig, ax = plt.subplots(figsize=(5, 3.5))
    xs = sorted({x for x, _ in points})
    ax.plot([x for x, _ in points], [k for _, k in points], 'o', label='measured (each seed)')
    if family in fitted:
      f = fitted[family]
      spaced = np.geomspace if min(xs) > 0 else np.linspace
      grid = spaced(min(xs), max(xs), 50)
      model = steps_model.MODELS[family]
      ax.plot(grid, [model.predict(f['coefficients'], g) for g in grid], '-',
              label=f"{f['formula']}, fitted on {', '.join(f'{x:g}' for x in f['fit_on'])}")
      if family == 'batch' and math.isfinite(f['fitted']['B_noise']):
        ax.axvline(f['fitted']['B_noise'], ls=':', color='grey', label='B_noise (fit)')
    if family == 'batch' and 'batch_measured_noise' in fitted:
      f = fitted['batch_measured_noise']
      grid = np.geomspace(min(xs), max(xs), 50)
      model = steps_model.batch_with_noise_scale(f['fitted']['B_noise'])
      ax.plot(grid, [model.predict(f['coefficients'], g) for g in grid], '--',
              label=f"B_noise measured ({f['fitted']['B_noise']:.0f}), K_min fitted on "
                    f"{', '.join(f'{x:g}' for x in f['fit_on'])}")
      if f['fitted']['B_noise'] <= 2 * max(xs):  # marked where it falls within the axes
        ax.axvline(f['fitted']['B_noise'], ls='--', color='grey', label='B_noise (measured)')
    if family in ('batch', 'capacity', 'period'):
      ax.set_xscale('log')
    ax.set_xlabel(LABELS[family])
    ax.set_ylabel(f"steps to loss ≤ {result['target_loss']}")
    written.append(_save(fig, ax, folder, f"{stem}_K_{family}.png"))
  if measured is not None:
    rows = time_to_target(result, measured)
    for setting in dict.fromkeys(r['setting'] for r in rows):
      # Left: time to the target; right: [T]'s per-step view, examples per second against
      # one device's (sync-split at N = 1, the serial step).
      fig, (ax, per_step) = plt.subplots(1, 2, figsize=(9, 3.5))
      mine = [r for r in rows if r['setting'] == setting]
      serial = [r['examples_per_second'] for r in mine if r['n'] == 1
                and r['scheme'] != 'async']
      for key in dict.fromkeys((r['scheme'], r['server']) for r in mine):
        line = sorted((r['n'], r['time'], r['examples_per_second']) for r in mine
                      if (r['scheme'], r['server']) == key)
        ax.plot([n for n, _, _ in line], [t for _, t, _ in line], 'o-', label=' '.join(key))
        if serial:
          per_step.plot([n for n, _, _ in line], [e / np.median(serial) for _, _, e in line],
                        'o-', label=' '.join(key))
      ax.set_xlabel('N')
      ax.set_ylabel('seconds to the target')
      ax.set_yscale('log')
      ax.set_title(f'{setting}: time to accuracy', fontsize=9)
      per_step.set_xlabel('N')
      per_step.set_ylabel('examples per second ÷ one device\'s')
      per_step.set_yscale('log')
      per_step.set_title(f'{setting}: per-step speedup', fontsize=9)
      per_step.legend(fontsize=7)
      written.append(_save(fig, ax, folder, f'{stem}_tta_{setting}.png'))
  return written


def _save(fig, ax, folder: str, name: str) -> str:
  import matplotlib.pyplot as plt
  ax.legend(fontsize=7)
  fig.tight_layout()
  path = os.path.join(folder, name)
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path


# =============================================================================== main
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if not FLAGS.out:
    raise app.UsageError('--out is required: the JSON file to write.')
  if FLAGS.config is None:
    raise app.UsageError('--config is required: a configs/*.py file[:arg].')
  for folder in filter(None, (os.path.dirname(os.path.abspath(FLAGS.out)), FLAGS.report)):
    if not os.path.isdir(folder):
      raise app.UsageError(f'folder {folder} does not exist.')
  measured = None
  if FLAGS.steps_json:
    with open(FLAGS.steps_json) as f:
      measured = json.load(f)
    other = measured_batch(measured)
    if other != FLAGS.batch:
      raise app.UsageError(f'--steps_json={FLAGS.steps_json} was measured at batch {other}: '
                           f'pass --batch with its batch, or measure at --batch={FLAGS.batch}.')
  plan(FLAGS)  # every flag checked before the backend starts
  from jaxpar import build
  build.keep_freed_memory(FLAGS.config)
  jax.config.update('jax_num_cpu_devices', FLAGS.devices)
  from jaxpar import config as config_lib
  from jaxpar import metrics
  metrics.quiet_libraries(keep='')  # hundreds of runs: the progress bar and warnings only
  try:
    result = measure(FLAGS.config, FLAGS, sys.argv)
  except config_lib.ConfigError as e:
    print(f'jaxpar: {e}', file=sys.stderr)
    sys.exit(2)
  with open(FLAGS.out, 'w') as f:
    json.dump(result, f, indent=1)
  text = report(result, measured)
  if FLAGS.report:
    with open(os.path.join(FLAGS.report, 'report.md'), 'w') as f:
      f.write(text)
    plots(result, FLAGS.report, measured)
  print(text)
  print(f'wrote {FLAGS.out}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
