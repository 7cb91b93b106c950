"""One markdown table from several `analysis.bench --out` files (the README's):

  python -m analysis.bench_table runs/*.json

A row per run: network, input size, compute dtype, devices, global batch, the devices
jaxpar's BatchNorm shares statistics over (jit's always: all; PyTorch's: each process),
each step's median time, jaxpar's throughput over the auto-sharded jit's (and PyTorch's, when the run
had the peer), and jaxpar's GFLOP/s per device.
"""
import json
import math
import sys


def row(r) -> str:
  steps = {s['step']: s for s in r['steps']}
  jaxpar, jit = steps['jaxpar shard_map'], steps['auto-sharded jit']
  peer = next((s for name, s in steps.items() if name.startswith('PyTorch')), None)
  devices, processes = math.prod(r['mesh']), r['config']['distributed']['num_processes']
  where = (f'{devices} ({processes} processes)' if processes > 1
           else f'{devices} (emulated)' if devices > 1 else '1')
  group = r['config']['bn_group_size']
  bn = ('no BN' if r['network'] != 'resnet34' and not r['config']['batch_norm']
        else 'all devices' if group in (0, devices)
        else 'each device' if group == 1 else f'groups of {group}')
  cells = [r['network'], f"{r['image_size']}²", r['dtype'], where, str(r['global_batch']), bn, f"{jaxpar['median_s']:.3f}", f"{jit['median_s']:.3f}",
           f"{r['shard_map_over_jit_throughput']:.3f}×",
           f"{peer['median_s']:.3f}" if peer else '–',
           f"{r['shard_map_over_torch_throughput']:.2f}×" if peer else '–',
           f"{jaxpar['flop_per_s_per_device'] / 1e9:.1f}"]
  return '| ' + ' | '.join(cells) + ' |'


def table(results) -> str:
  return '\n'.join(
      ['| network | input | compute | devices | batch | jaxpar BN over | jaxpar step (s) '
       '| jit step (s) | jaxpar / jit throughput | PyTorch step (s) | jaxpar / PyTorch '
       '| jaxpar GFLOP/s/device |',
       '|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|']
      + [row(r) for r in sorted(results, key=lambda r: (
          r['network'], r['image_size'], math.prod(r['mesh']),
          r['config']['distributed']['num_processes'], r['config']['bn_group_size'],
          r['dtype'] != 'float32'))])


def main(paths):
  if not paths:
    sys.exit(__doc__)
  results = []
  for path in paths:
    with open(path) as f:
      results.append(json.load(f))
  print(table(results))


if __name__ == '__main__':
  main(sys.argv[1:])
