"""The plan's step model judged on steps it never measured: each candidate of a plan made
across processes that runs on all of them, trained as a user's run trains it, beside the
plan's predicted step.

  python -m analysis.steptime.plan_steps --config configs/thesis.py:net=resnet34,batch=16,workers=2 \
      --config.image_size=32 --plan plan.json --processes 2 --out steps.json

(the plan made with `--config.plan.close=100`, so that every row's collectives are costed).

For each synchronous row of the plan on all its devices (Downpour on Ray's actors is not
predicted by the step model), `python -m jaxpar.train` with that row as the plan's choice
(`scheme=auto`, `plan.file`), fresh processes pinned to a core each over the plan's link
(`link.launch`, as `analysis.accuracy.plan_regret` trains them), `--steps` steps; the plan's
clock (`planner.TargetClock`, its target set out of reach) reads the training time at every
`--every`-th step, evaluations excluded. A row's measured step is the median over those
intervals after the first (which holds the early steps that fault memory in: docs/performance.md).
Each row is trained `--repeats` times, in rounds over all the rows (every other round in
reverse order, so that a drift of the machine's speed moves every row alike): one launch's
steps agree within ~3 %, two launches of the same row by ~7 % (ResNet34 32², 2 processes;
10-20 % before gloo's loop stopped leaving idle priority on a moment's kernel work), so a
row's measured step is the median of its launches' and both noises are reported — within a
launch (the half-range of its intervals) and between launches (the half-range of their
medians). A launch whose gloo loop left idle priority (a large all-reduce then takes up to
2x as long) is counted in the row's `launches_at_normal_priority`.

The prediction is never fitted to these steps: its parts (t_grad, the calls' costs, the
programs' times with their gradients stood in for) were each measured on other programs,
in phases 2-3b of the plan. Each row is judged twice, the error |log(predicted /
measured)|: as the plan predicts it, and without its program's own work (`own_work_s`, the
plan's `strategy_work` seconds: the program's time less its collectives' calibrated cost
and the one-device update's) — t_grad, the one-device update and the collectives at their
calibrated cost, the model that costs a program phase 3b did not time.

These shared cores take the same program up to 1.8× as long from one hour to the next,
which no model of a step can know. So the host's speed is read beside every launch
(`host_speed`: the plan's t_grad(b, N), timed again by the same processes before each
launch and once after the last): a launch's prediction at the host's speed is the
prediction × its speed factor (t_grad then, the geometric mean of the readings just before
and just after it, ÷ the plan's t_grad(b, N)), and each row is judged a third time so (`error_at_host_speed`:
|log| of the median over its launches of measured ÷ prediction at the host's speed). The
factor is a measurement of the host, the same for every row, not a fit to any row.
"""
import datetime
import json
import os
import shlex
import sys
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, 'The configs/*.py file[:arg] the plan was '
                                  'made for (with its --config.* overrides).', lock_config=False)
  flags.DEFINE_string('plan', None, 'The plan (`python -m jaxpar.plan --out`), made by '
                      '--processes processes.')
  flags.DEFINE_integer('processes', 2, "The plan's processes; each row runs on all of them.")
  flags.DEFINE_string('link', '', "The processes' emulated link (tc rate, e.g. 1gbit; "
                      'default: loopback).')
  flags.DEFINE_integer('steps', 80, 'Steps each row trains.')
  flags.DEFINE_integer('every', 16, 'Steps between two readings of the training time.')
  flags.DEFINE_integer('repeats', 2, 'Launches of each row (in rounds over all the rows).')
  flags.DEFINE_string('out', None, 'The JSON file to write.')
  flags.DEFINE_list('rows', [], "Only the rows whose label contains one of these (e.g. "
                    "'local-sgd τ=8'); default: every row the step model predicts.")
  flags.DEFINE_bool('host_speed', True, "Read the host's speed beside every launch "
                    '(`host_speed`), for each row\'s error at the host\'s speed.')


