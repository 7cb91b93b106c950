"""A checkpoint resumes on another mesh, number of devices or server (jaxpar/portable.py):
with the same global batch the resumed run's weights and optimizer state equal the
uninterrupted run's; replicas restored onto another number start from their mean; a
checkpoint of another network or optimizer is one line and every file stays; a checkpoint
whose metadata does not parse is damage and falls back."""
import json
import os

import jax
import numpy as np
import optax
import pytest

from jaxpar import checkpoint as checkpoint_lib
from jaxpar import config as config_lib
from jaxpar import portable
from jaxpar.checkpoint import Checkpoints
from jaxpar.config import ConfigError
from jaxpar.mesh import make_mesh
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.parallel.async_sgd import AsyncServer
from jaxpar.parallel.averaging import LocalSGD
from jaxpar.parallel.servers import CentralServer, DistributedServer
from jaxpar.parallel.sparsify import SparseGossip
from jaxpar.step import init_state, init_variables, make_train_step, to_global
from runs import TinyResNet, assert_trees_close, random_batches

IMAGE = (1, 16, 16, 3)
BATCHES = random_batches(4, batch=16)

MAKE = {
    'allreduce': lambda mesh: AllReduce(mesh.axis_names),
    'distributed': lambda mesh: DistributedServer(mesh),
    'greedy': lambda mesh: DistributedServer(mesh, placement='greedy'),
    'central': lambda mesh: CentralServer(mesh),
    'local_sgd': lambda mesh: LocalSGD(mesh, every=2),
    'sparse': lambda mesh: SparseGossip(mesh, threshold=0.0, capacity=0.5),
    'async': lambda mesh: AsyncServer(mesh, 'distributed'),
}


def _setup(name, shape, optimizer='sgd', loss_scaling=False):
  """(mesh, strategy, model, tx, fresh state) of TinyResNet with BatchNorm over every device."""
  axes = ('x', 'y')[:len(shape)] if len(shape) > 1 else ('data',)
  mesh = make_mesh(shape, axes)
  strategy = MAKE[name](mesh)
  c = config_lib.defaults().optimizer
  c.name, c.weight_decay, c.momentum = optimizer, 1e-3, 0.9
  c.eps = 1e-3  # Adam: near-zero moments would magnify the meshes' rounding differences
  rate = {'lars': 0.5, 'adam': 0.01}.get(optimizer, 0.05)
  params = jax.eval_shape(lambda: init_variables(TinyResNet(), IMAGE, jax.random.key(0)))['params']
  tx = strategy.make_optimizer(c, optax.constant_schedule(rate), params)
  model = TinyResNet(bn_axis_name=None if name in ('local_sgd', 'sparse', 'async')
                     else mesh.axis_names)
  state = init_state(model, tx, strategy, mesh, IMAGE, jax.random.key(0),
                     loss_scaling=loss_scaling)
  return mesh, strategy, model, tx, state


def _train(setup, state, batches):
  mesh, strategy, model, tx, _ = setup
  step = make_train_step(model, tx, mesh, strategy)
  for b in batches:
    state, _ = step(state, to_global(mesh, b), jax.random.key(7))
  return state


def _saved_and_restored(tmp_path, source, state, target):
  """`state` saved as `source` lays it out, restored onto `target`'s fresh state."""
  folder = str(tmp_path / 'run')
  checkpoints = Checkpoints(folder, every=1, keep=2,
                            record={'layout': source[1].checkpoint_layout()})
  checkpoints.save(int(state.step), state, force=True)
  checkpoints.close()
  checkpoints = Checkpoints(folder, every=1, keep=2,
                            record={'layout': target[1].checkpoint_layout()})
  restored = checkpoints.restore_latest(target[4])
  checkpoints.close()
  return restored, checkpoints.restored


