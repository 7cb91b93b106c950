"""Hybrid data/model parallelism ([H] §4): FC layers split along the output dimension over
a 'model' mesh axis train exactly like the data-parallel network; [H]'s rule decides per
layer; the split layers take 1/R of the parameter memory per device."""
import functools

import jax
import numpy as np
import optax
import pytest

from jaxpar import config as config_lib
from jaxpar import models
from jaxpar.mesh import make_mesh
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.parallel.hybrid import HybridFC, choose_split
from jaxpar.step import init_state, init_variables, make_eval_step, make_train_step, to_global
from runs import assert_trees_close

# A small VGG: one 3×3 conv, a pool, FC 16 → 16 → 8 classes (R = 4 divides 16 and 8).
TinyVGG = functools.partial(models.VGG, layers=(8, 'M'), num_classes=8, fc_features=16,
                            dropout_rate=0.0)
IMAGE = (1, 8, 8, 3)


def _batches(n, batch):
  rng = np.random.default_rng(0)
  return [{'image': rng.normal(size=(batch,) + IMAGE[1:]).astype(np.float32),
           'label': rng.integers(0, 8, batch).astype(np.int32)} for _ in range(n)]


def _run(model, strategy, mesh, batches, tx):
  state = init_state(model, tx, strategy, mesh, IMAGE, jax.random.key(0))
  step = make_train_step(model, tx, mesh, strategy)
  losses = []
  for b in batches:
    state, metrics = step(state, to_global(mesh, b), jax.random.key(7))
    losses.append(float(metrics['loss']))
  return state, losses, float(metrics['sent_bytes'])


def test_model_parallel_fc_with_lars_trains_like_data_parallel_lars():
  """LARS' trust ratio of a split layer takes the whole kernel's norms (its slices' sums of
  squares added over the model axis), so split and whole layers train alike."""
  mesh = make_mesh((2, 4), ('data', 'model'))
  c = config_lib.defaults().optimizer
  c.name, c.weight_decay, c.momentum = 'lars', 1e-3, 0.9
  split = TinyVGG.func.FC_LAYERS
  hybrid, allreduce = HybridFC(mesh, 'model', split, per_device_batch=4), AllReduce(mesh.axis_names)
  txs = [s.make_optimizer(c, optax.constant_schedule(0.5), None) for s in (hybrid, allreduce)]
  batches = _batches(3, batch=32)
  state, losses, _ = _run(TinyVGG(fc_axis='model', fc_split=split), hybrid, mesh, batches, txs[0])
  ref, ref_losses, _ = _run(TinyVGG(), allreduce, mesh, batches, txs[1])
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert losses[2] != losses[0]
  assert_trees_close(jax.device_get(state.params), jax.device_get(ref.params), rtol=1e-4,
                     atol=1e-6)


