"""Measure the thesis' inputs and every scheme's step time on this machine.

  python -m analysis.steptime.measure --config configs/thesis.py:net=resnet34 --out resnet34.json
  python -m analysis.steptime.compare resnet34.json --out report/

For the configured network and input size, after warm-up, repeated:
  t_grad   one device, one batch's gradients ([T]'s definition), for every batch a
           device computes below; in the processes' runs also with every process
           computing at once (t_grad under the run's contention);
  calls    the per-call cost of each collective kind inside a compiled program (chains of
           1, 2, 8, 32 calls), sizes 4 KB to 10× the network
           (`jaxpar.perfmodel.calibrate`); t_comm is the permute of the network's weights;
  t_iter   a train step of every synchronous scheme × server at N = 1, 2, 4, ...;
  t_train  D pushes of the asynchronous scheme (Downpour) on N workers;
  trace    outside the emulated setting, each t_grad and step profiled after its timing
           (--trace_calls calls): its compute, its collectives and their overlap
           (`analysis.steptime.trace`): the step's non-gradient work and overlap;
  volume   every collective of each step's lowered program, its bytes per device next
           to the method's analytic volume and its own `sent_bytes` (`analysis.steptime.volume`).

Settings, always labelled:
  emulated   one process with --workers CPU devices emulated on the machine's cores: the
             communication volume is real; the speed says nothing about speedup (the
             devices share the cores).
  processes  1, 2, 4, ... up to --processes separate processes, each with one device and
             pinned to its own core, joined by jax.distributed over loopback (gloo): the
             code path of a GPU/TPU cluster. Async here runs on Ray (worker and server
             actors, each its own process; `async_sgd.backend='ray'`), for N = 1, 2, ...
             workers, driven from the one-process run; skipped with a note when Ray is
             not installed.
  link-RATE  with --links=RATE[,RATE...]: the processes setting's steps again, each process
             in its own network namespace sending through a link of RATE (tc syntax:
             100mbit, 1gbit) into one bridge (`analysis.steptime.link`): a cluster's network,
             emulated. Needs root; skipped with one line otherwise. Async is not run there
             (Ray's actors would need a node per namespace).

t_grad and t_iter are timed in rounds that interleave every cell of a run
(`analysis.steptime.timing`), --rounds × --steps_per_round samples each; the whole
measurement is made --repetitions times, each setting's processes launched anew, and every
point keeps each repetition's samples: the noise a prediction is judged against.

Progress lines go to stderr; the JSON records the machine, versions, the config and every
sample. Each setting runs in child processes (`analysis.steptime.timing`).

Other work on the machine spoils the timings, even at idle priority (two cores: a test run
under SCHED_IDLE made one repetition's collective-heavy steps ~2× slower). Each run records
the CPU time the machine spent outside this measurement's processes (/proc/stat's busy time
less this process's and its children's, `other_cpu`), the JSON keeps it under 'other_load',
and a run where it passes 10 % of one core is named in a warning.
"""
import datetime
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from jax.sharding import AbstractMesh  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from analysis.steptime import link, volume  # noqa: E402
from analysis.steptime.timing import ONE_DEVICE  # noqa: E402
from jaxpar import build, models, validation  # noqa: E402
from jaxpar import config as config_lib  # noqa: E402
from jaxpar.cpu_load import cpu_clock, other_cpu  # noqa: E402
from jaxpar.data import sources  # noqa: E402
from jaxpar.collectives import nbytes  # noqa: E402
from jaxpar.perfmodel import calibrate  # noqa: E402
from jaxpar.plan.probe import machine, versions  # noqa: E402,F401 (also for analysis' tools)

SYNC_SCHEMES = ('sync-split', 'sync-join')
ASYNC_SERVERS = ('central', 'distributed')

FLAGS = flags.FLAGS


