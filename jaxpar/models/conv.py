"""Convolution lowerings, chosen per shape: XLA's, one matmul per kernel tap, im2col,
Winograd's F(2×2, 3×3), or oneDNN's (`jaxpar/models/onednn.py`).

A 2-D convolution of an input x (N, H, W, C) with a kernel w (kh, kw, C, D), stride
(sh, sw) and padding p, is a sum over the kernel's taps (i, j):

    y[n, a, b, :] = Σ_{i<kh, j<kw} x̃[n, a·sh + i, b·sw + j, :] @ w[i, j]

where x̃ is x padded by p. `conv_taps` computes exactly that: for every tap, the
strided slice of x̃ that the tap sees, times w[i, j] (an (N·oh·ow, C) × (C, D) matmul),
leaving out the taps that see only padding (on a 1×1 map a 3×3 kernel is its centre);
its gradients, by JAX's transposes, are matmuls and pads too. `conv_im2col` computes the
same sum as one matmul of the taps' slices side by side; `conv_winograd` computes 3×3
kernels at stride 1 from 4×4 input tiles with 16 matmuls per 2×2 outputs instead of 36
(Lavin & Gray 2016) — each an exact lowering, equal to XLA's convolution within float
rounding (tests/test_conv.py), selectable by `conv_impl` and timed per geometry by
`analysis.benchmarks.conv_bench`.

Why: XLA's CPU backend computes convolutions whose *output map is small* far below
its speed on larger maps (analysis/report/performance/: forward + backward of a 3×3
256→256 convolution on a 32×2×2 input: 68 ms as `lax.conv_general_dilated`, 7.5 ms as taps;
the same FLOPs on 32×8×8×64: 3.8 ms). On the CPU backend `conv_impl='auto'` takes oneDNN's
convolution where it can run, for float32 above 16 output positions and for every bfloat16
one (`ONEDNN_AUTO_ABOVE`; on a CPU without oneDNN's bfloat16 kernels it computes bfloat16 in
float32, above 16 positions as float32); else, for a geometry in `conv_auto.json`, the lowering whole
train steps confirmed (below), and elsewhere the rule of `use_taps`: taps on small output
maps, XLA's convolution above; GPU and TPU keep XLA's convolutions (docs/performance.md
has the measurements behind each).

Convolutions timed alone do not predict a step: the lowering fastest alone for every
geometry (`conv_choices.json`, `conv_impl='measured'`) made ResNet34's and GoogLeNet's
224² steps 7–8 % faster but VGG16E's 32² step 11 % slower. `auto`'s table keeps only the
choices of a kind (im2col, taps, XLA's, Winograd) whose whole-step A/B in that network
and input size beat the rule (`analysis.benchmarks.conv_step_ab --choices_out`), for the
compute dtype those steps ran in (float32; other dtypes keep the rule).

`conv_general_dilated(impl)` returns a drop-in for `lax.conv_general_dilated`, which
flax's `nn.Conv(conv_general_dilated=...)` accepts: parameters, their names and
checkpoints are the same whichever lowering computes the convolution.
"""
import functools
import json
import os

import jax
import jax.numpy as jnp
from absl import logging
from jax import lax

from jaxpar.models import explicit, onednn

