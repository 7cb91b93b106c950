"""The plan judged end to end: each of the plan's best-ranked candidates trained to the
plan's target, and the regret of its choice.

  python -m analysis.accuracy.plan_regret --config configs/squeezenet.py \\
      --config.image_size=16 --config.mesh.shape='(2,)' --plan plan.json \\
      --ranks 1,2,3,4,5,8,12 --seeds 2 --out regret.json

For each of the plan's rows at --ranks (`python -m jaxpar.plan`; its choice always among
them) and each seed, `python -m jaxpar.train` trains the config with that row as the plan's
choice (`scheme=auto`, `plan.file`: the row's scheme, server, N, batch and BN grouping, a
constant rate after warm-up), each run a process of its own as a user runs it (several runs
in one process slowed the later ones' 2-device steps 1.6× here), seed by seed with every row
in turn. `plan.eval_every` steps apart the target's metric is evaluated, and the training
time to the target is measured (`planner.TargetClock`: from the end of the first step, which
compiles, evaluations excluded) on the devices the plan was made on.

A row's measured T is its seeds' mean; the regret of the plan is the choice's measured T ÷
the smallest measured T (1 = it picked the fastest of those run). Beside each: the plan's
predicted K and T, and the error |log(predicted/measured)| of both.

Across processes (`--processes P`, over loopback or an emulated link, `--link 1gbit`:
`analysis.steptime.link`): `--make_plan` first makes the plan as P processes (`python -m
jaxpar.plan`, each process pinned to a core, in its namespace of the link), then each row
trains as its choice runs — all P processes over the same link, or one device as one
process pinned to one core (the plan timed it so).

  python -m analysis.accuracy.plan_regret --config configs/squeezenet.py \
      --config.image_size=16 --config.mesh.shape='(2,)' --config.plan.target_loss=0.5 \
      --processes 2 --link 1gbit --make_plan --plan plan.json --ranks 1,2,3,4,5 --out r.json
"""
import datetime
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxpar.perfmodel import steps_model  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, 'The configs/*.py file[:arg] the plan was '
                                  'made for (with its --config.* overrides).', lock_config=False)
  flags.DEFINE_string('plan', None, 'The plan (`python -m jaxpar.plan --out`).')
  flags.DEFINE_list('ranks', ['1', '2', '3', '4', '5', '6'], "The plan's ranks to train (and "
                    "its choice, always); exact:K: its K best-ranked candidates that it can "
                    "choose; devices:N: the best-ranked one it can choose on N devices; "
                    "family:F: the best-ranked row of family F (bn_device, local_sgd, async), "
                    'chosen or not.')
  flags.DEFINE_integer('seeds', 2, 'Seeds of every row.')
  flags.DEFINE_string('out', None, 'The JSON file to write.')
  flags.DEFINE_integer('processes', 1, 'Processes of the plan and of its rows\' runs on all '
                       'devices (one device: one process).')
  flags.DEFINE_string('link', '', "The processes' emulated link (tc rate, e.g. 1gbit; "
                      "default: loopback).")
  flags.DEFINE_string('extend', None, "An earlier result of this tool on the same plan, with "
                      "as many seeds or fewer (one --out wrote after a seed, when a check "
                      "stopped part way): train only the rows and seeds it lacks and report "
                      "the regret over all.")
  flags.DEFINE_bool('make_plan', False, 'Make the plan first (python -m jaxpar.plan as '
                    '--processes processes over --link, the target from --config.plan.*), '
                    'written to --plan.')


def config_args(argv: list) -> list:
  """The --config and --config.* arguments of a command line, as given."""
  out, take = [], False
  for arg in argv:
    if take:
      out.append(arg)
      take = False
    elif arg == '--config' or (arg.startswith('--config.') and '=' not in arg):
      out.append(arg)
      take = True
    elif arg.startswith('--config=') or arg.startswith('--config.'):
      out.append(arg)
  return out


def _may_choose(row: dict) -> bool:
  """A plan row its plan may choose (`rank.choosable`); in a plan written before that was
  recorded, one computing the serial maths."""
  return row.get('choosable', row['exact'])


