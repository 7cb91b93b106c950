"""Whole train steps under different convolution choices, side by side: which of the choices
of the table of isolated convolutions (`conv_bench`, jaxpar/models/conv_choices.json) make a
step faster — what `conv_impl='auto'` takes from it (jaxpar/models/conv_auto.json).

  python -m analysis.benchmarks.conv_step_ab --config configs/thesis.py:net=vgg16e,\\
      scheme=sync-split,server=allreduce,workers=1,batch=32 --config.dtype=float32 --out ab.json
  python -m analysis.benchmarks.conv_step_ab --from_json=analysis/report/conv/step_ab/*.json \\
      --choices_out=jaxpar/models/conv_auto.json

The variants of one config's step (one device), each compiled once and then run alternately,
one step of each per round, so all see the same machine state, each round starting with the
next variant (`alternate.in_turn`: none always runs first or after the same one):
- `rule`: `auto`'s rule without a table (oneDNN's convolution where `conv.onednn_in_auto`;
  else taps on small output maps, XLA's convolution above);
- `auto`: `conv_impl='auto'` as committed (the rule, and `conv_auto.json`'s choices);
- `previous`: the step before oneDNN's convolutions and the fast max-pool gradient
  (`conv.onednn_in_auto` off: `auto` where oneDNN cannot run; flax's max-pool,
  `max_pool(..., forward='flax')`);
- `pool_reduce_window`, `pool_full`: `auto`'s program with the max-pool's formulation before,
  XLA's `reduce_window` for the forward pass (`forward='reduce_window'`), the gradient's taps
  at full size instead of per stride phase (`gradient='full'`);
- `onednn`: oneDNN's convolution everywhere it computes (`conv_impl='onednn'`, any dtype);
- `unshared`: `auto`'s program, every oneDNN call with all OpenMP threads, however many
  devices the process has (`onednn.share_threads(False)`; by default they share them,
  jaxpar/models/onednn.py);
- `gated`: `auto`'s program with at most T / team oneDNN calls at once, the others waiting
  (`onednn.gate(True)`; by default as many as XLA's threads start, jaxpar/models/onednn.py);
- `xla`: XLA's convolution everywhere;
- `measured`: the isolated table's fastest lowering for every geometry it has;
- `measured:K` for each lowering K the table picks in this step where the rule does not: the
  table's choice only where it is K, the rule's elsewhere — which kinds of choice help the
  step and which hurt it.
Per variant: the median step (min, max, noise = (max − min)/median), its ratio to `rule`,
compile time, XLA's temporaries, and how many convolutions each lowering computes.

`auto`'s table (`verified`): a geometry's choice of kind K is kept where the `measured:K`
variant of every run whose step has that geometry was at least `--faster` below `rule`
(one run each: the noise is in the table beside it). Nothing here is asserted in tests.
"""
import collections
import datetime
import functools
import json
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from analysis.benchmarks.alternate import host_speed, in_turn  # noqa: E402
from analysis.benchmarks.bench import Runner  # noqa: E402
from analysis.steptime.measure import machine, versions  # noqa: E402
from jaxpar import build  # noqa: E402
from jaxpar import config as config_lib  # noqa: E402
from jaxpar.data import sources  # noqa: E402
from jaxpar.models import conv, onednn, pooling  # noqa: E402
from jaxpar.step import make_train_step, to_global  # noqa: E402

FLAGS = flags.FLAGS
VARIANTS = ('rule', 'auto', 'previous', 'pool_reduce_window', 'pool_full', 'onednn', 'unshared',
            'gated', 'xla', 'measured', 'measured:*')
FASTER = 0.02  # `verified`: a kind's variant must be at least this much below `rule`


class _Choices:
  """While active: `conv.measured_choices()` and `conv.auto_choices()` answer the tables
  given (None: the committed one), and every geometry a traced step asks `conv.choose`
  about is recorded with the lowering it got."""

  def __init__(self, measured: dict | None = None, auto: dict | None = None,
               onednn: bool = True):
    self.measured, self.auto, self.used = measured, auto, collections.Counter()
    self.onednn = onednn

  def __enter__(self):
    self._saved = (conv.measured_choices, conv.auto_choices, conv.choose,
                   conv.onednn_in_auto)
    if self.measured is not None:
      conv.measured_choices = lambda: self.measured
    if self.auto is not None:
      conv.auto_choices = lambda: self.auto
    if not self.onednn:
      conv.onednn_in_auto = lambda dtype=None: False
    choose = self._saved[2]

    def recording(impl, lhs_shape, rhs_shape, window_strides, padding, backend=None, **kw):
      lowering = choose(impl, lhs_shape, rhs_shape, window_strides, padding, backend, **kw)
      self.used[(conv.geometry_key(lhs_shape, rhs_shape, window_strides, padding),
                 lowering)] += 1
      return lowering
    conv.choose = recording
    return self

  def __exit__(self, *exc):
    (conv.measured_choices, conv.auto_choices, conv.choose,
     conv.onednn_in_auto) = self._saved