CONV_IMPLS = ('auto', 'measured', 'xla', 'taps', 'im2col', 'winograd', 'onednn')
# `auto` on CPU: taps where the output map has at most this many positions (oh·ow), XLA's
# convolution above. Measured on the four networks' convolutions at 16², 32² and 224²
# (docs/performance.md).
TAPS_MAX_OUTPUT_POSITIONS = 16
# `auto` on CPU, by compute dtype: oneDNN's convolution (`conv_onednn`) where the output map
# has more than this many positions and oneDNN can run here (`onednn.available()`); on
# smaller maps, other dtypes and elsewhere, the table and rule below. Measured in whole
# steps of the four networks at 32² and 224² (docs/performance.md): float32 steps 0.64–0.89×
# the time of the steps before (analysis/report/conv/step_onednn/), oneDNN on the small maps
# too 1.07–1.39× slower at 32²; bfloat16 steps with oneDNN on every map 0.50–0.77× the time
# before (analysis/report/conv/step_onednn_bf16/), and 0.66–0.88× the time of oneDNN above
# 16 positions only at 32² (step_bf16_above16/: XLA's and the per-tap bfloat16 code is slow).
# Where oneDNN has no bfloat16 kernels (an AVX2-only CPU) it computes them in float32
# (`onednn.computes_in`), with float32's threshold: ResNet34's bfloat16 step at 32² (batch 32,
# 1 device) 0.92× the time without oneDNN, and 1.25× with it on every map (docs/performance.md).
ONEDNN_AUTO_ABOVE = {'float32': TAPS_MAX_OUTPUT_POSITIONS, 'bfloat16': 0}
# `measured` on CPU, for a geometry the committed measurement has: the lowering it found
# fastest (forward and both gradients summed, each convolution alone; `conv_choices.json`,
# written by `analysis.benchmarks.conv_bench --choices_out` from
# analysis/report/conv/lowerings_*.json); elsewhere `auto`'s rule.
CHOICES_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'conv_choices.json')
# `auto` on CPU, for a geometry listed: the part of `measured`'s table that whole train steps
# confirmed (`conv_auto.json`, written by `analysis.benchmarks.conv_step_ab --choices_out`
# from analysis/report/conv/step_ab/*.json); elsewhere the rule.
AUTO_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'conv_auto.json')


def geometry_key(lhs_shape, rhs_shape, window_strides, padding) -> str:
  """A convolution's geometry without its batch: input map and channels, kernel and output
  channels, strides, explicit padding (the key of `conv_choices.json`)."""
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(lhs_shape[1:3], rhs_shape[:2], window_strides, padding)
  (pt, pb), (pl, pr) = padding
  h, w, c = lhs_shape[1:]
  kh, kw, _, d = rhs_shape
  return f'{h}x{w}x{c} {kh}x{kw}x{d} /{window_strides[0]}x{window_strides[1]} ' \
         f'pad {pt},{pb},{pl},{pr}'


def measured_choices() -> dict:
  """{geometry_key: lowering} of `conv_choices.json` ({} where the file is absent)."""
  return _table(CHOICES_FILE).get('choices', {})


def auto_choices() -> dict:
  """{geometry_key: lowering} of `conv_auto.json` ({} where the file is absent)."""
  return _table(AUTO_FILE).get('choices', {})


def auto_dtypes() -> tuple:
  """The compute dtypes whose whole steps made `conv_auto.json` (its choices apply to
  those only)."""
  return tuple(_table(AUTO_FILE).get('dtypes', ()))


@functools.cache
def _table(path: str) -> dict:
  """A committed table file, read once ({} where it is absent)."""
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


def write_table(path: str, tool: str, results, fields, made: dict, **extra) -> None:
  """A table file of the kind `_table` reads (`conv_bench --choices_out`, `conv_step_ab
  --choices_out`): the tool that made it, the runs it was made from (their `fields`), any
  `extra` fields, and {geometry_key: lowering}."""
  with open(path, 'w') as f:
    json.dump({'tool': tool, **extra, 'from': [{k: r.get(k) for k in fields} for r in results],
               'choices': made}, f, indent=1, sort_keys=True)
    f.write('\n')
  print(f'wrote {path}: {len(made)} geometries')


