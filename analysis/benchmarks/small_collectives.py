"""Small collectives across 2 processes: a psum's time per call by size, with gloo's TCP event
loop at normal priority and at idle priority (what jaxpar sets: `multihost.IdleGlooLoops`),
side by side in one run; then the same with another process busy on process 0's core, where
idle priority starves the loop and jaxpar's watch puts it back at normal priority.

  python -m analysis.benchmarks.small_collectives [--out small_collectives.json]
  python -m analysis.benchmarks.small_collectives --chain [--out sums_in_a_chain.json]

Starts 2 processes on loopback, each pinned to its own core (as launch/local.sh does), that
join with `distributed.collective_threads='normal'`; each round times every size back to back
(`--calls` calls after 3 warm-up ones) with the loop thread at SCHED_OTHER, then at
SCHED_IDLE; the rounds alternate the two. Then process 0 starts a busy process (`while
True: pass`) pinned to its core and the rounds are repeated with a third setting: idle
priority under `IdleGlooLoops`' watch, as a run has it (a fresh watch each round, set idle
again: the round's first sizes pay for finding the starvation). The table gives the median
over rounds of each round's median, with the rounds' range. Prints a markdown table;
`--out` writes the JSON.

`--chain`: how a step's BatchNorm statistics can travel, as a step sends them — one program
of `CHAIN` sums one after another, each needing the last, with the processes joined as a run
joins them (gloo's loop at idle priority): `lax.psum` (XLA's all-reduce: gloo's ring, a
reduce-scatter then an all-gather) against `lax.all_gather` and a sum on each device (one
exchange; `collectives.group_mean`), the two alternated round by round; µs per sum.
"""
import json
import os
import random
import subprocess
import sys
import tempfile
import time

SIZES = (1, 2, 4, 16, 256, 1024, 16384, 262144)  # float32 elements


def median_call(step, x, calls: int, warm: int = 3) -> float:
  """The median seconds of `calls` calls of `step(x)`, each to its result, after `warm`."""
  import numpy as np
  for _ in range(warm):
    step(x).block_until_ready()
  t = []
  for _ in range(calls):
    start = time.perf_counter()
    step(x).block_until_ready()
    t.append(time.perf_counter() - start)
  return float(np.median(t))


def child(process_id: int, port: str, rounds: int, calls: int, out: str):
  from jaxpar import multihost
  multihost.join(f'127.0.0.1:{port}', 2, process_id, 'none', 120, 60, 'normal')
  import jax
  import numpy as np
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxpar.mesh import make_mesh
  mesh = make_mesh((2,), ('d',), jax.devices())
  step = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, 'd'), mesh=mesh, in_specs=P('d'),
                               out_specs=P('d')))
  arrays = {n: jax.make_array_from_process_local_data(
      NamedSharding(mesh, P('d')), np.full((1, n), process_id + 1, np.float32)) for n in SIZES}
  for n, x in arrays.items():  # compile, connect, check: 1 + 2 in every element
    assert float(np.asarray(step(x).addressable_shards[0].data).min()) == 3.0, n
  time.sleep(0.5)
  loops = multihost.gloo_loop_threads()

  def time_calls(x):
    return median_call(step, x, calls)

  def set_all(sched):
    for tid in loops:
      os.sched_setscheduler(tid, sched, os.sched_param(0))

  times = {policy: {n: [] for n in SIZES} for policy in ('normal', 'idle')}
  for _ in range(rounds):
    for policy, sched in (('normal', os.SCHED_OTHER), ('idle', os.SCHED_IDLE)):
      set_all(sched)
      for n, x in arrays.items():
        times[policy][n].append(time_calls(x))
  # Another process busy on process 0's core.
  busy = None
  if process_id == 0:
    busy = subprocess.Popen(['taskset', '-c', str(sorted(os.sched_getaffinity(0))[0]),
                             sys.executable, '-c', 'while True: pass'])
  multihost.barrier('busy')
  contended = {p: {n: [] for n in SIZES} for p in ('normal', 'idle', 'watched')}
  reverted = 0
  for _ in range(rounds):
    for policy in contended:
      set_all(os.SCHED_OTHER if policy == 'normal' else os.SCHED_IDLE)
      watch = None
      if policy == 'watched':  # jaxpar's watch of the loops set idle, as join starts it
        watch = multihost.IdleGlooLoops(retry_s=3600)
        for tid in loops:
          watch.track(tid)
        watch.start()
      for n, x in arrays.items():
        contended[policy][n].append(time_calls(x))
      if watch is not None:
        watch.stop()
        reverted += any(to == 'normal' for _, to, _ in watch.history)
  if busy is not None:
    busy.kill()
    busy.wait()
  if process_id == 0:
    with open(out, 'w') as f:
      json.dump({'loop_threads': len(loops), 'times': times, 'contended': contended,
                 'watch_reverted': reverted}, f)


CHAIN = 51  # sums in one program: SqueezeNet's BatchNorm step sends 50 collectives
CHAIN_SIZES = (2, 256, 2048, 16384)  # float32 elements: a layer's stacked statistics are 2·C


