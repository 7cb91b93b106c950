"""Time to accuracy on real processes: the check of `tta`'s prediction, time = K × t_step.

  python -m analysis.accuracy.end_to_end --config configs/squeezenet.py --config.image_size=16 \\
      --tta squeezenet16.json --steps_json steps16.json \\
      --cases allreduce,central,local-sgd:4,async --out end_to_end.json --report report/

`tta` counts the steps K a scheme needs on emulated devices (exactly its updates, not its
timing) and `analysis.steptime.measure` times its step on real processes; `tta` predicts
the time to the target as K × t_step. Here each case trains for real on --processes
processes, one core each, joined by jax.distributed over loopback (or, with --link RATE,
through an emulated link: `analysis.steptime.link`), from the same initial weights, seed
and learning rate as `tta`'s run of that case (each process reading its own shard of the
training set), until the training-set loss reaches `tta`'s target (evaluated every `tta`
eval_every steps), and the training time to it is measured (evaluations excluded; from the
end of the first step, which compiles, scaled to K steps):

  allreduce, central, distributed   sync-join on N = --processes devices, b each (`tta`'s
                                    batch family at B = N·b)
  local-sgd:τ                       Local SGD averaging every τ steps (`tta`'s period
                                    family; its --workers must be N)
  async                             Downpour with the central server on N Ray workers
                                    (`tta`'s async family at N; each push is a step)

For each case the report sets the predicted time (`tta`'s K, the mean over its seeds at its
best rate, × the measured step; Local SGD has no step in a measure JSON: its own run's step
stands in, so only K is checked) beside the measured one, splits the error into K (real vs
emulated: the same initial weights and rate, but each process reads its own shard of the
training set, so the examples come in another order, in effect another seed; async's
staleness is the real run's) and the step (real vs measured), and says whether the
predicted order of the cases is the measured one, with the regret of the predicted best.
"""
import datetime
import json
import math
import os
import sys
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

SYNC_SERVERS = ('allreduce', 'central', 'distributed')
FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, 'The configs/*.py file[:arg] `tta` ran.',
                                  lock_config=False)
  flags.DEFINE_string('tta', None, 'The `analysis.accuracy.tta` JSON: K, rate and target.')
  flags.DEFINE_string('steps_json', None, 'The `analysis.steptime.measure` JSON at the same '
                      'batch: the step times of the prediction.')
  flags.DEFINE_list('cases', ['allreduce', 'central', 'local-sgd:4', 'async'],
                    'allreduce | central | distributed (sync-join) | local-sgd:τ | async.')
  flags.DEFINE_integer('processes', 2, 'N: processes, one device and one core each.')
  flags.DEFINE_string('link', '', 'An emulated link rate (tc syntax: 1gbit); empty: loopback.')
  flags.DEFINE_integer('seed', 0, "The seed of the real runs (one of `tta`'s).")
  flags.DEFINE_string('out', None, 'The JSON file to write.')
  flags.DEFINE_string('report', '', 'A folder for end_to_end.md (empty: none).')


