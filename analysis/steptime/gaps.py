"""What a small collective costs after compute, between two real processes, under gloo's
event loop as gloo leaves it (a spinning loop: calls end near ticks of the kernel's timer)
and as jaxpar runs it (idle priority: no tick).

The calibration (`jaxpar.perfmodel.calibrate`) times chains of back-to-back calls. Here each
of K all-reduces of a small buffer follows g seconds of compute (a loop of
16×256 · 256×256 matmuls, its length varied); the same program without the all-reduces
gives g. Per call,

  t_call(g) = (t_program(g, with) − t_program(g, without)) / K,   cycle = g + t_call.

With the spinning loop (gloo over loopback or an emulated 1 Gb/s link; Linux, CONFIG_HZ
= 250) a back-to-back call of 4 KB takes q ≈ 4 ms, and with both processes computing the
same g before it the cycle's mean lies near whole ticks, cycle(g) ≈ ⌈(g + l) / q⌉ · q,
l ≈ 2 ms: a call after compute costs what is left of its tick. With the loop at idle
priority a call costs ~0.1 ms whatever g, near the back-to-back chain, so the
calibration prices a step's small calls as they run (docs/measuring.md,
analysis/report/measured/collective_gaps.json). `ticks(rows)` reads q off the
back-to-back row and counts each cycle in ticks. Back to back by size
(`jaxpar.plan.call_timing.time_calls`, as the calibration runs it): a scalar (4 B)
all-reduce, one exchange, is its own kind (`calibrate.SCALAR`).

  python -m analysis.steptime.gaps --out gaps.json                 # loopback
  python -m analysis.steptime.gaps --links=1gbit --out gaps.json   # and an emulated link (root)
"""
import itertools
import os
import sys
import tempfile

from absl import app
from absl import flags

FLAGS = flags.FLAGS
MATMULS = (0, 8, 32, 64, 96, 128, 160, 200, 240, 280, 320, 400, 480, 560)
CALLS = 8  # K: all-reduces per program
SIZES = (16, 64, 256, 1024, 4096, 1 << 20)  # bytes of the back-to-back chains (and a scalar)


def ticks(rows) -> dict:
  """{'tick_s': q, 'rows': [row + {'cycle_s', 'ticks', 'off'}]}: q is the call time of the
  row without compute (the back-to-back call); each row's cycle g + t_call in ticks, and
  how far that is from the nearest whole number of ticks (0: on a tick; 0.5: midway)."""
  # In order of the compute's length, not of the measured gap: a few matmuls' gap can
  # measure no longer than none, and `table` lines the settings' rows up column by column.
  rows = sorted(rows, key=lambda r: r['matmuls'])
  base = next((r for r in rows if r['matmuls'] == 0), None)
  if base is None:
    raise ValueError('ticks needs the row without compute (matmuls = 0)')
  q = base['call_s']
  out = []
  for r in rows:
    cycle = r['gap_s'] + r['call_s']
    n = cycle / q
    out.append({**r, 'cycle_s': cycle, 'ticks': n, 'off': abs(n - round(n))})
  return {'tick_s': q, 'rows': out}


def table(out: dict) -> str:
  """A written file's calls after compute, one column per gap g (loopback's), one row per
  setting: each call's cost in ms (docs/measuring.md)."""
  from analysis.steptime import link
  settings = out['settings']
  first = next(iter(settings.values()))['rows']
  lines = ['| g (ms) | ' + ' | '.join(f"{r['gap_s'] * 1e3:.1f}" for r in first) + ' |',
           '|---|' + '---:|' * len(first)]
  for name, setting in settings.items():
    where = setting.get('setting', name)
    where = ('loopback' if where == 'processes' else
             link.describe(where.removeprefix('link-')) if where.startswith('link-') else where)
    if 'collective_threads' in setting:  # files of one loop priority have none
      where += f", gloo loop {setting['collective_threads']}"
    lines.append(f'| call, {where} (ms) | '
                 + ' | '.join(f"{r['call_s'] * 1e3:.2f}" for r in setting['rows']) + ' |')
  return '\n'.join(lines)


