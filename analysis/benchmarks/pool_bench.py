"""Times every distinct max-pool of the four networks' train steps in each formulation,
forward and forward + backward, beside PyTorch's: the measurement behind
`jaxpar/models/pooling.py`.

  python -m analysis.benchmarks.pool_bench --torch --out analysis/report/pool/float32.json
  python -m analysis.benchmarks.pool_bench --dtype=bfloat16 --out .../bfloat16.json

For each network, input size and per-device batch, the max-pools the step runs are
collected (input shape, window, strides, padding), and each distinct one is timed as
- `flax`: flax's `nn.max_pool` — XLA's `reduce_window`, and its `select_and_scatter`
  gradient (what a flax user's step runs);
- `before`: `reduce_window` and the gradient with each tap's cotangents placed at full size
  (`max_pool(..., forward='reduce_window', gradient='full')`: jaxpar's max-pool before the
  stride phases);
- `interleave`, `parity`: the maximum of strided slices, and the gradient per stride phase
  with its phases interleaved or selected by parity (`assembly=`);
- `jaxpar`: what `max_pool` runs by default (`assembly='auto'`: parity where the pool is
  unpadded, else interleaved — the rule these rows are for);
- with `--torch`, PyTorch's `max_pool2d` on NCHW (as torchvision's networks run it; Caffe's
  ceil padding as `ceil_mode`, a symmetric one as `padding`) and its gradient.
'forward + backward' is one call computing the pool, kept as an output as the next layer
reads it, and its gradient (what a train step runs of it); all formulations alternate in
rounds, each call `--repeat` times in a row with the last timed, median of the rounds
(`alternate.medians`). Nothing here is asserted in tests; the formulations' equality is
(tests/test_pooling.py).
"""
import collections
import datetime
import json
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from analysis.benchmarks.alternate import call_timer, host_speed, jax_timer, medians  # noqa: E402
from analysis.steptime.measure import machine, versions  # noqa: E402
from jaxpar.models import MIN_IMAGE_SIZE, MODELS, pooling  # noqa: E402

FLAGS = flags.FLAGS

Pool = collections.namedtuple('Pool', 'shape window strides padding')
FORMULATIONS = {'flax': {'forward': 'flax'},
                'before': {'forward': 'reduce_window', 'gradient': 'full'},
                'interleave': {'assembly': 'interleave'},
                'parity': {'assembly': 'parity'},
                'jaxpar': {}}
PASSES = ('forward', 'forward_backward')


def pools(net: str, size: int, batch: int, dtype) -> collections.Counter:
  """Every max-pool of `net`'s train step at this input, with its count."""
  seen = []

  def record(x, window_shape, strides=None, padding='VALID'):
    seen.append(Pool(tuple(x.shape), *pooling.geometry(x.shape, window_shape, strides, padding)))
    return pooling.max_pool(x, window_shape, strides, padding)

  model = MODELS[net](num_classes=10, dtype=dtype, pool=record)
  x = jnp.zeros((batch, size, size, 1))
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=True))
  seen.clear()
  jax.eval_shape(lambda v: model.apply(v, x, train=True, mutable=['batch_stats'],
                                       rngs={'dropout': jax.random.key(0)}), variables)
  return collections.Counter(seen)


def _forward_backward(pool):
  """x, dy ↦ (y, dx): the pool's output is kept, as a step's next layer reads it (else XLA
  may compute it inside the gradient's loop, once per element that reads it)."""
  def f(x, dy):
    y, vjp = jax.vjp(pool, x)
    return y, vjp(dy)[0]
  return f


def programs(formulation: str, p: Pool, dtype) -> dict:
  """{pass: (jitted function, its arguments)} of one formulation of pool `p`."""
  rng = np.random.default_rng(0)
  # After a ReLU, as in the networks: ties among zeros in most windows.
  x = jnp.asarray(np.maximum(rng.normal(size=p.shape), 0), dtype)
  pool = lambda x: pooling.max_pool(x, p.window, p.strides, p.padding,
                                    **FORMULATIONS[formulation])
  dy = jnp.asarray(rng.normal(size=jax.eval_shape(pool, x).shape), dtype)
  return {'forward': (jax.jit(pool), (x,)),
          'forward_backward': (jax.jit(_forward_backward(pool)), (x, dy))}


def jax_passes(formulation: str, p: Pool, dtype) -> dict:
  """{pass: timer} of one formulation of pool `p`."""
  return {q: jax_timer(f, *args) for q, (f, args) in programs(formulation, p, dtype).items()}


def torch_passes(p: Pool, dtype) -> dict:
  """{pass: timer} of PyTorch's max_pool2d of pool `p` (NCHW), padding as ceil_mode where
  only the bottom/right is padded (Caffe's rounding), else symmetric."""
  import torch
  import torch.nn.functional as F
  torch.set_num_threads(os.cpu_count())
  tdtype = {jnp.dtype(jnp.float32): torch.float32, jnp.dtype(jnp.bfloat16): torch.bfloat16}[
      jnp.dtype(dtype)]
  n, h, w, c = p.shape
  (pt, pb), (pl, pr) = p.padding
  if pt == pb and pl == pr:
    kwargs = dict(padding=(pt, pl))
  elif pt == pl == 0:
    kwargs = dict(ceil_mode=True)
  else:
    raise ValueError(f'no PyTorch max_pool2d for padding {p.padding}')
  g = torch.Generator().manual_seed(0)
  x = torch.relu(torch.randn(n, c, h, w, generator=g)).to(tdtype).requires_grad_(True)
  pool = lambda: F.max_pool2d(x, p.window, p.strides, **kwargs)
  dy = torch.randn(pool().shape, generator=g).to(tdtype)

  def forward():
    with torch.no_grad():
      pool()

  def forward_backward():
    torch.autograd.grad(pool(), x, dy)

  return {'forward': call_timer(forward), 'forward_backward': call_timer(forward_backward)}


