"""Max-pooling that XLA's CPU backend computes fast, forward and gradient: `max_pool`, a
drop-in for flax's `nn.max_pool` on NHWC maps.

The forward pass,

    y[n, a, b, c] = max_{i<kh, j<kw} x̃[n, a·sh + i, b·sw + j, c]     (x̃: x padded with −∞),

is the elementwise maximum of the kh·kw strided slices x̃_t (one per tap), which XLA fuses
into one loop; its `reduce_window`, flax's, took up to 8× as long on these networks' pools
in float32 and up to 11× in bfloat16 (below float32 the maximum runs in float32: exact, and
XLA's CPU bfloat16 elementwise code is slow; `analysis.benchmarks.pool_bench`,
docs/performance.md).

The gradient sends each dy[n, a, b, c] to the *first* window element, in row-major tap
order, that equals the maximum — the element JAX's own gradient picks
(`select_and_scatter_add` with a ≥ selection keeps the first maximum):

    taken₀ = 0;  m_t = (x̃_t == y) ∧ ¬taken_{t−1};  taken_t = taken_{t−1} ∨ m_t
    dx̃ = Σ_t place_t(m_t · dy),

place_t the transpose of tap t's strided slice. Computed per stride phase: the padded-map
positions p ≡ r (mod s) (per axis) only receive from the taps with i ≡ r (mod s), position
p = q·s + r from output a = q − ⌊i/s⌋, so

    D_{r,r'}[q, q'] = Σ_{i ≡ r, j ≡ r'} (m_{ij} · dy)[q − ⌊i/s⌋, q' − ⌊j/s'⌋]      (0 outside)

is a sum of shifted pooled-size arrays (≤ 4 for 3×3 at stride 2), and dx̃ interleaves the
s·s' phases (dx̃[q·s + r, q'·s' + r'] = D_{r,r'}[q, q']: a stack and a reshape) or, where the
windows overlap and the pool is unpadded, sums each phase repeated s×s' times and kept where
(p mod s, p' mod s') = (r, r') — the faster of the two there, measured per pool (`assembly`;
SqueezeNet's unpadded 3×3/2 on odd maps 0.43–0.64× the interleaving's time, the padded pools
the other way round; why XLA's loops differ so was not found). Every term is elementwise, a
pad or a reshape, which XLA fuses into one loop over dx̃ that reads pooled-size arrays; XLA's
CPU `select_and_scatter` runs a scalar loop instead — 4–25× slower on these networks' pools
(the 2×2/2 pool on VGG16E's 2×224×224×64: 50 ms against 2 ms; docs/performance.md), on 224²
inputs a larger share of GoogLeNet's and SqueezeNet's step than their convolutions. The first
formulation (`gradient='full'`: each m_t · dy placed at full size with the stride's
interior zeros, 9 full-size terms for 3×3) is kept for the A/B
(`analysis.benchmarks.conv_step_ab`'s `pool_full`). Forward and backward together, the 224²
pools took 0.16–0.82× the time of these formulations before (reduce_window, taps at full
size) in float32, 0.02–0.12× flax's, and every pool 0.09–0.85× PyTorch's `max_pool2d` (NCHW;
`analysis.benchmarks.pool_bench`).

Exact: the forward pass is the same maximum (a maximum is exact in any order, and float32
holds every bfloat16); the same elements receive the same cotangents; where windows overlap
(3×3 at stride 1 and 2) an element's contributions are summed in another order, so equal
within float rounding (tests/test_pooling.py, with ties). Below float32 the backward pass
runs in float32 and rounds once (XLA's CPU bfloat16 elementwise code is slower than its loop
there). On GPU and TPU `max_pool` is flax's (XLA's gradient there was not measured slow).

The formulations the benchmarks compare are `max_pool`'s keyword arguments; a network takes
its pool as a field (`pool`, this `max_pool` by default), so an A/B builds it with
`functools.partial(max_pool, forward=..., gradient=...)`.
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from jaxpar.models import explicit


FORWARDS = ('slices', 'reduce_window', 'flax')  # flax: nn.max_pool, forward and gradient
GRADIENTS = ('phases', 'full')
ASSEMBLIES = ('auto', 'interleave', 'parity')  # how the phases make dx̃; auto: the rule


def max_pool(x, window_shape, strides=None, padding='VALID', *, forward: str = 'slices',
             gradient: str = 'phases', assembly: str = 'auto'):
  """`nn.max_pool(x, window_shape, strides, padding)` computed as above on the CPU backend
  (NHWC input); flax's elsewhere. `forward`, `gradient` and `assembly` choose among the
  formulations above (the defaults: the fastest measured; `forward='flax'`: flax's pool)."""
  for name, value, known in (('forward', forward, FORWARDS), ('gradient', gradient, GRADIENTS),
                             ('assembly', assembly, ASSEMBLIES)):
    if value not in known:
      raise ValueError(f'max_pool: {name}={value!r}; choose one of {known}')
  if (forward == 'flax' or x.ndim != 4 or len(window_shape) != 2
      or jax.default_backend() != 'cpu'):
    return nn.max_pool(x, window_shape, strides, padding)
  return _max_pool(x, *geometry(x.shape, window_shape, strides, padding), forward, gradient,
                   assembly)


def geometry(shape, window_shape, strides=None, padding='VALID') -> tuple:
  """(window, strides, padding) of a 2-D pool on NHWC maps of `shape` as tuples, the padding
  as (low, high) per spatial axis (flax's 'VALID' and 'SAME' resolved)."""
  strides = tuple(strides or (1,) * len(window_shape))
  if isinstance(padding, str):
    padding = lax.padtype_to_pads(shape[1:3], window_shape, strides, padding)
  return tuple(window_shape), strides, tuple(tuple(p) for p in padding)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3, 4, 5, 6))