def run(spec) -> dict:
  """One child process: each matmul count's program with and without its all-reduces,
  timed in turn (every process at once: both compute on their own cores)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from analysis.steptime import timing
  from jaxpar import multihost
  from jaxpar.mesh import make_mesh
  from jaxpar.perfmodel import calibrate
  from jaxpar.plan import call_timing
  multihost.join(spec['coordinator'], spec['num_processes'], spec['process_id'], 'none', 120, 60,
                 spec['collective_threads'])
  mesh = make_mesh((2,), ('pair',), jax.devices()[:2])
  elements = max(2, spec['bytes'] // 4)

  def program(m, reduce):
    def body(x, w):
      for _ in range(CALLS):
        y = jnp.broadcast_to(x[:, :1], (16, 256)) * w[:16]
        y = lax.fori_loop(0, m, lambda _, y: jnp.tanh(y @ w), y)
        x = x + 1e-9 * y.sum()
        if reduce:
          x = lax.psum(x, 'pair') * 0.5
      return x
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P('pair'), P()),
                                 out_specs=P('pair'), check_vma=False))

  x = jax.jit(lambda: jnp.ones((2, elements), jnp.float32),
              out_shardings=NamedSharding(mesh, P('pair')))()
  w = jax.jit(lambda: jnp.eye(256, dtype=jnp.float32) * 0.5,
              out_shardings=NamedSharding(mesh, P()))()
  if spec['collective_threads'] == 'idle':  # the loop starts with the first collective
    jax.block_until_ready(program(0, True)(x, w))
    if not multihost.wait_for_idle_gloo_loops():
      timing._log(spec, "gloo's loop thread was not found idle: calls may wait for ticks")
  rows = []
  for m in spec['matmuls']:
    t = {}
    for reduce in (False, True):
      f = program(m, reduce)
      multihost.barrier(f'gaps {m} {reduce}')
      t[reduce] = call_timing.timed(lambda f=f: jax.block_until_ready(f(x, w)),
                                    spec['repeats'], spec['warmup'])
    gap = float(np.mean(t[False])) / CALLS
    call = (float(np.mean(t[True])) - float(np.mean(t[False]))) / CALLS
    rows.append({'matmuls': m, 'gap_s': gap, 'call_s': call,
                 'samples_without': t[False], 'samples_with': t[True]})
    timing._log(spec, f'{m} matmuls: gap {gap * 1e3:.2f} ms, call {call * 1e3:.2f} ms')
  # Back to back by size, as the calibration times them: the scalar apart.
  sizes = call_timing.time_calls(list(SIZES), spec['repeats'], spec['warmup'],
                                 ops=('all_reduce', calibrate.SCALAR))
  return {'setting': spec['setting'], 'bytes': elements * 4, 'calls': CALLS, 'rows': rows,
          'sizes': sizes}


def main(argv) -> int:
  import datetime
  import json

  from analysis.steptime import link, measure
  from jaxpar.perfmodel import calibrate
  if len(argv) > 1:
    print(f'unexpected arguments: {argv[1:]}', file=sys.stderr)
    return 2
  for name, value, least in (('bytes', FLAGS.bytes, 8), ('repeats', FLAGS.repeats, 1),
                             ('warmup', FLAGS.warmup, 0)):
    if value < least:
      print(f'--{name}={value}: must be at least {least}', file=sys.stderr)
      return 2
  if not all(m.isdigit() for m in FLAGS.matmuls) or FLAGS.matmuls[:1] != ['0']:
    print(f'--matmuls={",".join(FLAGS.matmuls)}: use whole numbers, 0 first (the row without '
          'compute is the back-to-back call the others are counted against)', file=sys.stderr)
    return 2
  if not FLAGS.collective_threads or set(FLAGS.collective_threads) - {'idle', 'normal'}:
    print(f'--collective_threads={",".join(FLAGS.collective_threads)}: use idle, normal or '
          'both (gloo\'s event loop at idle priority, as jaxpar runs it, or as gloo leaves it)',
          file=sys.stderr)
    return 2
  out = {'tool': 'analysis.steptime.gaps', 'created': datetime.datetime.now().isoformat(
      timespec='seconds'), 'command': 'python -m analysis.steptime.gaps ' + ' '.join(
          sys.argv[1:]), 'machine': measure.machine(), 'settings': {}}
  common = {'bytes': FLAGS.bytes, 'matmuls': [int(m) for m in FLAGS.matmuls],
            'repeats': FLAGS.repeats, 'warmup': FLAGS.warmup}
  links = FLAGS.links
  if links and (why_not := link.unavailable()):
    print(f'skipping the emulated links {",".join(links)}: {why_not}', file=sys.stderr)
    links = []
  with tempfile.TemporaryDirectory() as folder:
    for setting, threads in itertools.product(['processes'] + [f'link-{r}' for r in links],
                                              FLAGS.collective_threads):
      found = measure.run_setting(setting, 2, {}, {**common, 'collective_threads': threads},
                                  folder, module='analysis.steptime.gaps')
      summary = ticks(found['rows'])
      name = setting if threads == 'idle' else f'{setting}, gloo loop {threads}'
      out['settings'][name] = {**found, **summary, 'collective_threads': threads}
      print(f'\n{name}: a back-to-back all-reduce of {found["bytes"]:,} B takes '
            f'q = {summary["tick_s"] * 1e3:.2f} ms\n\n| matmuls | gap (ms) | call (ms) | '
            'gap + call (ms) | in ticks |\n|---:|---:|---:|---:|---:|')
      for r in summary['rows']:
        print(f"| {r['matmuls']} | {r['gap_s'] * 1e3:.2f} | {r['call_s'] * 1e3:.2f} | "
              f"{r['cycle_s'] * 1e3:.2f} | {r['ticks']:.2f} |")
      costs = calibrate.from_calls(found['sizes'])
      print('\nback to back, per call: ' + ', '.join(
          f'{b:,} B {c * 1e3:.2f} ms' for kind in (calibrate.SCALAR, 'all_reduce')
          for b, c in costs.points[kind]))
  if FLAGS.out:
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.out)), exist_ok=True)
    with open(FLAGS.out, 'w') as f:
      json.dump(out, f, indent=1)
    print(f'\nwrote {FLAGS.out}')
  return 0


def child_main(argv) -> None:
  from analysis.steptime import timing
  timing.child(argv[1], run)


if __name__ == '__main__':
  if len(sys.argv) == 2 and sys.argv[1].endswith('.spec.json'):
    child_main(sys.argv)
  else:
    flags.DEFINE_string('out', '', 'Also write the results as JSON here.')
    flags.DEFINE_list('links', [], 'Also across emulated links of these rates (tc syntax; root).')
    flags.DEFINE_list('collective_threads', ['normal', 'idle'],
                      "gloo's event loop as gloo leaves it (normal: a spinning loop, calls on "
                      "timer ticks) and as jaxpar runs it (idle); each setting under each.")
    flags.DEFINE_list('matmuls', [str(m) for m in MATMULS],
                      'Lengths of the compute before each call, in matmuls (0 first: the '
                      'back-to-back call).')
    flags.DEFINE_integer('bytes', 4096, 'The all-reduced buffer.')
    flags.DEFINE_integer('repeats', 10, 'Timed runs of each program.')
    flags.DEFINE_integer('warmup', 3, 'Untimed runs first (the first compiles).')
    app.run(main)
