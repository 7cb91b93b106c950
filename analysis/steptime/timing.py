"""What `analysis.steptime.measure` times in one setting, run by it as a child process:

  python -m analysis.steptime.timing SPEC.json

SPEC names the setting (`emulated`: one process, its devices emulated on shared cores;
`processes`: this is one of `num_processes` pinned processes joined by jax.distributed),
the configs to time and where process 0 writes its results (JSON). Every process of a
setting runs the same programs in the same order; process 0 keeps the times.

Times are wall-clock seconds of calls each ended by `block_until_ready`, after `warmup`
calls (compilation is in the first):
  t_grad    one device, one batch's gradients: the worker's computation of [T] eq. 4.4ff.
            In a run of P > 1 processes every process computes at once: t_grad under the
            contention of the run's steps.
  t_iter    one train step of a synchronous scheme × server on N devices.
  calls     each collective kind of the steps (permute, all-reduce, all-gather,
            reduce-scatter) between devices 0 and 1, as programs of k = 1, 2, 8, 32 calls
            in a chain for sizes from 4 KB to 10× the network's weights: the per-call cost
            inside a compiled program is the slope of t(k) (`jaxpar.perfmodel.calibrate`).
  t_train   D pushes applied by the asynchronous loop (Downpour) on N workers: threads
            (emulated setting) or Ray's actors (processes setting).
  trace     with `trace_calls` > 0, outside the emulated setting: after a group's rounds,
            each of its cells profiled for that many calls (`analysis.steptime.trace`):
            the seconds of its compute, of its collectives and of their overlap.

t_grad and t_iter are measured in rounds: every cell (a step program or a t_grad) is
compiled first, then each round runs every cell once untimed and `steps_per_round` times
timed, the cells in an order drawn anew each round (the same on every process), so slow
drift of the machine falls on all cells alike. Cells are grouped so that the states held
at once stay under `MEMORY_BUDGET` bytes; each group runs its own rounds.
"""
import functools
import itertools
import json
import os
import sys
import time

from jaxpar.perfmodel import calibrate
from jaxpar.plan import call_timing, probe

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

ONE_DEVICE = {'mesh.shape': (1,), 'mesh.axes': ('data',), 'bn_group_size': 0,
              'fc_parallel': 'data'}


def _log(spec, message):
  if spec['process_id'] == 0:
    print(f"[{spec['setting']}] {message}", file=sys.stderr, flush=True)


def _summary(samples) -> str:
  import numpy as np
  return f'median {np.median(samples):.4g} s (min {min(samples):.4g}, max {max(samples):.4g})'


SCALAR, CALIBRATED, time_calls = (calibrate.SCALAR, call_timing.CALIBRATED,
                                  call_timing.time_calls)


def step_cell(cfg, meta) -> dict:
  """The config's synchronous step on its mesh (the first N devices), compiled: `run` makes
  one step (and keeps its state), `volume()` its volume row (lowered program, analytic,
  reported), `compiled` the collectives of the compiled program (`jaxpar.perfmodel.hlo`),
  `hlo` its text."""
  import jax
  from analysis.steptime import volume
  from jaxpar.perfmodel import hlo
  from jaxpar import build
  from jaxpar import config as config_lib
  from jaxpar.mesh import make_mesh
  from jaxpar.step import make_train_step, to_global

  n = config_lib.num_devices(cfg)
  mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axes, jax.devices()[:n], cfg.bn_group_size)
  model, strategy, tx, state = build.for_timing(cfg, meta['num_classes'], meta['channels'], mesh)
  step = make_train_step(model, tx, mesh, strategy, cfg.grad_accum_steps)
  batch = to_global(mesh, probe.synthetic_batch(config_lib.global_batch(cfg) // jax.process_count(),
                                                cfg, meta, seed=jax.process_index()))
  rng = jax.random.key(1)
  lowered = step.lower(state, batch, rng)
  stablehlo, compiled = lowered.as_text(), lowered.compile()  # one lowering: read, then run
  box = {'state': state}

  def run():
    box['state'], box['metrics'] = compiled(box['state'], batch, rng)
    jax.block_until_ready(box['metrics'])

  def volume_row():
    abstract = build.abstract_variables(cfg, model, meta['channels'])
    return volume.row(cfg, stablehlo, abstract['params'], abstract.get('batch_stats', {}),
                      reported=float(box['metrics']['sent_bytes']),
                      live=getattr(strategy, 'live', None))
  text = compiled.as_text()
  return {'run': run, 'volume': volume_row, 'hlo': text,
          'compiled': volume.program_collectives(hlo.compiled_collectives(text),
                                                 jax.device_count())}


def time_step(cfg, meta, repeats: int, warmup: int) -> dict:
  """t_iter of the config's step alone (`repeats` calls), with its volume row."""
  cell = step_cell(cfg, meta)
  samples = call_timing.timed(cell['run'], repeats, warmup)
  return {'samples': samples, 'volume': cell['volume'](), 'compiled': cell['compiled']}


MEMORY_BUDGET = 4 << 30


