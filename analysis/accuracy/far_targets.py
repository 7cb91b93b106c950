"""Far targets: is the plan's extrapolated K right when its serial run stops far short?

  python -m analysis.accuracy.far_targets --config configs/squeezenet.py \\
      --config.image_size=16 --config.batch_norm=True --target_loss 0.1 --seeds 2 \\
      --out far_squeezenet16.json

For each seed, the plan's serial run (`probe.serial_run`: one device at per_device_batch, the
config's rate constant after warm-up, the target's metric as the plan measures it) trains
until the far target; K is the step it is reached. Then only the curve's first K/--reach steps
are kept — what a plan stopped by its budget or `max_steps` would have seen — and the plan's
extrapolation (`steps_model.extrapolate`) predicts K from them, and its own check on them
(`steps_model.backtest`) says whether to trust that. Nothing after K/--reach enters either.

The plan's promise (docs/plan.md): an extrapolated K within 25 % of the measured one, or the
plan says the target is beyond what it can predict. Each run is judged so: 'within'
(|log(predicted/measured)| ≤ 25 %), 'flagged' (beyond 25 %, and the check said not to trust
it), or 'missed' (beyond 25 % and trusted: the promise broken).
"""
import datetime
import json
import math
import os
import shlex
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxpar.perfmodel import steps_model  # noqa: E402
from jaxpar.plan import probe  # noqa: E402

FLAGS = flags.FLAGS
TOLERANCE = 0.25


def define_flags():
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].', lock_config=False)
  flags.DEFINE_float('target_loss', 0.1, 'The far training-set loss.')
  flags.DEFINE_integer('seeds', 2, 'Serial runs, at seeds config.seed, +1, ...')
  flags.DEFINE_float('reach', 5.0, 'The serial run is cut at K/reach: the target is reach × '
                     'beyond what the plan saw.')
  flags.DEFINE_integer('max_steps', 6000, 'Steps at most of each run.')
  flags.DEFINE_string('out', None, 'The JSON file to write.')


def judge(curve: list, k: float, threshold: float, reach: float) -> dict:
  """The extrapolation from `curve`'s first k/reach steps against the measured `k`."""
  seen = [(s, m) for s, m in curve if s <= k / reach]
  check = steps_model.backtest(seen, threshold)  # its 'K': the extrapolation from `seen`
  predicted = check['K']
  error = abs(math.log(predicted / k)) if predicted else None
  verdict = ('within' if error is not None and error <= TOLERANCE else
             'flagged' if not check['trusted'] else 'missed')
  return {'seen_steps': seen[-1][0] if seen else 0, 'seen_points': len(seen),
          'predicted_K': predicted, 'error': error, 'backtest': check, 'verdict': verdict}


def serial_seeds(cfg, target: probe.Target, seeds: int, max_steps: int):
  """The plan's serial run (`probe.serial_run`, without B_noise) at seeds config.seed, +1, …:
  yields (seed, its result), each as the plan measures it (`plan.eval_every`,
  `plan.eval_share`)."""
  from jaxpar import validation
  from jaxpar.data import sources
  from jaxpar import config as config_lib
  source = sources.open_source(cfg.dataset)
  for i in range(seeds):
    one = config_lib.with_overrides(cfg, {**probe.one_device_overrides(cfg, cfg.per_device_batch),
                                          'total_steps': max_steps, 'seed': cfg.seed + i})
    validation.validate(one)
    yield one.seed, probe.serial_run(one, source, target, eval_every=cfg.plan.eval_every,
                                     max_steps=max_steps, deadline=math.inf, noise_batches=0,
                                     log=lambda line: print(line, file=sys.stderr, flush=True),
                                     eval_share=cfg.plan.eval_share, time_saves=False)


def run(cfg, target: probe.Target, seeds: int, reach: float, max_steps: int) -> list:
  out = []
  for seed, serial in serial_seeds(cfg, target, seeds, max_steps):
    row = {'seed': seed, 'K': serial['K'], 'stopped': serial['stopped'],
           'curve': serial['curve'], 'metric': serial['metric']}
    if serial['K'] is not None:
      row.update(judge(serial['curve'], serial['K'], target.threshold, reach))
    out.append(row)
    print(f"seed {seed}: K = {serial['K']}; " + (
        f"from the first {row['seen_steps']} steps: {row['predicted_K']} ({row['verdict']})"
        if serial['K'] else serial['stopped']), file=sys.stderr, flush=True)
  return out


def table(results: list) -> str:
  """One row per network and seed (Markdown)."""
  lines = ['| network | target | seed | K measured | seen (steps, evaluations) | K extrapolated '
           '| error | its own check | verdict |', '|---|---|---:|---:|---|---:|---:|---|---|']
  for result in results:
    for r in result['runs']:
      if r['K'] is None:
        lines.append(f"| {result['network']} {result['image_size']}² | loss "
                     f"{result['target']['value']:g} | {r['seed']} | not reached ({r['stopped']}) "
                     '| | | | | |')
        continue
      check = r['backtest']
      name = f"{result['network']}{' BN' if result.get('batch_norm') and result['network'] != 'resnet34' else ''}"
      own = ('trusted' if check['trusted'] else 'not trusted') + (
          f" ({check['error']:.0%} off at {check['ratio']:.1f}×)" if check['error'] is not None
          else ' (too few points)')
      predicted = (('—' if not r['predicted_K'] else f"{r['predicted_K']:.0f}"
                    if r['predicted_K'] < 1e6 else f"{r['predicted_K']:.1e}"))
      error = ('—' if r['error'] is None else f"{r['error']:.0%}" if r['error'] < 5
               else f"{math.exp(r['error']):.0e}×")
      lines.append(f"| {name} {result['image_size']}² | loss "
                   f"{result['target']['value']:g} | {r['seed']} | {r['K']:.0f} | "
                   f"{r['seen_steps']}, {r['seen_points'] - 1} | {predicted} | {error} | {own} | "
                   f"{r['verdict']} |")
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  cfg = FLAGS.config
  target = probe.Target('loss', FLAGS.target_loss)
  runs = run(cfg, target, FLAGS.seeds, FLAGS.reach, FLAGS.max_steps)
  write(FLAGS.out, record('analysis.accuracy.far_targets', cfg, target)
        | {'reach': FLAGS.reach, 'tolerance': TOLERANCE, 'runs': runs}, table)


def record(tool: str, cfg, target: probe.Target) -> dict:
  """What a serial-run check's JSON opens with: the tool, its command, when, where, what."""
  return {'tool': tool, 'created': datetime.datetime.now().isoformat(timespec='seconds'),
          'command': f'python -m {tool} ' + shlex.join(sys.argv[1:]),
          'machine': probe.machine(), 'versions': probe.versions(),
          'network': cfg.model, 'image_size': cfg.image_size,
          'batch_norm': bool(cfg.batch_norm), 'batch': cfg.per_device_batch,
          'target': target.to_dict()}


def write(path: str, result: dict, table_of) -> None:
  """`result` as JSON at `path`, and its table printed."""
  with open(path, 'w') as f:
    json.dump(result, f, indent=1)
  print(table_of([result]))


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['config', 'out'])
  app.run(main)
