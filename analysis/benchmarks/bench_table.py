"""One markdown table from several `analysis.benchmarks.bench --out` files (the README's):

  python -m analysis.benchmarks.bench_table runs/*.json
  python -m analysis.benchmarks.bench_table --methods runs/methods/*.json
      # (analysis/benchmarks/bench_methods.sh runs both)
  python -m analysis.benchmarks.bench_table --sync_bn runs/*_2p.json
      # runs of `bench --device_bn` (analysis/benchmarks/bench_sync_bn.sh): `sync_bn_table`

A row per run: network, input size, compute dtype, devices, global batch, the devices
jaxpar's BatchNorm shares statistics over (jit's always: all; PyTorch's: each process),
each step's median time, jaxpar's throughput over the auto-sharded jit's (and PyTorch's, when the run
had the peer, and torch.compile's: two more columns when any run had that peer), and jaxpar's
GFLOP/s per device; on a GPU whose peak is known (`PEAK_TFLOPS`), that rate as a fraction of
the GPU's dense tensor-core peak for the step's arithmetic. On a GPU XLA's cost analysis leaves out the
convolutions (they run as cuDNN custom calls: of VGG16E's 7,528 GFLOP a step at 224², batch
64, it counted the fully connected layers' 44): there the step's FLOPs are PyTorch's count of
the same network and batch (`torch.utils.flop_counter`), marked *.
"""
import json
import math
import statistics
import sys


# Dense (no structured sparsity) tensor-core peaks in TFLOP/s, from NVIDIA's data sheets (their
# figures "with sparsity" halved), keyed by JAX's `device_kind`. float32 steps count at the
# TF32 rate: JAX's default precision and PyTorch's `cudnn.allow_tf32` run float32
# convolutions in TF32 (measured above the GPUs' 51–67 TFLOP/s non-tensor float32 rates).
PEAK_TFLOPS = {
    'NVIDIA H100 80GB HBM3': {'bfloat16': 989.4, 'float32': 494.7},  # H100 SXM5
    'NVIDIA H200': {'bfloat16': 989.4, 'float32': 494.7},            # H200 SXM
    'NVIDIA H100 PCIe': {'bfloat16': 756.0, 'float32': 378.0},
    'NVIDIA H100 NVL': {'bfloat16': 835.5, 'float32': 417.5},
    'NVIDIA A100-SXM4-80GB': {'bfloat16': 312.0, 'float32': 156.0},
    'NVIDIA A100-SXM4-40GB': {'bfloat16': 312.0, 'float32': 156.0},
    'NVIDIA A100 80GB PCIe': {'bfloat16': 312.0, 'float32': 156.0},
}


def peak_flops(r):
  """The dense peak FLOP/s of the run's device for its compute dtype, or None (CPUs, and GPUs
  not in `PEAK_TFLOPS`)."""
  if r.get('backend', 'cpu') == 'cpu':
    return None
  peak = PEAK_TFLOPS.get(r.get('device_kind', ''), {}).get(r['dtype'])
  return peak * 1e12 if peak else None


def _peers(steps):
  """The eager PyTorch peer's step and the torch.compile peer's, each or None."""
  return (next((s for name, s in steps.items() if name.startswith('PyTorch')), None),
          next((s for name, s in steps.items() if name.startswith('torch.compile')), None))


def _spread(r, key: str):
  """(low, high, brackets) of a ratio's uncertainty: the median's 95 % interval where the run
  recorded it (`alternate.median_interval`, '[]'), else its rounds' quartiles (older files,
  '()'); None for a file with neither."""
  for suffix, brackets in (('_interval', '[]'), ('_quartiles', '()')):
    if key + suffix in r:
      return (*r[key + suffix], brackets)
  return None


def ratio(r, key: str, digits: int = 2) -> str:
  """A throughput ratio of the run (`key` + '_throughput') with its `_spread` in brackets."""
  cell = f"{r[key + '_throughput']:.{digits}f}×"
  spread = _spread(r, key)
  if spread:
    low, high, (opening, closing) = spread
    cell += f' {opening}{low:.2f}–{high:.2f}{closing}'
  return cell