def rows_to_run(plan: dict, only: list = ()) -> list:
  """Indices of the plan's rows on all its devices that the step model predicts: not
  Downpour (its updates are another model's, and on Ray's actors not predicted at all), and
  not a row left at its bound (`pruned`: its collectives not costed; make the plan with a
  large `plan.close` to cost them all); of those, only the ones whose label contains one of
  `only` where it is given."""
  return [i for i, row in enumerate(plan['candidates'])
          if row['devices'] == plan['devices'] and row['devices'] > 1
          and row['family'] != 'async' and not row.get('pruned')
          and (not only or any(part in row['label'] for part in only))]


def step_seconds(curve: list) -> tuple:
  """(median, lowest, highest) seconds a step between the clock's readings ([step, metric,
  training seconds] at each), the first interval left out (it holds the run's first steps
  after the compiling one, which fault memory in); None where fewer than two are left."""
  rates = [(t1 - t0) / (s1 - s0) for (s0, _, t0), (s1, _, t1) in zip(curve[1:], curve[2:])]
  if len(rates) < 2:
    return None
  return float(np.median(rates)), float(min(rates)), float(max(rates))


def left_idle_priority(logs: str) -> bool:
  """Whether gloo's loop went back to normal priority in any process of a launch (its logs
  in `logs`: `multihost.IdleGlooLoops` logs it), which makes a large all-reduce's step up to
  2x slower (docs/performance.md): such a launch is marked in the record."""
  import glob
  from jaxpar.multihost import BACK_AT_NORMAL
  for path in glob.glob(os.path.join(logs, 'process_*.log')):
    with open(path, errors='replace') as f:
      if BACK_AT_NORMAL in f.read():
        return True
  return False


def own_work(plan: dict, row: dict) -> float:
  """The row's programs' own work (the plan's phase 3b), 0 where the plan has none."""
  for w in plan.get('strategy_work') or []:
    if (w['server'], w['devices'], w['period']) == (row['server'], row['devices'],
                                                     row['period']):
      return w['seconds']
  return 0.0


def planned_speed(plan: dict) -> float:
  """The plan's t_grad(b, N): b its serial batch, N its devices — what `host_speed` times."""
  b, n = plan['serial']['batch'], plan['devices']
  for t in plan['t_grad']:
    if (t['batch'], t['devices']) == (b, n):
      return t['seconds']
  raise ValueError(f"the plan has no t_grad at its serial batch {b} on its {n} devices")


def judged(plan: dict, row: dict, runs: list, at_normal: int = 0, speeds=None) -> dict:
  """One row's prediction with and without the programs' own work beside its measured step:
  the median of its launches' steps (`runs`: `step_seconds` of each launch, None where one
  gave too few readings). The range is the launches' lowest and highest step where there
  are several, one launch's intervals' otherwise; `noise` is the half-range of a launch's
  intervals (the median over launches), `run_noise` that of the launches' steps;
  `at_normal`: the launches whose gloo loop left idle priority (`left_idle_priority`).
  `speeds`: each launch's host speed factor (t_grad then ÷ the plan's), for the prediction
  at the host's speed (the module docstring)."""
  with_work = row['t_predicted']
  without = with_work - own_work(plan, row)
  out = {'label': row['label'], 'predicted_s': with_work, 'predicted_without_work_s': without,
         'own_work_s': own_work(plan, row), 'measured_s': None, 'measured_range_s': None,
         'runs_s': [], 'error': None, 'error_without_work': None, 'noise': None,
         'run_noise': None, 'launches_at_normal_priority': at_normal,
         'host_speed': None, 'error_at_host_speed': None}
  done = [r for r in runs if r]
  paired = [(r[0], f) for r, f in zip(runs, speeds or []) if r and f]
  if paired:
    ratio = float(np.median([m / (with_work * f) for m, f in paired]))
    out.update(host_speed=[f for _, f in paired], error_at_host_speed=abs(float(np.log(ratio))))
  if done:
    steps = [r[0] for r in done]
    measured = float(np.median(steps))
    spread = (min(steps), max(steps)) if len(done) > 1 else done[0][1:]
    out.update(measured_s=measured, measured_range_s=list(spread), runs_s=steps,
               error=abs(float(np.log(with_work / measured))),
               error_without_work=abs(float(np.log(without / measured))),
               noise=float(np.median([np.log(r[2] / r[1]) / 2 for r in done])),
               run_noise=(float(np.log(max(steps) / min(steps))) / 2 if len(done) > 1
                          else None))
  return out