# =============================================================================== the cases
def plan(cases: list, processes: int, result: dict, seed: int) -> list[dict]:
  """Each case as `tta`'s case (family, x, devices, overrides) with the rate factor `tta`
  found best and its K; raises app.UsageError naming the flag, before anything runs."""
  from analysis.accuracy import tta
  table = tta.steps_by_case(result)
  b, out = result['batch'], []
  if processes < 1:
    raise app.UsageError(f'--processes={processes}: must be at least 1.')
  if seed not in range(result['seeds']):
    raise app.UsageError(f"--seed={seed}: the tta run's seeds are 0..{result['seeds'] - 1}.")
  for name in cases:
    kind, _, arg = name.partition(':')
    if kind in SYNC_SERVERS and not arg:
      case = {'family': 'batch', 'x': processes * b, 'devices': processes,
              'overrides': {'scheme': 'sync-join', 'server': kind, 'per_device_batch': b}}
    elif kind == 'local-sgd' and arg.isdigit() and int(arg) >= 1:
      if result['workers'] != processes:
        raise app.UsageError(f"--cases={name}: the tta run's period family ran on "
                             f"--workers={result['workers']}, not --processes={processes}.")
      case = {'family': 'period', 'x': int(arg), 'devices': processes,
              'overrides': {'scheme': 'sync-join', 'server': 'allreduce',
                            'per_device_batch': b, 'sync_every': int(arg)}}
    elif kind == 'async' and not arg:
      case = {'family': 'async', 'x': processes, 'devices': processes,
              # one CPU a worker, as measure's Ray workers and each synchronous process have
              'overrides': {'scheme': 'async', 'server': 'central', 'per_device_batch': b,
                            'async_sgd.backend': 'ray', 'async_sgd.cpus_per_worker': 1}}
    else:
      raise app.UsageError(f'--cases: {name!r} unknown; choose from {list(SYNC_SERVERS)}, '
                           f'local-sgd:τ, async.')
    entry = table.get((case['family'], case['x']))
    if not entry or entry['K'] is None:
      raise app.UsageError(f"--cases={name}: the tta run has no K for {case['family']} "
                           f"{case['x']} (not run, or not reached by every seed).")
    seed_k = [r['K'] for r in result['runs'] if (r['family'], r['x'], r['lr_factor'], r['seed'])
              == (case['family'], case['x'], entry['lr_factor'], seed)]
    out.append({**case, 'name': name, 'lr_factor': entry['lr_factor'], 'K_emulated': entry['K'],
                'K_emulated_seeds': entry['Ks'], 'K_emulated_seed': seed_k[0] if seed_k else None})
  return out


def predicted_step(measured: dict, setting: str, case: dict):
  """The case's step in an `analysis.steptime.measure` JSON (median seconds; async: a
  push, the run's time ÷ D), or None when it has none (Local SGD)."""
  data = measured['settings'].get(setting, {})
  if case['family'] == 'batch':
    server = case['overrides']['server']
    for step in data.get('steps', []):
      if (step['scheme'], step['server'], step['n']) == ('sync-join', server, case['devices']):
        return float(np.median(step['samples']))
  if case['family'] == 'async':
    for run in data.get('async', []):
      if (run['server'], run['n']) == ('central', case['devices']):
        return float(np.median(run['samples'])) / measured['batches']
  return None


def time_at(clock: list, k: float) -> float:
  """Training seconds to step k from the clock [(step, seconds from step 1's end)]: linear
  between evaluations, scaled by k/(k − 1) to count step 1 as one ordinary step."""
  steps, seconds = zip(*[(1, 0.0), *clock])
  return float(np.interp(k, steps, seconds)) * k / max(k - 1, 1)


# =============================================================================== one process
def worker(spec: dict) -> dict:
  """One process of a case's run: joins the others, trains as `tta.run_case` does."""
  import jax
  import ml_collections

  from analysis.accuracy import tta
  from jaxpar import config as config_lib
  from jaxpar import metrics, multihost
  from jaxpar.data import sources
  from jaxpar import build
  metrics.quiet_libraries(keep='')
  cfg = ml_collections.ConfigDict(spec['config'])
  build.keep_freed_memory(cfg)
  if spec['num_processes'] > 1:
    multihost.join(spec['coordinator'], spec['num_processes'], spec['process_id'], 'none',
                   cfg.distributed.initialization_timeout, cfg.distributed.heartbeat_timeout)
  if config_lib.on_ray(cfg):  # Ray's actors inherit the driver's cores: all, as on a node
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
  case = spec['case']
  result = tta.run_case(cfg, case, sources.open_source(cfg.dataset), spec['target'],
                        spec['eval_every'])
  return {**result, 'processes': jax.process_count(), 'devices': jax.device_count()}


