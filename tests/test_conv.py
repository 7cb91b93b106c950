"""`conv_impl`: each hand lowering (per tap, im2col, Winograd's F(2×2, 3×3)) equals XLA's
convolution, forward and both gradients, for every distinct convolution geometry of the four
networks at 16², 32² and 224² it computes; a train step is the same whichever lowering `auto`
picks; GPU and TPU keep XLA's convolutions."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from analysis.benchmarks.conv_bench import convolutions, positions
from jaxpar.models import MIN_IMAGE_SIZE, MODELS
from jaxpar.step import loss_and_logits
from jaxpar.models import conv as conv_lib
from jaxpar.models import onednn
from jaxpar.models.conv import (LOWERINGS, TAPS_MAX_OUTPUT_POSITIONS, auto_choices, choose,
                                conv_general_dilated, conv_taps, geometry_key, measured_choices,
                                use_taps, winograd_applies)

DN = ('NHWC', 'HWIO', 'NHWC')


def geometries(sizes):
  """Each distinct geometry (input map, kernel, stride, padding) of the four networks'
  convolutions at these input sizes, at batch 2 and with the channels cut to at most 6 in
  and 5 out: the lowering's slices and pads depend on the geometry; the channels enter
  only as the contracted and kept dimensions of each tap's matmul."""
  shapes = set()
  for net in sorted(MODELS):
    for size in sizes:
      if size >= MIN_IMAGE_SIZE[net]:
        shapes |= {c._replace(lhs=(2,) + c.lhs[1:3] + (min(c.lhs[3], 6),),
                              rhs=c.rhs[:2] + (min(c.rhs[2], 6), min(c.rhs[3], 5)))
                   for c in convolutions(net, size, 1, jnp.float32)}
  return sorted(shapes)


