"""Gradient accumulation (config `grad_accum_steps`): k micro-batches a device, one update."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpar.perfmodel.hlo import collectives
from jaxpar import models
from jaxpar.mesh import make_mesh
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.parallel.async_sgd import gradient_fn
from jaxpar.parallel.servers import CentralServer, DistributedServer
from jaxpar.step import init_state, loss_and_logits, make_train_step, to_global
from runs import TinyResNet, assert_trees_close, init_plain, random_batches, sharded_run

# No BatchNorm, no dropout: the mean of the micro-batches' gradients is the batch's.
TinyVGG = functools.partial(models.VGG, layers=(8, 'M'), num_classes=5, fc_features=16,
                            dropout_rate=0.0)
TX = optax.sgd(0.05, momentum=0.9)


@pytest.mark.parametrize('server', ['allreduce', 'distributed', 'central'])
def test_k_micro_batches_equal_one_step_on_their_union(server):
  """Without BatchNorm, 4 micro-batches of 2 per device and one update train exactly as
  the whole batch of 8 per device does, under every server; the program's collectives
  are those of the plain step (communication once per update)."""
  mesh = make_mesh((2, 4), ('x', 'y'))
  method = {'allreduce': lambda: AllReduce(mesh.axis_names),
            'distributed': lambda: DistributedServer(mesh, placement='greedy'),
            'central': lambda: CentralServer(mesh)}[server]
  batches = random_batches(3, batch=64)
  runs = []
  for micro_batches in (4, 1):
    strategy = method()
    runs.append(sharded_run(TinyVGG(), _tx(strategy), mesh, batches, strategy,
                            micro_batches=micro_batches))
  (state, losses), (ref, ref_losses) = runs
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert losses[2] != losses[0]
  assert_trees_close(state.params, ref.params, rtol=1e-4, atol=1e-6)
  assert _collectives(method(), mesh, 4) == _collectives(method(), mesh, 1)


def _tx(strategy):
  params = jax.eval_shape(lambda: TinyVGG().init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)),
                                                 train=False))['params']
  return strategy.make_optimizer(_SGD, optax.constant_schedule(0.05), params)


class _SGD:  # what `make_optimizer` reads
  name, weight_decay, momentum, nesterov = 'sgd', 0.0, 0.9, False


def _collectives(strategy, mesh, micro_batches):
  model = TinyVGG()
  tx = _tx(strategy)  # sets the distributed server's packing
  state = init_state(model, tx, strategy, mesh, (1, 16, 16, 3), jax.random.key(0))
  text = make_train_step(model, tx, mesh, strategy, micro_batches).lower(
      state, to_global(mesh, random_batches(1, batch=64)[0]), jax.random.key(0)).as_text()
  return [(c.op, c.shape) for c in collectives(text)]


def test_with_batch_norm_each_micro_batch_is_normalised_on_its_own():
  """BatchNorm over all 8 devices, 2 micro-batches a device: micro-batch i is every
  device's i-th piece, normalised by its own statistics; the gradient is the mean of the
  two, and the running statistics are updated twice, in order (a numpy-free single-device
  reference)."""
  mesh = make_mesh((8,), ('data',))
  batches = random_batches(2, batch=32)
  state, losses = sharded_run(TinyResNet(), TX, mesh, batches, bn_group_size=8, micro_batches=2)

  model = TinyResNet()
  ref = init_plain(model, TX, (1, 16, 16, 3))
  ref_losses = []
  for b in batches:
    # Device d holds rows 4d … 4d+3; its micro-batch i is rows 4d + 2i, 4d + 2i + 1.
    pieces = jax.tree.map(lambda x: x.reshape(8, 2, 2, *x.shape[1:]), b)
    stats, grads, loss = ref.batch_stats, [], 0.0
    for i in range(2):
      micro = jax.tree.map(lambda x: x[:, i].reshape(16, *x.shape[3:]), pieces)
      (l, stats), g = _grad(model)(ref.params, stats, micro)
      grads.append(g)
      loss += float(l) / 2
    mean = jax.tree.map(lambda a, b: (a + b) / 2, *grads)
    updates, opt_state = TX.update(mean, ref.opt_state, ref.params)
    ref = ref.replace(params=optax.apply_updates(ref.params, updates), batch_stats=stats,
                      opt_state=opt_state)
    ref_losses.append(loss)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  assert_trees_close(state.params, ref.params, rtol=1e-4, atol=1e-6)
  assert_trees_close(state.batch_stats, ref.batch_stats, rtol=1e-4, atol=1e-6)


@functools.cache
def _grad(model):
  def loss_fn(params, stats, micro):
    out, new = model.apply({'params': params, 'batch_stats': stats}, micro['image'],
                           train=True, mutable=['batch_stats'])
    return loss_and_logits(out, micro['label'])[0], new['batch_stats']
  return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))


def test_an_async_workers_push_accumulates_too():
  """Downpour's workers compute their push with the same accumulation."""
  model = TinyVGG()
  variables = model.init(jax.random.key(0), jnp.zeros((1, 16, 16, 3)), train=False)
  batch = random_batches(1, batch=8)[0]
  one = gradient_fn(model)(variables['params'], {}, batch, jax.random.key(1))
  four = gradient_fn(model, 4)(variables['params'], {}, batch, jax.random.key(1))
  assert_trees_close(four[0], one[0], rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(four[2]['loss'], one[2]['loss'], rtol=1e-6)
