"""The plan judged end to end: each of the plan's best-ranked candidates trained to the
plan's target, and the regret of its choice.

  python -m analysis.accuracy.plan_regret --config configs/squeezenet.py \\
      --config.image_size=16 --config.mesh.shape='(2,)' --plan plan.json \\
      --candidates 6 --seeds 2 --out regret.json

For each of the first --candidates rows of the plan (`python -m jaxpar.plan`; the choice
is the first) and each seed, `jaxpar.train` trains the config with that row as the plan's
choice (`scheme=auto`, `plan.file`: the row's scheme, server, N, batch and BN grouping, a
constant rate after warm-up), evaluating the plan's target every `plan.eval_every` steps,
and the training time to the target is measured (`planner.TargetClock`: from the end of the
first step, which compiles, evaluations excluded) — on the devices the plan was made on.
A row's measured T is its seeds' mean; the regret of the plan is the choice's measured T ÷
the smallest measured T (1 = it picked the fastest of those run). Beside each: the plan's
predicted K and T, and the error |log(predicted/measured)| of both.
"""
import copy
import datetime
import json
import math
import os
import sys
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, 'The configs/*.py file[:arg] the plan was '
                                  'made for.', lock_config=False)
  flags.DEFINE_string('plan', None, 'The plan (`python -m jaxpar.plan --out`).')
  flags.DEFINE_integer('candidates', 6, 'How many of its ranked rows to train (the first is '
                       'the choice).')
  flags.DEFINE_integer('seeds', 2, 'Seeds of every row.')
  flags.DEFINE_string('out', None, 'The JSON file to write.')


def run(cfg, plan: dict, rows: int, seeds: int) -> dict:
  from jaxpar import config as config_lib
  from jaxpar import mesh as mesh_lib
  from jaxpar.plan import probe
  from jaxpar.train import train_and_evaluate
  if cfg.mesh.emulate_cpu_devices:
    mesh_lib.emulate_cpu_devices(plan['devices'])
  results = []
  with tempfile.TemporaryDirectory() as scratch:
    for i, row in enumerate(plan['candidates'][:rows]):
      one = {**plan, 'choice': row}
      path = os.path.join(scratch, f'plan_{i}.json')
      with open(path, 'w') as f:
        json.dump(one, f)
      runs = []
      for seed in range(seeds):
        c = copy.deepcopy(cfg)
        c.unlock()
        c.scheme, c.plan.file, c.seed = 'auto', path, seed
        c.eval_every, c.checkpoint_every = 0, 10**9
        c.total_steps = 0
        result = train_and_evaluate(c, os.path.join(scratch, f'run_{i}_{seed}'))
        runs.append({'seed': seed, 'step': result.plan['step'],
                     'seconds': result.plan['seconds'], 'top1': result.eval.get('top1')})
        print(f"{row['label']} seed {seed}: {result.plan['summary']}", file=sys.stderr,
              flush=True)
      reached = [r for r in runs if r['seconds'] is not None]
      measured = (float(np.mean([r['seconds'] for r in reached])) if len(reached) == seeds
                  else None)
      steps = float(np.mean([r['step'] for r in reached])) if len(reached) == seeds else None
      results.append({'rank': i + 1, 'label': row['label'], 'predicted_T': row['T'],
                      'predicted_K': row['K'], 'measured_T': measured, 'measured_K': steps,
                      'T_error': _error(row['T'][0], measured),
                      'K_error': _error(row['K'][0], steps), 'runs': runs})
  done = [r for r in results if r['measured_T'] is not None]
  best = min(done, key=lambda r: r['measured_T']) if done else None
  choice = results[0]
  regret = (choice['measured_T'] / best['measured_T']
            if best and choice['measured_T'] is not None else None)
  return {'tool': 'analysis.accuracy.plan_regret',
          'created': datetime.datetime.now().isoformat(timespec='seconds'),
          'command': ' '.join(['python -m analysis.accuracy.plan_regret', *sys.argv[1:]]),
          'machine': probe.machine(), 'versions': probe.versions(),
          'network': plan['network'], 'image_size': plan['image_size'],
          'setting': plan['setting'], 'target': plan['target'],
          'planning_s': plan['planning_s'], 'plan_created': plan['created'],
          'seeds': seeds, 'rows': results,
          'best_measured': best['label'] if best else None, 'regret': regret,
          'median_T_error': _median([r['T_error'] for r in results]),
          'median_K_error': _median([r['K_error'] for r in results])}


def _error(predicted, measured):
  return None if not measured else abs(math.log(predicted / measured))


def _median(values):
  values = [v for v in values if v is not None]
  return float(np.median(values)) if values else None


def table(result: dict) -> str:
  """Predicted against measured time to the target, by the plan's rank (Markdown)."""
  lines = ['| plan rank | candidate | K predicted (range) | K measured | T predicted s (range) '
           '| T measured s | T error |', '|---:|---|---|---:|---|---:|---:|']
  for r in result['rows']:
    k, t = r['predicted_K'], r['predicted_T']
    lines.append(
        f"| {r['rank']} | {r['label']} | {k[0]:.0f} ({k[1]:.0f}–{k[2]:.0f}) | "
        f"{_cell(r['measured_K'], '.0f')} | {t[0]:.2f} ({t[1]:.2f}–{t[2]:.2f}) | "
        f"{_cell(r['measured_T'], '.2f')} | {_cell(r['T_error'], '.0%')} |")
  return '\n'.join(lines)


def _cell(value, spec):
  return '—' if value is None else format(value, spec)


def main(argv):
  from jaxpar import metrics
  from jaxpar.plan import planner
  metrics.quiet_libraries()
  logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  plan = planner.read(FLAGS.plan)
  result = run(FLAGS.config, plan, FLAGS.candidates, FLAGS.seeds)
  with open(FLAGS.out, 'w') as f:
    json.dump(result, f, indent=1)
  print(table(result))
  print(f"\nregret of the plan's choice: {_cell(result['regret'], '.3f')} (best measured: "
        f"{result['best_measured']}); median error of T {_cell(result['median_T_error'], '.0%')}, "
        f"of K {_cell(result['median_K_error'], '.0%')}")


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['config', 'plan', 'out'])
  app.run(main)