def train_row(configuration: list, plan: dict, index: int, workdir: str, processes: int,
              rate: str, steps: int, every: int, seed: int) -> list:
  """Trains row `index` of `plan` for `steps` steps as its choice, as the regret check
  trains a row (`plan_regret.train`), the target out of reach: the clock's curve ([step,
  metric, seconds])."""
  from analysis.accuracy import plan_regret
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, 'plan.json')
  with open(path, 'w') as f:  # never reached: the clock reads the time at every evaluation
    json.dump({**plan, 'choice': plan['candidates'][index],
               'target': {'kind': 'loss', 'value': 1e-12}}, f)
  return plan_regret.train([*configuration, f'--config.stop_after_steps={steps}',
                            f'--config.plan.eval_every={every}'],
                           path, seed, workdir, processes, rate)['curve']


def host_speed(configuration: list, devices: int, processes: int, rate: str,
               folder: str) -> float:
  """t_grad(b, `devices`) now (`host_speed`), timed by `processes` fresh processes over
  `rate` as the rows are launched."""
  from analysis.steptime import link
  out = os.path.join(folder, 'speed.json')
  link.launch('analysis.steptime.host_speed', [*configuration, f'--devices={devices}',
                                               f'--out={out}'], processes, rate, folder)
  with open(out) as f:
    return json.load(f)['t_grad_s']


def summary(plan: dict, results: list) -> dict:
  from jaxpar.plan import probe
  done = [r for r in results if r['error'] is not None]
  med = lambda key: float(np.median([r[key] for r in done])) if done else None
  return {'tool': 'analysis.steptime.plan_steps',
          'created': datetime.datetime.now().isoformat(timespec='seconds'),
          'command': 'python -m analysis.steptime.plan_steps ' + shlex.join(sys.argv[1:]),
          'machine': probe.machine(), 'versions': probe.versions(),
          'network': plan['network'], 'image_size': plan['image_size'],
          'setting': plan['setting'], 'processes': plan.get('processes', 1),
          'link': plan.get('link', 'loopback'), 'plan_created': plan['created'],
          'rows': results, 'median_error': med('error'),
          'median_error_without_work': med('error_without_work'),
          # the lowest and highest speed factor of any launch (`judged`'s `host_speed`)
          'host_speed': ([min(f for r in done for f in r['host_speed'] or []),
                          max(f for r in done for f in r['host_speed'] or [])]
                         if any(r['host_speed'] for r in done) else None),
          'median_error_at_host_speed': (med('error_at_host_speed') if all(
              r['error_at_host_speed'] is not None for r in done) else None),
          'median_noise': med('noise'),
          'median_run_noise': (med('run_noise') if all(r['run_noise'] is not None for r in done)
                               else None)}


