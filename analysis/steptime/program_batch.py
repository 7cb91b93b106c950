"""Whether a program's time beside its gradients is per weight, as the plan's phase 3b reads
it: each of a plan's multi-device programs, its real step at two device batches less t_grad
at each, and its step with the gradients stood in for — timed in rounds, in turn, inside one
launch of the plan's processes.

  launch/local.sh 2 --module analysis.steptime.program_batch --workdir /tmp/pb \
      --config configs/thesis.py:net=resnet34,batch=16,workers=2 --config.image_size=32 \
      --plan plan.json --out program_batch.json

Phase 3b (`jaxpar.plan.planner.strategy_work`) times each program as its real step at a
small device batch b₀ less t_grad(b₀, N), and its rows at their own batches take that
program's time (`rank.program_step`): the exchange, the packing, the update and the
gradients' writes into a server's buffers scale with the weights, not the examples. Here,
for the plan's programs (one row of each `work_key`, BatchNorm per device): per round,

  program(b) = step(b) − t_grad(b, N)      at b = b₀ and at the plan's device batch,

and the stand-in program (`probe.update_call`, the gradients the weights × a small
factor), which the plan read before. A round times every call once, in turn
(`planner.in_rounds`, as phase 3b does); the medians over rounds, and the rounds
themselves, are written (process 0) as {'rows': [{'program', 'batches', 'program_s':
{b: s}, 'rounds_s': ..., 'stand_in_s'}], 't_grad_s': {b: s}, ...}.
"""
import dataclasses
import datetime
import json
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, "The plan's configs/*.py file[:arg] (with "
                                  'its --config.* overrides).', lock_config=False)
  flags.DEFINE_string('plan', None, 'The plan (python -m jaxpar.plan --out) whose programs.')
  flags.DEFINE_integer('rounds', 5, 'Rounds, every call timed once a round.')
  flags.DEFINE_integer('calls', 8, 'Calls a timing (their median), after one.')
  flags.DEFINE_string('out', None, 'The JSON file process 0 writes.')


def label(c) -> str:
  return f'{c.server} N={c.devices}' + (f' τ={c.period}' if c.period else '')


def summarize(samples: dict, programs: list, batches: list) -> list:
  """A row per program (candidates, one per `work_key`) from the rounds' samples (name: a
  time a step, one a round): per round its step at each batch less that round's t_grad at
  the batch on as many devices, the medians; the stand-in program's median."""
  rows = []
  for c in programs:
    name = label(c)
    rounds = {batch: [s - g for s, g in zip(samples[f'{name} b={batch}'],
                                            samples[f't_grad b={batch} N={c.devices}'])]
              for batch in batches}
    rows.append({'program': name, 'server': c.server, 'devices': c.devices,
                 'period': c.period, 'batches': batches,
                 'program_s': {batch: float(np.median(r)) for batch, r in rounds.items()},
                 'rounds_s': rounds, 'stand_in_s': float(np.median(samples[f'{name} stand-in'])),
                 'step_s': {batch: float(np.median(samples[f'{name} b={batch}']))
                            for batch in batches}})
  return rows


def main(argv):
  import jax

  from analysis.steptime.measure import machine, versions
  from jaxpar import validation
  from jaxpar.config import with_overrides
  from jaxpar.data import sources
  from jaxpar.plan import candidates, planner, probe
  del argv
  cfg = planner.prepare(FLAGS.config)
  with open(FLAGS.plan) as f:
    plan = json.load(f)
  b = cfg.per_device_batch
  one = with_overrides(cfg, {**probe.one_device_overrides(cfg, b), 'total_steps': 10**6})
  source = sources.open_source(cfg.dataset)
  meta = source.meta
  variables = probe.initial_variables(one, meta)
  fields = {f.name for f in dataclasses.fields(candidates.Candidate)}
  programs = {}
  for row in plan['candidates']:
    c = candidates.Candidate(**{k: row[k] for k in fields if k in row})
    if c.devices > 1 and c.family != 'async':
      programs.setdefault(planner.work_key(c), c)
  batches = sorted({planner.PROGRAM_BATCH, b})
  calls = {}  # name: (call, steps a call)
  devices = sorted({key[1] for key in programs})
  for n in devices:
    for batch in batches:
      calls[f't_grad b={batch} N={n}'] = (probe.gradient_call(
          with_overrides(one, {'per_device_batch': batch}), meta, batch,
          max(n // jax.process_count(), 1), variables), 1)
  for key, c in programs.items():
    steps = max(c.period, 1)
    name = label(c)
    for batch in batches:
      cfg_c = with_overrides(one, planner.program_overrides(c, batch))
      validation.validate(cfg_c)
      calls[f'{name} b={batch}'] = (probe.update_call(cfg_c, meta, variables, repeats=steps,
                                                      gradients=True)[1], steps)
    cfg_c = with_overrides(one, planner.program_overrides(c, b))
    validation.validate(cfg_c)
    calls[f'{name} stand-in'] = (probe.update_call(cfg_c, meta, variables, repeats=steps)[1],
                                 steps)
  samples = planner.in_rounds(calls, FLAGS.rounds, lambda steps: FLAGS.calls, 'program_batch')
  if jax.process_index() != 0:
    return
  rows = summarize(samples, list(programs.values()), batches)
  result = {'tool': 'analysis.steptime.program_batch',
            'created': datetime.datetime.now().isoformat(timespec='seconds'),
            'machine': machine(), 'versions': versions(), 'network': cfg.model,
            'image_size': cfg.image_size, 'processes': jax.process_count(),
            'plan_created': plan.get('created'), 'rounds': FLAGS.rounds,
            't_grad_s': {name: float(np.median(v)) for name, v in samples.items()
                         if name.startswith('t_grad')},
            'samples_s': dict(samples), 'rows': rows}
  for r in rows:
    print(f"{r['program']}: " + ', '.join(f'b={batch} {s * 1e3:.1f} ms'
                                          for batch, s in r['program_s'].items())
          + f"; with its gradients stood in for {r['stand_in_s'] * 1e3:.1f} ms", flush=True)
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['config', 'plan'])
  app.run(main)