def _runner(cfg, name: str, impl: str, source, batch, mesh, share: bool = True,
            gate: bool = False, pool: dict | None = None, **tables):
  """`pool`: `pooling.max_pool`'s formulation (its keyword arguments); the step before
  oneDNN (`onednn=False` in `tables`) had flax's max-pool too."""
  cfg = cfg.copy_and_resolve_references()
  cfg.conv_impl = impl
  model, strategy, tx, state = build.for_timing(cfg, source.num_classes, source.channels, mesh)
  pool = dict(pool or {}, **({} if tables.get('onednn', True) else {'forward': 'flax'}))
  model = model.clone(pool=functools.partial(pooling.max_pool, **pool))
  with _Choices(**tables) as recorded:  # the step's lowering only (not the initialisation's)
    runner = Runner(name, make_train_step(model, tx, mesh, strategy), state, batch,
                    jax.random.key(0), mesh.size)
  runner.used, runner.share, runner.gate = recorded.used, share, gate
  return runner


def _run(runner, timed: bool = True):
  onednn.share_threads(runner.share)
  onednn.gate(runner.gate)
  try:
    runner(timed=timed)
  finally:
    onednn.share_threads(True)
    onednn.gate(False)


def ab(cfg, steps: int, warmup: int, wanted=VARIANTS) -> dict:
  mesh = build.mesh(cfg)
  speed = host_speed()  # before anything compiles or runs
  source = sources.open_source(cfg.dataset)
  global_batch = config_lib.global_batch(cfg)
  rng = np.random.default_rng(0)
  batch = to_global(mesh, {
      'image': rng.normal(size=(global_batch, cfg.image_size, cfg.image_size,
                                source.channels)).astype(np.float32),
      'label': rng.integers(0, source.num_classes, global_batch).astype(np.int32)})
  first = _runner(cfg, 'rule', 'auto', source, batch, mesh, auto={})
  rule = {key: lowering for key, lowering in first.used}
  table = conv.measured_choices()
  differing = {k: table[k] for k in rule if k in table and table[k] != rule[k]}
  variants = [('auto', 'auto', {}), ('previous', 'auto', {'onednn': False}),
              ('pool_reduce_window', 'auto', {'pool': {'forward': 'reduce_window'}}),
              ('pool_full', 'auto', {'pool': {'gradient': 'full'}}),
              ('onednn', 'onednn', {}), ('unshared', 'auto', {'share': False}),
              ('gated', 'auto', {'gate': True}), ('xla', 'xla', {}),
              ('measured', 'measured', {'measured': table})]
  variants += [(f'measured:{kind}', 'measured',
                {'measured': {k: v for k, v in differing.items() if v == kind}})
               for kind in sorted(set(differing.values()))]
  variants = [v for v in variants if v[0] in wanted or (
      v[0].startswith('measured:') and 'measured:*' in wanted)]
  runners = [first] + [_runner(cfg, name, impl, source, batch, mesh, **tables)
                       for name, impl, tables in variants]
  for _ in range(warmup):
    for r in runners:
      _run(r, timed=False)
  for i in range(steps):
    for r in in_turn(runners, i):  # each round starts with the next variant
      _run(r)
    print(f'\rround {i + 1}/{steps}', end='', file=sys.stderr, flush=True)
  print(file=sys.stderr)
  base = float(np.median(first.times))
  rows = []
  for r in runners:
    median = float(np.median(r.times))
    lowerings = collections.Counter()
    for (_, lowering), count in r.used.items():
      lowerings[lowering] += count
    rows.append({'variant': r.name, 'median_s': median, 'min_s': min(r.times),
                 'max_s': max(r.times), 'noise': (max(r.times) - min(r.times)) / median,
                 'over_rule': median / base, 'compile_s': r.compile_time,
                 'temp_bytes_per_device': r.temp_bytes, 'samples': r.times,
                 'convolutions_by_lowering': dict(lowerings)})
  return {'tool': 'analysis.benchmarks.conv_step_ab',
          'created': datetime.datetime.now().isoformat(timespec='seconds'),
          'machine': machine(), 'host_speed': speed, 'versions': versions(),
          'command': ' '.join(['python -m analysis.benchmarks.conv_step_ab'] + sys.argv[1:]),
          'network': cfg.model, 'image_size': cfg.image_size, 'dtype': cfg.dtype,
          'global_batch': global_batch, 'geometries': len(rule),
          'table_differs_from_rule': differing, 'rows': rows}