def ranks_of(given: list, plan: dict) -> list:
  """--ranks: the numbers given; exact:K the ranks of the plan's first K candidates it may
  choose (`choosable`; in a plan written before, those computing the serial maths); family:F
  the rank of the best-ranked row of family F."""
  rows = plan['candidates']
  out = []
  for item in given:
    if item.startswith('devices:'):  # the best-ranked row it may choose on that many devices
      n = int(item.removeprefix('devices:'))
      out += [i + 1 for i, row in enumerate(rows) if row['devices'] == n
              and _may_choose(row)][:1]
    elif item.startswith('exact:'):
      k = int(item.removeprefix('exact:'))
      out += [i + 1 for i, row in enumerate(rows) if _may_choose(row)][:k]
    elif item.startswith('family:'):
      family = item.removeprefix('family:')
      out += [i + 1 for i, row in enumerate(rows) if row.get('family') == family][:1]
    else:
      out.append(int(item))
  return sorted(set(out))


def train(configuration: list, plan_file: str, seed: int, workdir: str, processes: int = 1,
          rate: str = '') -> dict:
  """One `python -m jaxpar.train` with the plan (fresh processes, as a user runs it): its
  `plan_outcome.json`. `processes` > 0 launches them pinned to cores (`link.launch`, over
  `rate`); 0: one process as the shell starts it (a plan made in one process)."""
  from jaxpar.plan import planner
  args = [*configuration, '--config.scheme=auto', f'--config.plan.file={plan_file}',
          f'--config.seed={seed}', '--config.total_steps=0', '--config.eval_every=0',
          # ended where the target is reached: the rest of the run measures nothing here
          '--config.plan.stop_at_target=True',
          '--config.checkpoint_every=1000000000', f'--workdir={workdir}',
          # compiled as the plan's steps were, not loaded (jaxpar/compile_cache.py)
          '--config.compilation_cache=off']
  if processes:
    from analysis.steptime import link
    link.launch('jaxpar.train', args, processes, rate, os.path.join(workdir, 'logs'))
  else:
    command = [sys.executable, '-m', 'jaxpar.train', *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
      raise RuntimeError(f'{shlex.join(command)} failed: {done.stderr[-3000:]}')
  with open(os.path.join(workdir, planner.OUTCOME_FILE)) as f:
    return json.load(f)


def launched(command: str, processes: int, rate: str) -> str:
  """A command as `link.launch` ran it, said once for all its processes: without the
  `config.distributed` flags each process was given."""
  kept = [a for a in shlex.split(command) if not a.startswith('--config.distributed.')]
  return f'{processes} processes ({rate}), each: {shlex.join(kept)}'


def make_plan(configuration: list, out: str, processes: int, rate: str) -> dict:
  """`python -m jaxpar.plan` as `processes` processes over `rate` (`link.launch`): the plan
  written to `out`, its link recorded in it; process 0's output goes to stderr."""
  from analysis.steptime import link
  from jaxpar.plan import planner
  with tempfile.TemporaryDirectory() as folder:
    # No checkpoints, as `train` runs it: T without saves. Planned as a first launch: its
    # planning time compiles every program (jaxpar/compile_cache.py). No time limit: the
    # plan bounds itself (`plan.budget_s`, or its steps: VGG16E's at 32² took 2,892 s one
    # day and over an hour the next, when launch's hour stopped it).
    logs = link.launch('jaxpar.plan', [*configuration, '--config.checkpoint_every=1000000000',
                                       '--config.compilation_cache=off', f'--out={out}'],
                       processes, rate, folder, timeout_s=None)
    with open(logs[0]) as f:
      sys.stderr.write(f.read())
  plan = planner.read(out)
  plan['link'] = rate or 'loopback'
  plan['command'] = launched(plan['command'], processes, plan['link'])
  with open(out, 'w') as f:
    json.dump(plan, f, indent=1)
  return plan


def run(configuration: list, plan: dict, ranks: list, seeds: int, rate: str = '',
        earlier: dict | None = None, out: str | None = None) -> dict:
  """Trains the rows at `ranks` (and the choice) `seeds` times, seed by seed with every row
  in turn; with `earlier` (a result of this tool on the same plan, with as many seeds or
  fewer) only the runs it lacks — rows it does not have, and seeds its rows have not — its
  runs kept: the regret over all of them. With `out`, the result so far is written there
  after each seed (`summary` of the seeds every row has): a check stopped part way is
  extended from it (`--extend`)."""
  from jaxpar.plan import probe
  chosen = plan.get('choice_rank', 1) - 1
  made = plan.get('processes', 1)
  here = probe.machine()['cpu']
  # Each run keeps the CPU it trained on: an extension may run on another host of the kind.
  done = ({r['rank'] - 1: [{'cpu': earlier['machine']['cpu'], **run} for run in r['runs']]
           for r in earlier['rows']} if earlier else {})
  indices = sorted({chosen} | {r - 1 for r in ranks} | set(done))
  runs = {i: list(done.get(i, [])) for i in indices}
  with tempfile.TemporaryDirectory() as scratch:
    # Seed by seed, every row in turn: a machine whose speed drifts moves every row alike.
    for seed in range(seeds):
      for i in indices:
        if any(r['seed'] == seed for r in runs[i]):
          continue
        row = plan['candidates'][i]
        path = os.path.join(scratch, f'plan_{i}.json')
        with open(path, 'w') as f:
          json.dump({**plan, 'choice': row}, f)
        # One device runs as one process (pinned to a core, as the plan's processes were);
        # all devices as the processes the plan was made by; Downpour on Ray's actors as one
        # process given the host, its actors spread over the cores (as the plan timed it).
        processes = (0 if made == 1 or row.get('backend') == 'ray' else 1
                     if row['devices'] == 1 else made)
        outcome = train(configuration, path, seed, os.path.join(scratch, f'run_{i}_{seed}'),
                        processes, rate)
        runs[i].append({'seed': seed, 'step': outcome['step'], 'seconds': outcome['seconds'],
                        'cpu': here})
        print(f"{row['label']} seed {seed}: {outcome['summary']}", file=sys.stderr, flush=True)
      if out and seed + 1 < seeds:
        with open(out, 'w') as f:
          json.dump(summary(plan, runs, seed + 1, earlier), f, indent=1)
  return summary(plan, runs, seeds, earlier)


def summary(plan: dict, runs: dict, seeds: int, earlier: dict | None = None) -> dict:
  """The result of `run` from each trained row's runs ({index: [{'seed', 'step',
  'seconds'}]}): measured K and T, errors, the regret and its interval."""
  from jaxpar.plan import probe
  chosen = plan.get('choice_rank', 1) - 1
  command = 'python -m analysis.accuracy.plan_regret ' + shlex.join(sys.argv[1:])
  results = []
  for i in sorted(runs):
    row = plan['candidates'][i]
    kept = sorted((r for r in runs[i] if r['seed'] < seeds), key=lambda r: r['seed'])
    reached = [r for r in kept if r['seconds'] is not None]
    measured = (float(np.mean([r['seconds'] for r in reached])) if len(reached) == seeds
                else None)
    steps = float(np.mean([r['step'] for r in reached])) if len(reached) == seeds else None
    results.append({'rank': i + 1, 'choice': i == chosen, 'label': row['label'],
                    'predicted_T': row['T'],
                    'predicted_K': row['K'], 'measured_T': measured, 'measured_K': steps,
                    'T_error': _error(row['T'][0], measured),
                    'K_error': _error(row['K'][0], steps), 'runs': kept})
  done = [r for r in results if r['measured_T'] is not None]
  best = min(done, key=lambda r: r['measured_T']) if done else None
  choice = next(r for r in results if r['choice'])
  regret = (choice['measured_T'] / best['measured_T']
            if best and choice['measured_T'] is not None else None)
  return {'tool': 'analysis.accuracy.plan_regret',
          'created': datetime.datetime.now().isoformat(timespec='seconds'),
          # Extended: the first command and each that added rows, in order.
          'command': f"{earlier['command']}; then {command}" if earlier else command,
          'machine': probe.machine(), 'versions': probe.versions(),
          'network': plan['network'], 'image_size': plan['image_size'],
          'setting': plan['setting'], 'processes': plan.get('processes', 1),
          'link': plan.get('link', 'loopback'), 'target': plan['target'],
          'planning_s': plan['planning_s'], 'plan_created': plan['created'],
          'seeds': seeds, 'rows': results, 'machines': machines(results),
          'best_measured': best['label'] if best else None, 'regret': regret,
          'regret_interval': regret_interval({'rows': results}),
          'level_interval': level_interval({'rows': results, 'best_measured':
                                            best['label'] if best else None}),
          **runner_up({'rows': results, 'best_measured': best['label'] if best else None}),
          'median_T_error': _median([r['T_error'] for r in results]),
          'median_K_error': _median([r['K_error'] for r in results])}


def machines(rows: list) -> dict:
  """{CPU: the seeds trained on it} over the rows' runs: every row of a seed trains on one
  host, in turn, but a check extended later (`--extend`) may have run its new seeds on another
  host of the kind; `machine` is the newest's."""
  found = {}
  for row in rows:
    for r in row['runs']:
      if 'cpu' in r:
        found.setdefault(r['cpu'], set()).add(r['seed'])
  return {cpu: sorted(seeds) for cpu, seeds in found.items()}


def regret_interval(result: dict, resamples: int = 2000, level: float = 0.9):
  """The regret's own interval from the seeds: the seeds resampled with replacement, the same
  seeds for every row (each seed's runs share its initial weights and data order), the regret
  recomputed from each resample's row means — the best row may change — and its central
  `level` range. Rows with a seed that did not reach the target are left out, as the regret
  leaves them (`run`); None where the choice's did not."""
  done = [row for row in result['rows'] if all(r['seconds'] is not None for r in row['runs'])]
  if not any(row['choice'] for row in done):
    return None
  times = np.array([[r['seconds'] for r in row['runs']] for row in done])  # rows × seeds
  chosen = next(i for i, row in enumerate(done) if row['choice'])
  means = _resampled_means(times, resamples)
  return _central(means[chosen] / means.min(axis=0), level)


def _resampled_means(times, resamples: int):
  """Each row's mean over `resamples` draws of its seeds with replacement, the same draws
  for every row (rows × seeds in, rows × resamples out)."""
  picks = np.random.default_rng(0).integers(0, times.shape[1], (resamples, times.shape[1]))
  return times[:, picks].mean(axis=2)


def _central(values, level: float) -> list:
  tail = (1 - level) / 2
  return [float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))]