def row(r, compiled_column: bool = False, peak_column: bool = False) -> str:
  steps = {s['step']: s for s in r['steps']}
  jaxpar, jit = steps['jaxpar shard_map'], steps['auto-sharded jit']
  peer, compiled = _peers(steps)
  devices, processes = math.prod(r['mesh']), r['config']['distributed']['num_processes']
  where = (f'{devices} ({processes} processes)' if processes > 1
           else f'{devices} (emulated)' if devices > 1 else '1')
  group = r['config']['bn_group_size']
  bn = ('no BN' if r['network'] != 'resnet34' and not r['config']['batch_norm']
        else 'all devices' if group in (0, devices)
        else 'each device' if group == 1 else f'groups of {group}')
  cells = [r['network'], f"{r['image_size']}²", r['dtype'], where, str(r['global_batch']), bn, _seconds(jaxpar), _seconds(jit),
           ratio(r, 'shard_map_over_jit', 3),
           _seconds(peer) if peer else '–',
           ratio(r, 'shard_map_over_torch') if peer else '–']
  if compiled_column:
    cells += [_seconds(compiled) if compiled else '–',
              ratio(r, 'shard_map_over_torch_compile') if compiled else '–']
  cells.append(_gflops(r, jaxpar, peer or compiled))
  if peak_column:
    rate, peak = _flop_rate(r, jaxpar, peer or compiled), peak_flops(r)
    cells.append(f'{100 * rate / peak:.0f} %' if rate and peak else 'n/a')
  return '| ' + ' | '.join(cells) + ' |'


def _seconds(step) -> str:
  """A median step time: three decimals, four below 0.1 s (a GPU's steps take milliseconds)."""
  return f"{step['median_s']:.{4 if step['median_s'] < 0.1 else 3}f}"


PEER_FLOPS = ('* FLOPs as PyTorch counts the same step: on a GPU XLA\'s cost analysis leaves out '
              'the convolutions (cuDNN calls).')


def xla_counts_convolutions(r) -> bool:
  """Whether XLA's cost analysis of the run's programs counted their convolutions: on the
  CPU it does (files before `backend` was recorded are CPU runs); on a GPU they are cuDNN
  custom calls it leaves out."""
  return r.get('backend', 'cpu') == 'cpu'


def _flop_rate(r, jaxpar, peer):
  """jaxpar's FLOP/s per device: XLA's count, or on a GPU the PyTorch peer's (None without)."""
  if xla_counts_convolutions(r):
    return jaxpar['flop_per_s_per_device']
  return peer['flops_per_device'] / jaxpar['median_s'] if peer else None


def _gflops(r, jaxpar, peer) -> str:
  rate = _flop_rate(r, jaxpar, peer)
  if rate is None:
    return 'n/a'
  value, mark = rate / 1e9, '' if xla_counts_convolutions(r) else '*'
  return (f'{value:,.0f}' if value >= 1000 else f'{value:.1f}') + mark


def _device(r) -> str:
  """The run's accelerator, short (a GPU's name without the vendor), or 'cpu'."""
  kind = r.get('device_kind', 'cpu')
  return kind.removeprefix('NVIDIA ') if r.get('backend', 'cpu') != 'cpu' else 'cpu'


def host(machine: dict) -> str:
  """A measurement's CPU host in a table cell (compile_bench's and ray_worker_bench's tables):
  'AMD EPYC, 2 cores, AVX2'."""
  return (f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
          f"{machine.get('cpu_isa', '?')}")


def _date(r) -> str:
  return r.get('created', '')[:10] or '?'


def cpu_name(r) -> str:
  """The run's CPU, short: 'Intel(R) Xeon(R) Processor' → 'Intel Xeon'."""
  model = r.get('machine', {}).get('cpu', '') or '?'
  return ' '.join(model.replace('(R)', '').replace('(TM)', '').replace(' Processor', '').split())


def cell(r) -> tuple:
  """What a run measured, less when: its device, network, input, compute, devices, processes,
  BatchNorm grouping and global batch."""
  return (_device(r), r['network'], r['image_size'], r['dtype'], tuple(r['mesh']),
          r['config']['distributed']['num_processes'], r['config']['bn_group_size'],
          r['global_batch'])