def verified(results: list, faster: float = FASTER) -> dict:
  """{geometry: lowering} of the isolated table's choices that whole steps confirmed: kind K
  for a geometry is kept where, in every run whose step has it, `measured:K` ran at least
  `faster` below `rule`."""
  kept, dropped = {}, set()
  for result in results:
    ratio = {row['variant']: row['over_rule'] for row in result['rows']}
    for key, kind in result['table_differs_from_rule'].items():
      if ratio.get(f'measured:{kind}', 1.0) <= 1.0 - faster:
        kept[key] = kind
      else:
        dropped.add(key)
  return {k: v for k, v in sorted(kept.items()) if k not in dropped}


def write_choices(results: list, path: str, faster: float = FASTER) -> None:
  conv.write_table(
      path, 'analysis.benchmarks.conv_step_ab --choices_out', results,
      ('created', 'machine', 'versions', 'network', 'image_size', 'global_batch'),
      verified(results, faster), faster=faster, dtypes=sorted({r['dtype'] for r in results}))


def table(results: list) -> str:
  """One line per network, size and variant: the step (median; and the mean, which a heavy
  tail of slow steps moves where the median stays) against `rule`'s, one run each."""
  lines = ['| network | input | compute | batch | variant | convolutions by lowering | '
           'step (s) | mean (s) | × rule | noise |',
           '|---|---|---|---:|---|---|---:|---:|---:|---:|']
  for result in results:
    for row in result['rows']:
      used = (', '.join(f'{k} {v}' for k, v in sorted(row['convolutions_by_lowering'].items()))
              or f"every one by {row['variant']}")  # an impl that asks no table
      lines.append(f"| {result['network']} | {result['image_size']}² | {result['dtype']} "
                   f"| {result['global_batch']} "
                   f"| {row['variant']} | {used} | {row['median_s']:.3f} | "
                   f"{float(np.mean(row['samples'])):.3f} | "
                   f"{row['over_rule']:.2f} | {row['noise']:.0%} |")
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if FLAGS.from_json:
    results = []
    for path in FLAGS.from_json:
      with open(path) as f:
        results.append(json.load(f))
  else:
    if FLAGS.config is None:
      raise app.UsageError('--config (or --from_json) is required.')
    unknown = [v for v in FLAGS.variants if v not in VARIANTS]
    if unknown:
      raise app.UsageError(f"--variants: {unknown[0]!r} is not one of {', '.join(VARIANTS)}.")
    results = [ab(FLAGS.config, FLAGS.steps, FLAGS.warmup, FLAGS.variants)]
    if FLAGS.out:
      with open(FLAGS.out, 'w') as f:
        json.dump(results[0], f, indent=1)
  print(table(results))
  if FLAGS.choices_out:
    write_choices(results, FLAGS.choices_out, FLAGS.faster)


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].')
  flags.DEFINE_integer('steps', 7, 'Timed rounds (one step of each variant) after the warm-up.')
  flags.DEFINE_integer('warmup', 1, 'Untimed rounds first.')
  flags.DEFINE_list('variants', list(VARIANTS), "Which variants besides 'rule' "
                    "('measured:*': every kind the table picks).")
  flags.DEFINE_string('out', '', 'Also write the results as JSON here.')
  flags.DEFINE_list('from_json', [], 'Measure nothing: read these files of this tool.')
  flags.DEFINE_string('choices_out', '', "Write `auto`'s table (jaxpar/models/conv_auto.json) "
                      'from the results.')
  flags.DEFINE_float('faster', FASTER, 'How far below rule a kind must run to be kept.')
  app.run(main)