def groups(costs, budget: int = MEMORY_BUDGET) -> list:
  """Consecutive runs of indices whose summed costs stay under `budget` (each at least one
  index): the cells held, and interleaved, at once."""
  out, total = [], 0
  for i, cost in enumerate(costs):
    if out and total + cost <= budget:
      out[-1].append(i)
      total += cost
    else:
      out.append([i])
      total = cost
  return out


def round_order(cells: int, round_index: int) -> list:
  """The order of a round's cells: a permutation drawn from the round's number, so every
  process of a setting runs the same programs in the same order."""
  import random
  return random.Random(round_index).sample(range(cells), cells)


def time_in_rounds(make_cells, rounds: int, steps_per_round: int, warmup: int,
                   barrier=None) -> list:
  """Samples of each cell: `make_cells()` gives the cells' calls (made, and compiled by the
  warm-up, before any is timed); then `rounds` rounds, each running every cell once untimed
  and `steps_per_round` times timed, in `round_order`. `barrier(name)` (if given) starts
  each cell's warm-up and each round on every process at once."""
  calls = make_cells()
  for i, call in enumerate(calls):
    if barrier:
      barrier(f'warm-up {i}')  # the processes compile at their own pace (or load a cache)
    for _ in range(warmup):
      call()
  samples = [[] for _ in calls]
  for r in range(rounds):
    if barrier:
      barrier(f'round {r}')
    for i in round_order(len(calls), r):
      samples[i] += call_timing.timed(calls[i], steps_per_round, 1)
  return samples


def time_async(cfg, meta, batches: int, repeats: int) -> list:
  """Seconds for the asynchronous loop to apply each of `repeats` runs of `batches` pushes
  on N workers, one loop throughout, after 2N pushes of warm-up (each worker compiles)."""
  import jax
  from jaxpar import build
  from jaxpar import config as config_lib
  from jaxpar.mesh import make_mesh
  from jaxpar.parallel.async_ray import RayDownpour
  from jaxpar.parallel.async_sgd import Downpour

  n = config_lib.num_devices(cfg)
  warmup = 2 * n
  count = warmup + repeats * batches
  if config_lib.on_ray(cfg):  # the workers and servers are Ray's actors; this is the driver
    mesh = make_mesh((1,), ('data',), jax.devices()[:1])
    model, strategy, tx, state = build.for_timing(cfg, meta['num_classes'], meta['channels'],
                                                  mesh)
    rows = config_lib.device_batch(cfg)
    stream = functools.partial(synthetic_stream, rows, cfg.image_size, meta['channels'],
                               meta['num_classes'])
    # One CPU a worker (Ray's OMP_NUM_THREADS, oneDNN's team), as each process of the
    # processes setting has one core; not the run's default, the cluster's CPUs / workers.
    loop = RayDownpour(model, tx, strategy, stream, count, jax.random.key(1), workers=n,
                       micro_batches=cfg.grad_accum_steps, cpus_per_worker=1)
    # Ray's processes inherit this one's core: they get every core, as on a cluster node.
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    try:
      state, metrics = loop(state)  # starts Ray (once) and the actors
    finally:
      os.sched_setaffinity(0, pinned)
    warmup -= 1
  else:
    mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axes, jax.devices()[:n], cfg.bn_group_size)
    model, strategy, tx, state = build.for_timing(cfg, meta['num_classes'], meta['channels'],
                                                  mesh)
    push = probe.synthetic_batch(config_lib.device_batch(cfg), cfg, meta)
    loop = Downpour(model, tx, strategy, itertools.repeat(push), count, jax.random.key(1),
                    cfg.grad_accum_steps)
  for _ in range(warmup):
    state, metrics = loop(state)
  samples = []
  for _ in range(repeats):
    # Ends when every push is applied and the weights are at hand (Ray: fetched from the
    # servers, as for a checkpoint).
    jax.block_until_ready((loop.synced(state), metrics))
    start = time.perf_counter()
    for _ in range(batches):
      state, metrics = loop(state)
    jax.block_until_ready((loop.synced(state), metrics))
    samples.append(time.perf_counter() - start)
  loop.close()
  return samples


def synthetic_stream(rows, image_size, channels, classes, worker, position):
  """A Ray worker's stream for timing: one synthetic batch, again and again."""
  import numpy as np
  rng = np.random.default_rng(worker)
  batch = {'image': rng.normal(size=(rows, image_size, image_size, channels)).astype(np.float32),
           'label': rng.integers(0, classes, rows).astype(np.int32)}
  while True:
    yield batch