def _value_and_grads(conv, c, x, w, cotangent):
  def loss(x, w):
    y = conv(x, w, c.strides, c.padding, dimension_numbers=DN)
    return jnp.sum(y.astype(jnp.float32) * cotangent), y
  (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(x, w)
  return y, *grads


def _inputs(c, dtype):
  """Random input and kernel, and a random cotangent, so every output element weighs in
  the gradients differently (numpy: no random-number program to compile)."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=c.lhs), dtype)
  w = jnp.asarray(rng.normal(size=c.rhs) / np.sqrt(np.prod(c.rhs[:3])), dtype)
  out = jax.eval_shape(lambda: lax.conv_general_dilated(x, w, c.strides, c.padding,
                                                         dimension_numbers=DN))
  return x, w, jnp.asarray(rng.normal(size=out.shape), jnp.float32)


def _run(impl, c, inputs):
  return jax.jit(functools.partial(_value_and_grads, LOWERINGS[impl], c))(*inputs)


@functools.cache
def _xla(c, dtype):
  """XLA's output and gradients for geometry `c`, computed once for every lowering's test."""
  inputs = _inputs(c, dtype)
  return inputs, _run('xla', c, inputs)


def _assert_same(impl, c, dtype, rtol):
  inputs, want = _xla(c, dtype)
  got = _run(impl, c, inputs)
  for name, g, w in zip(('output', 'input gradient', 'kernel gradient'), got, want):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    scale = np.abs(w).max()
    # Relative to the largest element: sums of many products in another order.
    np.testing.assert_allclose(g, w, rtol=0, atol=rtol * scale, err_msg=f'{impl} {c} {name}')


HAND = ('taps', 'im2col', 'winograd', 'onednn')
needs_onednn = pytest.mark.skipif(not onednn.available(), reason=onednn.unavailable_reason())


def _cases(shapes):
  """(lowering, geometry) for every geometry a lowering computes itself (Winograd: 3×3 at
  stride 1; the others fall back to XLA's convolution, tested below)."""
  return [pytest.param(impl, c, id=f'{impl}-{c}',
                       marks=[needs_onednn] if impl == 'onednn' else [])
          for impl in HAND
          for c in shapes if impl != 'winograd' or winograd_applies(c.rhs, c.strides)]


SMALL = geometries((16, 32))
LARGE = sorted(set(geometries((224,))) - set(SMALL))


@pytest.mark.parametrize('impl,c', _cases(SMALL))
def test_lowerings_equal_xla_float32_16_32(impl, c):
  _assert_same(impl, c, jnp.float32, 1e-5)


@pytest.mark.parametrize('impl,c', _cases(LARGE))
def test_lowerings_equal_xla_float32_224(impl, c):
  # Winograd's transforms add and subtract four inputs, then four products, before and
  # after each sum over channels: a few more roundings than a direct sum. oneDNN's kernel
  # gradient on one thread (this process's 8 devices share 2 cores: onednn.py) sums the
  # 2·224·224 positions in one running sum: ~2.6e-5 of the largest element apart from XLA's.
  _assert_same(impl, c, jnp.float32, {'winograd': 2e-5, 'onednn': 5e-5}.get(impl, 1e-5))


@pytest.mark.parametrize('impl,c', _cases(SMALL))
def test_lowerings_equal_xla_bfloat16(impl, c):
  # bfloat16 has an 8-bit mantissa: the lowerings sum (and round) in other orders.
  _assert_same(impl, c, jnp.bfloat16, 2e-2)


@needs_onednn
@pytest.mark.parametrize('c', LARGE, ids=str)
def test_onednn_equals_xla_bfloat16_224(c):
  # `auto` computes every bfloat16 convolution by oneDNN, the 224² ones too.
  _assert_same('onednn', c, jnp.bfloat16, 2e-2)


def test_winograd_leaves_other_kernels_and_strides_to_xla():
  c = next(c for c in SMALL if not winograd_applies(c.rhs, c.strides))
  inputs, want = _xla(c, jnp.float32)
  for g, w in zip(_run('winograd', c, inputs), want):
    np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize('impl', HAND)
def test_layouts_and_options_the_lowerings_cannot_do_fall_back_to_xla(impl):
  conv = LOWERINGS[impl]
  x = jax.random.normal(jax.random.key(0), (2, 3, 9, 9))
  w = jax.random.normal(jax.random.key(1), (4, 3, 3, 3))
  for kwargs in (dict(dimension_numbers=None),  # NCHW/OIHW
                 dict(dimension_numbers=('NCHW', 'OIHW', 'NCHW'), rhs_dilation=(2, 2))):
    np.testing.assert_allclose(conv(x, w, (1, 1), 'SAME', **kwargs),
                               lax.conv_general_dilated(x, w, (1, 1), 'SAME', **kwargs),
                               rtol=1e-6)
  xh, wh = jnp.transpose(x, (0, 2, 3, 1)), jnp.transpose(w, (2, 3, 1, 0))
  for strides in ((2, 2), (1, 1)):  # string padding, asymmetric at stride 2
    np.testing.assert_allclose(
        conv(xh, wh, strides, 'SAME', dimension_numbers=DN),
        lax.conv_general_dilated(xh, wh, strides, 'SAME', dimension_numbers=DN),
        rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('impl', HAND)
def test_each_lowering_over_explicit_mesh_axes_computes_one_devices_values(impl):
  # `jax.make_mesh`'s Explicit axes (sharding in types) refuse a reshape whose result's
  # split JAX cannot infer: Winograd's interleave of its tiles was one. Both strides.
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P
  if impl == 'onednn' and not onednn.available():
    pytest.skip(onednn.unavailable_reason())
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Explicit,))
  rng = np.random.default_rng(0)
  x = rng.normal(size=(16, 12, 12, 8)).astype(np.float32)
  w = rng.normal(size=(3, 3, 8, 16)).astype(np.float32)
  for strides in ((1, 1), (2, 2)):
    step = jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(jnp.sin(LOWERINGS[impl](
        x, w, strides, ((1, 1), (1, 1)), dimension_numbers=DN))), argnums=(0, 1)))
    want = step(x, w)
    with jax.set_mesh(mesh):
      got = step(jax.device_put(x, NamedSharding(mesh, P('data'))),
                 jax.device_put(w, NamedSharding(mesh, P())))
    for g, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(g, v, rtol=0, atol=1e-5 * float(np.abs(v).max()))


def test_auto_uses_taps_on_small_cpu_maps_only():
  assert use_taps('auto', TAPS_MAX_OUTPUT_POSITIONS, 'cpu')
  assert not use_taps('auto', TAPS_MAX_OUTPUT_POSITIONS + 1, 'cpu')
  for backend in ('gpu', 'cuda', 'rocm', 'tpu'):
    assert not use_taps('auto', 1, backend)
  assert use_taps('taps', 10_000, 'gpu') and not use_taps('xla', 1, 'cpu')
  assert not use_taps('winograd', 1, 'cpu') and not use_taps('im2col', 1, 'cpu')
  assert conv_general_dilated('xla') is lax.conv_general_dilated
  assert conv_general_dilated('taps') is conv_taps


