"""What measuring the target's metric costs the plan's serial run: at most `plan.eval_share`
of its training (docs/plan.md, the metric's cost).

  python -m analysis.accuracy.metric_share --config configs/squeezenet.py \\
      --config.image_size=32 --config.batch_norm=True --config.plan.target_loss=0.5 \\
      --seeds 2 --out squeezenet32.json

For each seed, the plan's serial run (`far_targets.serial_seeds`: one device at
per_device_batch, the config's rate constant after warm-up, `plan.eval_every`,
`plan.eval_share`) trains until the target; its `metric` record says what the readings read
(examples of the split, the spacing), what a batch and a reading cost, any confirmation, and
the share of the training they all took: judged against the budget. Run under `taskset -c
0` it is the serial run of a plan across 2 processes on 2 cores (process 0's core).
"""
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from analysis.accuracy import far_targets  # noqa: E402
from jaxpar.plan import planner, probe  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].', lock_config=False)
  flags.DEFINE_integer('seeds', 2, 'Serial runs, at seeds config.seed, +1, ...')
  flags.DEFINE_string('out', None, 'The JSON file to write.')


def run(cfg, target: probe.Target, seeds: int) -> list:
  out = []
  for seed, serial in far_targets.serial_seeds(cfg, target, seeds, cfg.plan.max_steps):
    metric = serial['metric']
    out.append({'seed': seed, 'K': serial['K'], 'stopped': serial['stopped'],
                'steps': serial['curve'][-1][0], 'curve': serial['curve'],
                'step_seconds': sum(serial['step_seconds']) / len(serial['step_seconds']),
                'metric': metric, 'within': metric['share'] is not None
                and metric['share'] <= metric['budget']})
    print(f"seed {seed}: K = {serial['K']}; the metric's share {metric['share'] or 0:.1%} "
          f"(budget {metric['budget']:.0%})", file=sys.stderr, flush=True)
  return out


def table(results: list) -> str:
  """One row per network and seed (Markdown)."""
  lines = ['| network | target | seed | K | steps run | a step | readings: examples, every '
           '| a reading | confirmed on | the metric\'s share | budget | within | measured |',
           '|---|---|---:|---:|---:|---:|---|---:|---|---:|---:|---|---|']
  for result in results:
    bn = ' BN' if result['batch_norm'] and result['network'] != 'resnet34' else ''
    name = f"{result['network']}{bn} {result['image_size']}²"
    measured = (f"{result['created'][:10]}, {result['machine']['cpu']}, "
                f"{result['cores']} core{'s' if result['cores'] > 1 else ''}")
    for r in result['runs']:
      m = r['metric']
      confirmed = ', '.join(f"{c['examples']} (step {c['step']})" for c in m['confirmed']) or '—'
      k = f"{r['K']:.0f}" if r['K'] is not None else f"not reached ({r['stopped']})"
      lines.append(f"| {name} | {result['target']['kind']} {result['target']['value']:g} | "
                   f"{r['seed']} | {k} | {r['steps']} | {r['step_seconds'] * 1e3:.0f} ms | "
                   f"{m['examples']} of {m['of']}, {m['every']} | {m['eval_seconds']:.2f} s | "
                   f"{confirmed} | {m['share']:.1%} | {m['budget']:.0%} | "
                   f"{'yes' if r['within'] else '**no**'} | {measured} |")
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  cfg = FLAGS.config
  target = planner.check(cfg)
  runs = run(cfg, target, FLAGS.seeds)
  far_targets.write(FLAGS.out, far_targets.record('analysis.accuracy.metric_share', cfg, target)
                    | {'cores': len(os.sched_getaffinity(0)), 'runs': runs}, table)


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['config', 'out'])
  app.run(main)