def level_interval(result: dict, resamples: int = 2000, level: float = 0.9):
  """The choice's measured T ÷ the best measured row's, the seeds resampled in pairs as for
  `regret_interval`: its central `level` range. Where it holds 1 the seeds cannot tell the
  two rows apart — they are level, and a tie the plan's tie rule resolves toward fewer
  devices is no loss. None where the choice is the best measured or either row missed the
  target on a seed."""
  rows = {row['label']: row for row in result['rows']}
  choice = next(row for row in result['rows'] if row['choice'])
  best = rows.get(result.get('best_measured'))
  if best is None or best is choice:
    return None
  pair = [[r['seconds'] for r in row['runs']] for row in (choice, best)]
  if any(s is None for seconds in pair for s in seconds):
    return None
  return _paired_interval(pair, resamples, level)


def _paired_interval(pair, resamples: int, level: float) -> list:
  """The central `level` range of row a's mean T ÷ row b's, `pair` = [a's, b's] seconds a
  seed, the seeds resampled in pairs (`_resampled_means`)."""
  means = _resampled_means(np.array(pair), resamples)
  return _central(means[0] / means[1], level)


def runner_up(result: dict, resamples: int = 2000, level: float = 0.9) -> dict:
  """Where the choice is the best measured row: the next fastest (by its mean over the
  seeds, every seed reached) as 'runner_up', and the choice's T ÷ its T with the seeds
  resampled in pairs as 'runner_up_interval' (its central `level` range). Where that holds 1
  the two rows are level — the regret interval's upper end is the runner-up winning
  resamples — and the choice between them lies inside the seeds' spread. {} otherwise."""
  choice = next((row for row in result['rows'] if row['choice']), None)
  if choice is None or result.get('best_measured') != choice['label']:
    return {}
  done = [row for row in result['rows'] if row is not choice
          and all(r['seconds'] is not None for r in row['runs'])]
  if not done:
    return {}
  mean = lambda row: np.mean([r['seconds'] for r in row['runs']])  # noqa: E731
  other = min(done, key=mean)
  pair = [[r['seconds'] for r in row['runs']] for row in (choice, other)]
  return {'runner_up': other['label'],
          'runner_up_interval': _paired_interval(pair, resamples, level)}