def chain_child(process_id: int, port: str, rounds: int, calls: int, out: str):
  from jaxpar import multihost
  multihost.join(f'127.0.0.1:{port}', 2, process_id, 'none', 120, 60, 'idle')
  import jax
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxpar.mesh import make_mesh
  mesh = make_mesh((2,), ('d',), jax.devices())

  def chain(total):
    def body(x):
      for _ in range(CHAIN):  # each sum reads the last: one after another, as a step's
        x = total(x) * 0.5
      return x
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P('d'), out_specs=P('d'),
                                 check_vma=False))
  ways = {'psum': chain(lambda x: lax.psum(x, 'd')),
          'all_gather': chain(lambda x: lax.all_gather(x, 'd').sum(0))}
  arrays = {n: jax.make_array_from_process_local_data(
      NamedSharding(mesh, P('d')), np.full((1, n), process_id + 1, np.float32))
            for n in CHAIN_SIZES}
  for step in ways.values():  # compile, connect, check: (1 + 2) / 2 = 1.5 after every sum
    for n, x in arrays.items():
      assert np.allclose(np.asarray(step(x).addressable_shards[0].data), 1.5), n
  times = {way: {n: [] for n in CHAIN_SIZES} for way in ways}
  for _ in range(rounds):
    for way, step in ways.items():
      for n, x in arrays.items():
        times[way][n].append(median_call(step, x, calls, warm=1) / CHAIN)
  if process_id == 0:
    with open(out, 'w') as f:
      json.dump({'chain': CHAIN, 'times': times}, f)


def chain_table(result: dict) -> str:
  """µs per sum in a chain by size: the median over rounds (the rounds' range), and the
  all-gather's time ÷ the all-reduce's."""
  import numpy as np
  times = result['times']
  sizes = [int(n) for n in times['psum']]
  cell = lambda v: f'{np.median(v) * 1e6:.0f} ({min(v) * 1e6:.0f}–{max(v) * 1e6:.0f})'
  names = {'psum': 'all-reduce (`psum`), µs',
           'all_gather': 'all-gather and a sum (`group_mean`), µs'}
  lines = ['| one sum of a chain | ' + ' | '.join(f'{n:,} floats' for n in sizes) + ' |',
           '|---|' + '---:|' * len(sizes)]
  for way, name in names.items():
    lines.append(f'| {name} | ' + ' | '.join(cell(times[way][str(n)]) for n in sizes) + ' |')
  ratio = [np.median(times['all_gather'][str(n)]) / np.median(times['psum'][str(n)])
           for n in sizes]
  lines.append('| all-gather ÷ all-reduce | ' + ' | '.join(f'{r:.2f}×' for r in ratio) + ' |')
  return '\n'.join(lines)


def table(result: dict) -> str:
  """Milliseconds per call by size: the median over rounds (the rounds' range)."""
  import numpy as np
  times = result['times']
  sizes = [int(n) for n in times['normal']]
  cell = lambda v: f'{np.median(v) * 1e3:.2f} ({min(v) * 1e3:.2f}–{max(v) * 1e3:.2f})'
  lines = ['| gloo loop thread | ' + ' | '.join(f'{n:,} float{"s" if n > 1 else ""}'
                                                for n in sizes) + ' |',
           '|---|' + '---:|' * len(sizes)]
  rows = [(times, 'normal', 'normal priority (before)'),
          (times, 'idle', 'idle priority (jaxpar)')]
  if 'contended' in result:
    busy = 'another process busy on its core'
    rows += [(result['contended'], 'normal', f'{busy}: normal priority'),
             (result['contended'], 'idle', f'{busy}: idle priority'),
             (result['contended'], 'watched', f'{busy}: jaxpar (idle, watched)')]
  for source, policy, name in rows:
    lines.append(f'| {name}, ms | ' + ' | '.join(cell(source[policy][str(n)]) for n in sizes)
                 + ' |')
  return '\n'.join(lines)


def main(argv):
  import argparse

  from analysis.steptime.measure import machine
  from jaxpar.multihost import gloo_loop_threads  # noqa: F401 — fail early if absent
  p = argparse.ArgumentParser(prog='python -m analysis.benchmarks.small_collectives',
                              description=__doc__.split('\n\n')[0])
  p.add_argument('--rounds', type=int, default=5)
  p.add_argument('--calls', type=int, default=30)
  p.add_argument('--chain', action='store_true',
                 help='time sums in a chain: all-reduce against all-gather and a sum')
  p.add_argument('--out', default='')
  args = p.parse_args(argv)
  if args.rounds < 1 or args.calls < 1:
    p.error('--rounds and --calls must be at least 1')
  port = str(random.randint(20000, 40000))
  cores = os.cpu_count() or 1
  with tempfile.TemporaryDirectory() as folder:
    out = os.path.join(folder, 'result.json')
    procs = [subprocess.Popen(
        ['taskset', '-c', str(i % cores), sys.executable, '-m',
         'analysis.benchmarks.small_collectives', '--chain-child' if args.chain else '--child',
         str(i), port, str(args.rounds), str(args.calls), out]) for i in range(2)]
    codes = [proc.wait(timeout=1800) for proc in procs]
    if any(codes):
      sys.exit(f'small_collectives: a process failed (exit statuses {codes})')
    with open(out) as f:
      result = json.load(f)
  import jax
  result.update(tool='analysis.benchmarks.small_collectives', machine=machine(),
                created=time.strftime('%Y-%m-%dT%H:%M:%S'), jax=jax.__version__,
                rounds=args.rounds, calls=args.calls, pinned=True,
                command='python -m analysis.benchmarks.small_collectives ' + ' '.join(argv))
  print(chain_table(result) if args.chain else table(result))
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  if sys.argv[1:2] in (['--child'], ['--chain-child']):
    run = chain_child if sys.argv[1] == '--chain-child' else child
    run(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
  else:
    main(sys.argv[1:])