# =============================================================================== the run
def run(base, result: dict, measured: dict, cases: list, processes: int, link: str,
        seed: int, folder: str, progress=print) -> list[dict]:
  from analysis.accuracy import tta
  from analysis.steptime import measure
  from jaxpar import config as config_lib
  from jaxpar import optim
  setting = f'link-{link}' if link else 'processes'
  rows = []
  for i, case in enumerate(cases):
    cfg = tta.case_config(base, case, seed, case['lr_factor'], result['max_steps'])
    on_ray = config_lib.on_ray(cfg)
    progress(f"[{i + 1}/{len(cases)}] {case['name']}: N = {processes}, lr × {case['lr_factor']:g}"
             f" ({'one driver, Ray workers' if on_ray else f'{processes} processes'})")
    common = {'config': cfg.to_dict(), 'case': case, 'target': result['target_loss'],
              'eval_every': result['eval_every']}
    real = measure.run_setting('processes' if on_ray else setting, 1 if on_ray else processes,
                               {}, common, folder, module='analysis.accuracy.end_to_end')
    t_pred = predicted_step(measured, setting, case)
    k_real, k_pred = real['K'], case['K_emulated']
    row = {'case': case['name'], 'family': case['family'], 'x': case['x'], 'n': processes,
           'setting': setting, 'lr_factor': case['lr_factor'],
           'lr': optim.peak_learning_rate(cfg.optimizer, config_lib.global_batch(cfg)),
           'K_emulated': k_pred, 'K_emulated_seeds': case['K_emulated_seeds'],
           'K_emulated_seed': case['K_emulated_seed'], 'K_real': k_real,
           't_step_measured': t_pred, 'curve': real['curve'], 'clock': real['clock'],
           'top1': real['top1'], 'top1_stderr': real['top1_stderr'],
           'staleness': real.get('staleness')}
    if k_real is not None:
      row['time_real'] = time_at(real['clock'], k_real)
      row['t_step_real'] = row['time_real'] / k_real
    row['t_step_predicted_from'] = 'measure' if t_pred is not None else 'this run'
    t_step = t_pred if t_pred is not None else row.get('t_step_real')
    row['time_predicted'] = k_pred * t_step if t_step is not None else None
    rows.append(row)
    progress(f"    K {k_real if k_real is None else round(k_real)} (emulated "
             f"{k_pred:.0f}); time {row.get('time_real', math.nan):.1f} s (predicted "
             f"{row['time_predicted'] or math.nan:.1f} s)")
  return rows


def summary(rows: list[dict]) -> dict:
  """Median |log(predicted/real)| of the time, of K and of the step; whether the predicted
  order is the real one; the regret of the predicted best (its real time ÷ the best real)."""
  both = [r for r in rows if r.get('time_real') and r.get('time_predicted')]

  def err(a, b):
    pairs = [(r[a], r[b]) for r in both if r.get(a) and r.get(b)]
    return float(np.median([abs(math.log(x / y)) for x, y in pairs])) if pairs else math.nan
  out = {'median_error_time': err('time_predicted', 'time_real'),
         'median_error_K': err('K_emulated', 'K_real'),
         'median_error_step': err('t_step_measured', 't_step_real')}
  if len(both) > 1:
    predicted = min(both, key=lambda r: r['time_predicted'])
    real = min(both, key=lambda r: r['time_real'])
    out.update(predicted_best=predicted['case'], real_best=real['case'],
               regret=predicted['time_real'] / real['time_real'],
               same_order=[r['case'] for r in sorted(both, key=lambda r: r['time_predicted'])]
               == [r['case'] for r in sorted(both, key=lambda r: r['time_real'])])
  return out


def report(out: dict) -> str:
  return '\n'.join([
      f"# Time to accuracy on {out['processes']} real processes ({out['setting']}): "
      f"{out['network']} at {out['image_size']}²", '',
      f"Target: training-set loss ≤ {out['target_loss']}; seed {out['seed']}; the rate "
      f"`tta` found best per case. Command: `{out['command']}`; {out['created']}.", '',
      table(out)]) + '\n'