def define_flags():
  """Defined when run, not at import: jaxpar.train defines --config too, and tests import both."""
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].', lock_config=False)
  flags.DEFINE_string('out', None, 'The JSON file to write.')
  flags.DEFINE_integer('workers', 8, 'Emulated setting: N = 1, 2, 4, ... up to this many '
                       'devices (0: skip the setting).')
  flags.DEFINE_integer('processes', os.cpu_count() or 1, 'Processes setting: N = 1, 2, 4, ... '
                       'up to this many processes, one core each (0: skip the setting).')
  flags.DEFINE_list('schemes', list(SYNC_SCHEMES), 'Synchronous schemes to time.')
  flags.DEFINE_list('servers', list(config_lib.SERVERS), 'Servers to time.')
  flags.DEFINE_list('links', [], 'Emulated link rates (tc syntax: 100mbit, 1gbit): the '
                    'processes setting again on each (needs root); empty: loopback only.')
  flags.DEFINE_list('async_servers', list(ASYNC_SERVERS),
                    'Servers of the async scheme to time (empty: none).')
  flags.DEFINE_integer('batches', 128, 'D: batches of a training run ([T]: 128); the async '
                       'runs apply D pushes.')
  flags.DEFINE_integer('rounds', 10, 'Rounds of the interleaved t_grad and t_iter timing.')
  flags.DEFINE_integer('steps_per_round', 3, 'Timed calls of each cell in a round.')
  flags.DEFINE_integer('repetitions', 2, 'Independent repetitions of the whole measurement '
                       '(each setting launched anew).')
  flags.DEFINE_integer('repeats', 5, 'Timed runs of each calibration program.')
  flags.DEFINE_integer('calibration_sizes', 6, 'Sizes of each calibrated collective, 4 KB to '
                       '--calibrate_up_to (and the weights\' own size).')
  flags.DEFINE_float('calibrate_up_to', 10.0, 'The largest calibrated collective, in multiples '
                     'of the network\'s weights.')
  flags.DEFINE_integer('warmup', 2, 'Untimed calls first (the first compiles).')
  flags.DEFINE_integer('trace_calls', 3, 'Processes and link settings: after the timing, each '
                       't_grad and step profiled for this many calls, its compute, collectives '
                       'and their overlap recorded (`analysis.steptime.trace`; 0: none).')
  flags.DEFINE_integer('async_repeats', 2, 'Timed runs of D async pushes.')
  flags.DEFINE_string('compilation_cache', 'off', "Where the children keep compiled programs "
                      "(JAX's persistent compilation cache): 'off' (every child compiles its "
                      "own, as a training run does), 'run' (a folder of this run: each program "
                      "compiled once, later repetitions and link settings load it), or a "
                      "folder kept across runs. Loaded programs can run faster than freshly "
                      "compiled ones (docs/measuring.md): compare only runs alike.")
  flags.DEFINE_boolean('volume', True, 'Also lower (and run once) the variants that are not in '
                       'the grid, on the largest emulated mesh: ring, bfloat16, torus2d, other '
                       'schedules and placements, sparsified gossip, Local SGD, hybrid FC.')
  flags.mark_flag_as_required('config')