def choose(impl: str, lhs_shape, rhs_shape, window_strides, padding,
           backend: str | None = None, dtype=None) -> str:
  """The lowering that computes this convolution under `impl`: `impl` itself, or for 'auto'
  and 'measured' XLA's on GPU and TPU; on the CPU for 'auto' oneDNN's on output maps of
  more than `ONEDNN_AUTO_ABOVE[d]` positions (d: the dtype it computes `dtype` in) where
  `onednn_in_auto` (oneDNN available);
  otherwise the lowering its table has for this geometry
  (`auto_choices`: confirmed in whole steps of the compute dtypes `auto_dtypes`, and for
  those only where `dtype` is given; `measured_choices`: fastest alone), and otherwise taps
  on small output maps (`use_taps`) and XLA's above."""
  if impl not in ('auto', 'measured'):
    return impl
  backend = backend or jax.default_backend()
  if backend != 'cpu':
    return 'xla'
  positions = output_positions(lhs_shape, rhs_shape, window_strides, padding)
  if impl == 'auto' and onednn_in_auto(dtype) and positions > ONEDNN_AUTO_ABOVE[
      onednn.computes_in(dtype or jnp.float32).name]:  # the threshold of the dtype it computes in
    return 'onednn'
  if impl == 'measured':
    table = measured_choices()
  else:
    judged = dtype is None or jnp.dtype(dtype).name in auto_dtypes()
    table = auto_choices() if judged else {}
  found = table.get(geometry_key(lhs_shape, rhs_shape, window_strides, padding))
  if found:
    return found
  return 'taps' if use_taps('auto', positions, backend) else 'xla'


def onednn_in_auto(dtype=None) -> bool:
  """Whether `auto` computes this dtype's CPU convolutions by oneDNN: where it can run here
  (`onednn.available()`; JAXPAR_ONEDNN=0 turns it off) and for the compute dtypes whole
  steps measured it faster in (`ONEDNN_AUTO_ABOVE`; None: a float32 step's); bfloat16 on a
  CPU without oneDNN's bfloat16 kernels in float32 (`onednn.computes_in`, logged)."""
  judged = dtype is None or jnp.dtype(dtype).name in ONEDNN_AUTO_ABOVE
  if not judged:
    return False
  if not onednn.available():
    _say_once(f"conv_impl='auto': oneDNN's convolutions cannot run here "
              f'({onednn.unavailable_reason()}); XLA\'s and the per-tap lowerings compute them')
    return False
  _say_once(f"conv_impl='auto': oneDNN's convolutions compute the {', '.join(ONEDNN_AUTO_ABOVE)} "
            f'convolutions on CPU ({onednn.library()})')
  name = jnp.dtype(dtype or jnp.float32).name
  compute = onednn.computes_in(name)
  if compute is None:  # no kernels here of it, nor of float32
    _say_once(f"conv_impl='auto': {onednn.native_reason(name)}; XLA's and the per-tap "
              f'lowerings compute the {name} convolutions')
    return False
  if compute != name:
    _say_once(f"conv_impl='auto': {onednn.native_reason(name)}: it computes the {name} "
              f'convolutions in {compute}, each result rounded to {name} once')
  return True


@functools.cache
def _say_once(line: str) -> None:
  logging.info('%s', line)


def use_taps(impl: str, out_positions: int, backend: str | None = None) -> bool:
  """Whether `impl` computes a convolution with an output map of `out_positions` by taps."""
  if impl != 'auto':
    return impl == 'taps'
  backend = backend or jax.default_backend()
  return backend == 'cpu' and out_positions <= TAPS_MAX_OUTPUT_POSITIONS


def _is_nhwc_hwio(dimension_numbers, ndim) -> bool:
  if ndim != 4:
    return False
  if dimension_numbers is None:  # lax's default is NCHW/OIHW
    return False
  dn = lax.conv_dimension_numbers((1,) * 4, (1,) * 4, dimension_numbers)
  return (dn.lhs_spec, dn.rhs_spec, dn.out_spec) == ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def _plain(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers,
           feature_group_count, batch_group_count):
  """The explicit padding ((pt, pb), (pl, pr)) of a convolution the hand lowerings compute —
  NHWC × HWIO, no dilation, no groups, no negative padding — or None (XLA's then)."""
  plain = (_is_nhwc_hwio(dimension_numbers, lhs.ndim) and feature_group_count == 1
           and batch_group_count == 1 and all(d == 1 for d in (lhs_dilation or (1, 1)))
           and all(d == 1 for d in (rhs_dilation or (1, 1))))
  if not plain:
    return None
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(lhs.shape[1:3], rhs.shape[:2], window_strides, padding)
  padding = tuple(tuple(p) for p in padding)
  return None if any(p < 0 for pair in padding for p in pair) else padding


