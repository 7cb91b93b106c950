"""The training step under shard_map against single-device references ([T] ch. 3)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jaxpar.perfmodel.hlo import collectives
from jaxpar.mesh import make_mesh
from jaxpar import collectives as collectives_lib
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.step import loss_and_logits, make_eval_step, make_train_step, to_global
from runs import (TinyResNet, assert_trees_close, init_plain, random_batches, reference_run,
                  sharded_run)


@pytest.mark.parametrize('fusion', ['per_tensor', 'by_size', 'one_buffer'])
def test_sync_split_on_8_devices_equals_one_device_with_the_whole_batch(fusion, monkeypatch):
  """[T]: sync-split gives the same result as sequential training, BN statistics included
  (BN groups span all 8 devices: bn_group_size 8), however psum sends the gradients (by size
  with a 4 KiB threshold: TinyResNet's 3×3 convolutions alone, the rest in one buffer)."""
  monkeypatch.setattr(collectives_lib, 'SMALL_TENSOR_BYTES', 4096)
  tx = optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.1, momentum=0.9))
  batches = random_batches(3, batch=32)
  mesh = make_mesh((2, 4), ('x', 'y'))
  strategy = AllReduce(mesh.axis_names, fusion=fusion)
  state, losses = sharded_run(TinyResNet(), tx, mesh, batches, strategy, bn_group_size=8)
  # The program's all-reduces of the gradients: one per tensor, one, or one plus the large.
  stacked = jax.tree.map(lambda p: jax.ShapeDtypeStruct((8, *p.shape), p.dtype), state.params)
  reduce = jax.shard_map(lambda g: strategy.reduce(jax.tree.map(lambda x: x[0], g)), mesh=mesh,
                         in_specs=P(mesh.axis_names), out_specs=P())
  calls = len(collectives(jax.jit(reduce).lower(stacked).as_text()))
  leaves = jax.tree.leaves(state.params)
  large = sum(p.size * p.dtype.itemsize >= 4096 for p in leaves)
  assert 0 < large < len(leaves) - 1
  assert calls == {'per_tensor': len(leaves), 'by_size': 1 + large, 'one_buffer': 1}[fusion]
  ref_state, ref_losses = reference_run(TinyResNet(), tx, batches)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert losses[2] != losses[0]  # the parameters moved
  assert_trees_close(state.params, ref_state.params, rtol=2e-4, atol=2e-6)
  assert_trees_close(state.batch_stats, ref_state.batch_stats, rtol=2e-4, atol=2e-6)
  assert int(state.examples_seen) == 3 * 32 and int(state.step) == 3


def test_an_extra_sum_would_be_caught():
  """The equivalence test can fail: a reduction that sums instead of averaging differs."""
  tx = optax.sgd(0.1)
  batches = random_batches(2, batch=16)
  mesh = make_mesh((8,), ('data',))
  model = TinyResNet(bn_axis_name=('data',))
  state = jax.device_put(init_plain(model, tx, (1, 16, 16, 3)),
                         jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  summing = AllReduce(('data',))
  summing.reduce = lambda g: jax.lax.psum(g, 'data')
  step = make_train_step(model, tx, mesh, summing)
  for b in batches:
    state, _ = step(state, to_global(mesh, b), jax.random.key(7))
  ref_state, _ = reference_run(TinyResNet(), tx, batches)
  diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree.leaves(state.params), jax.tree.leaves(ref_state.params)))
  assert diff > 1e-3


class DropoutProbe(nn.Module):
  """Zero kernel: logits are 0 whatever the mask, so each device's kernel gradient
  is its dropout mask times a constant."""
  bn_axis_name: object = None

  @nn.compact
  def __call__(self, x, train=True):
    x = nn.Dropout(0.5, deterministic=not train)(x)
    return nn.Dense(2, use_bias=False, kernel_init=nn.initializers.zeros)(x)


