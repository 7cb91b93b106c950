"""What `analysis.measure` times in one setting, run by it as a child process:

  python -m analysis.timing SPEC.json

SPEC names the setting (`emulated`: one process, its devices emulated on shared cores;
`processes`: this is one of `num_processes` pinned processes joined by jax.distributed),
the configs to time and where process 0 writes its results (JSON). Every process of a
setting runs the same programs in the same order; process 0 keeps the times.

Times are wall-clock seconds of `repeats` calls after `warmup` calls (compilation is
in the first), each ended by `block_until_ready`:
  t_grad    one device, one batch's gradients: the worker's computation of [T] eq. 4.4ff.
  transfer  a buffer of b bytes from device 0 to device 1 (`ppermute`), and all-reduced
            over both (`psum`), for the sizes of the α-β calibration up to the network's
            weights, P: t_comm is the transfer of P ([T]'s `transport.py`).
  t_iter    one train step of a synchronous scheme × server on N devices.
  t_train   D pushes applied by the asynchronous loop (Downpour) on N workers: threads
            (emulated setting) or Ray's actors (processes setting).
"""
import functools
import itertools
import json
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

ONE_DEVICE = {'mesh.shape': (1,), 'mesh.axes': ('data',), 'bn_group_size': 0,
              'fc_parallel': 'data'}


def _log(spec, message):
  if spec['process_id'] == 0:
    print(f"[{spec['setting']}] {message}", file=sys.stderr, flush=True)


def _timed(fn, repeats: int, warmup: int) -> list:
  """Seconds of each of `repeats` calls of `fn` (which blocks), after `warmup` calls."""
  for _ in range(warmup):
    fn()
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    samples.append(time.perf_counter() - start)
  return samples


def _summary(samples) -> str:
  import numpy as np
  return f'median {np.median(samples):.4g} s (min {min(samples):.4g}, max {max(samples):.4g})'


def _synthetic(rows: int, cfg, meta, seed=0):
  import numpy as np
  rng = np.random.default_rng(seed)
  return {'image': rng.normal(size=(rows, cfg.image_size, cfg.image_size, meta['channels']))
          .astype(np.float32),
          'label': rng.integers(0, meta['num_classes'], rows).astype(np.int32)}


def time_gradients(cfg, meta, batch: int, repeats: int, warmup: int) -> list:
  """t_grad: the gradients of one batch on this process's first device."""
  import jax
  from jaxpar import build
  from jaxpar.parallel.async_sgd import gradient_fn
  from jaxpar.step import init_variables

  from jaxpar.mesh import make_mesh
  device = jax.local_devices()[0]
  model = build.model(cfg, meta['num_classes'], meta['channels'],
                      make_mesh(cfg.mesh.shape, cfg.mesh.axes, [device], cfg.bn_group_size))
  variables = jax.device_put(init_variables(model.clone(bn_axis_name=None),
                                            (1, cfg.image_size, cfg.image_size, meta['channels']),
                                            jax.random.key(0)), device)
  grads = gradient_fn(model)
  data = jax.device_put(_synthetic(batch, cfg, meta), device)
  rng = jax.random.key(1)
  return _timed(lambda: jax.block_until_ready(
      grads(variables['params'], variables.get('batch_stats', {}), data, rng)), repeats, warmup)