@pytest.mark.parametrize('source, target, optimizer', [
    (('distributed', (8,)), ('allreduce', (4,)), 'sgd'),     # 8 → 4, distributed → all-reduce
    (('allreduce', (4,)), ('distributed', (8,)), 'adam'),    # 4 → 8, all-reduce → distributed
    (('allreduce', (2, 4)), ('central', (8,)), 'lars'),      # 2-D → 1-D, → central
    (('central', (4,)), ('greedy', (2,)), 'adam'),           # central → distributed (greedy)
    (('greedy', (8,)), ('distributed', (4,)), 'lars'),       # greedy 8 → even 4
    (('distributed', (2,)), ('allreduce', (1,)), 'sgd'),     # 2 → 1
])
def test_a_resumed_run_on_another_mesh_and_server_equals_the_uninterrupted_run(
    tmp_path, source, target, optimizer):
  """Two steps where the checkpoint was written, two where it resumed; the same global batch
  (16) and BatchNorm over every device, so each run is one device's maths: the weights, BN
  statistics, optimizer state and loss scale equal those of one all-reduce run of four steps."""
  whole = _setup('allreduce', (1,), optimizer, loss_scaling=True)
  reference = jax.device_get(_train(whole, whole[4], BATCHES))
  first = _setup(*source, optimizer, loss_scaling=True)
  second = _setup(*target, optimizer, loss_scaling=True)
  restored, done = _saved_and_restored(tmp_path, first, _train(first, first[4], BATCHES[:2]),
                                       second)
  if source[0] != target[0] or len(source[1]) != len(target[1]):
    assert done['notes'][0].startswith('converted from'), done
  assert int(restored.step) == 2 and int(restored.examples_seen) == 32
  for x, like in zip(jax.tree.leaves(restored), jax.tree.leaves(second[4])):
    assert x.sharding == like.sharding  # laid out as this run lays out its own
  resumed = _train(second, restored, BATCHES[2:])
  kw = dict(rtol=2e-5, atol=2e-6)
  assert_trees_close(jax.device_get(second[1].variables(resumed)),
                     {'params': reference.params, 'batch_stats': reference.batch_stats}, **kw)
  assert_trees_close(jax.device_get(resumed.loss_scale), reference.loss_scale, rtol=0)
  # The optimizer state in whole tensors: restored onto the reference's layout again.
  back, _ = _saved_and_restored(tmp_path / 'back', second, resumed, whole)
  assert_trees_close(jax.device_get(back.opt_state), reference.opt_state, **kw)


def test_replicas_resumed_on_another_number_start_from_their_mean(tmp_path):
  """Local SGD saved between averages (8 replicas that differ) and restored onto 4 and onto
  all-reduce: every replica, and the one copy, is the mean of the 8 (weights, statistics,
  momentum); the counters are kept; onto 8 again each keeps its own."""
  eight = _setup('local_sgd', (8,))
  state = _train(eight, eight[4], BATCHES[:3])
  saved = jax.device_get(state)
  mean = lambda tree: jax.tree.map(lambda x: x.mean(0), tree)
  assert not np.allclose(*jax.tree.leaves(saved.params)[0][:2])  # the replicas differ
  four = _setup('local_sgd', (4,))
  restored, done = _saved_and_restored(tmp_path / 'four', eight, state, four)
  assert 'the 8 saved replicas averaged into each of the 4' in done['notes']
  got = jax.device_get(restored)
  for tree in ('params', 'batch_stats', 'opt_state'):
    for x, m in zip(jax.tree.leaves(getattr(got, tree)), jax.tree.leaves(mean(getattr(saved, tree)))):
      assert x.shape[0] == 4
      for replica in x:
        np.testing.assert_allclose(replica, m, rtol=1e-6, atol=1e-7, err_msg=tree)
  one, _ = _saved_and_restored(tmp_path / 'one', eight, state, _setup('allreduce', (2,)))
  assert_trees_close(jax.device_get(one.params), mean(saved.params), rtol=1e-6, atol=1e-7)
  same, done = _saved_and_restored(tmp_path / 'same', eight, state, _setup('local_sgd', (8,)))
  assert done['notes'] == []
  assert_trees_close(jax.device_get(same), saved, rtol=0, atol=0)


