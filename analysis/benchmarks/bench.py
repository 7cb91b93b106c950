"""Benchmark jaxpar's train step against an auto-sharded `jax.jit` step, side by side.

  python -m analysis.benchmarks.bench --config configs/resnet34_2d.py --config.mesh.shape=8, \\
      --config.mesh.axes=data, --out bench.json
  launch/local.sh 2 --module analysis.benchmarks.bench --workdir /tmp/bench --config ... --torch

For the configured network, compute dtype, scheme, server and reduction: jaxpar's step
(`shard_map`, the strategy's collectives) and the baseline a flax or big_vision user
writes — the same model, optimizer and global batch in a plain `jax.jit` step, the batch
sharded over every mesh axis with `NamedSharding`, the parameters replicated, XLA
inserting the collectives — are compiled, then run alternately, round by round, so both
see the same machine state; in each round each runner takes `--repeat` steps in a row and
the last is timed (a step right after another framework's is slower: `REPEAT`). Per step:
compile time; step time (median, min, max); images/s; FLOPs per device from the compiled
program's cost analysis and the FLOP/s achieved; peak memory and temporaries per device
from its memory analysis; the process's minor page faults a timed step (`getrusage`); the
host's speed when the run starts (`host_speed`); the collectives of the
compiled program and their bytes per device and step (`jaxpar.perfmodel.hlo.compiled_collectives`:
every branch of a conditional counts, and on CPU bfloat16 sums show as float32). Ratios are taken side by side
in this one run; nothing here is asserted in tests. `--torch` adds PyTorch's eager step and
`--torch_compile` its `torch.compile`d step (`analysis.benchmarks.torch_peer`), alternated with
the others. On a GPU (`bench_gpu.sh`) the PyTorch peers run on CUDA, and XLA's FLOP count leaves out the convolutions, which run as cuDNN custom calls
(`bench_table` then uses PyTorch's count).
"""
import datetime
import json
import os
import re
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import app, flags  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from analysis.benchmarks import alternate, bench_table, profile, torch_peer  # noqa: E402
from jaxpar.models import onednn  # noqa: E402
from jaxpar.perfmodel import hlo  # noqa: E402
from analysis.steptime.measure import machine, versions  # noqa: E402
from jaxpar import build  # noqa: E402
from jaxpar import config as config_lib  # noqa: E402
from jaxpar import host_memory, optim, validation  # noqa: E402
from jaxpar.data import sources  # noqa: E402
from jaxpar.parallel.allreduce import AllReduce  # noqa: E402
from jaxpar.step import batch_spec, gradients, init_state, make_train_step, to_global  # noqa: E402

FLAGS = flags.FLAGS


def jit_train_step(model, tx, mesh):
  """The auto-sharded baseline: one `jax.jit` over the global batch, parameters and
  optimizer state replicated, the batch split over every mesh axis. BatchNorm normalises
  over the whole global batch (XLA all-reduces its statistics), as jaxpar's BN over all
  devices does."""
  model = model.clone(bn_axis_name=None)
  replicated, data = NamedSharding(mesh, P()), NamedSharding(mesh, batch_spec(mesh))

  def step(state, batch, rng):
    rng = jax.random.fold_in(rng, state.step)
    grads, batch_stats, metrics = gradients(model, state.params, state.batch_stats, batch, rng)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new_state = state.replace(step=state.step + 1,
                              examples_seen=state.examples_seen + batch['label'].shape[0],
                              params=optax.apply_updates(state.params, updates),
                              batch_stats=batch_stats, opt_state=opt_state)
    return new_state, metrics
  return jax.jit(step, in_shardings=(replicated, data, replicated),
                 out_shardings=(replicated, replicated), donate_argnums=0)