def _error(predicted, measured):
  return None if not measured else abs(steps_model.log_error(predicted, measured))


def _choice(result: dict) -> tuple:
  """(the choice's row, its seeds' times to the target, those that reached it)."""
  row = next(r for r in result['rows'] if r['choice'])
  return row, [r['seconds'] for r in row['runs'] if r['seconds'] is not None]


def _median(values):
  values = [v for v in values if v is not None]
  return float(np.median(values)) if values else None


def table(result: dict) -> str:
  """Predicted against measured time to the target, by the plan's rank (Markdown)."""
  lines = ['| plan rank | candidate | K predicted (range) | K measured | T predicted s (range) '
           '| T measured s (seeds) | T error |', '|---:|---|---|---:|---|---|---:|']
  for r in result['rows']:
    k, t = r['predicted_K'], r['predicted_T']
    lines.append(
        f"| {r['rank']}{' (choice)' if r['choice'] else ''} | {r['label']} | "
        f"{k[0]:.0f} ({k[1]:.0f}–{k[2]:.0f}) | "
        f"{_cell(r['measured_K'], '.0f')} | {t[0]:.2f} ({t[1]:.2f}–{t[2]:.2f}) | "
        f"{_cell(r['measured_T'], '.2f')}{_seeds(r)} | {_cell(r['T_error'], '.0%')} |")
  return '\n'.join(lines)