def _tapped_ops(impl, net, size):
  """The convolution ops in the lowered train-mode forward pass."""
  conv = functools.partial(nn.Conv, conv_general_dilated=conv_general_dilated(impl))
  model = MODELS[net](num_classes=10, conv=conv)
  x = jnp.zeros((2, size, size, 1))
  variables = jax.eval_shape(lambda: model.init(jax.random.key(0), x, train=False))
  text = jax.jit(lambda v: model.apply(v, x, train=False)).lower(variables).as_text()
  return text.count('stablehlo.convolution')


@pytest.fixture
def without_onednn(monkeypatch):
  """`auto` as where oneDNN's convolutions cannot run: the rule and `conv_auto.json`."""
  monkeypatch.setattr(conv_lib, 'onednn_in_auto', lambda dtype=None: False)


@pytest.mark.parametrize('impl', ['auto', 'measured'])
def test_auto_and_measured_lower_each_convolution_as_chosen(impl, without_onednn):
  # SqueezeNet at 32²: 26 convolutions; a convolution op is left only where XLA's
  # convolution computes it (chosen, or Winograd's fallback off 3×3 stride 1). `auto`: its
  # table's choice (whole steps confirmed im2col here), and the rule elsewhere (the ones on
  # 3×3 and 1×1 maps by taps).
  convs = convolutions('squeezenet', 32, 2, jnp.float32)
  chosen = {c: choose(impl, c.lhs, c.rhs, c.strides, c.padding, 'cpu') for c in convs}
  by_xla = sum(n for c, n in convs.items() if chosen[c] == 'xla' or (
      chosen[c] == 'winograd' and not winograd_applies(c.rhs, c.strides)))
  if impl == 'auto':
    table = auto_choices()
    assert 'im2col' in chosen.values()
    for c in convs:
      rule = 'taps' if use_taps('auto', positions(c), 'cpu') else 'xla'
      assert chosen[c] == table.get(geometry_key(c.lhs, c.rhs, c.strides, c.padding), rule)
  assert by_xla < 26
  assert _tapped_ops('xla', 'squeezenet', 32) == 26
  assert _tapped_ops(impl, 'squeezenet', 32) == by_xla
  assert _tapped_ops('taps', 'squeezenet', 32) == 0


def test_measured_takes_the_measured_fastest_then_the_rule_and_xla_off_the_cpu(without_onednn):
  table = measured_choices()
  assert table and set(table.values()) <= set(LOWERINGS)
  key, lowering = next(iter(table.items()))
  c = next(c for net in sorted(MODELS) for size, batch in ((224, 2), (32, 32))
           if size >= MIN_IMAGE_SIZE[net]
           for c in convolutions(net, size, batch, jnp.float32)
           if geometry_key(c.lhs, c.rhs, c.strides, c.padding) == key)
  assert choose('measured', c.lhs, c.rhs, c.strides, c.padding, 'cpu') == lowering
  assert choose('measured', c.lhs, c.rhs, c.strides, c.padding, 'gpu') == 'xla'
  assert choose('im2col', c.lhs, c.rhs, c.strides, c.padding, 'cpu') == 'im2col'
  # A geometry no run measured: the rule (taps on ≤ 16 output positions).
  for impl in ('auto', 'measured'):
    assert choose(impl, (1, 3, 3, 7), (3, 3, 7, 5), (1, 1), ((1, 1), (1, 1)), 'cpu') == 'taps'
    assert choose(impl, (1, 99, 99, 7), (3, 3, 7, 5), (1, 1), ((1, 1), (1, 1)), 'cpu') == 'xla'


def test_the_tables_are_what_the_committed_measurements_give():
  """`measured`'s table: each geometry's fastest lowering alone (conv_bench); `auto`'s: the
  part of it whose kind made whole steps of the network faster (conv_step_ab)."""
  import json
  import pathlib
  from analysis.benchmarks import conv_bench, conv_step_ab
  folder = pathlib.Path(__file__).parent.parent / 'analysis' / 'report' / 'conv'
  load = lambda pattern: [json.loads(p.read_text()) for p in sorted(folder.glob(pattern))]
  results = load('onednn/lowerings_*.json')
  assert results and conv_bench.choices(results) == measured_choices()
  assert 'onednn' in measured_choices().values()
  # `auto`'s table (where oneDNN cannot run) came from the measurements before oneDNN's.
  before, steps = load('lowerings_*.json'), load('step_ab/*.json')
  assert steps and conv_step_ab.verified(steps) == auto_choices()
  assert auto_choices() and all(conv_bench.choices(before)[k] == v
                                for k, v in auto_choices().items())


