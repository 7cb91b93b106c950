"""How long a Downpour worker on Ray takes for one gradient with one reserved CPU and with more.

A Ray worker actor is a process of its own; Ray sets its `OMP_NUM_THREADS` to the CPUs it
reserves (`async_sgd.cpus_per_worker`), and that is the OpenMP team of jaxpar's oneDNN
convolutions in it (jaxpar/models/onednn.py). XLA's other operations use their own thread
pool, whatever Ray reserved. Here one worker actor per setting computes the configured
network's gradient (`async_sgd.gradient_fn`, the function a worker runs) on a batch of
`per_device_batch` random images; the settings take turns round by round (each round
starts with the next one), so both see the same machine, and only one computes at a time.
Per setting: each round's median of `--reps` gradients, their median, min and max, and
the oneDNN team the actor reported; the ratio of the first setting's time to each other
one's is taken round by round (median and quartiles); the host's speed before anything
compiles (`alternate.host_speed`).

  python -m analysis.benchmarks.ray_worker_bench \\
      --config configs/thesis.py:net=resnet34,scheme=async,server=central,workers=1,batch=16 \\
      --config.image_size=64 --config.dataset.name=synthetic --rounds 5 --out ray.json

Nothing here is asserted in tests; docs/async.md shows the committed results.
"""
import datetime
import json
import os
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

FLAGS = flags.FLAGS


class _Timer:
  """A Ray actor: the worker's gradient function on one batch, timed."""

  def __init__(self, model, image_shape, num_classes, batch, micro_batches):
    import jax

    from jaxpar.parallel.async_sgd import gradient_fn
    from jaxpar.step import init_variables
    variables = init_variables(model, (1,) + image_shape, jax.random.key(0))
    self.params, self.stats = variables['params'], variables.get('batch_stats', {})
    rng = np.random.default_rng(0)
    self.batch = {'image': rng.normal(size=(batch,) + image_shape).astype(np.float32),
                  'label': rng.integers(0, num_classes, batch).astype(np.int32)}
    self.fn = gradient_fn(model, micro_batches)
    self.key = jax.random.key(1)
    jax.block_until_ready(self.fn(self.params, self.stats, self.batch, self.key))  # compiled

  def time(self, reps: int) -> float:
    import jax
    times = []
    for _ in range(reps):
      start = time.perf_counter()
      jax.block_until_ready(self.fn(self.params, self.stats, self.batch, self.key))
      times.append(time.perf_counter() - start)
    return float(np.median(times))

  def threads(self) -> dict:
    from jaxpar.models import onednn
    return {'omp_num_threads': os.environ.get('OMP_NUM_THREADS'),
            'onednn_threads': onednn.threads(),  # 0 where oneDNN cannot run
            'onednn_calls_by_team': {str(k): v for k, v in onednn.calls_by_team().items()}}


def run(cfg, cpus: list[int], rounds: int, reps: int) -> dict:
  import ray

  from analysis.benchmarks import alternate
  from jaxpar import build
  from jaxpar.data import sources
  from jaxpar.plan.probe import machine, versions
  speed = alternate.host_speed()  # before anything compiles or runs
  source = sources.open_source(cfg.dataset)
  model = build.model(cfg, source.num_classes, source.channels, build.mesh(cfg))
  shape = (cfg.image_size, cfg.image_size, source.channels)
  ray.init(num_cpus=sum(cpus), include_dashboard=False, logging_level='warning')
  timer = ray.remote(_Timer)
  actors = {c: timer.options(num_cpus=c).remote(model, shape, source.num_classes,
                                                cfg.per_device_batch, cfg.grad_accum_steps)
            for c in cpus}
  found = {c: [] for c in cpus}
  for i in range(rounds):
    for c in alternate.in_turn(cpus, i):
      found[c].append(ray.get(actors[c].time.remote(reps)))
      print(f'round {i + 1}/{rounds}, {c} CPU(s): {found[c][-1]:.3f} s', flush=True)
  threads = {c: ray.get(actors[c].threads.remote()) for c in cpus}
  ray.shutdown()
  first = cpus[0]
  ratios = {c: alternate.paired_ratio(found[first], found[c]) for c in cpus[1:]}
  return {'tool': 'analysis.benchmarks.ray_worker_bench',
          'created': datetime.datetime.now().isoformat(timespec='seconds'),
          'machine': machine(), 'versions': versions(), 'host_speed': speed,
          'network': cfg.model, 'image_size': cfg.image_size, 'dtype': cfg.dtype,
          'conv_impl': cfg.conv_impl, 'batch': cfg.per_device_batch, 'reps': reps,
          'settings': {str(c): {'samples': found[c], 'median_s': float(np.median(found[c])),
                                'min_s': min(found[c]), 'max_s': max(found[c]), **threads[c]}
                       for c in cpus},
          'ratios': {f'{first}/{c}': {'median': r['median'], 'quartiles': [r['q25'], r['q75']]}
                     for c, r in ratios.items()}}


def table(results: list[dict]) -> str:
  """Markdown: one row per run and setting beyond the first, its time against the first's."""
  from analysis.benchmarks import bench_table
  lines = ['| network | input | compute | batch | measured | machine | jax | CPUs reserved '
           '| oneDNN threads | gradient (s) | one CPU / this (quartiles) |',
           '|---|---|---|---:|---|---|---|---:|---:|---:|---:|']
  for r in results:
    m = r['machine']
    host = bench_table.host(m)
    first = next(iter(r['settings']))
    for cpus, s in r['settings'].items():
      ratio = r['ratios'].get(f'{first}/{cpus}')
      low, high = ratio['quartiles'] if ratio else (1, 1)
      shown = f"{ratio['median']:.2f}× ({low:.2f}–{high:.2f})" if ratio else '1'
      lines.append(
          f"| {r['network']} | {r['image_size']}² | {r['dtype']} | {r['batch']} "
          f"| {r['created'][:10]} | {host} | {r['versions'].get('jax', '?')} | {cpus} "
          f"| {s['onednn_threads']} | {s['median_s']:.3f} ({s['min_s']:.3f}–{s['max_s']:.3f}) "
          f"| {shown} |")
  return '\n'.join(lines)


def main(argv):
  del argv
  from jaxpar import validation
  validation.validate(FLAGS.config)  # one line naming the field, before any actor starts
  cpus = [int(c) for c in FLAGS.cpus.split(',')] if FLAGS.cpus else [1, os.cpu_count() or 1]
  if len(cpus) < 2 or min(cpus) < 1:
    raise app.UsageError(f'--cpus={FLAGS.cpus!r}: give two or more counts of 1 or more, '
                         f'e.g. --cpus=1,{os.cpu_count()}')
  result = run(FLAGS.config, cpus, FLAGS.rounds, FLAGS.reps)
  print(table([result]))
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      json.dump(result, f, indent=1)
      f.write('\n')
    print(f'wrote {FLAGS.out}')


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'a jaxpar config file', lock_config=True)
  flags.DEFINE_string('cpus', '', "the CPUs each worker reserves, compared with the first "
                      "(default: 1 and this machine's cores)")
  flags.DEFINE_integer('rounds', 5, 'rounds, the settings taking turns')
  flags.DEFINE_integer('reps', 5, "gradients a round (their median is the round's time)")
  flags.DEFINE_string('out', '', 'write the result (JSON) here')
  flags.mark_flags_as_required(['config'])
  app.run(main)
