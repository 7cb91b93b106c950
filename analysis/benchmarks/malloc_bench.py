"""Which of `host_memory='keep'`'s three malloc settings costs a step, and which saves one.

`keep` (jaxpar/host_memory.py) asks glibc for one arena for every thread (M_ARENA_MAX = 1),
direct mmap only above 2 GiB and no trimming. The last two keep a step's temporaries mapped
from one step to the next; the first lets the main heap hold blocks above 64 MiB (a thread's
own arena cannot) at the price of one lock for every thread's malloc. This times the
one-device training loop `jaxpar.plan` times (`probe.step_call`: real input, dispatched as
training dispatches, 5 windows of 10 steps after a warm-up window) in a fresh process per
setting, the settings in turn per round:

  system   malloc as glibc sets it
  keep     jaxpar's `keep` (all three settings)
  mapped   jaxpar's `mapped`: mmap threshold and no trimming only, each thread keeps its
           own arena

Each cell also records the step's temporaries as `host_memory='auto'` estimates them
before the backend starts (`build.step_temporaries`), what `auto` chooses from that, and
XLA's temporaries of the compiled step (its memory analysis, in the `system` process).

  python -m analysis.benchmarks.malloc_bench --out analysis/report/host_memory/arenas.json \
      --cells squeezenet:auto:64 squeezenet:xla:64 resnet34_2d:auto:32 --rounds 2
  python -m analysis.benchmarks.malloc_bench --out analysis/report/host_memory/auto.json \
      --cells squeezenet:auto:64 squeezenet:auto:192 googlenet:auto:32 squeezenet:auto:640 \
      resnet34_2d:auto:32 --rounds 2
  python -m analysis.benchmarks.malloc_bench --out analysis/report/host_memory/networks.json \
      --cells googlenet:auto:16:32 googlenet:auto:128:32 googlenet:auto:256:32 \
      googlenet:auto:128:64 resnet34_2d:auto:128:16 --settings mapped,keep --rounds 2 \
      --windows 3 --steps 5
  python -m analysis.benchmarks.malloc_bench --out analysis/report/host_memory/networks_224.json \
      --cells googlenet:auto:16:224 --settings mapped,keep --rounds 2 --windows 3 --steps 5
  python -m analysis.benchmarks.malloc_bench --out analysis/report/host_memory/programs.json \
      --cells googlenet:auto:64:32 resnet34_2d:auto:64:16 --settings mapped,keep \
      --programs compiled,loaded --rounds 2 --windows 3 --steps 5

(a cell NETWORK:CONV_IMPL:BATCH[:IMAGE]; `--settings`, `--windows` and `--steps` choose what
is timed and how long; `--programs loaded`: each process loads its programs from JAX's
compilation cache, filled by one process before, instead of compiling them: the compiler's
freed memory is then not in the heap every setting's allocations search). JSON: the date,
machine and versions, and per cell and setting each
window's ms a step and the minor page faults a step (`getrusage`).
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile

SETTINGS = ('system', 'keep', 'mapped')


def child(setting: str, net: str, conv: str, batch: int, data_dir: str, image: int = 16,
          windows: int = 5, steps: int = 10, cache: str = '') -> dict:
  import jax
  import numpy as np

  from jaxpar import build, compile_cache, host_memory, models, validation
  from jaxpar.data import sources
  from jaxpar.plan import probe
  from jaxpar import config as config_lib
  cfg = config_lib.from_file(
      os.path.join(os.path.dirname(__file__), '..', '..', 'configs', f'{net}.py'))
  cfg.image_size = image
  cfg.update_from_flattened_dict({'conv_impl': conv, 'plan.target_loss': 0.5,
                                  **({'dataset.data_dir': data_dir} if data_dir else {})})
  one = config_lib.with_overrides(cfg, probe.one_device_overrides(cfg, batch))
  validation.validate(one)
  # What 'auto' would choose here, from the estimate (before the backend starts), then the
  # setting this process is timed in.
  estimate = build.estimated_temporaries(one)
  auto = host_memory.resolve('auto', lambda: estimate, models.KEEP_ABOVE.get(one.model))
  host_memory.keep_freed_memory(setting)
  if cache:  # every program loaded from there (compiled into it by an earlier process)
    compile_cache.apply(cache, 1)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)
    jax.config.update('jax_persistent_cache_min_entry_size_bytes', 0)
  source = sources.open_source(one.dataset)
  meta = source.meta
  _, window = probe.step_call(one, meta, source, probe.initial_variables(one, meta),
                             lower=False)
  window(5)
  faults = host_memory.minor_faults()
  ms = [window(steps) * 1e3 for _ in range(windows)]
  faults = (host_memory.minor_faults() - faults) / (windows * steps)
  window.close()
  return {'ms': ms, 'median_ms': float(np.median(ms)), 'faults_a_step': faults,
          'arenas': host_memory.arenas(), 'estimated_temp_bytes': estimate, 'auto': auto,
          'temp_bytes': compiled_temporaries(one, meta) if setting == 'system' else None}


def compiled_temporaries(cfg, meta) -> int:
  """XLA's temporaries of a one-device config's train step at `per_device_batch` (its
  compiled memory analysis): what `build.step_temporaries` estimates."""
  import jax

  from jaxpar import build
  from jaxpar.mesh import make_mesh
  from jaxpar.plan import probe
  from jaxpar.step import make_train_step, to_global
  mesh = make_mesh((1,), ('data',), jax.devices()[:1])
  model, strategy, tx, shapes = build.for_timing(cfg, meta['num_classes'], meta['channels'],
                                                 mesh, abstract=True)
  step = make_train_step(model, tx, mesh, strategy, cfg.grad_accum_steps)
  batch = to_global(mesh, probe.synthetic_batch(cfg.per_device_batch, cfg, meta))
  compiled = step.lower(shapes, batch, jax.random.key(1)).compile()
  return int(compiled.memory_analysis().temp_size_in_bytes)


def table(result: dict) -> str:
  """Markdown: a row a cell: its step's temporaries as estimated and as XLA allocates them,
  `auto`'s choice, and each setting's ms a step (median of every window of every round, the
  rounds' medians in brackets) with its minor faults a step (median over rounds). The
  fastest setting's time in bold."""
  import numpy as np
  lines = ['| network (16²) | batch | temporaries: estimated / XLA (MiB) | auto | '
           + ' | '.join(f'{s}: ms a step (faults)' for s in SETTINGS) + ' |',
           '|---|---:|---:|---|' + '---:|' * len(SETTINGS)]
  for cell in result['cells']:
    runs = cell['settings']
    first = runs['system'][0]
    medians = {s: float(np.median([t for run in runs[s] for t in run['ms']])) for s in SETTINGS}
    best = min(medians, key=medians.get)
    cells = []
    for s in SETTINGS:
      rounds = '/'.join(f"{run['median_ms']:.1f}" for run in runs[s])
      faults = float(np.median([run['faults_a_step'] for run in runs[s]]))
      shown = f'{medians[s]:.1f}'
      cells.append(f"{f'**{shown}**' if s == best else shown} ({rounds}; {faults:,.0f})")
    lines.append(f"| {cell['network']}, {cell['conv_impl']} convolutions | {cell['batch']} | "
                 f"{first['estimated_temp_bytes'] / 2**20:.1f} / {first['temp_bytes'] / 2**20:.1f} "
                 f"| {first['auto']} | " + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


def processes_table(result: dict) -> str:
  """Markdown: `jaxpar.train` on processes of one core each under `mapped` and `keep`
  (analysis/report/host_memory/processes.json: the log's step time over windows 3-5 of
  every round, their median; `keep`'s ratio to `mapped`; the faults a step the run said)."""
  import numpy as np
  lines = ['| `jaxpar.train` on 2 processes, one core each | `auto` | `mapped`: s a step '
           '(faults) | `keep`: s a step |', '|---|---|---:|---:|']
  for net, label in result['labels'].items():
    runs = [r for r in result['runs'] if r['network'] == net]
    median = {s: float(np.median([t for r in runs if r['host_memory'] == s
                                  for t in r['step_time_s_windows'][2:]]))
              for s in ('mapped', 'keep')}
    faults = max(r['faults_a_step_said'] for r in runs if r['host_memory'] == 'mapped')
    lines.append(f"| {label} | {result['auto_chose'][net]} | {median['mapped']:.3f} "
                 f"({faults:,}) | {median['keep']:.3f} ({median['keep'] / median['mapped']:.2f}×) |")
  return '\n'.join(lines)


def networks_table(*results: dict) -> str:
  """Markdown: a row a cell of the one-device training step under `mapped` and `keep`
  (analysis/report/host_memory/networks*.json, the cells of each in turn): its temporaries
  as `auto` estimates them, `auto`'s choice, each setting's ms a step (median of every window
  of every round, the rounds' medians in brackets; `mapped`'s minor faults a step), `keep`'s
  ratio to `mapped`; whether each process compiled its programs or loaded them from JAX's
  compilation cache (`--programs`; cells before that option compiled)."""
  import numpy as np
  lines = ['| network | image | batch | temporaries, estimated (MiB) | `auto` | programs | '
           '`mapped`: ms a step (rounds; faults) | `keep`: ms a step (rounds) | '
           '`keep` / `mapped` |', '|---|---:|---:|---:|---|---|---:|---:|---:|']
  for cell in [cell for result in results for cell in result['cells']]:
    runs = cell['settings']
    median = {s: float(np.median([t for run in runs[s] for t in run['ms']])) for s in runs}
    rounds = {s: '/'.join(f"{run['median_ms']:.0f}" for run in runs[s]) for s in runs}
    faults = float(np.median([run['faults_a_step'] for run in runs['mapped']]))
    first = runs['mapped'][0]
    lines.append(
        f"| {cell['network']} | {cell['image_size']}² | {cell['batch']} | "
        f"{first['estimated_temp_bytes'] / 2**20:.0f} | {first['auto']} | "
        f"{cell.get('programs', 'compiled')} | {median['mapped']:.0f} "
        f"({rounds['mapped']}; {faults:,.0f}) | {median['keep']:.0f} "
        f"({rounds['keep']}) | {median['keep'] / median['mapped']:.2f}× |")
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--out', required=True)
  parser.add_argument('--cells', nargs='+', default=['squeezenet:auto:64'],
                      help='NETWORK:CONV_IMPL:BATCH[:IMAGE] (a configs/ name; 16² images '
                      'unless IMAGE)')
  parser.add_argument('--rounds', type=int, default=2)
  parser.add_argument('--settings', default=','.join(SETTINGS),
                      help='the settings timed, comma-separated')
  parser.add_argument('--windows', type=int, default=5, help='timed windows a process')
  parser.add_argument('--steps', type=int, default=10, help='steps a window')
  parser.add_argument('--data_dir', default='')
  parser.add_argument('--programs', default='compiled',
                      help="'compiled' (each process compiles its programs), 'loaded' (from "
                      "JAX's compilation cache, filled by a process before), or both")
  parser.add_argument('--cache', default='', help=argparse.SUPPRESS)
  parser.add_argument('--child', nargs=5, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    setting, net, conv, batch, image = args.child
    print(json.dumps(child(setting, net, conv, int(batch), args.data_dir, int(image),
                           args.windows, args.steps, args.cache)))
    return
  settings = args.settings.split(',')
  from jaxpar.plan import probe
  result = {'tool': 'analysis.benchmarks.malloc_bench',
            'created': datetime.datetime.now().isoformat(timespec='seconds'),
            'machine': probe.machine(), 'versions': probe.versions(),
            'command': 'python -m analysis.benchmarks.malloc_bench ' + ' '.join(
                sys.argv[1:] if argv is None else argv), 'cells': []}
  programs = args.programs.split(',')
  for cell in args.cells:
    net, conv, batch, image = (cell + ':16').split(':')[:4]
    rows = {p: {'network': net, 'conv_impl': conv, 'batch': int(batch), 'image_size': int(image),
                'programs': p, 'settings': {s: [] for s in settings}} for p in programs}
    with tempfile.TemporaryDirectory() as cache:
      def run(setting, program, windows=args.windows, steps=args.steps):
        done = subprocess.run(
            [sys.executable, '-m', 'analysis.benchmarks.malloc_bench', '--out', args.out,
             '--data_dir', args.data_dir, '--windows', str(windows), '--steps', str(steps),
             '--cache', cache if program == 'loaded' else '',
             '--child', setting, net, conv, batch, image],
            capture_output=True, text=True, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])
      if 'loaded' in programs:
        run(settings[0], 'loaded', 1, 1)  # fills the cache: the timed processes load
      for _ in range(args.rounds):
        for program in programs:
          for setting in settings:
            rows[program]['settings'][setting].append(run(setting, program))
            print(cell, program, setting, rows[program]['settings'][setting][-1]['median_ms'],
                  flush=True)
    result['cells'].extend(rows.values())
  with open(args.out, 'w') as f:
    json.dump(result, f, indent=1, allow_nan=False)


if __name__ == '__main__':
  main()