class Runner:
  """One compiled step, its static measurements, and a state it advances."""

  def __init__(self, name, step, state, batch, rng, devices: int):
    self.name, self.state, self.batch, self.rng = name, state, batch, rng
    lowered = step.lower(state, batch, rng)
    start = time.perf_counter()
    self.compiled = lowered.compile()
    self.compile_time = time.perf_counter() - start
    # From the compiled program: an auto-sharded jit has its collectives only there.
    found = hlo.compiled_collectives(self.compiled.as_text())
    self.collectives = len(found)
    self.collective_bytes = hlo.step_bytes(found, devices)
    cost = self.compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    # XLA's count leaves out custom calls: oneDNN's convolutions are counted from the HLO.
    self.flops = (float(cost.get('flops', 0.0)) if cost else 0.0) + onednn.hlo_flops(
        self.compiled.as_text())
    memory = self.compiled.memory_analysis()
    self.peak_memory = (memory.argument_size_in_bytes + memory.output_size_in_bytes
                        - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
    self.temp_bytes = memory.temp_size_in_bytes
    self.times = []

  def __call__(self, timed: bool = True):
    start = time.perf_counter()
    self.state, metrics = self.compiled(self.state, self.batch, self.rng)
    jax.block_until_ready(metrics)
    if timed:
      self.times.append(time.perf_counter() - start)

  def profile(self, steps: int) -> dict:
    """Time by HLO op category of `steps` more steps (`analysis.benchmarks.profile`)."""
    return profile.op_times(lambda: self(timed=False), self.compiled.as_text(), steps)

  def result(self, images: int) -> dict:
    median = float(np.median(self.times))
    return {'step': self.name, 'compile_s': self.compile_time, 'median_s': median,
            'min_s': min(self.times), 'max_s': max(self.times), 'samples': self.times,
            'images_per_s': images / median, 'flops_per_device': self.flops,
            'flop_per_s_per_device': self.flops / median,
            'peak_memory_bytes_per_device': self.peak_memory,
            'temp_bytes_per_device': self.temp_bytes,
            'collectives': self.collectives,
            'collective_bytes_per_device': self.collective_bytes}


def check(cfg, with_torch: bool, flag: str = '--torch'):
  """Refuses what the bench cannot time, before anything compiles."""
  validation.validate(cfg)
  if cfg.scheme == 'async':
    raise config_lib.ConfigError("config.scheme='async' is invalid here: "
                                 "analysis.benchmarks.bench times a synchronous step; time "
                                 "async with analysis.steptime.measure")
  if with_torch and cfg.model != 'resnet34' and cfg.batch_norm:
    raise config_lib.ConfigError(
        f'config.batch_norm=True is invalid with {flag}: the PyTorch peer of {cfg.model} is '
        f'the published network, without BatchNorm; set --config.batch_norm=False')
  if with_torch and not torch_peer.available():
    raise config_lib.ConfigError(
        f"{flag} needs PyTorch and torchvision: pip install -e '.[bench]'")


def check_device_bn(cfg):
  """`--device_bn` compares BatchNorm over a group of devices with BatchNorm per device:
  it needs a network with BatchNorm and a group of more than one device."""
  if cfg.model != 'resnet34' and not cfg.batch_norm:
    raise config_lib.ConfigError(
        f'config.batch_norm=False is invalid with --device_bn: {cfg.model} has no BatchNorm to '
        f'compare; set --config.batch_norm=True')
  if cfg.bn_group_size == 1:
    raise config_lib.ConfigError(
        'config.bn_group_size=1 is invalid with --device_bn: the step already normalises per '
        'device; set --config.bn_group_size=0 (all devices) or a group size above 1')


def _torch_device() -> str:
  """The PyTorch peer runs where JAX does: a GPU of this process or the CPU. Asks JAX's
  backend, so only after `build.mesh` has joined the processes (jax.distributed must start
  before anything touches the backend)."""
  device = 'cuda' if jax.default_backend() == 'gpu' else 'cpu'
  if device == 'cuda':
    import torch
    if not torch.cuda.is_available():
      raise config_lib.ConfigError(
          "--torch on JAX's GPU backend needs PyTorch built with CUDA; torch.cuda.is_available() "
          "is False here: install a CUDA build of torch, or leave out --torch")
  return device


# Idle before each runner's turn: the previous step's thread pools (XLA's, oneDNN's and
# PyTorch's OpenMP teams) go to sleep before the next step starts, instead of spinning on the
# cores it needs (SqueezeNet 224², one device: jaxpar's step after PyTorch's 54-62 ms without
# the pause, 46-47 ms alternating with jaxpar's own variants; 2026-11-27).
PAUSE_S = 0.05
# Steps a runner takes in a row each round, the last one timed: a step right after another
# framework's is slower for a reason no pause removes (SqueezeNet 224², one device, float32,
# 2026-11-27: jaxpar 0.081 s and PyTorch 0.070 s alternating step by step, also with 0.5 s
# idle between; 0.055 s and 0.053 s each timed after an untimed step of its own, as each
# alone: 0.054-0.062 s and 0.055-0.056 s) — each runner's timed step follows its own.
REPEAT = 2


def bench(cfg, steps: int, warmup: int, profile_steps: int = 0, with_torch: bool = False,
          with_torch_compile: bool = False, repeat: int = REPEAT,
          with_device_bn: bool = False, within: float = 0.0, max_steps: int = 0,
          trace_dir: str = '', trace_steps: int = 3) -> dict:
  """The steps side by side: `steps` timed rounds, then, with `within` > 0, more rounds, a
  turn at a time (a round led by each runner), up to `max_steps` in all, until the ratios
  the verdicts rest on — jaxpar's throughput over jit's and, with `with_device_bn`, the
  sync-BN ratio — are each known within ± `within` of their median
  (`alternate.known_within`); the PyTorch peers' ratios get those rounds too, whatever
  their width. With `trace_dir`, each runner's `trace_steps` more steps under a profiler
  (JAX's, or PyTorch's for its peers): the traces kept there with each JAX step's compiled
  HLO (the program whose instructions the trace's `hlo_op`s name), and each result's
  `kernels` the device time by kernel (`profile.traced_steps`; on a GPU)."""
  peers = [compiled for compiled, wanted in ((False, with_torch), (True, with_torch_compile))
           if wanted]
  check(cfg, bool(peers), '--torch_compile' if with_torch_compile and not with_torch
        else '--torch')
  if with_device_bn:
    check_device_bn(cfg)
  mesh = build.mesh(cfg)
  speed = alternate.host_speed()  # before anything compiles or runs: BLAS's threads then sleep
  torch_device = _torch_device() if peers else None
  source = sources.open_source(cfg.dataset)
  global_batch = config_lib.global_batch(cfg)
  channels = source.channels
  model, strategy, tx, state = build.for_timing(cfg, source.num_classes, channels, mesh)
  rng = np.random.default_rng(0)
  local = global_batch // jax.process_count()
  local_batch = {
      'image': rng.normal(size=(local, cfg.image_size, cfg.image_size, channels))
      .astype(np.float32),
      'label': rng.integers(0, source.num_classes, local).astype(np.int32)}
  batch = to_global(mesh, local_batch)
  key = jax.random.key(0)
  runners = [Runner('jaxpar shard_map', make_train_step(model, tx, mesh, strategy), state,
                    batch, key, mesh.size)]
  baseline = AllReduce(mesh.axis_names)
  base_tx, _ = build.optimizer(cfg, model, channels, baseline, global_batch,
                               total_steps=build.timing_steps(cfg))
  runners.append(Runner('auto-sharded jit', jit_train_step(model, base_tx, mesh),
                        init_state(model, base_tx, baseline, mesh,
                                   (1, cfg.image_size, cfg.image_size, channels), key),
                        batch, key, mesh.size))
  if with_device_bn:  # the same step, each device normalising over its own examples
    per_device = config_lib.with_overrides(cfg, {'bn_group_size': 1})
    model_1, strategy_1, _, state_1 = build.for_timing(per_device, source.num_classes,
                                                        channels, mesh)
    runners.append(Runner(bench_table.DEVICE_BN, make_train_step(model_1, tx, mesh, strategy_1),
                          state_1, batch, key, mesh.size))
  for compiled in peers:
    runners.append(torch_peer.TorchRunner(
        cfg, source.num_classes, local_batch, optim.peak_learning_rate(cfg.optimizer, global_batch),
        jax.process_count(), jax.process_index(), torch_device, compiled=compiled))
  for _ in range(warmup):
    for r in runners:
      r(timed=False)
  faults = [[] for _ in runners]
  # The ratios `within` waits for: (numerator, denominator) runners, round by round.
  watched = [(runners[1], runners[0])] + ([(runners[0], runners[2])] if with_device_bn else [])

  def more(i):
    if i < steps:
      return True
    if not within or i >= max_steps:
      return False
    if i % len(runners):
      return True  # the rest of a turn: every runner leads as often
    wanted = not all(alternate.known_within(a.times, b.times, within) for a, b in watched)
    # Across processes every process runs the same rounds: process 0's timings decide.
    return bool(multihost_utils.broadcast_one_to_all(np.int32(wanted)))

  i = 0
  while more(i):  # alternate: every runner sees the same machine state
    # Each round starts with the next runner: each comes right after each other equally
    # often (the first of every round ran up to 1.12x the second's time, the same program
    # on one device, 2026-11-27: the step after PyTorch's pays for it, `REPEAT` aside).
    pairs = list(zip(runners, faults))
    for r, counted in pairs[i % len(pairs):] + pairs[:i % len(pairs)]:
      time.sleep(PAUSE_S)
      for _ in range(repeat - 1):
        r(timed=False)
      before = host_memory.minor_faults()
      r()
      counted.append(host_memory.minor_faults() - before)
    i += 1
    print(f'\rround {i}/{max(steps, max_steps if within else 0)}', end='', file=sys.stderr,
          flush=True)
  print(file=sys.stderr)
  results = [r.result(global_batch) | {'page_faults_per_step': float(np.mean(counted))}
             for r, counted in zip(runners, faults)]
  if profile_steps:
    for r, result in zip(runners[:2], results):
      result['profile'] = r.profile(profile_steps)
  if trace_dir:
    os.makedirs(trace_dir, exist_ok=True)
    for r, result in zip(runners, results):
      slug = re.sub(r'[^a-z0-9]+', '_', r.name.lower()).strip('_')
      if not isinstance(r, torch_peer.TorchRunner):  # the program the trace's ops name
        with open(os.path.join(trace_dir, f'{slug}.hlo.txt'), 'w') as f:
          f.write(r.compiled.as_text())
      try:  # a trace that cannot be read costs its summary, not the timings above
        result['kernels'] = profile.traced_steps(
            lambda: r(timed=False), trace_steps,
            os.path.join(trace_dir, f'{slug}.trace.json.gz'),
            r.torch if isinstance(r, torch_peer.TorchRunner) else None)
      except Exception as e:  # noqa: BLE001
        result['kernels'] = {'error': f'{type(e).__name__}: {e}'[:500]}
        print(f'bench: tracing {r.name} failed: {e}', file=sys.stderr)
  for r in runners:
    if isinstance(r, torch_peer.TorchRunner):
      r.close()
  ratios = {}
  peer_results = results[3:] if with_device_bn else results[2:]
  if with_device_bn:
    # jaxpar's step (BatchNorm over the group) over its per-device-BN twin, round by round
    paired = alternate.paired_ratio(results[0]['samples'], results[2]['samples'])
    ratios['sync_bn_over_device_bn'] = paired['median']
    ratios['sync_bn_over_device_bn_interval'] = paired['interval']
  for key, result in [('shard_map_over_jit', results[1])] + [
      (f"shard_map_over_torch{'_compile' if compiled else ''}", result)
      for compiled, result in zip(peers, peer_results)]:
    # jaxpar's throughput over the other's: the other's step over jaxpar's, round by round
    paired = alternate.paired_ratio(result['samples'], results[0]['samples'])
    ratios[f'{key}_throughput'] = paired['median']
    ratios[f'{key}_quartiles'] = [paired['q25'], paired['q75']]
    ratios[f'{key}_interval'] = paired['interval']
  found = versions()
  if peers:
    import torch
    found['torch'] = torch.__version__
  return {'tool': 'analysis.benchmarks.bench',
          'created': datetime.datetime.now().isoformat(timespec='seconds'),
          'machine': machine(), 'host_speed': speed, 'versions': found,
          'backend': jax.default_backend(), 'device_kind': jax.devices()[0].device_kind,
          'config': cfg.to_dict(), 'command': ' '.join(['python -m analysis.benchmarks.bench']
                                                       + sys.argv[1:]),
          'network': cfg.model, 'image_size': cfg.image_size, 'dtype': cfg.dtype,
          'mesh': list(cfg.mesh.shape), 'global_batch': global_batch, 'repeat': repeat,
          'rounds': i, 'within': within or None,
          'xla_flags': os.environ.get('XLA_FLAGS', ''),
          'method': f'{cfg.scheme} {cfg.server} {cfg.grad_reduce} {cfg.grad_reduce_dtype}',
          'steps': results, **ratios}


def _shown(value, scale: float, digits: int) -> str:
  return 'n/a' if value is None else f'{value / scale:.{digits}f}'


def markdown(r) -> str:
  speed = (f"; host: matmul {r['host_speed']['matmul_gflop_s']:.0f} GFLOP/s, copy "
           f"{r['host_speed']['copy_gb_s']:.1f} GB/s" if 'host_speed' in r else '')
  lines = [f"{r['network']} {r['image_size']}², {r['dtype']}, mesh {tuple(r['mesh'])}, global "
           f"batch {r['global_batch']}, {r['method']}{speed}", '',
           '| step | compile (s) | step (s): median (min–max) | images/s | GFLOP/device '
           '| GFLOP/s/device | peak MB/device | collectives | collective MB/device |',
           '|---|---:|---:|---:|---:|---:|---:|---:|---:|']
  for s in r['steps']:
    lines.append(f"| {s['step']} | {s['compile_s']:.1f} | {s['median_s']:.4f} "
                 f"({s['min_s']:.4f}–{s['max_s']:.4f}) | {s['images_per_s']:.1f} "
                 f"| {s['flops_per_device'] / 1e9:.2f} | {s['flop_per_s_per_device'] / 1e9:.2f} "
                 f"| {_shown(s['peak_memory_bytes_per_device'], 1e6, 1)} "
                 f"| {_shown(s['collectives'], 1, 0)} "
                 f"| {_shown(s['collective_bytes_per_device'], 1e6, 2)} |")
  if not bench_table.xla_counts_convolutions(r):
    lines.append("\nOn this GPU XLA's GFLOP count of the JAX steps leaves out the convolutions "
                 "(cuDNN custom calls).")
  lines.append('')
  for key, peer in (('shard_map_over_jit', "auto-sharded jit's"),
                    ('shard_map_over_torch', "PyTorch's"),
                    ('shard_map_over_torch_compile', "torch.compile's")):
    if f'{key}_throughput' in r:
      lines.append(f"jaxpar's throughput / {peer}: {bench_table.ratio(r, key, 3)}")
  if 'sync_bn_over_device_bn' in r:
    low, high = r['sync_bn_over_device_bn_interval']
    lines.append(f"jaxpar's step with BatchNorm over the group / with BatchNorm per device: "
                 f"{r['sync_bn_over_device_bn']:.3f}× [{low:.2f}–{high:.2f}]")
  profiled = [s for s in r['steps'] if 'profile' in s]  # the two JAX steps
  if profiled:
    profiles = [s['profile']['seconds_per_step'] for s in profiled]
    lines += ['', 'Time by HLO op, ms per step (thread time summed over devices):', '',
              '| op | ' + ' | '.join(s['step'] for s in profiled) + ' |',
              '|---|' + '---:|' * len(profiles)]
    for category in sorted(set().union(*profiles), key=lambda c: -profiles[0].get(c, 0)):
      lines.append(f'| {category} | '
                   + ' | '.join(f'{p.get(category, 0) * 1e3:.1f}' for p in profiles) + ' |')
    lines.append('| total | ' + ' | '.join(f'{sum(p.values()) * 1e3:.1f}' for p in profiles)
                 + ' |')
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if FLAGS.steps < 1 or FLAGS.warmup < 1 or FLAGS.profile < 0 or FLAGS.repeat < 1:
    raise app.UsageError('--steps, --warmup and --repeat must be at least 1, --profile at '
                         'least 0.')
  if FLAGS.within < 0 or FLAGS.within >= 1:
    raise app.UsageError(f'--within={FLAGS.within}: a fraction of the median, e.g. 0.03 for '
                         '±3 %; 0 runs --steps rounds.')
  if FLAGS.within and FLAGS.max_steps < FLAGS.steps:
    raise app.UsageError(f'--within={FLAGS.within} needs --max_steps of at least --steps '
                         f'({FLAGS.steps}), got {FLAGS.max_steps}.')
  try:
    result = bench(FLAGS.config, FLAGS.steps, FLAGS.warmup, FLAGS.profile, FLAGS.torch,
                   FLAGS.torch_compile, FLAGS.repeat, FLAGS.device_bn, FLAGS.within,
                   FLAGS.max_steps, FLAGS.trace)
  except config_lib.ConfigError as e:
    print(f'jaxpar: {e}', file=sys.stderr)
    sys.exit(2)
  if jax.process_index() != 0:  # across processes (launch/local.sh): process 0 reports
    return
  print(markdown(result))
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  # Defined here, not at import: jaxpar.train defines --config too, and tests import both.
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].')
  flags.DEFINE_integer('steps', 10, 'Timed rounds (one step of each) after the warm-up.')
  flags.DEFINE_integer('warmup', 2, 'Untimed rounds first.')
  flags.DEFINE_float('within', 0.0, 'Then more rounds, up to --max_steps in all, until '
                     "jaxpar's throughput over jit's (and with --device_bn the sync-BN ratio) "
                     "is known within ± this fraction of its median (the median's 95 % "
                     'interval; 0.03: ±3 %). 0: --steps rounds.')
  flags.DEFINE_integer('max_steps', 0, 'The most rounds --within may run.')
  flags.DEFINE_integer('repeat', REPEAT, 'Steps each runner takes in a row each round, the '
                       'last timed (1: alternate step by step).')
  flags.DEFINE_bool('torch', False, 'Also time the PyTorch peer (torchvision\'s network), '
                    'alternated (needs the [bench] extra).')
  flags.DEFINE_bool('torch_compile', False, 'Also time the PyTorch peer under torch.compile '
                    '(its first step, the compilation, reported apart), alternated.')
  flags.DEFINE_integer('profile', 0, 'Then profile this many steps of each: time by HLO op.')
  flags.DEFINE_bool('device_bn', False, 'Also time jaxpar\'s step with BatchNorm per device '
                    '(bn_group_size=1): the ratio sync_bn_over_device_bn is the configured '
                    'group\'s step time over it, round by round.')
  flags.DEFINE_string('trace', '', 'Then trace 3 more steps of each runner into this folder '
                      "(JAX's profiler; PyTorch's for its peers): the device time by kernel in "
                      "each step's JSON (`kernels`), the traces beside it. For GPUs.")
  flags.DEFINE_string('out', '', 'Also write the results as JSON here.')
  flags.mark_flag_as_required('config')
  app.run(main)