def table(out: dict) -> str:
  """Each case predicted against its real run, then the medians and the pick's regret (the
  report's body; docs/accuracy.md shows it too)."""
  from analysis.accuracy.tta import _pct
  s = out['summary']
  lines = ['| case | lr | K emulated (seeds) | K real | step: measured / real | '
           'time to target: predicted / real | error | test top-1 |',
           '|---|---:|---|---:|---|---|---:|---|']
  for r in out['rows']:
    ks = ', '.join(f'{k:.0f}' for k in r['K_emulated_seeds'])
    real_k = 'not reached' if r['K_real'] is None else f"{r['K_real']:.0f}"
    step = (f"{r['t_step_measured'] * 1e3:.1f}" if r['t_step_measured'] is not None else '–')
    step += f" / {r['t_step_real'] * 1e3:.1f} ms" if r.get('t_step_real') else ' / –'
    t = (f"{r['time_predicted']:.1f} / {r['time_real']:.1f} s"
         if r.get('time_real') and r.get('time_predicted') else '–')
    e = (_pct(abs(math.log(r['time_predicted'] / r['time_real'])))
         if r.get('time_real') and r.get('time_predicted') else '–')
    lines.append(f"| {r['case']} | {r['lr']:.3g} | {r['K_emulated']:.0f} ({ks}) | {real_k} | "
                 f"{step} | {t} | {e} | {r['top1'] * 100:.1f} ± {r['top1_stderr'] * 100:.1f} % |")
  lines += ['', f"Median error: time {_pct(s['median_error_time'])}, K "
                f"{_pct(s['median_error_K'])}, step {_pct(s['median_error_step'])}."]
  if 'regret' in s:
    lines.append(f"Predicted best: {s['predicted_best']}; measured best: {s['real_best']}; "
                 f"regret {s['regret']:.2f}; predicted order "
                 f"{'is' if s['same_order'] else 'is not'} the measured one.")
  no_step = [r['case'] for r in out['rows'] if r['t_step_predicted_from'] != 'measure']
  if no_step:
    lines.append(f"No measured step for {', '.join(no_step)}: its prediction uses its own "
                 f"run's step (K checked only).")
  return '\n'.join(lines)


# =============================================================================== main
def main(argv):
  if len(argv) == 2 and argv[1].endswith('.spec.json'):  # one process of a case's run
    from analysis.steptime import timing
    timing.child(argv[1], worker)
    return
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  for name in ('config', 'tta', 'steps_json', 'out'):
    if getattr(FLAGS, name) is None:
      raise app.UsageError(f'--{name} is required.')
  from analysis.accuracy import tta
  from analysis.steptime import link
  from analysis.steptime.measure import machine, versions
  with open(FLAGS.tta) as f:
    result = json.load(f)
  with open(FLAGS.steps_json) as f:
    measured = json.load(f)
  if tta.measured_batch(measured) != result['batch']:
    raise app.UsageError(f'--steps_json={FLAGS.steps_json} was measured at batch '
                         f"{tta.measured_batch(measured)}, the tta run at {result['batch']}.")
  if FLAGS.link and (why_not := link.refusal(FLAGS.link)):
    raise app.UsageError(why_not)
  cases = plan(FLAGS.cases, FLAGS.processes, result, FLAGS.seed)
  base = FLAGS.config
  with tempfile.TemporaryDirectory() as folder:
    rows = run(base, result, measured, cases, FLAGS.processes, FLAGS.link, FLAGS.seed, folder,
               progress=lambda line: print(line, file=sys.stderr, flush=True))
  out = {'tool': 'analysis.accuracy.end_to_end',
         'created': datetime.datetime.now().isoformat(timespec='seconds'),
         'command': ' '.join(['python -m analysis.accuracy.end_to_end', *sys.argv[1:]]),
         'machine': machine(), 'versions': versions(), 'network': base.model,
         'image_size': base.image_size, 'target_loss': result['target_loss'],
         'processes': FLAGS.processes, 'setting': rows[0]['setting'], 'seed': FLAGS.seed,
         'tta': FLAGS.tta, 'steps_json': FLAGS.steps_json, 'rows': rows,
         'summary': summary(rows)}
  os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
  with open(FLAGS.out, 'w') as f:
    json.dump(out, f, indent=1)
  text = report(out)
  if FLAGS.report:
    os.makedirs(FLAGS.report, exist_ok=True)
    with open(os.path.join(FLAGS.report, 'end_to_end.md'), 'w') as f:
      f.write(text)
  print(text)
  print(f'wrote {FLAGS.out}')


if __name__ == '__main__':
  define_flags()
  app.run(main)