def _seeds(row) -> str:
  seconds = [f"{r['seconds']:.2f}" if r['seconds'] is not None else 'not reached'
             for r in row['runs']]
  return f" ({', '.join(seconds)})" if len(seconds) > 1 else ''


def _cell(value, spec):
  return '—' if value is None else format(value, spec)


def main(argv):
  from jaxpar.plan import planner
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  configuration = config_args(sys.argv[1:])
  if FLAGS.link:
    from analysis.steptime import link
    if why_not := link.refusal(FLAGS.link):
      raise app.UsageError(why_not)
  if FLAGS.make_plan:
    make_plan(configuration, FLAGS.plan, FLAGS.processes, FLAGS.link)
  plan = planner.read(FLAGS.plan)
  if plan.get('processes', 1) != FLAGS.processes:
    raise app.UsageError(f"--processes={FLAGS.processes}: the plan was made with "
                         f"{plan.get('processes', 1)}; train its rows as it was made")
  ranks = ranks_of(FLAGS.ranks, plan)
  if any(not 1 <= r <= len(plan['candidates']) for r in ranks):
    raise app.UsageError(f"--ranks: the plan ranks 1..{len(plan['candidates'])}")
  earlier = None
  if FLAGS.extend:
    with open(FLAGS.extend) as f:
      earlier = json.load(f)
    if earlier['plan_created'] != plan['created'] or earlier['seeds'] > FLAGS.seeds:
      raise app.UsageError(f'--extend={FLAGS.extend}: made from another plan or with '
                           f"{earlier['seeds']} seeds; extend it with its own plan and "
                           'as many --seeds or more')
  result = run(configuration, plan, ranks, FLAGS.seeds, FLAGS.link, earlier, FLAGS.out)
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


def setting(plan: dict) -> str:
  """The plan's devices, and across processes the link between them."""
  if plan.get('processes', 1) == 1:
    return plan['setting']
  rate = plan.get('link', 'loopback')
  if rate == 'loopback':
    return f"{plan['setting']}, loopback"
  from analysis.steptime import link
  return f"{plan['setting']}, emulated {link.describe(rate)} link"