def test_sparse_gossip_keeps_its_residual_across_a_change_of_devices(tmp_path):
  """Sparsified gossip's error-feedback residual (beside the optimizer's state) is the mean
  of the saved replicas' on 2 devices after 4; nothing else is lost."""
  four = _setup('sparse', (4,))
  state = _train(four, four[4], BATCHES[:2])
  saved = jax.device_get(state)
  residual = saved.opt_state[1]
  assert any(np.abs(x).sum() > 0 for x in jax.tree.leaves(residual))
  restored, _ = _saved_and_restored(tmp_path, four, state, _setup('sparse', (2,)))
  for x, r in zip(jax.tree.leaves(jax.device_get(restored.opt_state[1])),
                  jax.tree.leaves(residual)):
    np.testing.assert_allclose(x, np.broadcast_to(r.mean(0), x.shape), rtol=1e-6, atol=1e-8)


def test_an_asynchronous_servers_state_converts_both_ways(tmp_path):
  """Downpour's state in parts per owner (Algorithm 3.7 over 4 workers) restored onto
  all-reduce, and that onto Downpour over 2 workers: the same tensors throughout."""
  mesh, server, _, tx, state = _setup('async', (4,))
  # Momentum that is not zero, different in every tensor: one step's worth, by hand.
  state = state.replace(opt_state=jax.tree.map(
      lambda x: x + np.float32(0.5) if x.ndim else x, state.opt_state))
  source = (mesh, server, None, tx, state)
  replicated, _ = _saved_and_restored(tmp_path / 'a', source, state, _setup('allreduce', (2,)))
  leaves = jax.tree.leaves(jax.device_get(replicated.opt_state))
  assert all(np.all(x == 0.5) for x in leaves if x.ndim)
  two = _setup('async', (2,))
  back, done = _saved_and_restored(tmp_path / 'b', _setup('allreduce', (2,)), replicated, two)
  assert done['notes'] == ['converted from replicated to asynchronous (distributed server, '
                           '2 workers)']
  assert [len(part) for part in jax.tree.map(lambda x: 0, back.opt_state)] == [
      len(p) for p in jax.tree.map(lambda x: 0, two[4].opt_state)]
  assert all(np.all(x == 0.5) for x in jax.tree.leaves(jax.device_get(back.opt_state)) if x.ndim)
  assert_trees_close(jax.device_get(back.params), jax.device_get(state.params), rtol=0)


def test_a_checkpoint_of_another_network_is_one_line_and_every_file_stays(tmp_path):
  """Another width (a mismatch, not damage): a ConfigError naming what differs and what wrote
  it; no folder renamed. Another optimizer likewise."""
  mesh, strategy, model, tx, state = _setup('allreduce', (2,))
  folder = str(tmp_path)
  record = {'layout': strategy.checkpoint_layout(), 'config': {'model': 'resnet34'},
            'versions': {'jax': jax.__version__}}
  checkpoints = Checkpoints(folder, every=1, keep=2, record=record)
  checkpoints.save(1, state, force=True)
  checkpoints.close()
  before = sorted(os.listdir(tmp_path / 'checkpoints'))
  wider = TinyResNet(num_filters=16)
  other = init_state(wider, tx, strategy, mesh, IMAGE, jax.random.key(0))
  with pytest.raises(ConfigError) as e:
    Checkpoints(folder, every=1, keep=2, record=record).restore_latest(other)
  message = str(e.value)
  assert '\n' not in message and 'does not fit this run' in message
  assert "its parameters 'BasicBlock_0/BatchNorm_0/bias' are (8,), this run's (16,)" in message
  assert 'written by model=resnet34 (jaxpar on jax' in message
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == before

  _, adam, _, adam_tx, adam_state = _setup('allreduce', (2,), 'adam')
  with pytest.raises(ConfigError, match=r"its optimizer state has no '1/mu'"):
    Checkpoints(folder, every=1, keep=2, record=record).restore_latest(adam_state)
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == before


