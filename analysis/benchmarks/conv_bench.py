"""Times every distinct convolution of the four networks in both lowerings: the measurement
behind `conv_impl='auto'` (`jaxpar/models/conv.py`).

  python -m analysis.benchmarks.conv_bench --out analysis/report/conv/conv_bench.json

For each network, input size and per-device batch, the convolutions the train step runs
are collected (shape, kernel, stride, padding) and each distinct one is timed forward +
backward (the gradients w.r.t. input and kernel, as in training) as XLA's
`lax.conv_general_dilated` and as one matmul per kernel tap (`conv_taps`), alternately in
rounds, median of the rounds. The table gives both times, their ratio, the output map's
positions, and whether `auto`'s rule (taps where the output map has at most
`TAPS_MAX_OUTPUT_POSITIONS` positions) picks the faster one; the summary sums each
network's convolution time under XLA, taps, `auto` and the best of the two per shape.
Nothing here is asserted in tests.
"""
import collections
import json
import os
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from jax import lax  # noqa: E402

from analysis.steptime.measure import machine, versions  # noqa: E402
from jaxpar.models import MIN_IMAGE_SIZE, MODELS  # noqa: E402
from jaxpar.models.conv import (TAPS_MAX_OUTPUT_POSITIONS, conv_taps,  # noqa: E402
                                output_positions, use_taps)

_NETS = flags.DEFINE_list('nets', sorted(MODELS), 'Networks.')
_SIZES = flags.DEFINE_list('sizes', ['16:8', '32:8', '32:32', '224:2'],
                           'input size:per-device batch pairs.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Alternating rounds per shape (median).')
_OUT = flags.DEFINE_string('out', None, 'Write the JSON here.')

Conv = collections.namedtuple('Conv', 'lhs rhs strides padding')


def convolutions(net: str, size: int, batch: int, dtype) -> list:
  """Every convolution of `net`'s train step at this input, in order, with its count."""
  seen = []

  def record(lhs, rhs, window_strides, padding, *args, **kwargs):
    if isinstance(padding, str):
      padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding)
    seen.append(Conv(tuple(lhs.shape), tuple(rhs.shape), tuple(window_strides),
                     tuple(tuple(p) for p in padding)))
    return lax.conv_general_dilated(lhs, rhs, window_strides, padding, *args, **kwargs)

  model = MODELS[net](num_classes=10, dtype=dtype,
                      conv=lambda *a, **k: nn.Conv(*a, conv_general_dilated=record, **k))
  x = jnp.zeros((batch, size, size, 1))
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=True))
  seen.clear()
  jax.eval_shape(lambda v: model.apply(v, x, train=True, mutable=['batch_stats'],
                                       rngs={'dropout': jax.random.key(0)}), variables)
  return collections.Counter(seen)


def _fwd_bwd(impl, c: Conv, dtype):
  conv = conv_taps if impl == 'taps' else lax.conv_general_dilated

  def loss(x, w):
    y = conv(x, w, c.strides, c.padding, dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
    return jnp.sum(y.astype(jnp.float32) ** 2)
  f = jax.jit(jax.grad(loss, argnums=(0, 1)))
  x = jax.random.normal(jax.random.key(0), c.lhs, dtype)
  w = jax.random.normal(jax.random.key(1), c.rhs, dtype)
  jax.block_until_ready(f(x, w))  # compile

  def run():
    start = time.perf_counter()
    jax.block_until_ready(f(x, w))
    return time.perf_counter() - start
  return run


def positions(c: Conv) -> int:
  return output_positions(c.lhs, c.rhs, c.strides, c.padding)


def main(argv):
  del argv
  dtype = jnp.dtype(_DTYPE.value)
  rows, cache = [], {}
  for net in _NETS.value:
    for pair in _SIZES.value:
      size, batch = map(int, pair.split(':'))
      if size < MIN_IMAGE_SIZE[net]:
        continue
      for c, count in convolutions(net, size, batch, dtype).items():
        if c not in cache:
          runs = {impl: _fwd_bwd(impl, c, dtype) for impl in ('xla', 'taps')}
          times = {impl: [] for impl in runs}
          for _ in range(_ROUNDS.value):
            for impl, run in runs.items():
              times[impl].append(run())
          cache[c] = {impl: float(np.median(t)) for impl, t in times.items()}
        t, out = cache[c], positions(c)
        rows.append(dict(net=net, size=size, batch=batch, count=count, lhs=c.lhs, rhs=c.rhs,
                         strides=c.strides, padding=c.padding, positions=out,
                         xla_s=t['xla'], taps_s=t['taps'],
                         auto='taps' if use_taps('auto', out, 'cpu') else 'xla'))
        print(f"{net:10s} {size:3d}² b{batch:<2d} x{count:<2d} {str(c.lhs):18s} "
              f"{c.rhs[0]}×{c.rhs[1]}/{c.strides[0]} {c.rhs[2]:4d}→{c.rhs[3]:<4d} "
              f"out {out:4d}  xla {t['xla'] * 1e3:8.2f} ms  taps {t['taps'] * 1e3:8.2f} ms"
              f"  {t['xla'] / t['taps']:6.2f}×  auto={rows[-1]['auto']}", flush=True)
  summary = []
  for (net, size, batch), group in _group(rows).items():
    total = {k: sum(r['count'] * r[f'{k}_s'] for r in group) for k in ('xla', 'taps')}
    total['auto'] = sum(r['count'] * r[f"{r['auto']}_s"] for r in group)
    total['best'] = sum(r['count'] * min(r['xla_s'], r['taps_s']) for r in group)
    summary.append(dict(net=net, size=size, batch=batch, **{f'{k}_s': v for k, v in total.items()}))
  print('\n' + table(summary))
  if _OUT.value:
    os.makedirs(os.path.dirname(_OUT.value) or '.', exist_ok=True)
    with open(_OUT.value, 'w') as f:
      json.dump(dict(machine=machine(), versions=versions(), dtype=_DTYPE.value,
                     rounds=_ROUNDS.value, rule_max_positions=TAPS_MAX_OUTPUT_POSITIONS,
                     rows=rows, summary=summary), f, indent=1)


def table(summary) -> str:
  """Per network, size and batch: the convolutions' forward + backward time summed, by each
  lowering, by `auto`'s choice and by the faster of the two per shape (docs/performance.md)."""
  lines = ['| network | input | batch | XLA (s) | taps (s) | `auto` (s) | best of the two per '
           'shape (s) | `auto` speedup |', '|---|---|---:|---:|---:|---:|---:|---:|']
  for s in summary:
    lines.append(f"| {s['net']} | {s['size']}² | {s['batch']} | {s['xla_s']:.3f} | "
                 f"{s['taps_s']:.3f} | {s['auto_s']:.3f} | {s['best_s']:.3f} | "
                 f"{s['xla_s'] / s['auto_s']:.2f}× |")
  return '\n'.join(lines)


def _group(rows):
  groups = collections.defaultdict(list)
  for r in rows:
    groups[(r['net'], r['size'], r['batch'])].append(r)
  return groups


if __name__ == '__main__':
  app.run(main)