def summary_table(pairs: list, dated: bool = False) -> str:
  """One row per (plan, regret) pair: what the plan chose and how it fared end to end;
  `dated`: the day the plan was made first."""
  lines = [('| plan made ' if dated else '')
           + '| network | devices | target | K(B) from | candidates ranked | planning | choice '
           '| T predicted | T measured (seeds) | best measured | regret | median T error (K) |',
           ('|---' if dated else '') + '|---|---|---|---|---:|---:|---|---:|---:|---|---:|---:|']
  for plan, result in pairs:
    choice, seconds = _choice(result)
    spread = f" ({min(seconds):.2f}–{max(seconds):.2f})" if len(seconds) > 1 else ''
    target = plan['target']
    lines.append(
        (f"| {plan['created'][:10]} " if dated else '')
        + f"| {plan['network']} {plan['image_size']}² | {setting(plan)} | {target['kind']} "
        f"{target['value']:g} | {_batch_model(plan)} | {len(plan['candidates'])} "
        f"({len(result['rows'])} trained × "
        f"{result['seeds']} seed{'s' if result['seeds'] > 1 else ''}) | "
        f"{plan['planning_s']:.0f} s | {choice['label']} | "
        f"{choice['predicted_T'][0]:.2f} s | {_cell(choice['measured_T'], '.2f')} s{spread} | "
        f"{result['best_measured']} | {_cell(result['regret'], '.2f')}{_interval(result)} | "
        f"{_cell(result['median_T_error'], '.0%')} ({_cell(result['median_K_error'], '.0%')}) |")
  return '\n'.join(lines)


def _batch_model(plan: dict) -> str:
  """What the plan's K(B) rests on: two serial runs (b and the largest batch), the run at b
  and one at the largest batch stopped short (a bound), the noise scale read along one, or
  neither (perfect scaling)."""
  how, serial = plan['serial'].get('B_noise_how'), plan['serial']
  if how == 'fitted':
    return f"runs at b = {serial['batch']} and {serial['large']['batch']}"
  if how == 'bounded':
    return (f"run at b = {serial['batch']}; at {serial['large']['batch']} short of the "
            f"target ({serial['large']['K']:.0f} steps: a bound)")
  return 'perfect scaling' if plan['serial']['B_noise'][0] is None else 'noise scale'


def family_table(pairs: list) -> str:
  """Per (plan, regret) pair, every trained row beside synchronous SGD with BN over all
  devices — BN per device, Local SGD, Downpour — and the best synchronous one: its K and T
  predicted (with the range) and measured (the seeds' mean), and whether the plan could
  choose it."""
  lines = ['| network | K(B) from | row | family | K predicted (range) | K measured | K error | '
           'T predicted | T measured | may be chosen |',
           '|---|---|---|---|---:|---:|---:|---:|---:|---|']
  for plan, result in pairs:
    rows = {r['label']: r for r in plan['candidates']}
    for r in result['rows']:
      row = rows[r['label']]
      k, t = r['predicted_K'], r['predicted_T']
      lines.append(
          f"| {plan['network']} {plan['image_size']}² | {_batch_model(plan)} | "
          f"{r['label']}{' (choice)' if r['choice'] else ''} "
          f"| {row.get('family', 'sync')} | {k[0]:.0f} ({k[1]:.0f}–{k[2]:.0f}) | "
          f"{_cell(r['measured_K'], '.0f')} | {_cell(r['K_error'], '.0%')} | {t[0]:.2f} s | "
          f"{_cell(r['measured_T'], '.2f')} s | {'yes' if _may_choose(row) else 'no'} |")
  return '\n'.join(lines)


def _seeds_of(plan: dict) -> str:
  """', the mean of seeds s0, s1, …: K0, K1, …' where the plan ran several serial seeds."""
  seeds = plan['serial'].get('seeds')
  if not seeds:
    return ''
  from jaxpar.plan import planner, probe
  first = steps_model.reached(plan['serial']['curve'], probe.Target(**plan['target']).threshold)
  ks = [first] + [s['K'] for s in planner.counted(seeds)]  # less those the clock stopped
  return (f", the mean of {len(ks)} seeds: " + ', '.join(f'{k:.0f}' for k in ks))


def _budget(plan: dict) -> str:
  return (f"budget {plan['budget_s']:g} s" if plan['budget_s'] else
          f"bounded by steps, {len(plan['serial'].get('seeds', [])) + 1} serial seeds")


