"""The kernel taps of each convolution that read any input, from the network's shapes alone.

A kernel tap (i, j) whose every window position reads padding only contributes zeros to
the output, and its gradient is zero whatever the batch (∂L/∂w[i, j] = Σ x_pad[i + ·, j + ·]
· ∂L/∂y, and those x_pad are the zero padding): on a 1×1 map a 3×3 kernel is its centre
(ResNet34 at 32²: layer 4's six 512-channel kernels, 8 of 9 taps, 11.5 M of its 21.3 M
gradient entries). A sum of gradients over devices can send the live taps only and put
the zeros back after: the same result (0 + 0 = 0), fewer bytes — what XLA's partitioner
does for an auto-sharded `jit`, whose all-reduce sits before the taps are padded into
the kernel.

`boxes(model, image_size)` traces the network's initialisation on shapes only
(`jax.eval_shape`), watching each `nn.Conv` call (`nn.intercept_methods`): for every
kernel whose live taps are fewer than all, its parameter path → the bounding box
(row start, row stop, column start, column stop) of those taps. Dilated convolutions and
string paddings other than 'SAME' and 'VALID' are left whole.
"""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax


def _live(size: int, kernel: int, stride: int, pads: tuple) -> tuple:
  """(first, stop) of the kernel offsets along one axis that read a row of the input."""
  before, after = pads
  out = (size + before + after - kernel) // stride + 1
  seen = [k for k in range(kernel)
          if any(before <= k + a * stride < before + size for a in range(out))]
  return (seen[0], seen[-1] + 1) if seen else (0, kernel)  # no output: left whole


def box(input_hw, kernel_hw, strides, padding):
  """The bounding box of the live taps of one convolution (NHWC input of spatial shape
  `input_hw`), or None where every tap is live or the geometry is not one this reads."""
  strides = (strides,) * 2 if isinstance(strides, int) else tuple(strides or (1, 1))
  if isinstance(padding, str):
    if padding not in ('SAME', 'VALID'):
      return None
    padding = lax.padtype_to_pads(input_hw, kernel_hw, strides, padding)
  elif isinstance(padding, int):
    padding = ((padding, padding),) * 2
  rows = _live(input_hw[0], kernel_hw[0], strides[0], tuple(padding[0]))
  cols = _live(input_hw[1], kernel_hw[1], strides[1], tuple(padding[1]))
  if rows == (0, kernel_hw[0]) and cols == (0, kernel_hw[1]):
    return None
  return rows + cols


@functools.lru_cache(maxsize=32)
def boxes(model: nn.Module, image_size: int, channels: int = 3) -> dict:
  """{parameter path (a tuple of names ending in 'kernel'): live-tap box} of `model` on
  `image_size`² inputs (the channels do not change which taps are live)."""
  found = {}

  def watch(call, args, kwargs, context):
    module = context.module
    if (isinstance(module, nn.Conv) and context.method_name == '__call__'
        and all(d == 1 for d in jax.tree.leaves(module.kernel_dilation or 1))):
      kernel = tuple(module.kernel_size) if not isinstance(module.kernel_size, int) \
          else (module.kernel_size,) * 2
      where = box(args[0].shape[1:3], kernel, module.strides, module.padding)
      if where is not None:
        found[tuple(module.path) + ('kernel',)] = where
    return call(*args, **kwargs)

  with nn.intercept_methods(watch):
    jax.eval_shape(lambda: model.init({'params': jax.random.key(0),
                                       'dropout': jax.random.key(1)},
                                      jnp.zeros((1, image_size, image_size, channels)),
                                      train=True))
  return found


def compact(tree: dict, live: dict) -> dict:
  """`tree` (a gradient tree of the model's parameters) with each kernel of `live` cut to
  its live box."""
  return _map(tree, live, lambda x, b: x[b[0]:b[1], b[2]:b[3]])


def expand(tree: dict, live: dict, like: dict) -> dict:
  """`compact`'s inverse: each cut kernel padded with zeros back to its shape in `like`."""
  def pad(x, b, full):
    return jnp.pad(x, ((b[0], full.shape[0] - b[1]), (b[2], full.shape[1] - b[3]))
                   + ((0, 0),) * (x.ndim - 2))
  return _map(tree, live, pad, like)


def _map(tree, live, f, like=None):
  def at(path, x, *full):
    key = tuple(getattr(k, 'key', getattr(k, 'name', k)) for k in path)
    return f(x, live[key], *full) if key in live else x
  if like is None:
    return jax.tree_util.tree_map_with_path(at, tree)
  return jax.tree_util.tree_map_with_path(at, tree, like)