# --------------------------------------------------------------------------- arguments
def check_args(args):
  """A usage error for every bad argument (`args`: the flags' values), before anything is
  measured."""
  if not args.out:
    raise app.UsageError('--out is required: the JSON file to write.')
  folder = os.path.dirname(os.path.abspath(args.out))
  if not os.path.isdir(folder):
    raise app.UsageError(f'--out={args.out}: folder {folder} does not exist.')
  for name, value, lowest in (('workers', args.workers, 0), ('processes', args.processes, 0),
                              ('batches', args.batches, 1), ('repeats', args.repeats, 1),
                              ('rounds', args.rounds, 1),
                              ('steps_per_round', args.steps_per_round, 1),
                              ('repetitions', args.repetitions, 1),
                              ('calibrate_up_to', args.calibrate_up_to, 1),
                              ('calibration_sizes', args.calibration_sizes, 2),
                              ('warmup', args.warmup, 1),
                              ('async_repeats', args.async_repeats, 1),
                              ('trace_calls', args.trace_calls, 0)):
    if value < lowest:
      raise app.UsageError(f'--{name}={value}: must be at least {lowest}.')
  if not (args.workers or args.processes):
    raise app.UsageError('--workers=0 and --processes=0: nothing to measure.')
  for name, values, valid in (('schemes', args.schemes, SYNC_SCHEMES),
                              ('servers', args.servers, config_lib.SERVERS),
                              ('async_servers', args.async_servers, ASYNC_SERVERS)):
    bad = [v for v in values if v not in valid]
    if bad:
      raise app.UsageError(f'--{name}: {bad} unknown; choose from {list(valid)}.')
  for rate in args.links:
    try:
      link.bits_per_second(rate)
    except ValueError as e:
      raise app.UsageError(f'--links: {e}.')
  if args.links and args.processes < 2:
    raise app.UsageError(f'--links={",".join(args.links)} times 2 or more processes across the '
                         f'link: use --processes=2 or more (it is {args.processes}).')
  if args.processes > 1 and not shutil.which('taskset'):
    raise app.UsageError('--processes > 1 pins each process to a core with taskset, which is '
                         'not installed (util-linux); use --processes=1 or install it.')


def powers_of_two(limit: int) -> list:
  return [2 ** k for k in range(int(math.log2(limit)) + 1)] if limit else []


# --------------------------------------------------------------------------- the cells
def grid_overrides(cfg, scheme: str, server: str, n: int) -> dict:
  """One cell of the grid on a 1-D mesh of N devices; what belongs to another server or
  method is reset, the config's own choice kept where it applies (also `tta`'s cases)."""
  return {'mesh.shape': (n,), 'mesh.axes': ('data',), 'mesh.emulate_cpu_devices': False,
          'distributed.coordinator': '', 'distributed.num_processes': 1,
          'distributed.process_id': 0, 'scheme': scheme, 'server': server,
          'bn_group_size': _bn_groups(cfg, scheme, server, n), 'sync_every': 0,
          'local_sgd_warmup': 0, 'fc_parallel': 'data', 'sparsify.capacity': 0.0,
          'grad_reduce': 'psum' if scheme == 'async' or cfg.grad_reduce == 'torus2d'
          else cfg.grad_reduce,
          'grad_reduce_dtype': 'float32' if scheme == 'async' else cfg.grad_reduce_dtype,
          'central_schedule': cfg.central_schedule
          if server == 'central' and scheme != 'async' else 'serial',
          'placement': 'greedy' if scheme == 'async' and server == 'distributed'
          else cfg.placement if server == 'distributed' else 'even'}


def _bn_groups(cfg, scheme: str, server: str, n: int):
  """The config's BatchNorm groups where they fit the cell (N devices, the method's BN),
  else auto: what the method settles on (all devices; gossip's replicas and async's
  workers, their own)."""
  g = cfg.bn_group_size
  if (g is None or scheme == 'async' or (server == 'gossip' and g != 1)
      or (g and (g > n or n % g))):
    return None
  return g


