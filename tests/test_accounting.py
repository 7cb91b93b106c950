"""Every strategy reports the bytes a device sends per step, by its own accounting:
checked against the formulas worked out by hand for a model of 383 parameters."""
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpar.perfmodel.hlo import collectives, step_bytes
from analysis.steptime.volume import analytic_bytes
from jaxpar import config
from jaxpar.mesh import make_mesh
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.parallel.averaging import LocalSGD
from jaxpar.parallel.gossip import Gossip
from jaxpar.parallel.servers import CentralServer, DistributedServer
from jaxpar.parallel.sparsify import SparseGossip
from jaxpar.step import init_state, make_train_step, to_global

B = 383 * 4  # bytes of the model: Dense 48→7 and 7→5, float32


class Tiny(nn.Module):
  bn_axis_name: Any = None

  @nn.compact
  def __call__(self, x, train):
    return nn.Dense(5)(nn.relu(nn.Dense(7)(x.reshape(x.shape[0], -1))))


def _state_and_step(strategy, mesh):
  """SGD for the Tiny model in the strategy's layout (the distributed server packs its
  optimizer by the parameters' shapes)."""
  tx = optax.sgd(0.1)
  if hasattr(strategy, 'packing'):
    params = jax.eval_shape(lambda: Tiny().init(jax.random.key(0), jnp.zeros((1, 4, 4, 3)),
                                                train=True))['params']
    tx = strategy.make_optimizer(_SGD, optax.constant_schedule(0.1), params)
  state = init_state(Tiny(), tx, strategy, mesh, (1, 4, 4, 3), jax.random.key(0))
  return state, make_train_step(Tiny(), tx, mesh, strategy)


def _sent(strategy, mesh, steps=1):
  state, step = _state_and_step(strategy, mesh)
  rng = np.random.default_rng(0)
  sent = []
  for _ in range(steps):
    batch = {'image': rng.normal(size=(16, 4, 4, 3)).astype(np.float32),
             'label': rng.integers(0, 5, 16).astype(np.int32)}
    state, metrics = step(state, to_global(mesh, batch), jax.random.key(0))
    sent.append(float(metrics['sent_bytes']))
  return sent


class _SGD:
  name, weight_decay, momentum, nesterov = 'sgd', 0.0, 0.0, False


LINE = make_mesh((8,), ('data',))
GRID = make_mesh((2, 4), ('x', 'y'))


@pytest.mark.parametrize('name, strategy, expected', [
    # All-reduce: 2(N−1)/N of the message (the ring's count; XLA picks psum's algorithm).
    ('psum', AllReduce(LINE.axis_names), 2 * 7 / 8 * B),
    ('psum by size', AllReduce(LINE.axis_names, fusion='by_size'), 2 * 7 / 8 * B),
    ('ring', AllReduce(LINE.axis_names, 'ring'), 2 * 7 / 8 * B),
    ('bf16', AllReduce(LINE.axis_names, dtype=jnp.bfloat16), 2 * 7 / 8 * B / 2),
    # Torus 2×4: a ring on x of each half, then 1/X of it on y: (2·1/2 + 2·3/8)·B.
    ('torus2d', AllReduce(GRID.axis_names, 'torus2d'), 1.75 * B),
    # Central: 7 workers send B each, the server sends 7·B: a mean of 14·B/8 per device.
    ('central', CentralServer(LINE), 14 * B / 8),
    # Distributed, even: every device owns ⌈336/8⌉ + ⌈7/8⌉ + ⌈35/8⌉ + ⌈5/8⌉ = 49
    # elements and sends 7 slices of gradients and 7 of weights.
    ('distributed', DistributedServer(LINE), 7 * 49 * 8),
    # Gossip: the gradient to two partners.
    ('gossip', Gossip(LINE), 2 * B),
])
def test_sent_bytes_per_step(name, strategy, expected):
  mesh = GRID if name == 'torus2d' else LINE
  assert _sent(strategy, mesh) == pytest.approx([expected])


def test_local_sgd_sends_only_when_averaging():
  """τ = 2 after one synchronous step: gradients, nothing, then the model."""
  assert _sent(LocalSGD(LINE, every=2, warmup=1), LINE, steps=3) == pytest.approx(
      [2 * 7 / 8 * B, 0.0, 2 * 7 / 8 * B])