def newest(results) -> list:
  """Each cell's newest run (`created`), for a front page's table; the older runs of a cell
  stay in the tables of the days they ran."""
  last = {}
  for r in sorted(results, key=lambda r: r.get('created', '')):
    last[cell(r)] = r
  return list(last.values())


def table(results) -> str:
  """The rows of `results`; a first column names the device when they ran on several kinds,
  and one the day each ran when they ran on several days — with its CPU when they ran on
  several (a host of the same kind may be another CPU from one day to the next)."""
  compiled = any(_peers({s['step']: s for s in r['steps']})[1] for r in results)
  peak = any(peak_flops(r) for r in results)
  kinds = len({_device(r) for r in results}) > 1
  days = len({_date(r) for r in results}) > 1
  hosts = len({cpu_name(r) for r in results if _device(r) == 'cpu'}) > 1
  when = lambda r: f'{_date(r)}, {cpu_name(r)}' if hosts else _date(r)
  head = ['network', 'input', 'compute', 'devices', 'batch', 'jaxpar BN over', 'jaxpar step (s)',
          'jit step (s)', 'jaxpar / jit throughput', 'PyTorch step (s)', 'jaxpar / PyTorch']
  align = ['---'] * 4 + ['---:', '---'] + ['---:'] * 5
  if compiled:
    head += ['torch.compile step (s)', 'jaxpar / torch.compile']
    align += ['---:'] * 2
  head.append('jaxpar GFLOP/s/device')
  align.append('---:')
  if peak:
    head.append("jaxpar / GPU's peak")
    align.append('---:')
  if days or hosts:
    head, align = ['measured'] + head, ['---'] + align
  if kinds:
    head, align = ['device'] + head, ['---'] + align
  ordered = sorted(results, key=lambda r: (
      r['network'], r['image_size'], math.prod(r['mesh']),
      r['config']['distributed']['num_processes'], r['config']['bn_group_size'],
      r['dtype'] != 'float32', _device(r), _date(r)))
  rows = [row(r, compiled, peak) for r in ordered]
  if days or hosts:
    rows = [f'| {when(r)} {line}' for r, line in zip(ordered, rows)]
  if kinds:
    rows = [f'| {_device(r)} {line}' for r, line in zip(ordered, rows)]
  return '\n'.join(
      ['| ' + ' | '.join(head) + ' |', '|' + '|'.join(align) + '|'] + rows
      + (['', PEER_FLOPS] if not all(map(xla_counts_convolutions, results)) else []))


def verdict(r, key: str) -> str:
  """'ahead', 'level' or 'behind': where a ratio's `_spread` lies against 1 (a run with
  none, its median alone)."""
  spread = _spread(r, key)
  low, high = spread[:2] if spread else (r[key + '_throughput'],) * 2
  return 'ahead' if low > 1 else 'behind' if high < 1 else 'level'


def torch_summary(results) -> str:
  """One sentence on jaxpar's float32 step against PyTorch's eager step, computed from the
  table's rows: per kind of mesh, how many cells are ahead, level (their `_spread` holds 1)
  or behind (`verdict`), with the range of the ratios."""
  groups = {}
  for r in results:
    steps = {s['step']: s for s in r['steps']}
    if r['dtype'] != 'float32' or not _peers(steps)[0]:
      continue
    devices, processes = math.prod(r['mesh']), r['config']['distributed']['num_processes']
    where = ('on one device' if devices == 1 else f'across {processes} processes'
             if processes > 1 else f'on {devices} emulated devices')
    groups.setdefault(where, []).append(r)
  parts = []
  for where, rs in groups.items():
    counts = {v: [r for r in rs if verdict(r, 'shard_map_over_torch') == v]
              for v in ('ahead', 'level', 'behind')}
    low, high = (f(r['shard_map_over_torch_throughput'] for r in rs) for f in (min, max))
    said = []
    for v, c in counts.items():
      if c:
        named = ', '.join(f"{r['network']} {r['image_size']}²" for r in c)
        said.append(f'{v} in {len(c)}' + (f' ({named})' if v != 'ahead' else ''))
    span = f'{low:.2f}×' if f'{low:.2f}' == f'{high:.2f}' else f'{low:.2f}–{high:.2f}×'
    parts.append(f"{where} {' and '.join(said)} of {len(rs)}, {span}")
  return ("jaxpar's float32 step against PyTorch's eager step (a cell is ahead or behind "
          "where its median's 95 % interval — in older runs its rounds' quartiles — lies above "
          "or below 1×, else level): "
          + '; '.join(parts) + '.')


