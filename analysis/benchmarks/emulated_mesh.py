"""An emulated mesh's training step against one device's on the whole batch, and where the
difference goes.

  python -m analysis.benchmarks.emulated_mesh --config configs/resnet34_2d.py --rounds 15 \\
      --out analysis/report/bench/emulated/resnet34_2d.json

The config's mesh of D devices is emulated in this process (D CPU devices sharing its cores,
as `python -m pytest` and the README's quickstart run them). Its step computes the global
batch B as synchronous data parallelism does, the mean of the devices' gradients ([T] eq.
3.12): the same maths as one device computing all B (`probe.one_device_overrides`: the same
network, dtype and optimizer on one device). Timed in rounds, each call in turn
(`alternate.in_turn`), each the last of `--repeat` in a row:

  mesh step            the config's training step on its D devices (`probe.update_call`);
  mesh gradients       each device's gradients of its B/D examples at once, nothing
                       exchanged (`probe.gradient_call`: the plan's t_grad(B/D, D));
  mesh update          the step with its gradients stood in for (`probe.stand_in_gradients`):
                       the gradients' exchange and the update on every device;
  one-device step      one device's step on all B;
  one-device gradients its gradients of all B;
  one-device update    its step with the gradients stood in for.

The mesh's step less its gradients and its update is the rest: BatchNorm's statistics over
the devices, the per-device copies, and what the parts do not overlap. The ratio of the two
steps is taken round by round (`alternate.paired_ratio`: its median and 95 % interval), as
are the gradients' and the updates'. The host's speed is read first (`alternate.host_speed`).

Nothing here is asserted in tests (tests/test_bench.py runs it on a small config);
docs/benchmark.md shows the committed results (`analysis.report`'s `emulated-mesh` table).
"""
import datetime
import json
import sys

import jax
import numpy as np
from absl import app, flags
from ml_collections import config_flags

from analysis.benchmarks import alternate
from jaxpar import build
from jaxpar import config as config_lib
from jaxpar import mesh as mesh_lib
from jaxpar import validation
from jaxpar.plan import probe

FLAGS = flags.FLAGS
CALLS = ('mesh step', 'mesh gradients', 'mesh update', 'one-device step', 'one-device gradients',
         'one-device update')


def check(cfg) -> None:
  """Refuses what this cannot time, before anything compiles."""
  validation.validate(cfg)
  if cfg.scheme == 'async' or cfg.sync_every:
    raise config_lib.ConfigError(
        f'config.scheme={cfg.scheme!r} with config.sync_every={cfg.sync_every} is invalid '
        f'here: analysis.benchmarks.emulated_mesh compares a synchronous step with one '
        f"device's; set config.scheme='sync-split' or 'sync-join' and config.sync_every=0")


def one_device(cfg):
  """The config's maths on one device at the whole global batch."""
  batch = config_lib.global_batch(cfg)
  return config_lib.with_overrides(cfg, {**probe.one_device_overrides(cfg, batch),
                                         'total_steps': 10**6})


def calls(cfg) -> tuple:
  """(meta, {name: call}) for `CALLS`, each call compiled and run once."""
  from jaxpar.data import sources
  meta = sources.open_source(cfg.dataset).meta
  one = one_device(cfg)
  validation.validate(one)
  d, batch = config_lib.num_devices(cfg), config_lib.global_batch(cfg)
  variables = probe.initial_variables(one, meta)  # as the plan makes them: one device's
  first = jax.devices()[:1]
  made = {
      'mesh step': probe.update_call(cfg, meta, variables, gradients=True)[1],
      # The network as one device computes it (BatchNorm over each device's own batch).
      'mesh gradients': probe.gradient_call(one, meta, batch // d, devices=d,
                                            variables=variables),
      'mesh update': probe.update_call(cfg, meta, variables)[1],
      'one-device step': probe.update_call(one, meta, variables, devices=first,
                                           gradients=True)[1],
      'one-device gradients': probe.gradient_call(one, meta, batch, devices=1,
                                                  variables=variables),
      'one-device update': probe.update_call(one, meta, variables, devices=first)[1],
  }
  return meta, {name: alternate.call_timer(made[name]) for name in CALLS}