@pytest.mark.parametrize('split', [TinyVGG.func.FC_LAYERS, ('Dense_1',)])
def test_model_parallel_fc_trains_like_data_parallel(split):
  """Outputs (losses), gradients (through the updates) and evaluation equal the
  data-parallel network's, on a (data 2, model 4) mesh, with SGD + momentum."""
  mesh = make_mesh((2, 4), ('data', 'model'))
  tx = optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.1, momentum=0.9))
  batches = _batches(3, batch=32)
  hybrid = HybridFC(mesh, 'model', split, per_device_batch=4)
  hybrid.tx = tx  # the optimizer whose state follows the parameters' layout
  state, losses, sent = _run(TinyVGG(fc_axis='model', fc_split=split), hybrid, mesh, batches,
                             tx)
  ref, ref_losses, _ = _run(TinyVGG(), AllReduce(mesh.axis_names), mesh, batches, tx)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert losses[2] != losses[0]
  assert_trees_close(jax.device_get(state.params), jax.device_get(ref.params), rtol=1e-4,
                     atol=1e-6)
  if len(split) == 3:  # bytes sent, by hand: the conv's 224 gradients all-reduced over 8
    # devices, each device's 618 FC-slice gradients over the 2 data devices, and the
    # activations: 2·(R−1)·M·(K + N/R) per layer, M = 4, R = 4, (K, N/R) = (128, 4),
    # (16, 4), (16, 2): 3168 + 480 + 432 values.
    assert sent == 2 * 7 / 8 * 224 * 4 + 2 * 1 / 2 * 618 * 4 + (3168 + 480 + 432) * 4
  # The split layers' slices (and their momentum) live 1/4 per device.
  for name in split:
    kernel = state.params[name]['kernel']
    assert kernel.addressable_shards[0].data.shape == (kernel.shape[0], kernel.shape[1] // 4)
  momentum = state.opt_state[1][0].trace[split[0]]['kernel']
  assert momentum.addressable_shards[0].data.nbytes * 4 == momentum.nbytes
  batch = {**batches[0], 'mask': np.ones(32, np.float32)}
  evaluate = make_eval_step(TinyVGG(fc_axis='model', fc_split=split), mesh)
  sums = evaluate(hybrid.variables(state), to_global(mesh, batch))
  ref_sums = make_eval_step(TinyVGG(), mesh)(AllReduce(mesh.axis_names).variables(ref),
                                             to_global(mesh, batch))
  assert float(sums['top1']) == float(ref_sums['top1'])
  np.testing.assert_allclose(float(sums['loss']), float(ref_sums['loss']), rtol=1e-5)


@pytest.mark.parametrize('m, r, expected', [
    # VGG16E at 224²: FC6 25088→4096 pays while M·R < 1231.4, FC7 4096→4096 below 819.4,
    # FC8 4096→1000 below 286.7 (worked out by hand from (K+1)·N / (3K + 2N)).
    (32, 8, ('Dense_0', 'Dense_1', 'Dense_2')),
    (64, 8, ('Dense_0', 'Dense_1')),
    (128, 8, ('Dense_0',)),
    (256, 8, ()),
    (1, 2, ('Dense_0', 'Dense_1', 'Dense_2')),
    (200, 2, ('Dense_0', 'Dense_1')),
    (32, 3, ()),  # 4096 and 1000 outputs do not split 3 ways
])
def test_auto_follows_the_rule_of_h(m, r, expected):
  params = jax.eval_shape(lambda: init_variables(models.VGG16E(num_classes=1000),
                                                 (1, 224, 224, 3), jax.random.key(0)))['params']
  assert choose_split(params, models.VGG16E.func.FC_LAYERS, 'auto', m, r) == expected
  assert choose_split(params, models.VGG16E.func.FC_LAYERS, 'data', m, r) == ()
  if r == 3:
    with pytest.raises(ValueError, match='Dense_0 has 4096 outputs'):
      choose_split(params, models.VGG16E.func.FC_LAYERS, 'model', m, r)


def test_vgg16e_fc_memory_per_device_is_one_rth():
  """From the compiled memory analysis of the initial state: splitting VGG16E's three FC
  layers over R = 4 devices saves 3/4 of their parameters and momentum on every device."""
  mesh = make_mesh((2, 4), ('data', 'model'))
  tx = optax.sgd(0.1, momentum=0.9)
  model = models.VGG16E(num_classes=8)
  fc = models.VGG16E.func.FC_LAYERS

  def per_device_bytes(strategy, model):
    from jax.sharding import NamedSharding
    def init():
      variables = init_variables(model, (1, 32, 32, 3), jax.random.key(0))
      return strategy.init(tx, variables['params'], {})
    shapes = jax.eval_shape(init)
    specs = jax.tree.map(lambda _: jax.sharding.PartitionSpec(), shapes)
    if isinstance(strategy, HybridFC):
      from jaxpar.step import TrainState
      state = TrainState(0, 0, shapes[0], {}, shapes[2])
      s = strategy.state_specs(state)
      specs = (s.params, {}, s.opt_state)
    compiled = jax.jit(init, out_shardings=jax.tree.map(
        lambda p: NamedSharding(mesh, p), specs)).lower().compile()
    return compiled.memory_analysis().output_size_in_bytes

  hybrid = HybridFC(mesh, 'model', fc)
  hybrid.tx = tx
  replicated = per_device_bytes(AllReduce(mesh.axis_names), model)
  split = per_device_bytes(hybrid, model.clone(fc_axis='model', fc_split=fc))
  params = jax.eval_shape(lambda: init_variables(model, (1, 32, 32, 3),
                                                 jax.random.key(0)))['params']
  fc_bytes = sum(x.size * 4 for name in fc for x in jax.tree.leaves(params[name]))
  # Parameters and momentum of the FC layers: 2 × fc_bytes replicated, 2 × fc_bytes / 4 split.
  assert replicated - split == pytest.approx(2 * fc_bytes * 3 / 4, rel=1e-3)