def _accumulation(lhs, rhs, preferred_element_type):
  """(the dtype products and sums accumulate in, the result's dtype). Below float32 they
  accumulate in float32 and round once, as XLA's convolution does: left in bfloat16, the
  kernel gradient (a dot contracting over N·oh·ow positions) is summed in bfloat16 by
  jaxlib 0.12's CPU dot (2-5 % off on an 8×8 map, against 0.3 % for XLA's convolution;
  tests/test_conv.py)."""
  dtype = jnp.result_type(lhs, rhs)
  accumulate = preferred_element_type
  if accumulate is None and jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
    accumulate = jnp.float32
  return accumulate, preferred_element_type or dtype


def _taps_seeing_data(lhs, rhs, window_strides, padding):
  """The padded input, the output map (oh, ow) and the kernel taps (i, j) that read any
  input (a tap that reads padding alone adds zeros: on a 1×1 map a 3×3 kernel is its
  centre)."""
  (pt, pb), (pl, pr) = padding
  x = jnp.pad(lhs, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
  kh, kw = rhs.shape[:2]
  sh, sw = window_strides
  oh, ow = (x.shape[1] - kh) // sh + 1, (x.shape[2] - kw) // sw + 1
  h, w = lhs.shape[1:3]
  taps = [(i, j) for i in range(kh) if _sees_data(i, sh, oh, pt, h)
          for j in range(kw) if _sees_data(j, sw, ow, pl, w)]
  return x, (oh, ow), taps


def _tap(x, i, j, out, strides):
  """The strided slice of the padded input that kernel tap (i, j) multiplies."""
  (oh, ow), (sh, sw) = out, strides
  n, _, _, c = x.shape
  return lax.slice(x, (0, i, j, 0), (n, i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1, c),
                   (1, sh, sw, 1))


def _lowering(compute, applies=lambda lhs, rhs, window_strides: True):
  """A drop-in for `lax.conv_general_dilated` that computes a plain convolution (`_plain`)
  for which `applies(lhs, rhs, window_strides)` holds by
  `compute(lhs, rhs, window_strides, pads, precision, preferred_element_type)`, and every
  other (dilations, feature or batch groups, negative padding, other layouts) by
  `lax.conv_general_dilated` itself."""
  def conv(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
           dimension_numbers=None, feature_group_count=1, batch_group_count=1,
           precision=None, preferred_element_type=None):
    pads = _plain(lhs, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                  dimension_numbers, feature_group_count, batch_group_count)
    if pads is None or not applies(lhs, rhs, window_strides):
      return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation,
                                      rhs_dilation, dimension_numbers, feature_group_count,
                                      batch_group_count, precision, preferred_element_type)
    return compute(lhs, rhs, window_strides, pads, precision, preferred_element_type)
  conv.__name__ = compute.__name__.lstrip('_')
  conv.__doc__ = compute.__doc__
  return conv


def _conv_taps(lhs, rhs, window_strides, pads, precision, preferred_element_type):
  """`lax.conv_general_dilated`, NHWC × HWIO, as one matmul per kernel tap (module doc).
  Other geometries and layouts: `lax.conv_general_dilated`."""
  x, out_map, taps = _taps_seeing_data(lhs, rhs, window_strides, pads)
  accumulate, result = _accumulation(lhs, rhs, preferred_element_type)
  out = None
  for i, j in taps:
    y = jnp.einsum('nhwc,cd->nhwd', _tap(x, i, j, out_map, window_strides), rhs[i, j],
                   precision=precision, preferred_element_type=accumulate)
    out = y if out is None else out + y
  return out.astype(result)