def test_gossip_sends_once_to_a_partner_met_twice():
  """Where both ring partners are one device (2 devices; distance s = 2 of 4) its gradient
  travels once and counts twice: 4 devices send 2·B, then B at s = 2; 2 devices B a step,
  sparsified gossip one message per tensor likewise."""
  quad, pair = make_mesh((4,), ('data',)), make_mesh((2,), ('data',))
  assert _sent(Gossip(quad), quad, steps=3) == pytest.approx([2 * B, B, 2 * B])
  assert _sent(Gossip(pair), pair, steps=2) == pytest.approx([B, B])
  # ⌈10 %⌉ of each tensor (336, 7, 35, 5 entries: 34, 1, 4, 1), 4-byte values and indices.
  assert _sent(SparseGossip(pair, 0.0, 0.1, True), pair) == pytest.approx([8 * (34 + 1 + 4 + 1)])


def _lowered_bytes(strategy, mesh):
  """Bytes per device of the lowered step's collectives of arrays (the
  metrics' scalars aside), as `jaxpar.perfmodel.hlo` reads them from the StableHLO: of a
  conditional (Local SGD's averaging, gossip's ring distances) the costliest branch."""
  state, step = _state_and_step(strategy, mesh)
  batch = {'image': np.zeros((16, 4, 4, 3), np.float32), 'label': np.zeros(16, np.int32)}
  text = step.lower(state, to_global(mesh, batch), jax.random.key(0)).as_text()
  return step_bytes([c for c in collectives(text) if c.shape], mesh.size)


def _config(**overrides):
  c = config.defaults()
  c.update_from_flattened_dict({k.replace('__', '.'): v for k, v in overrides.items()})
  return c


TORUS = dict(grad_reduce='torus2d', mesh__shape=(2, 4), mesh__axes=('x', 'y'))
PAIR = make_mesh((2,), ('data',))
ON_PAIR = dict(mesh__shape=(2,), mesh__axes=('data',))


@pytest.mark.parametrize('name, strategy, cfg, over_analytic, over_reported', [
    ('psum', AllReduce(LINE.axis_names), _config(), 1.0, 1.0),
    ('psum by size', AllReduce(LINE.axis_names, fusion='by_size'), _config(), 1.0, 1.0),
    ('psum one buffer', AllReduce(LINE.axis_names, fusion='one_buffer'),
     _config(grad_fusion='one_buffer'), 1.0, 1.0),
    # The ring pads 383 floats to 8 chunks of 48: 2·7·48 against 2·7/8·383 floats.
    ('ring', AllReduce(LINE.axis_names, 'ring'), _config(grad_reduce='ring'), 384 / 383,
     384 / 383),
    ('bf16', AllReduce(LINE.axis_names, dtype=jnp.bfloat16),
     _config(grad_reduce_dtype='bfloat16'), 1.0, 1.0),
    # Halves of 192 and 191 floats, the odd one padded for the x axis of 2.
    ('torus2d', AllReduce(GRID.axis_names, 'torus2d'), _config(**TORUS), 384 / 383, 384 / 383),
    ('central', CentralServer(LINE), _config(server='central'), 1.0, 1.0),
    ('central parallel', CentralServer(LINE, schedule='parallel'),
     _config(server='central', central_schedule='parallel'), 1.0, 1.0),
    # Every device owns 49 elements (8·49 = 392 for 383): the strategy counts the padding.
    ('distributed', DistributedServer(LINE), _config(server='distributed'), 392 / 383, 1.0),
    ('gossip', Gossip(LINE), _config(server='gossip'), 1.0, 1.0),
    ('sparse gossip', SparseGossip(LINE, 0.0, 0.1, True),
     _config(server='gossip', sparsify__capacity=0.1), 1.0, 1.0),
    ('local SGD', LocalSGD(LINE, every=1), _config(sync_every=1), 1.0, 1.0),
    # 2 devices: both partners are the other device, one permute (XLA merged two before).
    ('gossip pair', Gossip(PAIR), _config(server='gossip', **ON_PAIR), 1.0, 1.0),
    ('sparse gossip pair', SparseGossip(PAIR, 0.0, 0.1, True),
     _config(server='gossip', sparsify__capacity=0.1, **ON_PAIR), 1.0, 1.0),
])
def test_compiled_program_sends_the_analytic_volume(name, strategy, cfg, over_analytic,
                                                    over_reported):
  """The volume table's three counts for each method: the lowered program's collectives,
  the method's equations (`analysis.steptime.volume`) and its own `sent_bytes`, equal up to the
  padding the program adds to split tensors evenly."""
  mesh = GRID if name == 'torus2d' else PAIR if name.endswith('pair') else LINE
  params = jax.eval_shape(lambda: Tiny().init(jax.random.key(0), jnp.zeros((1, 4, 4, 3)),
                                              train=True))['params']
  program = _lowered_bytes(strategy, mesh)
  assert program == pytest.approx(analytic_bytes(cfg, params, {}) * over_analytic)
  assert program == pytest.approx(_sent(strategy, mesh)[0] * over_reported)