def time_pool(p: Pool, dtype, rounds: int, repeat: int, torch: bool) -> dict:
  """{formulation: {pass: median seconds}}, all alternating in each round
  (`alternate.medians`)."""
  timers = {f: jax_passes(f, p, dtype) for f in FORMULATIONS}
  if torch:
    timers['torch'] = torch_passes(p, dtype)
  return medians(timers, rounds, repeat)


def main(argv):
  del argv
  speed = host_speed()  # before anything compiles or runs
  dtype = jnp.dtype(FLAGS.dtype)
  rows, cache = [], {}
  for net in FLAGS.nets:
    for pair in FLAGS.sizes:
      size, batch = map(int, pair.split(':'))
      if size < MIN_IMAGE_SIZE[net]:
        continue
      for p, count in pools(net, size, batch, dtype).items():
        if p not in cache:
          cache[p] = time_pool(p, dtype, FLAGS.rounds, FLAGS.repeat, FLAGS.torch)
        rows.append(dict(net=net, size=size, batch=batch, count=count, shape=p.shape,
                         window=p.window, strides=p.strides, padding=p.padding,
                         times=cache[p]))
        print(_line(rows[-1]), flush=True)
  result = dict(tool='analysis.benchmarks.pool_bench',
                created=datetime.datetime.now().isoformat(timespec='seconds'),
                machine=machine(), host_speed=speed, versions=versions(),
                backend=jax.default_backend(),
                dtype=FLAGS.dtype, rounds=FLAGS.rounds, repeat=FLAGS.repeat, rows=rows)
  print('\n' + table([result]))
  if FLAGS.out:
    os.makedirs(os.path.dirname(FLAGS.out) or '.', exist_ok=True)
    with open(FLAGS.out, 'w') as f:
      json.dump(result, f, indent=1)


def _line(r) -> str:
  cells = '  '.join(f"{f} {t['forward'] * 1e3:.2f}/{t['forward_backward'] * 1e3:.2f}"
                    for f, t in r['times'].items())
  return (f"{r['net']:10s} {r['size']:3d}² b{r['batch']:<2d} x{r['count']} "
          f"{str(tuple(r['shape'])):18s} {r['window'][0]}×{r['window'][1]}/{r['strides'][0]}"
          f"  ms fwd/fwd+bwd: {cells}")


def table(results) -> str:
  """One line per distinct pool: forward + backward per formulation (ms), the forward pass
  of flax's and jaxpar's, and jaxpar's ratios."""
  first = results[0]['rows'][0]['times'] if results and results[0]['rows'] else {}
  names = list(first)
  lines = ['| compute | pool (input, window/stride) | in | ' + ' | '.join(names) +
           ' | fwd: flax / jaxpar | jaxpar / before | jaxpar / flax | jaxpar / torch |',
           '|---|---|---|' + '---:|' * (len(names) + 4)]
  for result in results:
    seen = {}
    for r in result['rows']:
      key = (tuple(r['shape']), tuple(r['window']), tuple(r['strides']),
             tuple(map(tuple, r['padding'])))
      seen.setdefault(key, (r, []))[1].append(f"{r['net']} {r['size']}²")
    for (shape, window, strides, _), (r, where) in seen.items():
      t = r['times']
      both = lambda f: t[f]['forward_backward']
      cells = ' | '.join(f'{both(f) * 1e3:.2f}' for f in names)
      peer = f"{both('jaxpar') / both('torch'):.2f}" if 'torch' in t else 'n/a'
      lines.append(f"| {result['dtype']} | {'×'.join(map(str, shape))}, "
                   f"{window[0]}×{window[1]}/{strides[0]} | {', '.join(where)} | {cells} | "
                   f"{t['flax']['forward'] * 1e3:.2f} / {t['jaxpar']['forward'] * 1e3:.2f} | "
                   f"{both('jaxpar') / both('before'):.2f} | "
                   f"{both('jaxpar') / both('flax'):.2f} | {peer} |")
  return '\n'.join(lines)


if __name__ == '__main__':
  flags.DEFINE_list('nets', sorted(MODELS), 'Networks.')
  flags.DEFINE_list('sizes', ['32:32', '224:2'], 'input size:per-device batch pairs.')
  flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
  flags.DEFINE_integer('rounds', 15, 'Alternating rounds per pool (median).')
  flags.DEFINE_integer('repeat', 2, 'Calls in a row within a round, the last timed.')
  flags.DEFINE_bool('torch', False, "Also time PyTorch's max_pool2d and its gradient "
                    '(needs the [bench] extra).')
  flags.DEFINE_string('out', None, 'Write the JSON here.')
  app.run(main)