def _variants(cfg, n: int) -> list:
  """(label, overrides) of the methods the volume table adds to the grid's, on N devices."""
  base = grid_overrides(cfg, 'sync-split', 'allreduce', n)
  out = [('ring', {**base, 'grad_reduce': 'ring'}),
         ('bfloat16', {**base, 'grad_reduce_dtype': 'bfloat16'}),
         ('central parallel', {**base, 'server': 'central', 'central_schedule': 'parallel'}),
         ('central serial', {**base, 'server': 'central', 'central_schedule': 'serial'}),
         ('distributed greedy', {**base, 'server': 'distributed', 'placement': 'greedy'}),
         ('distributed even', {**base, 'server': 'distributed', 'placement': 'even'}),
         ('sparse gossip', {**base, 'server': 'gossip', 'sparsify.capacity': 0.01,
                            'bn_group_size': None}),
         ('local SGD', {**base, 'sync_every': 4, 'bn_group_size': None})]
  if n >= 4:
    out.append(('torus2d', {**base, 'grad_reduce': 'torus2d', 'mesh.shape': (2, n // 2),
                            'mesh.axes': ('x', 'y')}))
  if n >= 2 and models.fc_layers(cfg.model):
    out.append(('hybrid', {**base, 'fc_parallel': 'model', 'mesh.shape': (n // 2, 2),
                           'mesh.axes': ('data', 'model')}))
  return out


def _cell(cfg, overrides):
  c = ml_collections.ConfigDict(cfg.to_dict())
  c.update_from_flattened_dict(overrides)
  return c


def _validated(cfg, overrides, where: str):
  cell = _cell(cfg, overrides)
  try:
    validation.validate(cell)
    validation.validate_devices(cell, config_lib.driver_devices(cell), 1)
  except config_lib.ConfigError as e:
    raise config_lib.ConfigError(f'{e} (in the {where} cell)') from None
  # The children build the cell without validating it: BN's groups as settled for the method.
  return {**overrides, 'bn_group_size': cell.bn_group_size}


def plan(cfg, workers: int, processes: int, schemes, servers, async_servers, with_volume: bool,
         links=()):
  """What each setting's runs measure: {setting: [(processes, spec fields)]}, every cell
  validated. Raises ConfigError naming the cell and field."""
  batch = {'sync-split': cfg.global_batch, 'sync-join': cfg.per_device_batch}
  skipped = []

  def steps(ns):
    return [{'scheme': s, 'server': v, 'n': n,
             'per_device_batch': batch[s] // n if s == 'sync-split' else batch[s],
             'overrides': _validated(cfg, grid_overrides(cfg, s, v, n), f'{s} {v} N={n}')}
            for n in ns for s in schemes for v in servers]

  def grad_batches(cells):
    """t_grad is wanted for each device's batch (α-β) and each scheme's whole one (eq. 4.23)."""
    return sorted({c['per_device_batch'] for c in cells} | {batch[s] for s in schemes}
                  | ({cfg.per_device_batch} if async_servers else set()))

  runs = {}
  ns = powers_of_two(workers)
  if ns:
    grid = steps(ns)
    in_grid = {volume.method(_cell(cfg, c['overrides'])) for c in grid if c['n'] == ns[-1]}
    variants = []
    for label, overrides in (_variants(cfg, ns[-1]) if with_volume and ns[-1] > 1 else []):
      if volume.method(_cell(cfg, overrides)) in in_grid:
        continue  # the grid's own step at this N has the row
      try:
        variants.append({'label': label, 'n': ns[-1],
                         'overrides': _validated(cfg, overrides, label)})
      except config_lib.ConfigError as e:
        skipped.append(f'volume {label}: {e}')
    if with_volume and ns[-1] > 1 and not models.fc_layers(cfg.model):
      skipped.append(f'volume hybrid: {cfg.model} has no FC layers to split')
    if with_volume and 1 < ns[-1] < 4:
      skipped.append('volume torus2d: needs a mesh of 2×2 or more (--workers ≥ 4)')
    runs['emulated'] = [(1, {
        'local_devices': ns[-1], 'grad_batches': grad_batches(grid),
        'steps': grid,
        'async': [{'server': v, 'n': n, 'overrides': _validated(
            cfg, grid_overrides(cfg, 'async', v, n), f'async {v} N={n}')}
                  for n in ns for v in async_servers],
        'volume': variants})]
  ps = powers_of_two(processes)
  if ps:
    cells = {p: steps([p]) for p in ps}
    every = [c for p in ps for c in cells[p]]
    on_ray = []  # Downpour's real processes are Ray's actors, driven by the 1-process run
    if async_servers and importlib.util.find_spec('ray') is None:
      skipped.append("async on Ray (processes setting): Ray is not installed (pip install "
                     "'jaxpar[ray]')")
    elif async_servers:
      on_ray = [{'server': v, 'n': n, 'backend': 'ray', 'overrides': _validated(
          cfg, {**grid_overrides(cfg, 'async', v, n), 'async_sgd.backend': 'ray'},
          f'async on Ray {v} N={n}')} for n in ps for v in async_servers]
    # t_grad alone in the one-process run (one pinned core, as each process of the others
    # has); in the others, each device's batches under the run's contention.
    runs['processes'] = [(p, {'local_devices': 1, 'grad_batches': grad_batches(every) if p == 1
                              else sorted({c['per_device_batch'] for c in cells[p]}),
                              'steps': cells[p], 'async': on_ray if p == 1 else [],
                              'volume': []})
                         for p in ps]
    why_not = link.unavailable() if links else None
    if why_not:
      skipped.append(f'the emulated links {",".join(links)}: {why_not}')
    for rate in links if not why_not else ():
      runs[f'link-{rate}'] = [(p, {**fields, 'async': []}) for p, fields in runs['processes']]
  return runs, skipped


# --------------------------------------------------------------------------- running
OTHER_LOAD_WARNING = 0.10  # of one core, over a run


OTHER_LOAD = []  # per run of child processes: {setting, processes, seconds, other_cpu_s}


def _child_env(cache: str | None = None):
  """The children choose their device count: no inherited forced host device count. With
  `cache` a folder, they keep and load compiled programs there (JAX's persistent
  compilation cache; process 0 writes it) — the same program compiles once per run; ''
  turns an inherited cache off; None leaves the environment's choice."""
  env = dict(os.environ)
  env['XLA_FLAGS'] = ' '.join(f for f in env.get('XLA_FLAGS', '').split()
                              if 'xla_force_host_platform_device_count' not in f)
  if cache:
    env['JAX_COMPILATION_CACHE_DIR'] = cache
    env['JAX_ENABLE_COMPILATION_CACHE'] = 'true'  # over an inherited 'false'
    env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  elif cache == '':
    env.pop('JAX_COMPILATION_CACHE_DIR', None)
  return env


def compilation_cache(choice: str, folder: str) -> str:
  """The children's compilation cache folder for `--compilation_cache` (`folder`: the
  run's temporary one); '' when off."""
  if choice == 'off':
    return ''
  path = os.path.join(folder, 'xla_cache') if choice == 'run' else os.path.abspath(choice)
  os.makedirs(path, exist_ok=True)
  return path


def run_setting(setting: str, processes: int, fields: dict, common: dict, folder: str,
                module: str = 'analysis.steptime.timing', cache: str | None = None) -> dict:
  """Runs one setting's child processes, `python -m module SPEC.json` (pinned to cores
  0..P−1 unless emulated; a link setting's in their network namespaces; `cache`: their
  compilation cache folder, `_child_env`) and returns process 0's results, the JSON it
  writes to the spec's 'out'. A failed process stops the others and raises with its log."""
  if setting.startswith('link-') and processes > 1:
    with link.Link(processes, setting.removeprefix('link-')) as emulated:
      return _run_children(setting, processes, fields, common, folder, emulated, module, cache)
  return _run_children(setting, processes, fields, common, folder, None, module, cache)


def _run_children(setting, processes, fields, common, folder, emulated, module, cache) -> dict:
  out = os.path.join(folder, f'{setting}_{processes}.json')
  port = link.free_port() if processes > 1 else 0
  host = emulated.addresses[0] if emulated else '127.0.0.1'
  cores = os.cpu_count() or 1
  procs, logs = [], []
  clock, started = cpu_clock(), time.perf_counter()  # other work on the machine meanwhile
  for i in range(processes):
    spec = {**common, **fields, 'setting': setting, 'process_id': i,
            'num_processes': processes, 'coordinator': f'{host}:{port}' if port else '',
            'call_sizes': fields.get('call_sizes', []), 'out': out,
            'pinned_cores': [j % cores for j in range(processes)] if setting != 'emulated'
            else None}
    path = os.path.join(folder, f'{setting}_{processes}_{i}.spec.json')
    with open(path, 'w') as f:
      json.dump(spec, f)
    cmd = [sys.executable, '-m', module, path]
    if emulated:
      cmd = emulated.command(i, cmd)
    if setting != 'emulated':
      cmd = ['taskset', '-c', str(i % cores)] + cmd
    log = open(os.path.join(folder, f'{setting}_{processes}_{i}.log'), 'w+')
    logs.append(log)
    procs.append(subprocess.Popen(cmd, env=_child_env(cache), stdout=log if i else None,
                                  stderr=log if i else None))
  while any(p.poll() is None for p in procs):
    failed = [i for i, p in enumerate(procs) if p.poll() not in (None, 0)]
    if failed:
      for p in procs:
        if p.poll() is None:
          p.kill()
      break
    time.sleep(0.5)
  codes = [p.wait() for p in procs]
  _record_load(setting, processes, time.perf_counter() - started, other_cpu(clock, cpu_clock()))
  if any(codes):
    tails = []
    for i, log in enumerate(logs):
      log.seek(0)
      tails.append(f'--- process {i} (exit {codes[i]}) ---\n' + log.read()[-2000:])
    raise RuntimeError(f'{setting} setting with {processes} processes failed:\n'
                       + '\n'.join(tails))
  with open(out) as f:
    return json.load(f)


def _record_load(setting: str, processes: int, seconds: float, other: float | None):
  OTHER_LOAD.append({'setting': setting, 'processes': processes, 'seconds': seconds,
                     'other_cpu_s': other})
  if other is not None and other > OTHER_LOAD_WARNING * seconds:
    print(f'[measure] WARNING: other work used {other / seconds:.0%} of a core during the '
          f'{setting} run with {processes} process(es) ({other:.1f} of {seconds:.0f} s): its '
          'timings may be spoilt; measure on an otherwise idle machine', file=sys.stderr,
          flush=True)


def _merge(results: list) -> dict:
  """One repetition of a setting from its runs (one per process count): t_grad of the
  one-process run (alone), `t_grad_contended` {P: {batch: samples}} of the others; their
  traces likewise (`t_grad_trace`, `t_grad_trace_contended`)."""
  merged = {'processes': max(r['processes'] for r in results),
            'pinned_cores': results[-1]['pinned_cores'], 't_grad': {}, 't_grad_contended': {},
            't_grad_trace': {}, 't_grad_trace_contended': {},
            'calls': {}, 'steps': [], 'async': [], 'volume': []}
  for r in results:
    traced = r.get('t_grad_trace', {})
    if r['processes'] > 1 and r['setting'] != 'emulated':
      merged['t_grad_contended'][str(r['processes'])] = r['t_grad']
      if traced:
        merged['t_grad_trace_contended'][str(r['processes'])] = traced
    else:
      merged['t_grad'].update(r['t_grad'])
      merged['t_grad_trace'].update(traced)
    merged['calls'].update(r['calls'])
    for key in ('steps', 'async', 'volume'):
      merged[key] += r[key]
  return merged


def combine(repetitions: list) -> dict:
  """A setting's repetitions in one: every sample list is theirs concatenated, and each
  step, async run and t_grad keeps the repetitions' own lists under `repetitions`
  (calibration chains: concatenated)."""
  def joined(lists):
    return {'samples': [x for s in lists for x in s], 'repetitions': [list(s) for s in lists]}

  first = repetitions[0]
  out = {**first, 'repetitions': len(repetitions)}
  out['t_grad'] = {b: joined([r['t_grad'][b] for r in repetitions])['samples']
                   for b in first['t_grad']}
  out['t_grad_repetitions'] = {b: [r['t_grad'][b] for r in repetitions] for b in first['t_grad']}
  out['t_grad_contended'] = {p: {b: joined([r['t_grad_contended'][p][b] for r in repetitions])
                                 ['samples'] for b in batches}
                             for p, batches in first['t_grad_contended'].items()}
  out['calls'] = {op: [{'bytes': point['bytes'], 'chains': {
      k: [x for r in repetitions for x in r['calls'][op][i]['chains'].get(k, [])]
      for k in point['chains']}} for i, point in enumerate(points)]
                  for op, points in first['calls'].items()}
  for key in ('steps', 'async'):
    out[key] = [{**cell, **joined([r[key][i]['samples'] for r in repetitions])}
                for i, cell in enumerate(first[key])]
  # Traces: each repetition's, in a list (`analysis.steptime.trace`'s summaries).
  out['t_grad_trace'] = {b: [r['t_grad_trace'][b] for r in repetitions]
                         for b in first.get('t_grad_trace', {})}
  out['t_grad_trace_contended'] = {
      p: {b: [r['t_grad_trace_contended'][p][b] for r in repetitions] for b in batches}
      for p, batches in first.get('t_grad_trace_contended', {}).items()}
  for i, cell in enumerate(out['steps']):
    if 'trace' in cell:
      cell['trace'] = [r['steps'][i]['trace'] for r in repetitions]
  return out


def call_sizes(param_bytes: int, up_to: float = 10.0, count: int = 6) -> list:
  """The calibration's sizes: `count` from 4 KB to `up_to` × the network's weights, spaced
  evenly in log, with the weights' own size among them."""
  top = max(4096, up_to * param_bytes)
  return sorted({int(4096 * (top / 4096) ** (k / (count - 1))) // 8 * 8 for k in range(count)}
                | {param_bytes // 8 * 8})


def measure(cfg, argv) -> dict:
  validation.validate(cfg)
  runs, skipped = plan(cfg, FLAGS.workers, FLAGS.processes, FLAGS.schemes, FLAGS.servers,
                       FLAGS.async_servers, FLAGS.volume, FLAGS.links)
  source = sources.open_source(cfg.dataset)
  meta = source.meta
  one = _cell(cfg, ONE_DEVICE)
  params = build.abstract_variables(one, build.model(one, meta['num_classes'], meta['channels'],
                                                     AbstractMesh((1,), ('data',))),
                                    meta['channels'])['params']
  param_bytes = nbytes(params)
  sizes = call_sizes(param_bytes, FLAGS.calibrate_up_to, FLAGS.calibration_sizes)
  common = {'config': cfg.to_dict(), 'meta': meta, 'repeats': FLAGS.repeats,
            'warmup': FLAGS.warmup, 'batches': FLAGS.batches, 'rounds': FLAGS.rounds,
            'steps_per_round': FLAGS.steps_per_round, 'param_bytes': param_bytes,
            'async_repeats': FLAGS.async_repeats, 'trace_calls': FLAGS.trace_calls}
  for note in skipped:
    print(f'[measure] skipped {note}', file=sys.stderr)
  settings = {}
  with tempfile.TemporaryDirectory() as folder:
    cache = compilation_cache(FLAGS.compilation_cache, folder)
    for repetition in range(FLAGS.repetitions):
      for setting, setting_runs in runs.items():
        results = []
        for processes, fields in setting_runs:
          devices = fields['local_devices'] * processes
          calibrated = (setting == 'emulated' and devices > 1) or (setting != 'emulated'
                                                                   and processes == 2)
          print(f'[measure] repetition {repetition + 1}/{FLAGS.repetitions}, {setting}: '
                f'{processes} process(es), {devices} device(s)', file=sys.stderr, flush=True)
          results.append(run_setting(setting, processes,
                                     {**fields, 'call_sizes': sizes if calibrated else []},
                                     common, folder, cache=cache))
        settings.setdefault(setting, []).append(_merge(results))
  settings = {name: combine(reps) for name, reps in settings.items()}
  return {'tool': 'analysis.steptime.measure', 'created': datetime.datetime.now().isoformat(
      timespec='seconds'), 'command': ' '.join(['python -m analysis.steptime.measure'] + argv[1:]),
          'machine': machine(), 'versions': versions(), 'config': cfg.to_dict(),
          'network': {'model': cfg.model, 'image_size': cfg.image_size, **meta,
                      'parameters': sum(math.prod(x.shape) for x in jax.tree.leaves(params)),
                      'param_bytes': param_bytes},
          'batch': {'sync-split': cfg.global_batch, 'sync-join': cfg.per_device_batch,
                    'async': cfg.per_device_batch},
          'batches': FLAGS.batches, 'central_schedule': cfg.central_schedule,
          'repeats': FLAGS.repeats, 'warmup': FLAGS.warmup, 'trace_calls': FLAGS.trace_calls,
          'rounds': FLAGS.rounds,
          'steps_per_round': FLAGS.steps_per_round, 'repetitions': FLAGS.repetitions,
          'compilation_cache': FLAGS.compilation_cache, 'skipped': skipped,
          'other_load': list(OTHER_LOAD), 'settings': settings}


def summary(result) -> str:
  """What was measured, in brief: the inputs, the fit, the step times, the volume table."""
  lines = [f"{result['network']['model']} at {result['network']['image_size']}², "
           f"{result['network']['param_bytes'] / 1e6:.1f} MB of weights"]
  for name, s in result['settings'].items():
    lines.append(f'\n## {name}')
    for batch, samples in s['t_grad'].items():
      lines.append(f't_grad (batch {batch}): {np.median(samples):.4g} s')
    for p, batches in s.get('t_grad_contended', {}).items():
      for batch, samples in batches.items():
        lines.append(f't_grad (batch {batch}, {p} processes computing at once): '
                     f'{np.median(samples):.4g} s')
    t_comm, costs = calibrate.setting_inputs(s, result['network']['param_bytes'])
    if t_comm is not None:
      lines.append(f"t_comm ({result['network']['param_bytes']:,} B, calibrated permute): "
                   f"{t_comm:.4g} s")
      for kind, f in costs.fits.items():
        lines.append(f'α-β fit of the {kind} calls: α = {f.alpha:.3g} s, β = '
                     f'{f.beta / 1e9:.3g} GB/s (largest residual {f.max_relative_residual:.1%})')
    for c in s['steps']:
      lines.append(f"t_iter {c['scheme']} {c['server']} N={c['n']}: "
                   f"{np.median(c['samples']):.4g} s")
    for c in s['async']:
      lines.append(f"t_train async {c['server']} N={c['n']} ({result['batches']} pushes): "
                   f"{np.median(c['samples']):.4g} s")
    rows = volume.distinct_rows([s])
    if rows:
      lines.append('\n' + volume.markdown(rows))
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  check_args(FLAGS)
  try:
    result = measure(FLAGS.config, sys.argv)
  except config_lib.ConfigError as e:
    print(f'jaxpar: {e}', file=sys.stderr)
    sys.exit(2)
  except RuntimeError as e:
    print(f'analysis.steptime.measure: {e}', file=sys.stderr)
    sys.exit(1)
  with open(FLAGS.out, 'w') as f:
    json.dump(result, f, indent=1)
  print(summary(result))
  print(f'\nwrote {FLAGS.out}; next: python -m analysis.steptime.compare {FLAGS.out} --out DIR')


if __name__ == '__main__':
  define_flags()
  app.run(main)
