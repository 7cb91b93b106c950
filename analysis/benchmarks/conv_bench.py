"""Times every distinct convolution of the four networks in every exact lowering, pass by
pass, beside PyTorch's: the measurement behind `conv_impl='auto'` (`jaxpar/models/conv.py`).

  python -m analysis.benchmarks.conv_bench --out analysis/report/conv/conv_bench.json
  python -m analysis.benchmarks.conv_bench --nets=vgg16e --sizes=224:2 --dtype=bfloat16

For each network, input size and per-device batch, the convolutions the train step runs
are collected (shape, kernel, stride, padding), and each distinct one is timed in its
three passes — the forward convolution, the input gradient and the kernel gradient (a
train step runs each once) — in every lowering jaxpar can compute it by: XLA's
`lax.conv_general_dilated` in NHWC (what flax's `nn.Conv` asks for) and in NCHW, one matmul
per kernel tap (`taps`), one matmul over the taps' slices side by side (`im2col`),
Winograd's F(2×2, 3×3) where the kernel is 3×3 at stride 1, and oneDNN's primitives as FFI
calls (`onednn`); and with `--torch` PyTorch's `conv2d` and its two gradients
(`torch.nn.grad`, NCHW, oneDNN on a CPU) on the same shapes. All of them alternately in
rounds, median of the rounds. The summary sums each network's convolution time (count ×
the three passes) per lowering, under `auto`'s choice, under the fastest lowering per
geometry, and PyTorch's; `passes_table` sums each pass apart (forward or backward: where a
lead comes from). Nothing here is asserted in tests; the lowerings' exactness is
(tests/test_conv.py, tests/test_onednn.py).
"""
import collections
import datetime
import json
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from jax import lax  # noqa: E402

from analysis.benchmarks.alternate import call_timer, host_speed, jax_timer, medians  # noqa: E402
from analysis.steptime.measure import machine, versions  # noqa: E402
from jaxpar.models import MIN_IMAGE_SIZE, MODELS  # noqa: E402
from jaxpar.models.conv import (LOWERINGS, TAPS_MAX_OUTPUT_POSITIONS,  # noqa: E402
                                choose, geometry_key, output_positions, winograd_applies,
                                write_table)

_NETS = flags.DEFINE_list('nets', sorted(MODELS), 'Networks.')
_SIZES = flags.DEFINE_list('sizes', ['16:8', '32:8', '32:32', '224:2'],
                           'input size:per-device batch pairs.')
_DTYPE = flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
_ROUNDS = flags.DEFINE_integer('rounds', 5, 'Alternating rounds per shape (median).')
_REPEAT = flags.DEFINE_integer('repeat', 2, 'Calls of a pass in a row within a round, the '
                               'last timed (1: each pass timed right after another '
                               "lowering's, whose threads may still hold the cores).")
_IMPLS = flags.DEFINE_list('impls', ['xla', 'xla_nchw', 'taps', 'im2col', 'winograd', 'onednn'],
                           'Lowerings to time (winograd only where it applies).')
_TORCH = flags.DEFINE_bool('torch', False, "Also time PyTorch's conv2d and its gradients "
                           "(needs the [bench] extra).")
_OUT = flags.DEFINE_string('out', None, 'Write the JSON here.')
_FROM = flags.DEFINE_list('from_json', [], 'Measure nothing: read these files of this tool.')
_CHOICES = flags.DEFINE_string('choices_out', None, "Write `auto`'s table (jaxpar/models/"
                               'conv_choices.json) from the rows: each geometry\'s fastest '
                               'lowering.')

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


PASSES = ('forward', 'input_grad', 'kernel_grad')
NHWC = ('NHWC', 'HWIO', 'NHWC')
NCHW = ('NCHW', 'OIHW', 'NCHW')