def measure(cfg, rounds: int, repeat: int) -> dict:
  """Every call of `CALLS` timed in `rounds` rounds (the order turning each round)."""
  check(cfg)
  d = config_lib.num_devices(cfg)
  if jax.device_count() < d:
    raise config_lib.ConfigError(
        f'config.mesh.shape={tuple(cfg.mesh.shape)} needs {d} devices, this process has '
        f'{jax.device_count()}; emulated CPU devices are asked for before JAX starts '
        f'(config.mesh.emulate_cpu_devices=True)')
  speed = alternate.host_speed()
  meta, timers = calls(cfg)
  samples = {name: [] for name in CALLS}
  for r in range(rounds):
    for name in alternate.in_turn(list(CALLS), r):
      samples[name].append([timers[name]() for _ in range(repeat)][-1])
  ratio = lambda a, b: alternate.paired_ratio(samples[a], samples[b])
  median = {name: float(np.median(t)) for name, t in samples.items()}
  return {
      'config': {'model': cfg.model, 'image_size': cfg.image_size, 'dtype': cfg.dtype,
                 'mesh': list(cfg.mesh.shape), 'global_batch': config_lib.global_batch(cfg),
                 'scheme': cfg.scheme, 'server': cfg.server, 'grad_reduce': cfg.grad_reduce,
                 'bn_group_size': cfg.bn_group_size, 'optimizer': cfg.optimizer.name,
                 'batch_norm': bool(cfg.get('batch_norm', True))},
      'devices': d, 'num_classes': meta['num_classes'], 'rounds': rounds, 'repeat': repeat,
      'median_s': median, 'samples_s': samples,
      'rest_s': median['mesh step'] - median['mesh gradients'] - median['mesh update'],
      'step_ratio': ratio('mesh step', 'one-device step'),
      'gradients_ratio': ratio('mesh gradients', 'one-device gradients'),
      'update_ratio': ratio('mesh update', 'one-device update'),
      'host_speed': speed, 'machine': probe.machine(), 'versions': probe.versions(),
      'date': datetime.date.today().isoformat(),
  }


def _cell(ratio: dict) -> str:
  low, high = ratio['interval']
  return f"{ratio['median']:.2f}× [{low:.2f}–{high:.2f}]"


def table(results: list) -> str:
  """The `emulated-mesh` table: one row per committed result."""
  lines = ['| network | input | compute | devices | batch | one device: step (s) | mesh: step (s) '
           '| mesh / one device | gradients: mesh / one device | update: mesh / one device '
           '(s) | rest (s) | measured |',
           '|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|']
  for r in results:
    c, m = r['config'], r['median_s']
    mesh = '×'.join(map(str, c['mesh']))
    lines.append(
        f"| {c['model']} | {c['image_size']}² | {c['dtype']} | {r['devices']} ({mesh}) | "
        f"{c['global_batch']} | {m['one-device step']:.3g} | {m['mesh step']:.3g} | "
        f"{_cell(r['step_ratio'])} | {_cell(r['gradients_ratio'])} | "
        f"{m['mesh update']:.3g} / {m['one-device update']:.3g} | {r['rest_s']:.2g} | "
        f"{r['date']}, {r['machine']['cpu'] or 'a CPU'} |")
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if FLAGS.rounds < 1 or FLAGS.repeat < 1:
    raise app.UsageError('--rounds and --repeat must be at least 1.')
  cfg = FLAGS.config
  try:
    check(cfg)
    # As a run sizes it (before JAX starts), for the larger device batch: one device's.
    build.keep_freed_memory(cfg, batch=config_lib.global_batch(cfg))
    mesh_lib.emulate_cpu_devices(config_lib.num_devices(cfg))
    result = measure(cfg, FLAGS.rounds, FLAGS.repeat)
  except config_lib.ConfigError as e:
    print(f'jaxpar: {e}', file=sys.stderr)
    sys.exit(2)
  print(table([result]))
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].')
  flags.DEFINE_integer('rounds', 15, 'Timed rounds, every call once each, after one untimed.')
  flags.DEFINE_integer('repeat', 2, 'Calls of each in a row each round, the last timed.')
  flags.DEFINE_string('out', '', 'Also write the result as JSON here.')
  flags.mark_flag_as_required('config')
  app.run(main)
