"""Kernel taps that read padding only: found from the network's shapes, their gradients zero,
and the all-reduce that leaves them out trains as one device on the whole batch does."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from jaxpar import models
from jaxpar.mesh import make_mesh
from jaxpar.models import live_taps
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.perfmodel import hlo
from runs import TinyResNet, assert_trees_close, init_plain, random_batches, reference_run, \
    sharded_run

# TinyResNet on 8² inputs: the stem (stride 2) gives 4², the pool 2², the first block keeps
# 2², the second (stride 2) makes 1²: its first kernel reads rows 1-2 of 0-2 at stride 2 and
# its second, on the 1² map, the centre only.
TINY_BOXES = {('BasicBlock_1', 'Conv_0', 'kernel'): (1, 3, 1, 3),
              ('BasicBlock_1', 'Conv_1', 'kernel'): (1, 2, 1, 2)}


def test_the_live_box_by_hand():
  assert live_taps.box((1, 1), (3, 3), (1, 1), ((1, 1), (1, 1))) == (1, 2, 1, 2)
  assert live_taps.box((2, 2), (3, 3), (1, 1), ((1, 1), (1, 1))) is None  # every tap reads
  # 5×5 on 2² with padding 2: offsets 1-3 reach a row (0 and 4 see padding at both outputs).
  assert live_taps.box((2, 2), (5, 5), 1, 'SAME') == (1, 4, 1, 4)
  assert live_taps.box((2, 2), (3, 3), (2, 2), ((1, 1), (1, 1))) == (1, 3, 1, 3)
  assert live_taps.box((4, 1), (3, 3), (1, 1), ((1, 1), (1, 1))) == (0, 3, 1, 2)
  assert live_taps.box((4, 4), (3, 3), (1, 1), 'VALID') is None  # no padding: all live


def test_the_networks_boxes_from_their_shapes():
  assert live_taps.boxes(TinyResNet(), 8) == TINY_BOXES
  assert live_taps.boxes(TinyResNet(), 16) == {}
  resnet = models.ResNet34(num_classes=10)
  found = live_taps.boxes(resnet, 32)  # layer 4 on 1² maps: 6 kernels
  assert sorted(k[0] for k in found) == [f'BasicBlock_{i}' for i in (13, 13, 14, 14, 15, 15)]
  assert live_taps.boxes(resnet, 224) == {}


def test_the_gradient_outside_the_box_is_zero():
  batch = random_batches(1, batch=4, size=8)[0]
  model, tx = TinyResNet(), optax.sgd(0.1)
  state = init_plain(model, tx, (1, 8, 8, 3))

  def loss(params):
    out, _ = model.apply({'params': params, 'batch_stats': state.batch_stats}, batch['image'],
                         train=True, mutable=['batch_stats'])
    return jnp.sum(out ** 2)
  # Each block's last BatchNorm scale starts at 0, which would zero every kernel gradient.
  params = jax.tree_util.tree_map_with_path(
      lambda p, x: jnp.ones_like(x) if p[-1].key == 'scale' else x, state.params)
  grads = jax.grad(loss)(params)
  cut = live_taps.compact(grads, TINY_BOXES)
  back = live_taps.expand(cut, TINY_BOXES, grads)
  for path, (r0, r1, c0, c1) in TINY_BOXES.items():
    g = grads[path[0]][path[1]][path[2]]
    assert np.abs(np.asarray(g[r0:r1, c0:c1])).max() > 0
    assert cut[path[0]][path[1]][path[2]].shape == (r1 - r0, c1 - c0) + g.shape[2:]
  assert_trees_close(back, grads, rtol=0, atol=0)  # what was cut away was zeros


def test_all_reduce_of_the_live_taps_trains_as_one_device_and_sends_fewer_bytes():
  mesh = make_mesh((8,), ('data',))
  tx = optax.sgd(0.1, momentum=0.9)
  batches = random_batches(3, batch=16, size=8)
  whole, live = AllReduce(mesh.axis_names), AllReduce(mesh.axis_names, live=TINY_BOXES)
  state, losses = sharded_run(TinyResNet(), tx, mesh, batches, strategy=live)
  ref_state, ref_losses = reference_run(TinyResNet(), tx, batches)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert_trees_close(state.params, ref_state.params, rtol=2e-4, atol=2e-6)
  params = jax.eval_shape(lambda: init_plain(TinyResNet(), tx, (1, 8, 8, 3)).params)
  stacked = jax.tree.map(lambda p: jax.ShapeDtypeStruct((8, *p.shape), p.dtype), params)
  sent = []
  for strategy in (whole, live):
    reduce = jax.shard_map(lambda g: strategy.reduce(jax.tree.map(lambda x: x[0], g)),
                           mesh=mesh, in_specs=P('data'), out_specs=P())
    found = hlo.compiled_collectives(jax.jit(reduce).lower(stacked).compile().as_text())
    sent.append(sum(c.size for c in found))
  dead = (9 - 4) * 8 * 16 + (9 - 1) * 16 * 16  # the two kernels' dead taps: 8 → 16, 16 → 16
  assert sent[0] - sent[1] == dead
