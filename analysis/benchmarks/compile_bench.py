"""How long jaxpar's train step takes to compile under each `host_memory` setting.

`host_memory='keep'` serves every thread of the process from one malloc arena
(jaxpar/host_memory.py), and XLA's compiler works on several threads (LLVM's code
generation split over them; on a GPU ptxas too), which then wait for that arena's lock.
Each compilation here runs in a process of its own, since the setting must come before
JAX's backend starts; the settings take turns round by round (each round starts with the
next one), so both see the same machine. Per setting: the compile time of each round
(`lowered.compile()`, no compilation cache), their median, min and max, and the malloc arenas
the process had afterwards (`jaxpar.host_memory.arenas`); the ratio keep / system is taken
round by round (median and quartiles of the rounds' ratios); the host's speed before the
first round (`alternate.host_speed`).

  python -m analysis.benchmarks.compile_bench \\
      --config configs/thesis.py:net=resnet34,scheme=sync-split,server=allreduce,workers=1,batch=32 \\
      --config.image_size=32 --config.dataset.name=synthetic --rounds 5 --out compile.json

Nothing here is asserted in tests; docs/performance.md shows the committed results.
"""
import datetime
import json
import os
import subprocess
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

FLAGS = flags.FLAGS
SETTINGS = ('system', 'keep')


def compile_once(cfg) -> dict:
  """In this process, under `cfg.host_memory` (applied by `build.mesh`, before the backend):
  the seconds to lower and to compile the configured train step."""
  import jax

  from jaxpar import build, host_memory
  from jaxpar import config as config_lib
  from jaxpar.data import sources
  from jaxpar.step import make_train_step, to_global
  mesh = build.mesh(cfg)
  source = sources.open_source(cfg.dataset)
  batch_size = config_lib.global_batch(cfg)
  model, strategy, tx, state = build.for_timing(cfg, source.num_classes, source.channels, mesh)
  batch = to_global(mesh, {
      'image': np.zeros((batch_size, cfg.image_size, cfg.image_size, source.channels),
                        np.float32),
      'label': np.zeros(batch_size, np.int32)})
  start = time.perf_counter()
  lowered = make_train_step(model, tx, mesh, strategy).lower(state, batch, jax.random.key(0))
  lowered_at = time.perf_counter()
  lowered.compile()
  done = time.perf_counter()
  return {'lower_s': lowered_at - start, 'compile_s': done - lowered_at,
          'arenas': host_memory.arenas()}


def _summary(rounds: list[dict]) -> dict:
  times = [r['compile_s'] for r in rounds]
  return {'samples': times, 'median_s': float(np.median(times)), 'min_s': min(times),
          'max_s': max(times), 'lower_s': float(np.median([r['lower_s'] for r in rounds])),
          'arenas': sorted({r['arenas'] for r in rounds}, key=str)}


def run(argv: list[str], rounds: int) -> dict:
  """`rounds` compilations under each setting, each in a fresh process given `argv` (this
  tool's flags) and the setting."""
  from analysis.benchmarks import alternate
  from analysis.steptime.measure import machine, versions
  speed = alternate.host_speed()  # before the first child: nothing else runs
  found = {s: [] for s in SETTINGS}
  for i in range(rounds):
    for setting in alternate.in_turn(list(SETTINGS), i):
      done = subprocess.run(
          [sys.executable, '-m', 'analysis.benchmarks.compile_bench', *argv,
           f'--config.host_memory={setting}', '--child'],
          capture_output=True, text=True, check=False)
      if done.returncode != 0:
        raise RuntimeError(f'compile_bench child ({setting}) failed:\n{done.stderr[-3000:]}')
      found[setting].append(json.loads(done.stdout.strip().splitlines()[-1]))
      print(f'round {i + 1}/{rounds} {setting}: {found[setting][-1]["compile_s"]:.1f} s',
            file=sys.stderr, flush=True)
  ratio = alternate.paired_ratio([r['compile_s'] for r in found['keep']],
                                 [r['compile_s'] for r in found['system']])
  cfg = FLAGS.config
  return {'tool': 'analysis.benchmarks.compile_bench',
          'created': datetime.datetime.now().isoformat(timespec='seconds'),
          'machine': machine(), 'versions': versions(), 'host_speed': speed,
          'command': ' '.join(['python -m analysis.benchmarks.compile_bench', *argv]),
          'network': cfg.model, 'image_size': cfg.image_size, 'dtype': cfg.dtype,
          'global_batch': cfg.global_batch, 'mesh': list(cfg.mesh.shape),
          'settings': {s: _summary(r) for s, r in found.items()},
          'keep_over_system': ratio['median'],
          'keep_over_system_quartiles': [ratio['q25'], ratio['q75']]}


def table(results: list[dict]) -> str:
  """Markdown: one row per run, the compile time under each setting and their ratio."""
  from analysis.benchmarks import bench_table
  lines = ['| network | input | compute | batch | measured | machine | jax | compile, system (s) '
           '| compile, keep (s) | keep / system (quartiles) | arenas: system, keep |',
           '|---|---|---|---:|---|---|---|---:|---:|---:|---|']
  for r in results:
    s, k, m = r['settings']['system'], r['settings']['keep'], r['machine']
    q = r['keep_over_system_quartiles']
    host = bench_table.host(m)
    lines.append(
        f"| {r['network']} | {r['image_size']}² | {r['dtype']} | {r['global_batch']} "
        f"| {r['created'][:10]} | {host} | {r['versions'].get('jax', '?')} "
        f"| {s['median_s']:.1f} ({s['min_s']:.1f}–{s['max_s']:.1f}) "
        f"| {k['median_s']:.1f} ({k['min_s']:.1f}–{k['max_s']:.1f}) "
        f"| {r['keep_over_system']:.2f}× ({q[0]:.2f}–{q[1]:.2f}) "
        f"| {'/'.join(map(str, s['arenas']))}, {'/'.join(map(str, k['arenas']))} |")
  return '\n'.join(lines)


def main(argv):
  del argv
  if FLAGS.child:
    print(json.dumps(compile_once(FLAGS.config)))
    return
  from jaxpar import config as config_lib
  from jaxpar import validation
  validation.validate(FLAGS.config)  # one line naming the field, before any process starts
  if FLAGS.config.scheme == 'async':
    raise config_lib.ConfigError("config.scheme='async' is invalid here: compile_bench "
                                 "compiles a synchronous step; choose a synchronous scheme")
  from analysis.benchmarks import alternate
  result = run(alternate.passed_on(sys.argv[1:]), FLAGS.rounds)
  print(table([result]))
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].')
  flags.DEFINE_integer('rounds', 5, 'Compilations under each setting, taking turns.')
  flags.DEFINE_bool('child', False, 'Compile once in this process and print the JSON line.')
  flags.DEFINE_string('out', '', 'Also write the results as JSON here.')
  flags.mark_flag_as_required('config')
  app.run(main)