def test_auto_keeps_a_kind_only_where_every_step_with_it_ran_faster():
  from analysis.benchmarks.conv_step_ab import verified

  def run(ratios, differing):
    return {'rows': [{'variant': v, 'over_rule': r} for v, r in ratios.items()],
            'table_differs_from_rule': differing}
  a = run({'rule': 1.0, 'measured:im2col': 0.9, 'measured:taps': 0.99},
          {'g1': 'im2col', 'g2': 'taps', 'shared': 'im2col'})
  b = run({'rule': 1.0, 'measured:im2col': 1.05}, {'shared': 'im2col', 'g3': 'im2col'})
  assert verified([a, b]) == {'g1': 'im2col'}  # g2: 1 % only; shared: slower in b
  assert verified([a]) == {'g1': 'im2col', 'shared': 'im2col'}
  assert verified([a], faster=0.005) == {'g1': 'im2col', 'g2': 'taps', 'shared': 'im2col'}



def _one_step(net, impl):
  """Loss and parameters after one SGD step of `net` at 32² (batch 2), convolutions by `impl`."""
  conv = functools.partial(nn.Conv, conv_general_dilated=conv_general_dilated(impl))
  model = MODELS[net](num_classes=10, conv=conv)
  x, labels = _input()
  variables = _variables(net)

  def step(variables):
    def loss_fn(params):
      out, _ = model.apply({**variables, 'params': params}, x, train=True, mutable=['batch_stats'],
                           rngs={'dropout': jax.random.key(1)})
      return loss_and_logits(out, labels)[0]
    loss, grads = jax.value_and_grad(loss_fn)(variables['params'])
    return loss, jax.tree.map(lambda p, g: p - 0.01 * g, variables['params'], grads)
  # Without LLVM's optimisation passes: the same arithmetic, compiled several times faster.
  return jax.jit(step).lower(variables).compile(
      compiler_options={'xla_backend_optimization_level': 0})(variables)


def _input():
  rng = np.random.default_rng(0)
  return jnp.asarray(rng.normal(size=(2, 32, 32, 1)), jnp.float32), jnp.asarray([3, 7])


@functools.cache
def _variables(net):
  """The network's initial variables (the same whichever lowering: they are shapes and
  random draws), initialised once, compiled without LLVM's optimisation."""
  model = MODELS[net](num_classes=10)
  init = jax.jit(functools.partial(model.init, train=True)).lower(
      jax.random.key(0), _input()[0]).compile(
          compiler_options={'xla_backend_optimization_level': 0})
  return init(jax.random.key(0), _input()[0])


@pytest.mark.slow
@pytest.mark.parametrize('net,impl', [(net, 'auto') for net in sorted(MODELS)]
                         + [('resnet34', 'winograd'), ('vgg16e', 'im2col'),
                            ('googlenet', 'measured')])
def test_a_train_step_with_a_lowering_equals_xla(net, impl):
  want_loss, want = _one_step(net, 'xla')
  got_loss, got = _one_step(net, impl)
  np.testing.assert_allclose(got_loss, want_loss, rtol=1e-5)
  for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
    # Parameters of order 0.1–1; BatchNorm over 2 images of ResNet34's 1×1 maps amplifies
    # the lowerings' rounding differences to ~1e-5 in single elements.
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=5e-5, err_msg=jax.tree_util.keystr(path))


def test_autos_table_applies_to_the_dtype_its_steps_were_measured_in(without_onednn):
  from jaxpar.models.conv import auto_dtypes
  assert auto_dtypes() == ('float32',)
  key, lowering = next(iter(auto_choices().items()))
  c = next(c for net in sorted(MODELS) for size, batch in ((224, 2), (32, 32))
           if size >= MIN_IMAGE_SIZE[net]
           for c in convolutions(net, size, batch, jnp.float32)
           if geometry_key(c.lhs, c.rhs, c.strides, c.padding) == key)
  rule = 'taps' if use_taps('auto', positions(c), 'cpu') else 'xla'
  assert lowering != rule
  assert choose('auto', c.lhs, c.rhs, c.strides, c.padding, 'cpu', jnp.float32) == lowering
  assert choose('auto', c.lhs, c.rhs, c.strides, c.padding, 'cpu', jnp.bfloat16) == rule
  assert choose('auto', c.lhs, c.rhs, c.strides, c.padding, 'gpu', jnp.float32) == 'xla'
