"""[Y]'s sub-group batch norm: each device normalizes with its group's statistics, and the
replicated running statistics are the mean over groups of single-group updates; groups of
any size a split mesh axis can hold."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxpar import collectives
from jaxpar.mesh import make_mesh
from jaxpar.models.layers import batch_norm
from jaxpar.collectives import replicate
from jaxpar.group_batchnorm import (bn_group_sizes, group_axes, group_sizes,
                                             split_for_groups)
from runs import TinyResNet, assert_trees_close, random_batches, sharded_run

SHAPE, AXES = (2, 2, 2), ('a', 'b', 'c')
ROWS, FEATURES, EPS, MOMENTUM = 4, 3, 1e-5, 0.9
TX = optax.sgd(0.1, momentum=0.9)


class BN(nn.Module):
  axis_name: object = None

  @nn.compact
  def __call__(self, x):
    return batch_norm(True, self.axis_name, jnp.float32)()(x)


def _device_batches():
  # Each device's rows have their own offset, so the group's variance (E[x²] − E[x]²
  # over all its rows) differs from the mean of the per-device variances.
  rng = np.random.default_rng(0)
  offsets = np.arange(8, dtype=np.float32)[:, None, None] * np.array([1.0, -2.0, 0.5], np.float32)
  return rng.normal(size=(8, ROWS, FEATURES)).astype(np.float32) + offsets


@pytest.mark.parametrize('shape, axes', [(SHAPE, AXES), ((2, 4), ('x', 'y')), ((8,), ('d',))])
@pytest.mark.parametrize('group_size', [1, 2, 4, 8])
def test_sub_group_batch_norm_equals_numpy_per_group(shape, axes, group_size):
  """Every size that divides the 8 devices, on three meshes: where it is not a product of
  trailing axes (2 on (2, 4) and (8,), 4 on (8,)), the mesh splits an axis."""
  mesh = make_mesh(shape, axes, bn_group_size=group_size)
  assert [d.id for d in mesh.devices.flat] == [d.id for d in jax.devices()]  # same order
  bn_axes = group_axes(mesh.devices.shape, mesh.axis_names, group_size)
  x = _device_batches()
  variables = BN().init(jax.random.key(0), x[0])

  def body(x):
    y, new = BN(bn_axes).apply(variables, x[0], mutable=['batch_stats'])
    return y[None], replicate(new['batch_stats'])
  every = mesh.axis_names
  y, stats = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(every),
                                   out_specs=(P(every), P())))(x)

  groups = x.reshape(8 // group_size, group_size * ROWS, FEATURES)  # consecutive devices
  mean, var = groups.mean(1), groups.var(1)
  expected = (groups - mean[:, None]) / np.sqrt(var[:, None] + EPS)
  np.testing.assert_allclose(np.asarray(y).reshape(groups.shape), expected, rtol=1e-4, atol=1e-4)
  bn = stats['BatchNorm_0']
  np.testing.assert_allclose(bn['mean'], ((1 - MOMENTUM) * mean).mean(0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(bn['var'], (MOMENTUM + (1 - MOMENTUM) * var).mean(0), rtol=1e-5)


def test_a_group_size_no_split_can_make_is_refused():
  assert bn_group_sizes((2, 4)) == [1, 2, 4, 8] and bn_group_sizes((8,)) == [1, 2, 4, 8]
  assert bn_group_sizes((3, 4)) == [1, 2, 4, 12]  # 3 and 6 consecutive devices straddle rows of 4
  assert split_for_groups((2, 4), ('x', 'y'), 2) == ((2, 2, 2), ('x', 'y', 'y_bn'), 'y')
  assert split_for_groups((8,), ('d',), 4) == ((2, 4), ('d', 'd_bn'), 'd')
  assert split_for_groups((4, 2), ('x', 'y'), 4) == ((2, 2, 2), ('x', 'x_bn', 'y'), 'x')
  assert split_for_groups((2, 4), ('x', 'y'), 4) == ((2, 4), ('x', 'y'), None)


def test_a_split_mesh_trains_like_the_mesh_whose_trailing_axes_are_the_groups():
  """Groups of 2 on (2, 4) (axis 'y' split) and on (4, 2) (trailing 'y') are the same
  consecutive devices: all-reduce training with BN in those groups is the same."""
  runs = []
  for shape in ((2, 4), (4, 2)):
    mesh = make_mesh(shape, ('x', 'y'), bn_group_size=2)
    runs.append(sharded_run(TinyResNet(), TX, mesh, random_batches(2, batch=32),
                            bn_group_size=2))
  (state, losses), (ref, ref_losses) = runs
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
  assert_trees_close(state.params, ref.params, rtol=1e-5, atol=1e-7)
  assert_trees_close(state.batch_stats, ref.batch_stats, rtol=1e-5, atol=1e-7)


def test_groups_are_trailing_mesh_axes():
  assert group_sizes((2, 4)) == [1, 4, 8]
  assert group_axes((2, 4), ('x', 'y'), 4) == ('y',)
  assert group_axes((2, 4), ('x', 'y'), 8) == ('x', 'y')
  assert group_axes((2, 4), ('x', 'y'), 0) == ('x', 'y')  # 0 = every device
  assert group_axes((2, 4), ('x', 'y'), 1) is None        # per-device statistics
  with pytest.raises(ValueError, match=r'valid: \[1, 4, 8\]'):
    group_axes((2, 4), ('x', 'y'), 2)
  # Axes of one device share nothing: BN never all-reduces over a group of one.
  assert group_axes((1, 4), ('x', 'y'), 0) == ('y',)
  assert group_axes((1,), ('data',), 0) is None


class FlaxBN(nn.Module):
  axis_name: object = None

  @nn.compact
  def __call__(self, x):
    return nn.BatchNorm(use_running_average=False, momentum=MOMENTUM, epsilon=EPS,
                        dtype=jnp.float32, axis_name=self.axis_name, name='BatchNorm_0')(x)


def _sums(monkeypatch, gathered: bool) -> str:
  """The collective BatchNorm's statistics travel by: all-reduced (in one process), or
  gathered and summed (`collectives.gathers_small_sums`: on CPU across processes), here
  chosen by hand on emulated devices."""
  monkeypatch.setattr(collectives, 'gathers_small_sums', lambda: gathered)
  return '"stablehlo.all_gather"' if gathered else '"stablehlo.all_reduce"'


@pytest.mark.parametrize('gathered', [False, True])
@pytest.mark.parametrize('group_size', [2, 8])
def test_batch_norm_sums_its_statistics_once_each_way_and_computes_flaxs_numbers(
    group_size, gathered, monkeypatch):
  """jaxpar's BatchNorm against flax's on the same variables under `shard_map` (weights
  differentiated as a varying copy, as the step does): the same output, running statistics
  and gradients (of the input and of scale and bias, per device), and one collective in
  each direction where flax's lowered program has one all-reduce forward and two backward —
  an all-reduce, or an all-gather and a sum where a run sums by gathering."""
  mesh = make_mesh((8,), ('d',), bn_group_size=group_size)
  bn_axes = group_axes(mesh.devices.shape, mesh.axis_names, group_size)
  x = _device_batches()
  w = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
  variables = BN().init(jax.random.key(0), x[0])
  variables = {'params': {'BatchNorm_0': {'scale': jnp.array([1.5, 0.5, -1.0]),
                                          'bias': jnp.array([0.1, 0.0, -0.3])}},
               'batch_stats': variables['batch_stats']}
  every = mesh.axis_names

  def program(module):
    def body(x, w):
      params = jax.tree.map(lambda p: jax.lax.pcast(p, every, to='varying'),
                            variables['params'])

      def loss(params, x):
        y, new = module.apply({'params': params, 'batch_stats': variables['batch_stats']},
                              x[0], mutable=['batch_stats'])
        return jnp.sum(y * w[0]), (y, new['batch_stats'])
      (_, (y, stats)), grads = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(params, x)
      # Per device, as computed: no collective but the layer's own in the program.
      def varying(g):
        missing = tuple(a for a in every if a not in jax.typeof(g).mat.varying)
        return (jax.lax.pcast(g, missing, to='varying') if missing else g)[None]
      per_device = jax.tree.map(varying, (stats, grads[0]))
      return (y[None], *per_device, grads[1])
    return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(every), P(every)),
                                 out_specs=P(every)))
  theirs = program(FlaxBN(bn_axes))
  calls = theirs.lower(x, w).as_text().count('"stablehlo.all_reduce"')
  sums = _sums(monkeypatch, gathered)
  ours = program(BN(bn_axes))
  for mine, flax_ in zip(ours(x, w), theirs(x, w)):
    assert_trees_close(mine, flax_, rtol=1e-6, atol=1e-6)
  text = ours.lower(x, w).as_text()
  assert (text.count(sums), calls) == (2, 3)
  assert text.count('"stablehlo.all_reduce"') + text.count('"stablehlo.all_gather"') == 2


def _branches(name, norm):
  """A fire module's two expand layers, or an Inception module's six, small."""
  from jaxpar.models.googlenet import Inception
  from jaxpar.models.squeezenet import Fire
  return (Fire(2, 3, 4, norm=norm) if name == 'fire'
          else Inception((3, 2, 4, 2, 3, 2), norm=norm))


@pytest.mark.parametrize('gathered', [False, True])
@pytest.mark.parametrize('name, channels, calls', [('fire', 7, 2), ('inception', 12, 2)])
def test_parallel_branches_all_reduce_their_statistics_together_with_the_whole_batchs_numbers(
    name, channels, calls, gathered, monkeypatch):
  """A fire module's expand layers and an Inception module's two sets of independent layers
  (`layers.together`) over 2 devices: the output, the running statistics and the gradients
  of a weighted sum are those of the module on one device with both devices' rows (BatchNorm
  over the whole batch), the variables are named as without it, and the lowered program
  all-reduces once each way per set of layers: fire 1 + 1 (the squeeze layer, then both
  expand layers; 3 without), Inception 2 (four layers, then two; 6 without) — all-reduces,
  or all-gathers where a run sums by gathering."""
  sums = _sums(monkeypatch, gathered)
  mesh = make_mesh((2,), ('d',), jax.devices()[:2])
  rng = np.random.default_rng(2)
  x = rng.normal(size=(2, 3, 6, 6, 5)).astype(np.float32) + np.arange(2)[:, None, None, None,
                                                                           None]
  whole = _branches(name, batch_norm(True, None, jnp.float32))
  variables = whole.init(jax.random.key(0), x[0])
  sharded = _branches(name, batch_norm(True, 'd', jnp.float32))
  assert (jax.tree.structure(jax.eval_shape(sharded.init, jax.random.key(0), x[0]))
          == jax.tree.structure(variables))
  w = rng.normal(size=(2, 3, 6, 6, channels)).astype(np.float32)

  def loss(module, params, x, w):
    y, new = module.apply({'params': params, 'batch_stats': variables['batch_stats']}, x,
                          mutable=['batch_stats'])
    return jnp.sum(y * w), (y, new['batch_stats'])

  grad = jax.value_and_grad(loss, argnums=(1, 2), has_aux=True)
  (_, (y, stats)), (g_params, g_x) = grad(whole, variables['params'], x.reshape(6, 6, 6, 5),
                                          w.reshape((6,) + w.shape[2:]))

  def body(x, w):
    params = jax.tree.map(lambda p: jax.lax.pcast(p, 'd', to='varying'), variables['params'])
    (_, (y, stats)), (g_params, g_x) = grad(sharded, params, x[0], w[0])
    return y[None], stats, jax.tree.map(lambda g: g[None], g_params), g_x[None]
  program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P('d'), P('d')),
                                  out_specs=(P('d'), P(), P('d'), P('d'))))
  got = program(x, w)
  summed = jax.tree.map(lambda g: g.sum(0), got[2])  # the devices' gradients, summed here
  assert_trees_close((got[0].reshape(y.shape), got[1], summed, got[3].reshape(g_x.shape)),
                     (y, stats, g_params, g_x), rtol=2e-5, atol=2e-5)
  # BatchNorm's collectives alone: `calls` forward and as many backward.
  text = program.lower(x, w).as_text()
  assert text.count(sums) == 2 * calls
  assert text.count('"stablehlo.all_reduce"') + text.count('"stablehlo.all_gather"') == 2 * calls