def run(spec) -> dict:
  import jax
  import ml_collections

  from analysis.steptime import trace
  from jaxpar import mesh as mesh_lib
  from jaxpar import build, multihost
  base = ml_collections.ConfigDict(spec['config'])
  build.keep_freed_memory(base)
  multihost.join(spec['coordinator'], spec['num_processes'], spec['process_id'], 'none',
                 base.distributed.initialization_timeout, base.distributed.heartbeat_timeout,
                 base.distributed.collective_threads)
  mesh_lib.emulate_cpu_devices(spec['local_devices'])
  meta = spec['meta']
  repeats, warmup = spec['repeats'], spec['warmup']

  def cell(overrides):
    c = ml_collections.ConfigDict(base.to_dict())
    c.update_from_flattened_dict(overrides)
    return c

  out = {'setting': spec['setting'], 'processes': jax.process_count(),
         'devices': jax.device_count(), 'pinned_cores': spec.get('pinned_cores'),
         't_grad': {}, 't_grad_trace': {}, 'calls': {}, 'steps': [], 'async': [],
         'volume': []}
  # The cells of the rounds: t_grad of each batch, then every step; grouped by memory.
  weights = spec['param_bytes']
  cells = ([('grad', b, 3 * weights) for b in spec['grad_batches']]
           + [('step', c, 4 * weights * (c['n'] if spec['setting'] == 'emulated' else 1))
              for c in spec['steps']])
  done = 0
  grouped = groups([cost for _, _, cost in cells])
  # The first group with steps: its warm-ups run the process's first collectives.
  first_steps = next((g for g, group in enumerate(grouped)
                      if any(cells[i][0] == 'step' for i in group)), None)
  for g, group in enumerate(grouped):
    mine = [cells[i] for i in group]
    compiled, calls = {}, []

    def make(mine=mine, compiled=compiled, calls=calls):
      for j, (kind, what, _) in enumerate(mine):
        if kind == 'grad':
          calls.append(probe.gradient_call(cell(ONE_DEVICE), meta, what))
        else:
          compiled[j] = step_cell(cell(what['overrides']), meta)
          calls.append(compiled[j]['run'])
      return calls
    def barrier(name, g=g):
      if (name == 'round 0' and g == first_steps and spec['num_processes'] > 1
          and base.distributed.collective_threads == 'idle'):
        # The poller sees gloo's loop only while it waits (multihost.wait_for_idle_gloo_loops),
        # so the first round would else pay ticks.
        multihost.wait_for_idle_gloo_loops()
      multihost.barrier(f'cells {g} {name}')
    samples = time_in_rounds(make, spec['rounds'], spec['steps_per_round'], warmup, barrier)
    traced = {}
    if spec.get('trace_calls') and spec['setting'] != 'emulated':
      # After the timing, not during it: the profiler's own work would slow the samples.
      for j, call in enumerate(calls):
        multihost.barrier(f'cells {g} trace {j}')
        traced[j] = trace.trace_calls(call, compiled[j]['hlo'] if j in compiled else '',
                                      spec['trace_calls'])
    for j, (kind, what, _) in enumerate(mine):
      extra = {'trace': traced[j]} if j in traced else {}
      if kind == 'grad':
        out['t_grad'][str(what)] = samples[j]
        if extra:
          out['t_grad_trace'][str(what)] = traced[j]
        _log(spec, f't_grad, batch {what}: {_summary(samples[j])}')
      else:
        done += 1
        out['steps'].append({**what, 'samples': samples[j], 'volume': compiled[j]['volume'](),
                             'compiled': compiled[j]['compiled'], **extra})
        _log(spec, f"[{done}/{len(spec['steps'])}] t_iter {what['scheme']} {what['server']} "
                   f"N={what['n']}: {_summary(samples[j])}")
    del compiled, mine, calls
  if spec['call_sizes']:
    out['calls'] = time_calls(spec['call_sizes'], repeats, warmup)
    for op, points in out['calls'].items():
      for t in points:
        _log(spec, f"{op.replace('_', '-')} of {t['bytes']:,} B on devices 0, 1, chains "
                   f"{','.join(t['chains'])}: single {_summary(t['chains']['1'])}")
  for i, c in enumerate(spec['async']):
    samples = time_async(cell(c['overrides']), meta, spec['batches'], spec['async_repeats'])
    out['async'].append({**c, 'samples': samples})
    _log(spec, f"[{i + 1}/{len(spec['async'])}] t_train async {c['server']} N={c['n']}, "
               f"{spec['batches']} pushes: {_summary(samples)}")
  for c in spec['volume']:
    # Local SGD reports its bytes on an averaging step: the τ-th.
    variant = cell(c['overrides'])
    out['volume'].append(time_step(variant, meta, 0, max(1, variant.sync_every))['volume'])
    _log(spec, f"volume: {out['volume'][-1]['method']} on {c['n']} devices")
  return out


def main(argv) -> int:
  if len(argv) != 2:
    print('usage: python -m analysis.steptime.timing SPEC.json  (written by python -m '
          'analysis.steptime.measure)', file=sys.stderr)
    return 2
  child(argv[1], run)
  return 0


def child(path: str, work) -> None:
  """One child process of `measure.run_setting`: `work(spec)` of the spec at `path`;
  process 0 writes its result to the spec's 'out'; then the processes part."""
  with open(path) as f:
    spec = json.load(f)
  out = work(spec)
  if spec['process_id'] == 0:
    with open(spec['out'], 'w') as f:
      json.dump(out, f)
  if spec['num_processes'] > 1:
    import jax
    jax.distributed.shutdown()


if __name__ == '__main__':
  sys.exit(main(sys.argv))