def _conv_im2col(lhs, rhs, window_strides, pads, precision, preferred_element_type):
  """`lax.conv_general_dilated`, NHWC × HWIO, as one matmul: the slices every kernel tap
  sees, side by side along the channels (N, oh, ow, T·C) — im2col — times the kernel's
  taps stacked (T·C, D), T the taps that read data:

      y[n, a, b, :] = [x̃_{t₁}[n, a, b, :], …, x̃_{t_T}[n, a, b, :]] @ [w_{t₁}; …; w_{t_T}]

  the same sum as `conv_taps`, in one contraction of depth T·C. Other geometries and
  layouts: `lax.conv_general_dilated`."""
  x, out_map, taps = _taps_seeing_data(lhs, rhs, window_strides, pads)
  accumulate, result = _accumulation(lhs, rhs, preferred_element_type)
  patches = jnp.concatenate([_tap(x, i, j, out_map, window_strides) for i, j in taps], -1)
  kernel = jnp.concatenate([rhs[i, j] for i, j in taps], 0)
  return jnp.einsum('nhwk,kd->nhwd', patches, kernel, precision=precision,
                    preferred_element_type=accumulate).astype(result)


conv_taps = _lowering(_conv_taps)
conv_im2col = _lowering(_conv_im2col)


# Winograd's F(2×2, 3×3) (Lavin & Gray 2016): a 2×2 output tile of a 3×3 convolution from
# a 4×4 input tile d as  Y = Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A.
_BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
_G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))
_AT = ((1, 1, 1, 0), (0, 1, -1, -1))


def _combine(coefficients, terms):
  """Σ_k coefficients[k] · terms[k], leaving out zero coefficients (the transforms' entries
  are 0, ±1 and ±½: adds and subtracts, no products)."""
  out = None
  for c, t in zip(coefficients, terms):
    if c:
      term = t if c == 1 else -t if c == -1 else c * t
      out = term if out is None else out + term
  return out


def winograd_applies(rhs_shape, window_strides) -> bool:
  """Whether `conv_winograd` computes this convolution itself: 3×3 kernels at stride 1."""
  return tuple(rhs_shape[:2]) == (3, 3) and tuple(window_strides) == (1, 1)