def method_row(r) -> str:
  """A method's step beside the auto-sharded jit step (all-reduce, replicated state)."""
  steps = {s['step']: s for s in r['steps']}
  jaxpar, jit = steps['jaxpar shard_map'], steps['auto-sharded jit']
  c = r['config']
  method = ('Local SGD τ=%d' % c['sync_every'] if c['sync_every']
            else f"distributed {c['placement']}" if c['server'] == 'distributed' else c['server'])
  spread = lambda s: f"{s['median_s']:.3f} ({s['min_s']:.3f}–{s['max_s']:.3f})"
  cells = [r['network'], f"{r['image_size']}²", str(math.prod(r['mesh'])), str(r['global_batch']),
           method, c['optimizer']['name'], spread(jaxpar), spread(jit),
           f"{jit['median_s'] / jaxpar['median_s']:.3f}×",
           f"{jaxpar['peak_memory_bytes_per_device'] / 1e6:.0f}",
           f"{jit['peak_memory_bytes_per_device'] / 1e6:.0f}"]
  return '| ' + ' | '.join(cells) + ' |'


def methods_table(results) -> str:
  return '\n'.join(
      ['| network | input | devices | batch | method | optimizer | method step (s): median '
       '(min–max) | jit all-reduce step (s) | method / jit throughput | method peak MB/device '
       '| jit peak MB/device |', '|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|']
      + [method_row(r) for r in sorted(results, key=lambda r: (
          math.prod(r['mesh']), r['network'], r['config']['optimizer']['name'],
          r['method'], r['config']['sync_every']))])


def _host_memory_step(r) -> str:
  """A run's step, named without its `host_memory` setting."""
  c = r['config']
  devices, processes = math.prod(r['mesh']), max(1, c['distributed']['num_processes'])
  where = f'{processes} processes' if processes > 1 else 'one process'
  bn = ', per-device BN' if c['bn_group_size'] == 1 and devices > 1 else ''
  return (f"{r['network']} {r['image_size']}², {c['scheme']} {c['server']}, "
          f"{r['global_batch'] // devices} a device, {where}{bn}")


def host_memory_table(results) -> str:
  """jaxpar's step under `host_memory='system'` and `'keep'` side by side (one run each; the
  same command but for that setting): XLA's temporaries from the compiled program's memory
  analysis, and each setting's median step with the process's minor page faults a step
  (docs/performance.md, host memory). Runs without fault counts predate them and are left
  out."""
  by_step = {}
  for r in results:
    jaxpar = next(s for s in r['steps'] if s['step'] == 'jaxpar shard_map')
    if 'page_faults_per_step' in jaxpar:
      by_step.setdefault(_host_memory_step(r), {})[r['config']['host_memory']] = jaxpar
  lines = ["| jaxpar's step | XLA's temporaries (MB) | system: ms (faults a step) "
           '| keep: ms (faults a step) |', '|---|---:|---:|---:|']
  for step, runs in sorted(by_step.items()):
    cell = lambda s: (f"{s['median_s'] * 1e3:.1f} ({s['page_faults_per_step']:,.0f})"
                      if s else '—')
    temp = next(iter(runs.values()))['temp_bytes_per_device'] / 1e6
    lines.append(f"| {step} | {temp:.2f} | {cell(runs.get('system'))} | "
                 f"{cell(runs.get('keep'))} |")
  return '\n'.join(lines)


# The name of `bench --device_bn`'s step: jaxpar's, with BatchNorm per device.
DEVICE_BN = 'jaxpar shard_map, BN per device'


