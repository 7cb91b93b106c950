"""What JAX's persistent compilation cache saves a run started again (jaxpar/compile_cache.py).

`python -m jaxpar.train` as a user runs it, three times a round, each in a fresh process
with a fresh workdir: `off` (no cache: every program compiled), `cold` (an empty cache
folder: every program compiled and kept) and `warm` (the same command again on the folder
`cold` filled: what a resumed or repeated run does). `off` and `cold` take turns in
starting each round; `warm` follows `cold`. Per setting: each round's seconds from starting
the process to its exit and the run's own wall time (its last line: from the config to the
evaluation), their medians; warm / off taken round by round (median and quartiles); the
programs the folder held after `cold` and after `warm` (the same count: `warm` compiled
nothing worth keeping); the host's speed before the first round (`alternate.host_speed`).

  python -m analysis.benchmarks.restart_bench --rounds 3 \\
      --out analysis/report/compile_cache/resnet34_2d.json \\
      --config configs/resnet34_2d.py --config.total_steps=4 --config.optimizer.warmup_steps=1

(every argument but --rounds and --out is passed on to jaxpar.train)

Nothing here is asserted in tests; docs/reliability.md shows the committed results.
"""
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS

FINAL = re.compile(r'wall time ([\d.]+) s')


def _train(args: list[str], cache: str, workdir: str) -> dict:
  """One `python -m jaxpar.train ARGS` in a fresh process: its seconds from start to exit and
  the wall time it logged last."""
  command = [sys.executable, '-m', 'jaxpar.train', *args, f'--workdir={workdir}',
             f'--config.compilation_cache={cache}']
  env = {k: v for k, v in os.environ.items()
         if k not in ('JAX_COMPILATION_CACHE_DIR', 'JAX_ENABLE_COMPILATION_CACHE')}
  start = time.perf_counter()
  done = subprocess.run(command, capture_output=True, text=True, env=env)
  seconds = time.perf_counter() - start
  if done.returncode:
    raise RuntimeError(f'{shlex.join(command)} failed:\n{done.stderr[-3000:]}')
  lines = done.stdout.splitlines()
  logged = [float(m.group(1)) for m in map(FINAL.search, lines) if m]
  return {'process_s': seconds, 'run_s': logged[-1] if logged else None,
          'last_line': lines[-1] if lines else ''}  # the accuracy (and a plan's target)


def _entries(folder: str) -> int:
  return len(os.listdir(folder)) if os.path.isdir(folder) else 0


def run(args: list[str], rounds: int) -> dict:
  from analysis.benchmarks import alternate
  from analysis.steptime.measure import machine, versions
  speed = alternate.host_speed()
  found = {'off': [], 'cold': [], 'warm': []}
  kept = []
  for i in range(rounds):
    with tempfile.TemporaryDirectory(prefix='restart_bench_') as folder:
      cache = os.path.join(folder, 'xla')
      for setting in alternate.in_turn(['off', 'cold'], i):
        found[setting].append(_train(args, cache if setting == 'cold' else 'off',
                                     os.path.join(folder, setting)))
        if setting == 'cold':
          after_cold = _entries(cache)
          found['warm'].append(_train(args, cache, os.path.join(folder, 'warm')))
          kept.append([after_cold, _entries(cache)])
    print(f'round {i + 1}/{rounds}: ' + ', '.join(
        f"{s} {found[s][-1]['process_s']:.1f} s" for s in found), file=sys.stderr, flush=True)
  ratio = alternate.paired_ratio([r['process_s'] for r in found['warm']],
                                 [r['process_s'] for r in found['off']])
  return {'tool': 'analysis.benchmarks.restart_bench',
          'created': datetime.datetime.now().isoformat(timespec='seconds'),
          'machine': machine(), 'versions': versions(), 'host_speed': speed,
          'command': 'python -m jaxpar.train ' + shlex.join(args),
          'settings': {s: {'rounds': r,
                           'process_s': float(np.median([x['process_s'] for x in r])),
                           'run_s': float(np.median([x['run_s'] for x in r]))}
                       for s, r in found.items()},
          'programs_kept': kept,
          'warm_over_off': ratio['median'], 'warm_over_off_quartiles': [ratio['q25'], ratio['q75']]}


def table(results: list[dict]) -> str:
  """Markdown: one row per command, each setting's median seconds to the exit and warm / off."""
  from analysis.benchmarks import bench_table
  lines = ['| command | measured | machine | jax | off: compiled (s) | cold: compiled and kept (s) '
           '| warm: loaded (s) | warm / off (quartiles) | programs kept |',
           '|---|---|---|---|---:|---:|---:|---:|---:|']
  for r in results:
    s, q = r['settings'], r['warm_over_off_quartiles']
    cell = lambda name: (f"{s[name]['process_s']:.1f} "
                         f"({min(x['process_s'] for x in s[name]['rounds']):.1f}–"
                         f"{max(x['process_s'] for x in s[name]['rounds']):.1f})")
    kept = sorted({k for pair in r['programs_kept'] for k in pair})
    lines.append(f"| `{r['command'].removeprefix('python -m jaxpar.train ')}` "
                 f"| {r['created'][:10]} | {bench_table.host(r['machine'])} "
                 f"| {r['versions'].get('jax', '?')} | {cell('off')} | {cell('cold')} "
                 f"| {cell('warm')} | {r['warm_over_off']:.2f}× ({q[0]:.2f}–{q[1]:.2f}) "
                 f"| {'/'.join(map(str, kept))} |")
  return '\n'.join(lines)


def main(argv):
  from analysis.benchmarks import alternate
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  result = run(alternate.passed_on(sys.argv[1:]), FLAGS.rounds)
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
  with open(FLAGS.out, 'w') as f:
    json.dump(result, f, indent=1)
  print(table([result]))


if __name__ == '__main__':
  # Defined here, not at import: analysis.report imports every benchmark's table.
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg], with its '
                                   'overrides: the run timed.', lock_config=False)
  flags.DEFINE_integer('rounds', 3, 'Rounds of off, cold and warm.')
  flags.DEFINE_string('out', None, 'The JSON to write.')
  flags.mark_flags_as_required(['config', 'out'])
  app.run(main)