def _conv_winograd(lhs, rhs, window_strides, pads, precision, preferred_element_type):
  """`lax.conv_general_dilated` for 3×3 kernels at stride 1, NHWC × HWIO, by Winograd's
  F(2×2, 3×3): the padded input cut into 4×4 tiles at stride 2 (the map padded to whole
  tiles), each tile transformed V = Bᵀ d B and the kernel U = G g Gᵀ, then for each of the
  16 transformed positions one matmul M = V @ U over all tiles — 16 (C × D) products per
  four outputs where the direct sum takes 36 — and the 2×2 outputs Y = Aᵀ M A, cropped to
  the map. Exact in exact arithmetic; in floating point the transforms' adds round
  differently from a direct sum (tests/test_conv.py bounds it). Below float32 the whole
  computation runs in float32 and rounds once. Other kernels, strides, geometries and
  layouts: `lax.conv_general_dilated`."""
  accumulate, result = _accumulation(lhs, rhs, preferred_element_type)
  work = accumulate or result
  (pt, pb), (pl, pr) = pads
  n, h, w, c = lhs.shape
  oh, ow = h + pt + pb - 2, w + pl + pr - 2
  th, tw = -(-oh // 2), -(-ow // 2)  # tiles
  x = jnp.pad(lhs.astype(work), ((0, 0), (pt, pb + 2 * th - oh), (pl, pr + 2 * tw - ow), (0, 0)))
  # d[u][v]: the (u, v) element of every tile, (N, th, tw, C).
  d = [[lax.slice(x, (0, u, v, 0), (n, u + 2 * th - 1, v + 2 * tw - 1, c), (1, 2, 2, 1))
        for v in range(4)] for u in range(4)]
  rows = [[_combine(_BT[a], [d[u][v] for u in range(4)]) for v in range(4)] for a in range(4)]
  v_tiles = jnp.stack([_combine(_BT[b], rows[a]) for a in range(4) for b in range(4)])
  g = rhs.astype(work)
  g_rows = [[_combine(_G[a], [g[i, j] for i in range(3)]) for j in range(3)] for a in range(4)]
  u_kernel = jnp.stack([_combine(_G[b], g_rows[a]) for a in range(4) for b in range(4)])
  m = jnp.einsum('knhwc,kcd->knhwd', v_tiles, u_kernel, precision=precision,
                 preferred_element_type=accumulate)
  m = [[m[4 * a + b] for b in range(4)] for a in range(4)]
  m_rows = [[_combine(_AT[r], [m[a][b] for a in range(4)]) for b in range(4)] for r in range(2)]
  y = [[_combine(_AT[s], m_rows[r]) for s in range(2)] for r in range(2)]
  # Interleave the tiles' 2×2 outputs: (N, th, 2, tw, 2, D) → (N, 2·th, 2·tw, D), cropped.
  out = jnp.stack([jnp.stack(y[r], axis=3) for r in range(2)], axis=2)
  out = explicit.reshape(out, (n, 2 * th, 2 * tw, rhs.shape[3]))[:, :oh, :ow]
  return out.astype(result)


conv_winograd = _lowering(_conv_winograd,
                          lambda lhs, rhs, window_strides: winograd_applies(rhs.shape,
                                                                            window_strides))


def _sees_data(offset: int, stride: int, out: int, pad_before: int, size: int) -> bool:
  """Whether a tap at `offset` reads any input row (not only padding): a tap that reads
  padding alone adds zeros, and is left out (a 3×3 kernel on a 1×1 map is its centre)."""
  return any(pad_before <= offset + a * stride < pad_before + size for a in range(out))


def output_positions(lhs_shape, rhs_shape, window_strides, padding) -> int:
  """oh·ow: the positions of the output map of an NHWC × HWIO convolution."""
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(lhs_shape[1:3], rhs_shape[:2], window_strides, padding)
  return ((lhs_shape[1] + sum(padding[0]) - rhs_shape[0]) // window_strides[0] + 1) * \
         ((lhs_shape[2] + sum(padding[1]) - rhs_shape[1]) // window_strides[1] + 1)


# oneDNN's on the CPU backend where it can run (config validation fails `conv_impl='onednn'`
# where it cannot); XLA's elsewhere, and (`onednn.conv_onednn`) for dtypes other than
# float32 and bfloat16.
conv_onednn = _lowering(
    onednn.conv_onednn,
    lambda lhs, rhs, window_strides: jax.default_backend() == 'cpu' and onednn.available())

LOWERINGS = {'xla': lax.conv_general_dilated, 'taps': conv_taps, 'im2col': conv_im2col,
             'winograd': conv_winograd, 'onednn': conv_onednn}


def conv_general_dilated(impl: str):
  """A drop-in for `lax.conv_general_dilated` (NHWC/HWIO, as flax's `nn.Conv` calls it)
  that computes each convolution by the lowering `impl` names, or for 'auto' and 'measured'
  the one `choose` picks for its geometry."""
  if impl not in ('auto', 'measured'):
    return LOWERINGS[impl]

  @functools.wraps(lax.conv_general_dilated)
  def conv(lhs, rhs, window_strides, padding, *args, **kwargs):
    lowering = choose(impl, lhs.shape, rhs.shape, window_strides, padding, dtype=lhs.dtype)
    return LOWERINGS[lowering](lhs, rhs, window_strides, padding, *args, **kwargs)
  return conv