def time_collectives(sizes, repeats: int, warmup: int) -> dict:
  """Samples of each size (bytes) of a float32 buffer moved from device 0 to device 1
  (`ppermute`), and all-reduced over both (`psum`): the α-β calibration of each kind."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxpar.mesh import make_mesh
  mesh = make_mesh((2,), ('pair',), jax.devices()[:2])
  ops = {'transfers': lambda x: lax.ppermute(x, 'pair', [(0, 1)]),
         'all_reduces': lambda x: lax.psum(x, 'pair')}
  results = {}
  for kind, op in ops.items():
    fn = jax.jit(jax.shard_map(op, mesh=mesh, in_specs=P('pair'), out_specs=P('pair')))
    results[kind] = []
    for size in sizes:
      buffer = jax.jit(lambda s=size: jnp.ones((2, s // 4), jnp.float32),
                       out_shardings=NamedSharding(mesh, P('pair')))()
      results[kind].append({'bytes': size, 'samples': _timed(
          lambda b=buffer: jax.block_until_ready(fn(b)), repeats, warmup)})
  return results


def time_step(cfg, meta, repeats: int, warmup: int) -> dict:
  """t_iter of the config's synchronous step on its mesh (the first N devices), with its
  volume row (lowered program, analytic, reported)."""
  import jax
  from analysis import volume
  from jaxpar import build
  from jaxpar import config as config_lib
  from jaxpar.mesh import make_mesh
  from jaxpar.step import make_train_step, to_global

  n = config_lib.num_devices(cfg)
  mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axes, jax.devices()[:n], cfg.bn_group_size)
  model, strategy, tx, state = build.for_timing(cfg, meta['num_classes'], meta['channels'], mesh)
  step = make_train_step(model, tx, mesh, strategy, cfg.grad_accum_steps)
  batch = to_global(mesh, _synthetic(config_lib.global_batch(cfg) // jax.process_count(), cfg,
                                     meta, seed=jax.process_index()))
  rng = jax.random.key(1)
  lowered = step.lower(state, batch, rng)
  stablehlo, compiled = lowered.as_text(), lowered.compile()  # one lowering: read, then run
  box = {'state': state}

  def run():
    box['state'], box['metrics'] = compiled(box['state'], batch, rng)
    jax.block_until_ready(box['metrics'])
  samples = _timed(run, repeats, warmup)
  abstract = build.abstract_variables(cfg, model, meta['channels'])
  row = volume.row(cfg, stablehlo, abstract['params'], abstract.get('batch_stats', {}),
                   reported=float(box['metrics']['sent_bytes']))
  return {'samples': samples, 'volume': row}


def time_async(cfg, meta, batches: int, repeats: int) -> list:
  """Seconds for the asynchronous loop to apply each of `repeats` runs of `batches` pushes
  on N workers, one loop throughout, after 2N pushes of warm-up (each worker compiles)."""
  import jax
  from jaxpar import build
  from jaxpar import config as config_lib
  from jaxpar.mesh import make_mesh
  from jaxpar.parallel.async_ray import RayDownpour
  from jaxpar.parallel.async_sgd import Downpour

  n = config_lib.num_devices(cfg)
  warmup = 2 * n
  count = warmup + repeats * batches
  if config_lib.on_ray(cfg):  # the workers and servers are Ray's actors; this is the driver
    mesh = make_mesh((1,), ('data',), jax.devices()[:1])
    model, strategy, tx, state = build.for_timing(cfg, meta['num_classes'], meta['channels'],
                                                  mesh)
    rows = config_lib.device_batch(cfg)
    stream = functools.partial(synthetic_stream, rows, cfg.image_size, meta['channels'],
                               meta['num_classes'])
    loop = RayDownpour(model, tx, strategy, stream, count, jax.random.key(1), workers=n,
                       micro_batches=cfg.grad_accum_steps)
    # Ray's processes inherit this one's core: they get every core, as on a cluster node.
    pinned = os.sched_getaffinity(0)
    os.sched_setaffinity(0, range(os.cpu_count() or 1))
    try:
      state, metrics = loop(state)  # starts Ray (once) and the actors
    finally:
      os.sched_setaffinity(0, pinned)
    warmup -= 1
  else:
    mesh = make_mesh(cfg.mesh.shape, cfg.mesh.axes, jax.devices()[:n], cfg.bn_group_size)
    model, strategy, tx, state = build.for_timing(cfg, meta['num_classes'], meta['channels'],
                                                  mesh)
    push = _synthetic(config_lib.device_batch(cfg), cfg, meta)
    loop = Downpour(model, tx, strategy, itertools.repeat(push), count, jax.random.key(1),
                    cfg.grad_accum_steps)
  for _ in range(warmup):
    state, metrics = loop(state)
  samples = []
  for _ in range(repeats):
    # Ends when every push is applied and the weights are at hand (Ray: fetched from the
    # servers, as for a checkpoint).
    jax.block_until_ready((loop.synced(state), metrics))
    start = time.perf_counter()
    for _ in range(batches):
      state, metrics = loop(state)
    jax.block_until_ready((loop.synced(state), metrics))
    samples.append(time.perf_counter() - start)
  loop.close()
  return samples


def synthetic_stream(rows, image_size, channels, classes, worker, position):
  """A Ray worker's stream for timing: one synthetic batch, again and again."""
  import numpy as np
  rng = np.random.default_rng(worker)
  batch = {'image': rng.normal(size=(rows, image_size, image_size, channels)).astype(np.float32),
           'label': rng.integers(0, classes, rows).astype(np.int32)}
  while True:
    yield batch