def test_a_checkpoint_whose_metadata_does_not_parse_is_damaged_and_the_one_before_restored(
    tmp_path):
  mesh, strategy, model, tx, state = _setup('allreduce', (2,))
  record = {'layout': strategy.checkpoint_layout()}
  checkpoints = Checkpoints(str(tmp_path), every=1, keep=3, record=record)
  for step in (1, 2):
    checkpoints.save(step, state.replace(step=state.step + step), force=True)
  checkpoints.close()
  metadata = tmp_path / 'checkpoints' / '2' / 'default' / '_METADATA'
  assert metadata.exists()
  metadata.write_text('{"tree_metadata": ')
  restored = Checkpoints(str(tmp_path), every=1, keep=3, record=record).restore_latest(state)
  assert int(restored.step) == 1
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['1', '2.damaged']


def test_the_record_says_what_changed():
  saved = {'config': {'mesh': {'shape': [8]}, 'server': 'distributed', 'seed': 0},
           'versions': {'jax': '0.10.2'}, 'processes': 2, 'global_batch': 64}
  now = {'config': {'mesh': {'shape': [4]}, 'server': 'allreduce', 'seed': 0},
         'versions': {'jax': '0.12.0'}, 'processes': 1, 'global_batch': 64}
  assert checkpoint_lib.changes(saved, now) == [
      "mesh.shape: (8,) -> (4,)", "processes: 2 -> 1", "server: 'distributed' -> 'allreduce'",
      "version of jax: '0.10.2' -> '0.12.0'"]
  # The run's global batch once, whether the config's field says it (sync-split) or not.
  split = lambda batch, per_device: {'config': {'global_batch': batch,
                                                'per_device_batch': per_device},
                                     'global_batch': batch or 8 * per_device}
  assert checkpoint_lib.changes(split(64, 0), split(32, 0)) == ['global_batch: 64 -> 32']
  assert checkpoint_lib.changes(split(0, 8), split(0, 4)) == [
      'global batch: 64 -> 32', 'per_device_batch: 8 -> 4']
  # An image folder that gained files (a checkpoint written before the count was recorded:
  # nothing to say).
  assert checkpoint_lib.changes({**saved, 'train_examples': 105},
                                {**saved, 'train_examples': 153}) == ['train examples: 105 -> 153']
  assert checkpoint_lib.changes(saved, {**saved, 'train_examples': 153}) == []


def test_a_resumed_run_says_its_batch_and_train_split_changed(caplog):
  """The log of a resumed run: its changes, a new global batch, and a train split of another
  size (an image folder that gained files: the stream's order is not the first run's)."""
  from jaxpar import train
  saved = {'config': {'seed': 0}, 'global_batch': 64, 'train_examples': 105}
  with caplog.at_level('INFO'):
    train._log_changes({'step': 10, 'record': saved, 'notes': []},
                       {**saved, 'global_batch': 32, 'train_examples': 153})
  lines = [r.getMessage() for r in caplog.records]
  assert lines[0] == ('Changed since the checkpoint was written: global batch: 64 -> 32; '
                      'train examples: 105 -> 153.')
  assert lines[1].startswith('The global batch changed from 64 to 32')
  assert lines[2].startswith('The train split has 153 examples, 105 when the checkpoint was '
                             'written') and len(lines) == 3
  assert checkpoint_lib.written_by({'config': json.dumps({'model': 'vgg16e',
                                                          'mesh': {'shape': [8]}})}) == \
      'model=vgg16e, mesh.shape=(8,)'
  assert portable.describe({'kind': 'split', 'devices': 8, 'placement': 'even'}) == \
      'split (even) over 8 devices'