def jax_passes(impl: str, c: Conv, dtype) -> dict:
  """{pass: timer} of lowering `impl` ('xla_nchw': XLA's convolution on NCHW/OIHW arrays,
  transposed outside the timed call) for geometry `c`."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=c.lhs), dtype)
  w = jnp.asarray(rng.normal(size=c.rhs), dtype)
  if impl == 'xla_nchw':
    conv, dn = lax.conv_general_dilated, NCHW
    x, w = jnp.transpose(x, (0, 3, 1, 2)), jnp.transpose(w, (3, 2, 0, 1))
  else:
    conv, dn = LOWERINGS[impl], NHWC
  f = lambda x, w: conv(x, w, c.strides, c.padding, dimension_numbers=dn)
  dy = jnp.asarray(rng.normal(size=jax.eval_shape(f, x, w).shape), dtype)
  input_grad = lambda x, w, dy: jax.vjp(lambda x: f(x, w), x)[1](dy)[0]
  kernel_grad = lambda x, w, dy: jax.vjp(lambda w: f(x, w), w)[1](dy)[0]
  return {'forward': jax_timer(jax.jit(f), x, w),
          'input_grad': jax_timer(jax.jit(input_grad), x, w, dy),
          'kernel_grad': jax_timer(jax.jit(kernel_grad), x, w, dy)}


def torch_passes(c: Conv, dtype) -> dict:
  """{pass: timer} of PyTorch's convolution of geometry `c` (NCHW, as torchvision's networks
  run; an asymmetric padding is padded explicitly first, inside the timed call)."""
  import torch
  import torch.nn.functional as F
  torch.set_num_threads(os.cpu_count())
  tdtype = {jnp.dtype(jnp.float32): torch.float32, jnp.dtype(jnp.bfloat16): torch.bfloat16}[
      jnp.dtype(dtype)]
  g = torch.Generator().manual_seed(0)
  n, h, w_, ci = c.lhs
  kh, kw, _, co = c.rhs
  x = torch.randn(n, ci, h, w_, generator=g).to(tdtype)
  w = torch.randn(co, ci, kh, kw, generator=g).to(tdtype)
  (pt, pb), (pl, pr) = c.padding
  if pt == pb and pl == pr:
    pad, prepad = (pt, pl), lambda t: t
  else:
    pad, prepad = (0, 0), lambda t: F.pad(t, (pl, pr, pt, pb))
  with torch.no_grad():
    dy = torch.randn(F.conv2d(prepad(x), w, stride=c.strides, padding=pad).shape,
                     generator=g).to(tdtype)

  def timer(f):
    def call():
      with torch.no_grad():
        f()
    return call_timer(call)
  return {'forward': timer(lambda: F.conv2d(prepad(x), w, stride=c.strides, padding=pad)),
          'input_grad': timer(lambda: torch.nn.grad.conv2d_input(
              prepad(x).shape, w, dy, stride=c.strides, padding=pad)),
          'kernel_grad': timer(lambda: torch.nn.grad.conv2d_weight(
              prepad(x), w.shape, dy, stride=c.strides, padding=pad))}


def time_geometry(c: Conv, dtype, impls, rounds: int, torch: bool, repeat: int = 2) -> dict:
  """{lowering: {pass: median seconds}} for geometry `c`, every lowering's passes alternating
  in each round, each called `repeat` times in a row and the last call timed
  (`alternate.medians`). Winograd only where it applies."""
  timers = {impl: jax_passes(impl, c, dtype) for impl in impls
            if impl != 'winograd' or winograd_applies(c.rhs, c.strides)}
  if torch:
    timers['torch'] = torch_passes(c, dtype)
  return medians(timers, rounds, repeat)


def total(times: dict) -> float:
  """A lowering's time for a train step's three passes of one convolution."""
  return sum(times[p] for p in PASSES)


def positions(c: Conv) -> int:
  return output_positions(c.lhs, c.rhs, c.strides, c.padding)


CHOOSABLE = ('xla', 'taps', 'im2col', 'winograd', 'onednn')  # `auto` keeps NHWC: no transposes


def choices(results) -> dict:
  """{geometry_key: the fastest of `CHOOSABLE` (three passes summed)} over the rows of these
  runs (float32 ones); a geometry whose runs (other batches) disagree is left out, to the
  rule."""
  found = {}
  for result in results:
    if result.get('dtype', 'float32') != 'float32':
      continue
    for r in result['rows']:
      times = {k: total(v) for k, v in r.get('times', {}).items() if k in CHOOSABLE}
      if times:
        key = geometry_key(r['lhs'], r['rhs'], r['strides'], r['padding'])
        found.setdefault(key, set()).add(min(times, key=times.get))
  return {k: v.pop() for k, v in sorted(found.items()) if len(v) == 1}


def write_choices(results, path: str) -> None:
  write_table(path, 'analysis.benchmarks.conv_bench --choices_out', results,
              ('created', 'machine', 'versions', 'dtype'), choices(results))


def main(argv):
  del argv
  if _FROM.value:
    results = []
    for path in _FROM.value:
      with open(path) as f:
        results.append(json.load(f))
    for result in results:
      print(lowerings_table(result['summary']))
    if _CHOICES.value:
      write_choices(results, _CHOICES.value)
    return
  speed = host_speed()  # before anything compiles or runs
  dtype = jnp.dtype(_DTYPE.value)
  rows, cache = [], {}
  for net in _NETS.value:
    for pair in _SIZES.value:
      size, batch = map(int, pair.split(':'))
      if size < MIN_IMAGE_SIZE[net]:
        continue
      for c, count in convolutions(net, size, batch, dtype).items():
        if c not in cache:
          cache[c] = time_geometry(c, dtype, _IMPLS.value, _ROUNDS.value, _TORCH.value,
                                   _REPEAT.value)
        t, out = cache[c], positions(c)
        auto = choose('auto', c.lhs, c.rhs, c.strides, c.padding, 'cpu', dtype)
        jaxs = {k: total(v) for k, v in t.items() if k != 'torch'}
        rows.append(dict(net=net, size=size, batch=batch, count=count, lhs=c.lhs, rhs=c.rhs,
                         strides=c.strides, padding=c.padding, positions=out, times=t,
                         auto=auto, fastest=min(jaxs, key=jaxs.get)))
        cells = '  '.join(f'{k} {v * 1e3:8.2f}' for k, v in jaxs.items())
        peer = f"  torch {total(t['torch']) * 1e3:8.2f}" if 'torch' in t else ''
        print(f"{net:10s} {size:3d}² b{batch:<2d} x{count:<2d} {str(c.lhs):18s} "
              f"{c.rhs[0]}×{c.rhs[1]}/{c.strides[0]} {c.rhs[2]:4d}→{c.rhs[3]:<4d} "
              f"out {out:5d}  ms: {cells}{peer}  auto={auto}", flush=True)
  result = dict(tool='analysis.benchmarks.conv_bench',
                created=datetime.datetime.now().isoformat(timespec='seconds'),
                machine=machine(), host_speed=speed, versions=versions(),
                backend=jax.default_backend(),
                dtype=_DTYPE.value, rounds=_ROUNDS.value, repeat=_REPEAT.value,
                rule_max_positions=TAPS_MAX_OUTPUT_POSITIONS, rows=rows,
                summary=summarize(rows))
  print('\n' + lowerings_table(result['summary']))
  if _OUT.value:
    os.makedirs(os.path.dirname(_OUT.value) or '.', exist_ok=True)
    with open(_OUT.value, 'w') as f:
      json.dump(result, f, indent=1)
  if _CHOICES.value:
    write_choices([result], _CHOICES.value)


def _seconds(row, impl) -> float:
  """A row's three passes by `impl`; a lowering that does not apply there (Winograd off 3×3
  stride 1) falls back to XLA's convolution, so XLA's time."""
  t = row['times']
  return total(t[impl] if impl in t else t['xla'])


def summarize(rows) -> list:
  """Per network, size and batch: Σ count × the three passes, per lowering, under `auto`'s
  choice, under the fastest lowering `auto` can choose per geometry ('best': NHWC, so not
  XLA's NCHW), and PyTorch's ('torch')."""
  summary = []
  for (net, size, batch), group in _group(rows).items():
    impls = sorted({k for r in group for k in r['times']} - {'torch'})
    entry = dict(net=net, size=size, batch=batch)
    for impl in impls:
      entry[f'{impl}_s'] = sum(r['count'] * _seconds(r, impl) for r in group)
    entry['auto_s'] = sum(r['count'] * _seconds(r, r['auto']) for r in group)
    entry['best_s'] = sum(r['count'] * min(_seconds(r, i) for i in impls if i in CHOOSABLE)
                          for r in group)
    if all('torch' in r['times'] for r in group):
      entry['torch_s'] = sum(r['count'] * total(r['times']['torch']) for r in group)
    summary.append(entry)
  return summary


def lowerings_table(summary) -> str:
  """Per network, size and batch: its convolutions' three passes summed by each lowering,
  `auto`, the fastest per geometry, and PyTorch's, in seconds."""
  impls = [k[:-2] for k in summary[0] if k.endswith('_s')]
  lines = ['| network | input | batch | ' + ' | '.join(f'{i} (s)' for i in impls)
           + (' | PyTorch ÷ best |' if 'torch' in impls else ' |'),
           '|---|---|---:|' + '---:|' * (len(impls) + ('torch' in impls))]
  for s in summary:
    cells = ' | '.join(f"{s[f'{i}_s']:.4f}" for i in impls)
    ratio = f" | {s['torch_s'] / s['best_s']:.2f}×" if 'torch_s' in s else ''
    lines.append(f"| {s['net']} | {s['size']}² | {s['batch']} | {cells}{ratio} |")
  return '\n'.join(lines)


def passes_table(rows, impls=('xla', 'onednn', 'torch')) -> str:
  """Per network, size and batch: each pass (forward, input gradient, kernel gradient)
  summed over the network's convolutions (count × median), by each of `impls`, and
  PyTorch's time over oneDNN's per pass — where a lead comes from, forward or backward."""
  names = {'xla': "XLA's", 'onednn': 'oneDNN', 'torch': 'PyTorch'}
  short = {'forward': 'fwd', 'input_grad': 'dx', 'kernel_grad': 'dw'}
  head = [f'{names.get(i, i)} {short[p]} (ms)' for i in impls for p in PASSES]
  ratio = 'onednn' in impls and 'torch' in impls
  lines = ['| network | input | batch | ' + ' | '.join(head)
           + (' | PyTorch ÷ oneDNN: fwd, dx, dw, all |' if ratio else ' |'),
           '|---|---|---:|' + '---:|' * (len(head) + ratio)]
  for (net, size, batch), group in _group(rows).items():
    sums = {i: {p: sum(r['count'] * r['times'][i][p] for r in group) for p in PASSES}
            for i in impls}
    cells = ' | '.join(f'{sums[i][p] * 1e3:.1f}' for i in impls for p in PASSES)
    if ratio:
      each = [sums['torch'][p] / sums['onednn'][p] for p in PASSES]
      whole = sum(sums['torch'].values()) / sum(sums['onednn'].values())
      cells += ' | ' + ', '.join(f'{v:.2f}' for v in each) + f', **{whole:.2f}×**'
    lines.append(f'| {net} | {size}² | {batch} | {cells} |')
  return '\n'.join(lines)


def table(summary) -> str:
  """Per network, size and batch: the convolutions' forward + backward time summed, by XLA's
  lowering and the per-tap one, by `auto`'s choice and by the fastest lowering per shape
  (of XLA's and the taps in files before im2col and Winograd; docs/performance.md)."""
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