def run(spec) -> dict:
  import jax
  import ml_collections

  from jaxpar import mesh as mesh_lib
  from jaxpar import multihost
  base = ml_collections.ConfigDict(spec['config'])
  multihost.join(spec['coordinator'], spec['num_processes'], spec['process_id'], 'none',
                 base.distributed.initialization_timeout, base.distributed.heartbeat_timeout)
  mesh_lib.emulate_cpu_devices(spec['local_devices'])
  meta = spec['meta']
  repeats, warmup = spec['repeats'], spec['warmup']

  def cell(overrides):
    c = ml_collections.ConfigDict(base.to_dict())
    c.update_from_flattened_dict(overrides)
    return c

  out = {'setting': spec['setting'], 'processes': jax.process_count(),
         'devices': jax.device_count(), 'pinned_cores': spec.get('pinned_cores'),
         't_grad': {}, 'transfers': [], 'all_reduces': [], 'steps': [], 'async': [],
         'volume': []}
  for batch in spec['grad_batches']:
    samples = time_gradients(cell(ONE_DEVICE), meta, batch, repeats, warmup)
    out['t_grad'][str(batch)] = samples
    _log(spec, f't_grad, batch {batch}: {_summary(samples)}')
  if spec['transfer_sizes']:
    out.update(time_collectives(spec['transfer_sizes'], repeats, warmup))
    for kind in ('transfers', 'all_reduces'):
      for t in out[kind]:
        _log(spec, f"{kind[:-1].replace('_', '-')} of {t['bytes']:,} B on devices 0, 1: "
                   f"{_summary(t['samples'])}")
  for i, c in enumerate(spec['steps']):
    result = time_step(cell(c['overrides']), meta, repeats, warmup)
    out['steps'].append({**c, **result})
    _log(spec, f"[{i + 1}/{len(spec['steps'])}] t_iter {c['scheme']} {c['server']} N={c['n']}: "
               f"{_summary(result['samples'])}")
  for i, c in enumerate(spec['async']):
    samples = time_async(cell(c['overrides']), meta, spec['batches'], spec['async_repeats'])
    out['async'].append({**c, 'samples': samples})
    _log(spec, f"[{i + 1}/{len(spec['async'])}] t_train async {c['server']} N={c['n']}, "
               f"{spec['batches']} pushes: {_summary(samples)}")
  for c in spec['volume']:
    # Local SGD reports its bytes on an averaging step: the τ-th.
    variant = cell(c['overrides'])
    out['volume'].append(time_step(variant, meta, 0, max(1, variant.sync_every))['volume'])
    _log(spec, f"volume: {out['volume'][-1]['method']} on {c['n']} devices")
  return out


def main(argv) -> int:
  if len(argv) != 2:
    print('usage: python -m analysis.timing SPEC.json  (written by python -m analysis.measure)',
          file=sys.stderr)
    return 2
  with open(argv[1]) as f:
    spec = json.load(f)
  out = run(spec)
  if spec['process_id'] == 0:
    with open(spec['out'], 'w') as f:
      json.dump(out, f)
  if spec['num_processes'] > 1:
    import jax
    jax.distributed.shutdown()
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