def _interval(result: dict) -> str:
  """' (low–high)': the regret's interval over its seeds (`regret_interval`), where known;
  then ', level (low–high)' where the choice ÷ the best measured row's interval holds 1
  (`level_interval`)."""
  interval = result.get('regret_interval')
  if interval is None and result.get('seeds', 1) > 1:  # results written before it was kept
    interval = regret_interval(result)
  text = f' ({interval[0]:.2f}–{interval[1]:.2f})' if interval else ''
  level = (result['level_interval'] if 'level_interval' in result
           else level_interval(result) if result.get('seeds', 1) > 1 else None)
  if level and level[0] <= 1 <= level[1]:
    text += f', level ({level[0]:.2f}–{level[1]:.2f})'
  second = result.get('runner_up_interval')
  if second and second[0] <= 1 <= second[1]:
    text += f", level with {result['runner_up']} ({second[0]:.2f}–{second[1]:.2f})"
  return text


def _b_noise(reading: list) -> str:
  """The plan's B_noise [median, low, high]; None (∞ in plans written before): no reading."""
  if reading[0] is None or not math.isfinite(reading[0]):
    return 'B_noise not estimable (perfect scaling assumed)'
  return f'B_noise {reading[0]:.0f} ({reading[1]:.0f}–{reading[2]:.0f})'


def _steps(run: dict) -> str:
  from jaxpar.plan import planner
  seeds = planner.said_seeds(run)
  return (f"{run['K']:.0f} steps{seeds}" if run['stopped'] == 'reached'
          else f"at least {run['K']:.0f} steps{seeds} (stopped: {run['stopped']})")


def report(plan: dict, result: dict) -> str:
  """The plan's ranked table and its end-to-end check, as one Markdown page."""
  from jaxpar.plan import planner, rank
  m, v = plan['machine'], plan['versions']
  lines = [f"# Plan: {plan['network']} at {plan['image_size']}², {setting(plan)}", '',
           f"Target: {plan['target']['kind']} {plan['target']['value']:g}. Plan made "
           f"{plan['created']} on {m['cores']} cores of {m['cpu'] or m['system']} "
           f"({m['memory_bytes'] / 2**30:.0f} GiB), Python {m['python']}, jax {v['jax']}, "
           f"flax {v['flax']}, in {plan['planning_s']:.0f} s ({_budget(plan)}): "
           f"`{plan.get('command', 'python -m jaxpar.plan')}`.", '',
           f"Serial run at b = {plan['serial']['batch']}: K_b = {plan['serial']['K']:.0f} steps "
           f"({plan['serial']['K_how']}{_seeds_of(plan)}), {_b_noise(plan['serial']['B_noise'])} "
           'near the target.', '']
  large = plan['serial'].get('large')
  if large:
    lines += [f"Serial run at B = {large['batch']}: {_steps(large)}; "
              + ('the batch model through it and K_b (B_noise fitted).' if plan['serial'].get(
                  'B_noise_how') == 'fitted' else 'short of the target: the noise scale kept.'),
              '']
  names = {'bn_device': 'BatchNorm per device, sync-join at B = {batch}',
           'local_sgd': 'Local SGD at τ = {period}, B = {batch}',
           'async': 'Downpour, simulated at staleness {staleness}'}
  runs = rank.each_run(plan.get('methods', {}))
  lines += ["The methods' runs: " + '; '.join(
      f'{names[family].format(**run)}: {_steps(run)}' for family, run in runs) + '.',
      ''] if runs else []
  lines += ['## Ranked by predicted time to the target', '', planner.table(plan), '']
  lines += [f"- not ranked: {e['method']}: {e['reason']}" for e in plan['excluded']]
  _, seconds = _choice(result)
  spread = (f"; the choice's seeds differ by {math.log(max(seconds) / min(seconds)):.0%}"
            if len(seconds) > 1 else '')
  lines += ['', '## Trained to the target', '',
            f"{result['seeds']} seeds each, {result['created']}: `{result['command']}`.", '',
            table(result), '',
            f"Regret of the plan's choice: {_cell(result['regret'], '.3f')} (best measured: "
            f"{result['best_measured']}); median |log(predicted/measured)| of T "
            f"{_cell(result['median_T_error'], '.0%')}, of K {_cell(result['median_K_error'], '.0%')}"
            f"{spread}."]
  if plan.get('choice_reason'):
    lines += ['', f"The tie rule: {plan['choice_reason']}."]
  return '\n'.join(lines)
