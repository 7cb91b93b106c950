"""Convolution lowerings, chosen per shape: XLA's, or one matmul per kernel tap.

A 2-D convolution of an input x (N, H, W, C) with a kernel w (kh, kw, C, D), stride
(sh, sw) and padding p, is a sum over the kernel's taps (i, j):

    y[n, a, b, :] = Σ_{i<kh, j<kw} x̃[n, a·sh + i, b·sw + j, :] @ w[i, j]

where x̃ is x padded by p. `conv_taps` computes exactly that: for every tap, the
strided slice of x̃ that the tap sees, times w[i, j] (an (N·oh·ow, C) × (C, D) matmul),
leaving out the taps that see only padding (on a 1×1 map a 3×3 kernel is its centre);
its gradients, by JAX's transposes, are matmuls and pads too.

Why: XLA's CPU backend computes convolutions whose *output map is small* far below
its speed on larger maps (measured here, forward + backward of a 3×3 256→256
convolution on a 32×2×2 input: 68 ms as `lax.conv_general_dilated`, 7.5 ms as taps;
the same FLOPs on 32×8×8×64: 3.8 ms). `conv_impl='auto'` uses the taps where the
rule of `use_taps` says they are faster — on the CPU backend only; GPU and TPU keep
XLA's convolutions (docs/performance.md has the measurements behind the rule).

`conv_general_dilated(impl)` returns a drop-in for `lax.conv_general_dilated`, which
flax's `nn.Conv(conv_general_dilated=...)` accepts: parameters, their names and
checkpoints are the same whichever lowering computes the convolution.
"""
import functools

import jax
import jax.numpy as jnp
from jax import lax

CONV_IMPLS = ('auto', 'xla', 'taps')
# `auto` on CPU: taps where the output map has at most this many positions (oh·ow).
# Measured on the four networks' convolutions at 16², 32² and 224² (docs/performance.md).
TAPS_MAX_OUTPUT_POSITIONS = 16


def use_taps(impl: str, out_positions: int, backend: str | None = None) -> bool:
  """Whether `impl` computes a convolution with an output map of `out_positions` by taps."""
  if impl == 'taps':
    return True
  if impl == 'xla':
    return False
  backend = backend or jax.default_backend()
  return backend == 'cpu' and out_positions <= TAPS_MAX_OUTPUT_POSITIONS


def _is_nhwc_hwio(dimension_numbers, ndim) -> bool:
  if ndim != 4:
    return False
  if dimension_numbers is None:  # lax's default is NCHW/OIHW
    return False
  dn = lax.conv_dimension_numbers((1,) * 4, (1,) * 4, dimension_numbers)
  return (dn.lhs_spec, dn.rhs_spec, dn.out_spec) == ((0, 3, 1, 2), (3, 2, 0, 1), (0, 3, 1, 2))


def conv_taps(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
              dimension_numbers=None, feature_group_count=1, batch_group_count=1,
              precision=None, preferred_element_type=None):
  """`lax.conv_general_dilated`, NHWC × HWIO, as one matmul per kernel tap (module doc).

  Dilations, feature or batch groups, negative padding and other layouts are
  computed by `lax.conv_general_dilated` itself."""
  plain = (_is_nhwc_hwio(dimension_numbers, lhs.ndim) and feature_group_count == 1
           and batch_group_count == 1 and all(d == 1 for d in (lhs_dilation or (1, 1)))
           and all(d == 1 for d in (rhs_dilation or (1, 1))))
  kh, kw = rhs.shape[:2] if plain else (0, 0)
  if plain and isinstance(padding, str):
    padding = lax.padtype_to_pads(lhs.shape[1:3], (kh, kw), window_strides, padding)
  if not plain or any(p < 0 for pair in padding for p in pair):
    return lax.conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation,
                                    rhs_dilation, dimension_numbers, feature_group_count,
                                    batch_group_count, precision, preferred_element_type)
  (pt, pb), (pl, pr) = padding
  x = jnp.pad(lhs, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
  sh, sw = window_strides
  n, hp, wp, c = x.shape
  oh, ow = (hp - kh) // sh + 1, (wp - kw) // sw + 1
  h, w = lhs.shape[1:3]
  rows = [i for i in range(kh) if _sees_data(i, sh, oh, pt, h)]
  cols = [j for j in range(kw) if _sees_data(j, sw, ow, pl, w)]
  # Below float32, each tap's product and the sum over taps accumulate in float32 and round
  # once, as XLA's convolution does: left in bfloat16, the kernel gradient (a dot contracting
  # over N·oh·ow positions) is summed in bfloat16 by jaxlib 0.12's CPU dot (2-5 % off on an
  # 8×8 map, against 0.3 % for XLA's convolution; tests/test_conv.py).
  accumulate = preferred_element_type
  dtype = jnp.result_type(lhs, rhs)
  if accumulate is None and jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
    accumulate = jnp.float32
  out = None
  for i in rows:
    for j in cols:
      tap = lax.slice(x, (0, i, j, 0), (n, i + (oh - 1) * sh + 1, j + (ow - 1) * sw + 1, c),
                      (1, sh, sw, 1))
      y = jnp.einsum('nhwc,cd->nhwd', tap, rhs[i, j], precision=precision,
                     preferred_element_type=accumulate)
      out = y if out is None else out + y
  return out if preferred_element_type is not None else out.astype(dtype)


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


def conv_general_dilated(impl: str):
  """A drop-in for `lax.conv_general_dilated` (NHWC/HWIO, as flax's `nn.Conv` calls it)
  that computes each convolution by the lowering `impl` chooses for its shape."""
  if impl == 'xla':
    return lax.conv_general_dilated

  @functools.wraps(lax.conv_general_dilated)
  def conv(lhs, rhs, window_strides, padding, *args, **kwargs):
    if use_taps(impl, output_positions(lhs.shape, rhs.shape, window_strides, padding)):
      return conv_taps(lhs, rhs, window_strides, padding, *args, **kwargs)
    return lax.conv_general_dilated(lhs, rhs, window_strides, padding, *args, **kwargs)
  return conv
