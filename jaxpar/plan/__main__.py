"""Which scheme, server, number of devices and BatchNorm grouping reach a target soonest here.

  python -m jaxpar.plan --config configs/squeezenet.py --config.image_size=16 \\
      --target_loss 0.3 [--budget_s 600] [--out plan.json]

Measures on this process's devices (`jaxpar.plan.planner`), prints every candidate ranked
by predicted time to the target with its range, the methods not ranked and why, and
writes the plan. Across processes it runs in every one, as training would, and process 0
prints and writes:

  launch/local.sh 2 --module jaxpar.plan --workdir LOGS --config configs/squeezenet.py \
      --config.image_size=16 '--config.mesh.shape=(2,)' --target_loss 0.5 --out plan.json

`python -m jaxpar.train --config ... --config.scheme=auto --config.plan.file=plan.json`
trains with its choice (launched as the plan was; `scheme=auto` alone plans first, in one
process).
"""
import json
import os
import shlex
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from jaxpar import config as config_lib  # noqa: E402
from jaxpar import compile_cache, metrics, multihost  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].',
                                          lock_config=False)
_LOSS = flags.DEFINE_float('target_loss', None, 'The training-set loss to reach (config.plan.'
                           'target_loss).')
_ACCURACY = flags.DEFINE_float('target_accuracy', None, 'The test top-1 to reach, 0-1 '
                               '(config.plan.target_accuracy).')
_BUDGET = flags.DEFINE_float('budget_s', None, 'Seconds to measure for (config.plan.budget_s; '
                             '0: bounded by steps).')
_OUT = flags.DEFINE_string('out', 'plan.json', 'The plan to write.')


def main(argv):
  from jaxpar.plan import planner
  metrics.quiet_libraries()
  logging.set_verbosity(logging.WARNING)  # the plan prints its own progress
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  cfg = _CONFIG.value
  for flag, field in ((_LOSS, 'target_loss'), (_ACCURACY, 'target_accuracy'),
                      (_BUDGET, 'budget_s')):
    if flag.value is not None:
      cfg.plan[field] = flag.value
  try:
    # As `jaxpar.train` does: a plan made again (or its timed steps, compiled again) loads
    # the programs it compiled before (`config.compilation_cache`).
    compile_cache.apply(cfg.compilation_cache, multihost.process_count_of(**cfg.distributed))
    plan = planner.make(planner.prepare(cfg),
                        log=lambda line: print(line, file=sys.stderr, flush=True))
  except config_lib.ConfigError as e:
    print(f'jaxpar.plan: {e}', file=sys.stderr)
    sys.exit(2)
  except config_lib.RunError as e:
    print(f'{e}', file=sys.stderr)
    sys.exit(1)
  import jax
  if jax.process_index():  # process 0 prints and writes
    return
  plan['command'] = 'python -m jaxpar.plan ' + shlex.join(sys.argv[1:])
  with open(_OUT.value, 'w') as f:
    json.dump(plan, f, indent=1)
  print(f"{plan['network']} {plan['image_size']}², {plan['setting']}, target "
        f"{plan['target']['kind']} {plan['target']['value']:g}:")
  print(planner.table(plan))
  print()
  for e in plan['excluded']:
    print(f"not ranked: {e['method']}: {e['reason']}")
  c = plan['choice']
  error = plan['step_prediction_error']
  saves = plan.get('saves')
  saved = (f" + {c['saves']} saves × {saves['seconds']:.2f} s (one every {saves['every']} "
           f"steps)" if saves and c.get('saves') else '')
  print(f"\nchoice: {c['label']} — {c['K'][0]:.0f} steps × {c['t_step'][0] * 1e3:.2f} ms{saved} "
        f"= {c['T'][0]:.2f} s to the target ({c['T'][1]:.2f}–{c['T'][2]:.2f} s); planned in "
        f"{plan['planning_s']:.0f} s ({plan['planning_per_training']:.1f}× the training it "
        f"plans)" + (f"; step-time predictions off by {error['median_abs_log']:.0%} (median, "
           f"{error['measured']} measured)" if error['median_abs_log'] is not None else ''))
  check = plan['serial'].get('K_backtest')
  if check:
    print(f"K extrapolated {check['ratio']:.1f}× beyond the serial run: "
          + ('trusted' if check['trusted'] else 'the target is beyond what the plan can predict')
          + f" ({check['why']})")
  if plan.get('choice_reason'):
    print(f"tie rule: {plan['choice_reason']}")
  metric = plan['serial'].get('metric')
  if metric:
    print(f"the target's metric: the first {metric['examples']} of {metric['of']} examples "
          f"every {metric['every']} steps, standard error {metric['standard_error'] or 0:.3g} "
          f"at the last; evaluations {metric['share'] or 0:.0%} of the serial run's steps"
          + (f" (budget {metric['budget']:.0%})" if metric.get('budget') else ''))
  print(f'plan written to {_OUT.value}; train with it: python -m jaxpar.train --config ... '
        f'--config.scheme=auto --config.plan.file={_OUT.value} --workdir ...')
  logging.flush()


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main)