def sync_bn_table(results) -> str:
  """BatchNorm over a group of devices against BatchNorm per device (`bench --device_bn`):
  each network's two jaxpar steps from one run, alternated round by round, their compiled
  programs' collectives, and the step-time ratio with the median's 95 % interval."""
  lines = ['| network | input | batch | processes | BN over | collectives: BN over group / per '
           'device | step (s): BN over group | step (s): BN per device | BN over group / per '
           'device (step time) | measured |', '|---|---|---:|---:|---:|---:|---:|---:|---:|---|']
  for r in sorted(results, key=lambda r: (r['network'], r['image_size'])):
    steps = {s['step']: s for s in r['steps']}
    group, device = steps['jaxpar shard_map'], steps[DEVICE_BN]
    low, high = r['sync_bn_over_device_bn_interval']
    size = r['config']['bn_group_size'] or math.prod(r['mesh'])
    lines.append(
        f"| {r['network']} | {r['image_size']}² | {r['global_batch']} "
        f"| {r['config']['distributed']['num_processes']} | {size} devices "
        f"| {group['collectives']} / {device['collectives']} | {group['median_s']:.4f} "
        f"| {device['median_s']:.4f} | {r['sync_bn_over_device_bn']:.2f}× "
        f"[{low:.2f}–{high:.2f}] | {_date(r)} |")
  return '\n'.join(lines)


FUSIONS = ('per_tensor', 'one_buffer', 'by_size')


def fusion_table(results) -> str:
  """jaxpar's step under each `grad_fusion` side by side (docs/performance.md, gradients by
  size), a row per network, server and place (one process of emulated devices, or several
  processes): each setting's median over its runs of their median steps (the
  lowest–highest run median where it ran more than once), the compiled program's
  collectives, and by_size's throughput over the faster of the other two."""
  by_row = {}
  for r in results:
    c = r['config']
    processes = max(1, c['distributed']['num_processes'])
    devices = math.prod(r['mesh'])
    where = f'{devices} ({processes} processes)' if processes > 1 else f'{devices} (emulated)'
    key = (r['network'], c['server'], f"{r['image_size']}²", r['dtype'], where,
           r['global_batch'])
    jaxpar = next(s for s in r['steps'] if s['step'] == 'jaxpar shard_map')
    by_row.setdefault(key, {}).setdefault(c['grad_fusion'], []).append(jaxpar)
  head = ['network', 'server', 'input', 'compute', 'devices', 'batch']
  head += [f'{f} step (s)' for f in FUSIONS] + ['collectives (' + ', '.join(FUSIONS) + ')',
                                                 'by_size / faster other']
  lines = ['| ' + ' | '.join(head) + ' |', '|---|---|---|---|---|---:|' + '---:|' * 5]
  median = lambda runs: statistics.median(s['median_s'] for s in runs)
  for key, runs in sorted(by_row.items()):
    def step_cell(f):
      if f not in runs:
        return '—'
      times = [s['median_s'] for s in runs[f]]
      spread = f' ({min(times):.4f}–{max(times):.4f})' if len(times) > 1 else ''
      return f'{median(runs[f]):.4f}' + spread
    others = [median(runs[f]) for f in FUSIONS[:2] if f in runs]
    ratio = (f"{min(others) / median(runs['by_size']):.2f}×" if others and 'by_size' in runs
             else '—')
    calls = ', '.join(str(runs[f][0]['collectives']) if f in runs else '—' for f in FUSIONS)
    lines.append('| ' + ' | '.join([*key[:5], str(key[5])] + [step_cell(f) for f in FUSIONS]
                                   + [calls, ratio]) + ' |')
  return '\n'.join(lines)


def _flops_per_image(results) -> dict:
  """{(network, image size, dtype): FLOPs an image} by the PyTorch peers' count of the step,
  from whichever of `results` timed one (the count is linear in the batch)."""
  found = {}
  for r in results:
    peer = next((p for p in _peers({s['step']: s for s in r['steps']}) if p), None)
    if peer:
      found[(r['network'], r['image_size'], r['dtype'])] = (
          peer['flops_per_device'] * math.prod(r['mesh']) / r['global_batch'])
  return found


