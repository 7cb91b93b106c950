"""The four networks of [T] ch. 2: exact published parameter counts and output shapes."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxpar import models

RNGS = {'params': jax.random.key(0), 'dropout': jax.random.key(1)}


def conv(k, cin, cout, bias=True):
  return k * k * cin * cout + (cout if bias else 0)


def fc(cin, cout):
  return cin * cout + cout


def count_params(model, size=224, channels=3):
  # eval_shape: shapes only, no compute. train=True so GoogLeNet's auxiliary heads exist.
  variables = jax.eval_shape(lambda: model.init(
      RNGS, jnp.zeros((1, size, size, channels)), train=True))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(variables['params']))


def test_vgg16e_parameters():
  channels = [64, 64, 128, 128, 256, 256, 256, 256, 512, 512, 512, 512, 512, 512, 512, 512]
  expected = sum(conv(3, cin, cout) for cin, cout in zip([3] + channels, channels))
  expected += fc(7 * 7 * 512, 4096) + fc(4096, 4096) + fc(4096, 1000)
  assert expected == 143_667_240  # VGG-19 (configuration E) as published
  assert count_params(models.VGG16E(num_classes=1000)) == expected


def test_googlenet_parameters():
  table = {  # docs/sources.md: in, 1×1, 3×3 red, 3×3, 5×5 red, 5×5, pool proj
      '3a': (192, 64, 96, 128, 16, 32, 32), '3b': (256, 128, 128, 192, 32, 96, 64),
      '4a': (480, 192, 96, 208, 16, 48, 64), '4b': (512, 160, 112, 224, 24, 64, 64),
      '4c': (512, 128, 128, 256, 24, 64, 64), '4d': (512, 112, 144, 288, 32, 64, 64),
      '4e': (528, 256, 160, 320, 32, 128, 128), '5a': (832, 256, 160, 320, 32, 128, 128),
      '5b': (832, 384, 192, 384, 48, 128, 128)}
  main = conv(7, 3, 64) + conv(1, 64, 64) + conv(3, 64, 192)
  for cin, c1, r3, c3, r5, c5, pp in table.values():
    main += conv(1, cin, c1) + conv(1, cin, r3) + conv(3, r3, c3) + conv(1, cin, r5)
    main += conv(5, r5, c5) + conv(1, cin, pp)
  main += fc(1024, 1000)
  aux = sum(conv(1, cin, 128) + fc(4 * 4 * 128, 1024) + fc(1024, 1000) for cin in (512, 528))
  assert main == 6_998_552 and main + aux == 13_378_280  # Caffe's bvlc_googlenet
  assert count_params(models.GoogLeNet(num_classes=1000)) == main + aux


def test_squeezenet_parameters():
  fires = [(96, 16, 64, 64), (128, 16, 64, 64), (128, 32, 128, 128), (256, 32, 128, 128),
           (256, 48, 192, 192), (384, 48, 192, 192), (384, 64, 256, 256), (512, 64, 256, 256)]
  expected = conv(7, 3, 96) + conv(1, 512, 1000)
  expected += sum(conv(1, cin, s) + conv(1, s, e1) + conv(3, s, e3) for cin, s, e1, e3 in fires)
  assert expected == 1_248_424  # SqueezeNet v1.0 as published
  assert count_params(models.SqueezeNet(num_classes=1000)) == expected


def test_squeezenet_batch_norm_variant_normalises_every_convolution_the_classifier_too():
  # The digits variant (docs/training.md): BN before every ReLU, so no class unit starts
  # dead; each convolution drops its bias for BN's shift.
  fires = [(16, 64, 64), (16, 64, 64), (32, 128, 128), (32, 128, 128), (48, 192, 192),
           (48, 192, 192), (64, 256, 256), (64, 256, 256)]
  channels = [96] + [c for fire in fires for c in fire] + [10]
  model = models.SqueezeNet(num_classes=10, batch_norm=True)
  variables = jax.jit(lambda: model.init(RNGS, jnp.zeros((1, 32, 32, 3)), train=True))()
  paths = [jax.tree_util.keystr(p) for p, _ in
           jax.tree_util.tree_leaves_with_path(variables['params'])]
  assert sum(p.endswith("['kernel']") for p in paths) == len(channels)
  assert [p for p in paths if p.endswith("['bias']") and 'BatchNorm' not in p] == []
  assert len(jax.tree.leaves(variables['batch_stats'])) == 2 * len(channels)
  out = model.apply(variables, jax.random.normal(jax.random.key(2), (8, 32, 32, 3)),
                    train=True, rngs={'dropout': jax.random.key(3)}, mutable=['batch_stats'])[0]
  # Every class unit is positive on some image of the batch at initialisation.
  assert (np.asarray(out) > 0).any(axis=0).all()


@pytest.mark.parametrize('shortcut', ['projection', 'zero_pad'])
def test_resnet34_parameters(shortcut):
  bn = lambda c: 2 * c  # scale and bias
  expected = conv(7, 3, 64, bias=False) + bn(64) + fc(512, 1000)
  cin = 64
  for width, blocks in zip([64, 128, 256, 512], [3, 4, 6, 3]):
    for _ in range(blocks):
      expected += conv(3, cin, width, False) + conv(3, width, width, False) + 2 * bn(width)
      if cin != width and shortcut == 'projection':
        expected += conv(1, cin, width, False) + bn(width)
      cin = width
  if shortcut == 'projection':
    assert expected == 21_797_672  # ResNet-34 (option B) as published
  assert count_params(models.ResNet34(num_classes=1000, shortcut=shortcut)) == expected


ALL = [models.VGG16E, models.GoogLeNet, models.SqueezeNet, models.ResNet34]


def _outputs(net, classes):
  model = net(num_classes=classes)
  def outputs(x):
    variables = model.init(RNGS, x, train=True)
    train_out, _ = model.apply(variables, x, train=True, rngs={'dropout': jax.random.key(3)},
                               mutable=['batch_stats'])
    return train_out, model.apply(variables, x, train=False)
  return outputs


def _assert_heads(net, train_out, eval_out, batch, classes):
  heads = train_out if net is models.GoogLeNet else (train_out,)
  assert len(heads) == (3 if net is models.GoogLeNet else 1)  # main + two auxiliary
  for y in (*heads, eval_out):
    assert y.shape == (batch, classes) and y.dtype == jnp.float32


@pytest.mark.parametrize('net', ALL, ids=lambda n: getattr(n, 'func', n).__name__)
def test_output_shapes_32(net, batch=2, classes=7):
  """Init, a training and an evaluation forward pass at 32²: shapes, and finite values."""
  x = jax.random.normal(jax.random.key(2), (batch, 32, 32, 3))
  # One program: compiling GoogLeNet's init and applies op by op took 85 s of the suite.
  train_out, eval_out = jax.jit(_outputs(net, classes))(x)
  _assert_heads(net, train_out, eval_out, batch, classes)
  assert all(np.all(np.isfinite(y)) for y in jax.tree.leaves((train_out, eval_out)))


def test_output_shapes_224():
  """The published input size: shapes through every layer (traced, not computed: computing
  all four networks at 224² took 144 s of the suite and checks nothing 32² does not)."""
  x = jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.float32)
  for net in ALL:
    _assert_heads(net, *jax.eval_shape(_outputs(net, 7), x), 1, 7)


def test_bfloat16_compute_keeps_float32_params():
  model = models.ResNet34(num_classes=3, dtype=jnp.bfloat16)
  x = jnp.ones((2, 32, 32, 3))
  variables, y = jax.eval_shape(lambda x: model.init_with_output(RNGS, x, train=False)[::-1], x)
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(variables['params']))
  assert y.dtype == jnp.float32


def _symmetric_conv(x, kernel, stride, pad):
  return jax.lax.conv_general_dilated(x, kernel, (stride, stride), [(pad, pad), (pad, pad)],
                                      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))


def _intermediates(model, x):
  """(params, every module's output), in one program (op by op, GoogLeNet's took 73 s of the
  suite)."""
  def run(x):
    variables = model.init(RNGS, x, train=False)
    _, state = model.apply(variables, x, train=False, capture_intermediates=True,
                           mutable=['intermediates'])
    return variables['params'], state['intermediates']
  return jax.jit(run)(x)


def test_resnet_strided_convolutions_pad_symmetrically_on_even_inputs():
  """A 3×3/2 conv on an even map pads 1 on every side (flax's 'SAME' would pad 0 before, 1 after);
  the 7×7/2 stem pads 3."""
  model = models.ResNet(stage_sizes=(1, 1), num_filters=4, num_classes=3)
  x = jax.random.normal(jax.random.key(0), (2, 16, 16, 3))
  params, inter = _intermediates(model, x)
  stem = _symmetric_conv(x, params['conv_init']['kernel'], 2, 3)
  np.testing.assert_allclose(inter['conv_init']['__call__'][0], stem, rtol=1e-5, atol=1e-5)
  block_in = inter['BasicBlock_0']['__call__'][0]  # 4×4×4: an even map into the strided block
  assert block_in.shape[1] % 2 == 0
  strided = _symmetric_conv(block_in, params['BasicBlock_1']['Conv_0']['kernel'], 2, 1)
  np.testing.assert_allclose(inter['BasicBlock_1']['Conv_0']['__call__'][0], strided,
                             rtol=1e-5, atol=1e-5)
  asymmetric = jax.lax.conv_general_dilated(
      block_in, params['BasicBlock_1']['Conv_0']['kernel'], (2, 2), 'SAME',
      dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  assert not np.allclose(asymmetric, strided, atol=1e-3)  # the test can tell the two apart


def test_googlenet_stem_pads_symmetrically_on_even_inputs():
  model = models.GoogLeNet(num_classes=3)
  x = jax.random.normal(jax.random.key(0), (1, 32, 32, 3))
  params, inter = _intermediates(model, x)
  stem = params['ConvReLU_0']['Conv_0']
  expected = jax.nn.relu(_symmetric_conv(x, stem['kernel'], 2, 3) + stem['bias'])
  np.testing.assert_allclose(inter['ConvReLU_0']['__call__'][0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('name', [
    # SqueezeNet and VGG16E hold every piece (both of max-pooling's gradient assemblies).
    'squeezenet', 'vgg16e', *(pytest.param(n, marks=pytest.mark.slow)
                              for n in ('googlenet', 'resnet34'))])
def test_a_jit_over_explicit_mesh_axes_computes_the_one_device_step(name):
  """A flax user's step on `jax.make_mesh`'s Explicit axes (sharding in types, with
  `jax.set_mesh`), the batch split over 8 devices and `conv_impl='auto'` (oneDNN's calls,
  per-tap convolutions, max-pooling's rewritten gradient, dropout): its loss and gradients
  are one device's. JAX refuses an operation whose result's split it cannot infer; before,
  each network stopped at one (a custom gradient's untyped result, a reshape that merges
  dimensions, flax's dropout mask drawn unsplit)."""
  import functools

  import flax.linen as nn
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from jaxpar.models import conv as conv_lib
  model = models.MODELS[name](num_classes=10, conv=functools.partial(
      nn.Conv, conv_general_dilated=conv_lib.conv_general_dilated('auto')))
  rng = np.random.default_rng(0)
  size = max(16, models.MIN_IMAGE_SIZE[name])  # 16²: half of GoogLeNet's and ResNet34's time
  x = rng.normal(size=(16, size, size, 3)).astype(np.float32)
  labels = rng.integers(0, 10, 16)
  variables = jax.jit(functools.partial(model.init, train=True))(RNGS, x[:1])

  def loss(params, x):
    out, _ = model.apply({**variables, 'params': params}, x, train=True,
                         rngs={'dropout': jax.random.key(2)}, mutable=['batch_stats'])
    logits = out[0] if isinstance(out, tuple) else out
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), labels[:, None], 1))
  step = jax.jit(jax.value_and_grad(loss))
  want = step(variables['params'], x)
  mesh = jax.make_mesh((8,), ('data',), axis_types=(jax.sharding.AxisType.Explicit,))
  with jax.set_mesh(mesh):
    got = step(jax.device_put(variables['params'], NamedSharding(mesh, P())),
               jax.device_put(x, NamedSharding(mesh, P('data'))))
  for g, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, v, rtol=0, atol=2e-5 * float(np.abs(v).max()))