def _max_pool(x, window, strides, padding, forward, gradient, assembly):
  if forward == 'reduce_window':
    return lax.reduce_window(x, jnp.array(-jnp.inf, x.dtype), lax.max, (1, *window, 1),
                             (1, *strides, 1), ((0, 0), *padding, (0, 0)))
  wide = x.astype(jnp.float32) if jnp.finfo(x.dtype).bits < 32 else x
  xp = jnp.pad(wide, ((0, 0), *padding, (0, 0)), constant_values=-jnp.inf)
  out = tuple((xp.shape[k + 1] - window[k]) // strides[k] + 1 for k in (0, 1))
  y = None
  for _, _, seen in _taps(xp, window, strides, out):
    y = seen if y is None else jnp.maximum(y, seen)
  return y.astype(x.dtype)


def _forward(x, window, strides, padding, forward, gradient, assembly):
  y = _max_pool(x, window, strides, padding, forward, gradient, assembly)
  return y, (x, y)


def _taps(xp, window, strides, out):
  """Yields (i, j, x̃_ij) in row-major tap order: the strided slice of the padded map `xp`
  that tap (i, j) reads, one element per output position (`out`: the output's (h, w))."""
  n, c = xp.shape[0], xp.shape[3]
  for i in range(window[0]):
    for j in range(window[1]):
      yield i, j, lax.slice(xp, (0, i, j, 0), (n, i + (out[0] - 1) * strides[0] + 1,
                                               j + (out[1] - 1) * strides[1] + 1, c),
                            (1, *strides, 1))


def _first_maxima(xp, y, window, strides):
  """Yields (i, j, m_ij): tap (i, j)'s mask of the output positions whose first maximum it
  holds (m_t above), taps in row-major order."""
  taken = None
  for i, j, seen in _taps(xp, window, strides, y.shape[1:3]):
    first = seen == y if taken is None else (seen == y) & ~taken
    taken = first if taken is None else taken | first
    yield i, j, first


def _backward(window, strides, padding, forward, gradient, assembly, residuals, dy):
  x, y = residuals
  # Below float32 in float32, rounded once: XLA's CPU code for bfloat16 elementwise ops is
  # slower than its `select_and_scatter` (GoogLeNet's pools 1.2–1.4× its time); the masks
  # compare the same values, and each sum rounds once instead of once per term.
  out_dtype = dy.dtype
  if jnp.finfo(dy.dtype).bits < 32:
    x, y, dy = (t.astype(jnp.float32) for t in (x, y, dy))
  n, h, w, c = x.shape
  oh, ow = y.shape[1:3]
  (pt, pb), (pl, pr) = padding
  sh, sw = strides
  xp = jnp.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=-jnp.inf)
  hp, wp = xp.shape[1:3]
  zero = jnp.zeros((), dy.dtype)
  if gradient == 'full':
    dxp = None
    for i, j, first in _first_maxima(xp, y, window, strides):
      # place_t: each output position back where tap (i, j) read it.
      placed = lax.pad(jnp.where(first, dy, zero), zero,
                       ((0, 0, 0), (i, hp - i - (oh - 1) * sh - 1, sh - 1),
                        (j, wp - j - (ow - 1) * sw - 1, sw - 1), (0, 0, 0)))
      dxp = placed if dxp is None else dxp + placed
    return (dxp[:, pt:pt + h, pl:pl + w].astype(out_dtype),)
  # Per stride phase: D[r, r'] of shape (n, hq, wq, c), then assembled.
  hq, wq = -(-hp // sh), -(-wp // sw)
  phases = {}
  for i, j, first in _first_maxima(xp, y, window, strides):
    di, dj = i // sh, j // sw  # output a lands on phase row q = a + di
    shifted = lax.pad(jnp.where(first, dy, zero), zero,
                      ((0, 0, 0), (di, hq - oh - di, 0), (dj, wq - ow - dj, 0), (0, 0, 0)))
    key = (i % sh, j % sw)
    phases[key] = phases[key] + shifted if key in phases else shifted
  if assembly == 'auto':  # the rule analysis/report/pool/ measured (module doc)
    overlapping = window[0] > sh or window[1] > sw
    assembly = 'parity' if overlapping and not (pt or pb or pl or pr) else 'interleave'
  if assembly == 'parity':
    # Each phase repeated s×s' times (a broadcast and a reshape), kept where the
    # position's parity is the phase's.
    ri = lax.broadcasted_iota(jnp.int32, (1, hq * sh, 1, 1), 1) % sh
    rj = lax.broadcasted_iota(jnp.int32, (1, 1, wq * sw, 1), 2) % sw
    dxp = jnp.zeros((n, hq * sh, wq * sw, c), dy.dtype)
    for (r, q), d in phases.items():
      repeated = explicit.reshape(jnp.broadcast_to(d[:, :, None, :, None, :],
                                                   (n, hq, sh, wq, sw, c)),
                                  (n, hq * sh, wq * sw, c))
      dxp = dxp + jnp.where((ri == r) & (rj == q), repeated, zero)
  else:
    none = jnp.zeros((n, hq, wq, c), dy.dtype)  # a phase no tap reaches (window < stride)
    rows = [jnp.stack([phases.get((r, q), none) for q in range(sw)], axis=3)
            for r in range(sh)]
    dxp = explicit.reshape(jnp.stack(rows, axis=2), (n, hq * sh, wq * sw, c))
  return (dxp[:, pt:pt + h, pl:pl + w].astype(out_dtype),)


_max_pool.defvjp(_forward, _backward)