def check_table(results) -> str:
  """One GPU's check (analysis/benchmarks/gpu_check.sh): each run's step — its XLA flags
  and batch — beside `jit`'s and torch.compile's, and its FLOP rate against the GPU's peak
  by PyTorch's count of the step (for a run without a peer, the count of the same
  network's step in another run, scaled to its batch)."""
  per_image = _flops_per_image(results)
  lines = ['| run | network | compute | batch | XLA flags | jaxpar step (ms) | jaxpar / jit '
           'throughput | torch.compile step (ms) | jaxpar / torch.compile | jaxpar TFLOP/s* '
           "| jaxpar / GPU's peak |", '|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|']
  for r in sorted(results, key=lambda r: (r['network'], r['dtype'], r['global_batch'],
                                          r.get('xla_flags', ''))):
    steps = {s['step']: s for s in r['steps']}
    jaxpar, compiled = steps['jaxpar shard_map'], _peers(steps)[1]
    flops = per_image.get((r['network'], r['image_size'], r['dtype']))
    rate = flops * r['global_batch'] / math.prod(r['mesh']) / jaxpar['median_s'] if flops else None
    peak = peak_flops(r)
    flags = f"`{r['xla_flags']}`" if r.get('xla_flags') else 'default'
    peer_step = f"{1e3 * compiled['median_s']:.2f}" if compiled else '–'
    peer_ratio = ratio(r, 'shard_map_over_torch_compile', 3) if compiled else '–'
    tflops = f'{rate / 1e12:.0f}' if rate else 'n/a'
    share = f'{100 * rate / peak:.0f} %' if rate and peak else 'n/a'
    lines.append(
        f"| {r.get('run', '')} | {r['network']} | {r['dtype']} | {r['global_batch']} | {flags} "
        f"| {1e3 * jaxpar['median_s']:.2f} | {ratio(r, 'shard_map_over_jit', 3)} | {peer_step} "
        f'| {peer_ratio} | {tflops} | {share} |')
  return '\n'.join(lines + ['', '* FLOPs as PyTorch counts the same step (XLA leaves out the '
                            "convolutions on a GPU: cuDNN calls); % of the device's dense "
                            'peak for the step\'s compute dtype.'])


def kernel_table(results) -> str:
  """Where each traced step's GPU time goes (`bench --trace`): the kernels' summed time a step
  by kind (`profile.gpu_kind`), and the step's time the GPU ran none (the median step less
  the kernels' sum: launch gaps and the blocking step's start and end)."""
  kinds = ('convolution forward', 'convolution data gradient', 'convolution weight gradient',
           'matrix product', 'fusion/elementwise/reduction', 'copy/set')
  lines = ['| network | compute | batch | step | step (ms) | kernels a step | '
           + ' | '.join(f'{k} (ms)' for k in kinds) + ' | GPU idle (ms) |',
           '|---|---|---:|---|---:|---:|' + '---:|' * (len(kinds) + 1)]
  for r in sorted(results, key=lambda r: (r['network'], r['dtype'])):
    for s in r['steps']:
      k = s.get('kernels')
      if not k or 'error' in k or not k['kernels_per_step']:
        continue
      by_kind = k['by_kind_s_per_step']
      lines.append(
          f"| {r['network']} | {r['dtype']} | {r['global_batch']} | {s['step']} "
          f"| {1e3 * s['median_s']:.2f} | {k['kernels_per_step']:.0f} | "
          + ' | '.join(f'{1e3 * by_kind.get(kind, 0.0):.2f}' for kind in kinds)
          + f" | {1e3 * (s['median_s'] - k['busy_s_per_step']):.2f} |")
  return '\n'.join(lines)


def main(argv):
  kind = argv[0] if argv[:1] in (['--methods'], ['--sync_bn']) else ''
  paths = argv[1:] if kind else argv
  if not paths or any(p.startswith('-') for p in paths):
    print(__doc__, file=sys.stderr)
    sys.exit(2 if paths else 1)
  results = []
  for path in paths:
    try:
      with open(path) as f:
        results.append(json.load(f))
    except (OSError, json.JSONDecodeError) as e:
      sys.exit(f'bench_table: {path}: not a JSON written by analysis.benchmarks.bench ({e}); '
               'pass the files its --out wrote')
  print({'--methods': methods_table, '--sync_bn': sync_bn_table}.get(kind, table)(results))


if __name__ == '__main__':
  main(sys.argv[1:])