def table(*results: dict) -> str:
  """Each row's predicted step, with and without the programs' own work, beside the measured
  one, for one result or several (a network column then; Markdown)."""
  several = len(results) > 1
  speed = any(r.get('error_at_host_speed') is not None for res in results for r in res['rows'])
  lines = [('| network ' if several else '') + '| candidate | own work (ms) | predicted (ms) | '
           'error | predicted without it (ms) | error | measured (ms, range) |'
           + (" error at the host's speed |" if speed else ''),
           ('|---' if several else '') + '|---|---:|---:|---:|---:|---:|---|'
           + ('---:|' if speed else '')]
  pct = lambda v: '—' if v is None else f'{v:.0%}'
  rows = [(res, r) for res in results for r in res['rows']]
  for res, r in rows:
    measured = ('—' if r['measured_s'] is None else
                f"{r['measured_s'] * 1e3:.1f} ({r['measured_range_s'][0] * 1e3:.1f}–"
                f"{r['measured_range_s'][1] * 1e3:.1f})")
    if r.get('launches_at_normal_priority'):
      measured += f", {r['launches_at_normal_priority']} launch(es) with gloo's loop at normal priority"
    net = f"| {res['network']} {res['image_size']}² " if several else ''
    lines.append(net + f"| {r['label']} | {r['own_work_s'] * 1e3:.1f} | {r['predicted_s'] * 1e3:.1f} "
                 f"| {pct(r['error'])} | {r['predicted_without_work_s'] * 1e3:.1f} | "
                 f"{pct(r['error_without_work'])} | {measured} |"
                 + (f" {pct(r.get('error_at_host_speed'))} |" if speed else ''))
  for res in results:
    if res.get('median_error') is not None:
      lines.append('')
      lines.append(f"{res['network']} {res['image_size']}², {res['setting']}, {res['link']} "
                   f"({res['created'][:10]}): median error {res['median_error']:.0%} with the "
                   f"programs' own work, {res['median_error_without_work']:.0%} without it; "
                   f"the steps' own noise {res['median_noise']:.0%} within a launch"
                   + (f", {res['median_run_noise']:.0%} between launches of a row"
                      if res.get('median_run_noise') is not None else '')
                   + ' (median half-ranges).'
                   + (f" At the host's speed of each launch (t_grad timed beside it): median "
                      f"error {res['median_error_at_host_speed']:.0%}; the host ran at "
                      f"{res['host_speed'][0]:.2f}–{res['host_speed'][1]:.2f}× the plan's "
                      't_grad.' if res.get('median_error_at_host_speed') is not None else ''))
  return '\n'.join(lines)


def main(argv):
  from analysis.accuracy.plan_regret import config_args
  from jaxpar.plan import planner
  del argv
  plan = planner.read(FLAGS.plan)
  configuration = config_args(sys.argv[1:])
  indices = rows_to_run(plan, FLAGS.rows)
  runs = {i: [] for i in indices}
  normal = {i: 0 for i in indices}  # launches where gloo's loop left idle priority
  # Each launch's host speed: the readings just before and just after it (`host_speed`).
  readings, launched = [], {i: [] for i in indices}
  planned = planned_speed(plan) if FLAGS.host_speed else None

  def speeds(j):
    return [float(np.sqrt(readings[k] * readings[k + 1])) / planned
            if k + 1 < len(readings) else None for k in launched[j]]

  def results():
    return [judged(plan, plan['candidates'][j], runs[j], normal[j], speeds(j))
            for j in indices if runs[j]]

  with tempfile.TemporaryDirectory() as scratch:
    def read_speed():
      if planned:
        readings.append(host_speed(configuration, plan['devices'], FLAGS.processes,
                                   FLAGS.link, os.path.join(scratch, f'speed_{len(readings)}')))
    read_speed()
    for round_ in range(FLAGS.repeats):
      for i in (indices if round_ % 2 == 0 else indices[::-1]):
        row = plan['candidates'][i]
        workdir = os.path.join(scratch, f'row_{i}_{round_}')
        curve = train_row(configuration, plan, i, workdir, FLAGS.processes, FLAGS.link,
                          FLAGS.steps, FLAGS.every, FLAGS.config.seed)
        runs[i].append(step_seconds(curve))
        launched[i].append(len(readings) - 1)
        read_speed()
        got = runs[i][-1]
        normal[i] += left_idle_priority(os.path.join(workdir, 'logs'))
        print(f"{row['label']} (launch {round_ + 1}): predicted {row['t_predicted'] * 1e3:.1f} "
              'ms, measured ' + ('—' if got is None else f'{got[0] * 1e3:.1f} ms')
              + (f"; the host at {speeds(i)[-1]:.2f}× the plan's t_grad" if planned else ''),
              file=sys.stderr, flush=True)
        if FLAGS.out:
          with open(FLAGS.out, 'w') as f:
            json.dump(summary(plan, results()), f, indent=1)
  result = summary(plan, results())
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      json.dump(result, f, indent=1)
  print(table(result))


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['config', 'plan'])
  app.run(main)