def test_dropout_draws_a_different_mask_on_each_device():
  mesh = make_mesh((8,), ('data',))
  tx = optax.sgd(1.0)
  model = DropoutProbe()
  state = jax.device_put(init_plain(model, tx, (1, 64)),
                         jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  step = make_train_step(model, tx, mesh, AllReduce(('data',)))
  batch = {'image': np.ones((8, 64), np.float32), 'label': np.zeros(8, np.int32)}
  state, _ = step(state, to_global(mesh, batch), jax.random.key(3))
  # Per device, d loss / d kernel[j, 0] = -0.5 · 2 · mask_j; SGD(1) applies the
  # device mean, so kernel[j, 0] = mean over devices of mask_j ∈ {0, 1/8, …, 1}.
  # One mask shared by all devices would leave only 0s and 1s.
  kernel = np.asarray(state.params['Dense_0']['kernel'][:, 0])
  np.testing.assert_allclose(kernel * 8, np.round(kernel * 8), atol=1e-5)
  assert np.any((kernel > 0.01) & (kernel < 0.99))


def test_googlenet_auxiliary_losses_enter_the_training_loss():
  labels = jnp.array([0, 1])
  main, aux1, aux2 = (jax.random.normal(jax.random.key(i), (2, 3)) for i in range(3))
  ce = lambda z: -jnp.mean(jax.nn.log_softmax(z)[jnp.arange(2), labels])
  loss, logits = loss_and_logits((main, aux1, aux2), labels)
  np.testing.assert_allclose(loss, ce(main) + 0.3 * (ce(aux1) + ce(aux2)), rtol=1e-6)
  assert logits is main


def test_eval_step_counts_only_unmasked_rows():
  mesh = make_mesh((8,), ('data',))
  model = TinyResNet(bn_axis_name=('data',))
  tx = optax.sgd(0.1)
  state = jax.device_put(init_plain(model, tx, (1, 16, 16, 3)),
                         jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  batch = random_batches(1, batch=16)[0]
  mask = np.array([1.0] * 11 + [0.0] * 5, np.float32)
  variables = {'params': state.params, 'batch_stats': state.batch_stats}
  sums = make_eval_step(model, mesh)(variables, to_global(mesh, {**batch, 'mask': mask}))
  logits = model.clone(bn_axis_name=None).apply(
      {'params': state.params, 'batch_stats': state.batch_stats}, batch['image'], train=False)
  correct = (np.argmax(logits, -1) == batch['label'])[:11].sum()
  assert float(sums['count']) == 11
  assert float(sums['top1']) == correct


@pytest.mark.parametrize('kind', ['ring', 'torus2d'])
def test_ring_and_torus_steps_equal_the_psum_step(kind):
  """Same mean gradient whatever carries it: parameters and BN state after 3 steps match."""
  tx = optax.sgd(0.1, momentum=0.9)
  batches = random_batches(3, batch=32)
  mesh = make_mesh((2, 4), ('x', 'y'))
  state, losses = sharded_run(TinyResNet(), tx, mesh, batches,
                              AllReduce(mesh.axis_names, kind), bn_group_size=4)
  ref_state, ref_losses = sharded_run(TinyResNet(), tx, mesh, batches, bn_group_size=4)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert_trees_close(state.params, ref_state.params, rtol=1e-4, atol=1e-6)
  assert_trees_close(state.batch_stats, ref_state.batch_stats, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize('shape', [(1, 4), (1, 1)])
def test_a_torus_over_an_axis_of_one_device_sends_one_buffer_over_the_other(shape):
  """`torus2d` on a mesh with an axis of one device: the step of `psum` in one buffer —
  the same parameters after 2 steps, and the same collectives in its program (one
  all-reduce of every gradient over 'y', none at all on 1×1) — not the torus's scatter,
  sum and gather with two of them over one device."""
  tx = optax.sgd(0.1, momentum=0.9)
  batches = random_batches(2, batch=16)
  mesh = make_mesh(shape, ('x', 'y'), jax.devices()[:shape[0] * shape[1]])
  torus, one_buffer = (AllReduce(mesh.axis_names, 'torus2d'),
                       AllReduce(mesh.axis_names, 'psum', fusion='one_buffer'))
  state, losses = sharded_run(TinyResNet(), tx, mesh, batches, torus)
  ref_state, ref_losses = sharded_run(TinyResNet(), tx, mesh, batches, one_buffer)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
  assert_trees_close(state.params, ref_state.params, rtol=1e-6, atol=1e-7)
  model = TinyResNet(bn_axis_name=None)
  state = init_plain(model, tx, (1, 16, 16, 3))
  batch = to_global(mesh, batches[0])

  def program(strategy):
    step = make_train_step(model, tx, mesh, strategy)
    return sorted((c.op, c.shape) for c in collectives(
        step.lower(state, batch, jax.random.key(0)).as_text()))
  sent = program(torus)
  assert sent == program(one_buffer)
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  assert [c for c in sent if c[0] != 'all_reduce'] == []
  assert any(np.prod(c[1]) == num_params for c in sent) == (shape == (1, 4))


def test_bfloat16_compute_keeps_float32_state_and_tracks_float32_losses():
  """[Y]'s mixed precision: bf16 convolutions/activations/input, float32 master weights,
  optimizer state, BN statistics and loss; 4 steps stay within 2 % of float32's losses."""
  tx = optax.sgd(0.05, momentum=0.9)
  batches = random_batches(4, batch=32)
  mesh = make_mesh((2, 4), ('x', 'y'))
  f32_state, f32_losses = sharded_run(TinyResNet(), tx, mesh, batches)
  state, losses = sharded_run(TinyResNet(dtype=jnp.bfloat16), tx, mesh, batches,
                              AllReduce(mesh.axis_names, 'psum', jnp.bfloat16))
  for tree in (state.params, state.opt_state, state.batch_stats):
    assert {x.dtype for x in jax.tree.leaves(tree)} == {jnp.dtype(jnp.float32)}
  np.testing.assert_allclose(losses, f32_losses, rtol=2e-2)
  assert losses != f32_losses  # bf16 really computed something different


@pytest.mark.parametrize('kind', ['psum', 'ring', 'torus2d'])
def test_bfloat16_reduction_sends_bfloat16(kind):
  """Read from the lowered StableHLO, which keeps dtypes as written (compiled CPU HLO would
  show bf16 sums as f32): with the option the gradients' collectives move bf16, the same
  ops and shapes as the float32 program's; BN statistics and metrics stay float32."""
  mesh = make_mesh((2, 4), ('x', 'y'))
  model = TinyResNet(bn_axis_name=('x', 'y'))
  tx = optax.sgd(0.1)
  state = init_plain(model, tx, (1, 16, 16, 3))
  batch = to_global(mesh, random_batches(1, batch=16)[0])

  def program(dtype):
    step = make_train_step(model, tx, mesh, AllReduce(mesh.axis_names, kind, dtype))
    return collectives(step.lower(state, batch, jax.random.key(0)).as_text())
  f32, bf16 = program(None), program(jnp.bfloat16)
  assert sorted((c.op, c.shape) for c in f32) == sorted((c.op, c.shape) for c in bf16)
  assert all(c.dtype != 'bf16' for c in f32)
  sent = [c for c in bf16 if c.dtype == 'bf16']
  assert sent and len([c for c in f32 if c.dtype == 'f32']) - len(sent) == len(
      [c for c in bf16 if c.dtype == 'f32'])
  num_params = sum(x.size for x in jax.tree.leaves(state.params))
  if kind == 'psum':  # one all-reduce per gradient leaf
    assert sum(c.size for c in sent) == num_params
  if kind == 'ring':  # N−1 permutes and one all-gather of 1/N of the fused buffer each
    assert [c.op for c in sent] == ['collective_permute'] * 7 + ['all_gather']
    assert all(c.size == -(-num_params // 8) for c in sent)
