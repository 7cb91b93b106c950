"""What the tests share: a small ResNet, random batches, and training runs on a mesh (any
strategy) and on one device (the reference every parallel method is held to)."""
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxpar import models
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.group_batchnorm import group_axes
from jaxpar.step import TrainState, init_state, loss_and_logits, make_train_step, to_global

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def process_env(share_compiled: bool = False, default_emitters: bool = False) -> dict:
  """The environment of a process a test launches: the repository importable, conftest's
  XLA_FLAGS (compiled without LLVM's optimisations, with XLA's older CPU emitters where the
  jaxlib has them). `share_compiled`: the session's persistent compilation cache too, for a
  run of one process (a measurement's second repetition compiles its first one's programs);
  never for a multi-process run, where only some processes would find their programs there
  (conftest). `default_emitters`: XLA's own CPU emitters, for a run whose two programs of
  the same maths are compared through a diverging trajectory, which magnifies any
  difference in their rounding."""
  env = {**os.environ, 'PYTHONPATH': ROOT}
  if default_emitters:
    from conftest import OLDER_EMITTERS
    env['XLA_FLAGS'] = ' '.join(f for f in env.get('XLA_FLAGS', '').split()
                                if f != OLDER_EMITTERS)
  if share_compiled:
    env['JAX_COMPILATION_CACHE_DIR'] = os.environ['JAXPAR_TEST_XLA_CACHE']
    env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'  # 55 → 45 s a repetition
  else:  # nor jaxpar.train's own (config.compilation_cache=auto): nothing kept in ~/.cache
    env['JAX_ENABLE_COMPILATION_CACHE'] = 'false'
  return env


def train_losses(workdir) -> dict:
  """step → [train loss of every run that logged it in `workdir`], from the TensorBoard
  summaries (a resumed run adds its own events file beside the first run's)."""
  import tensorflow as tf
  losses = {}
  for path in sorted(workdir.glob('events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      for v in event.summary.value:
        if v.tag == 'train/loss':
          losses.setdefault(event.step, []).append(float(tf.make_ndarray(v.tensor)))
  return losses


def config_file(name: str, arg: str | None = None):
  """`configs/<name>.py`'s get_config(arg) (its default without one), as --config runs it."""
  from jaxpar import config as config_lib
  return config_lib.from_file(os.path.join(ROOT, 'configs', f'{name}.py'), arg)


# A small ResNet: same blocks and BatchNorm as ResNet34, cheap to compile.
TinyResNet = functools.partial(models.ResNet, stage_sizes=(1, 1), num_filters=8, num_classes=5)


def init_plain(model, tx, image_shape):
  """A single-device TrainState: the model's initial variables and `tx`'s state."""
  variables = model.clone(bn_axis_name=None).init(
      {'params': jax.random.key(0), 'dropout': jax.random.key(0)}, jnp.zeros(image_shape),
      train=True)
  return TrainState(step=jnp.int32(0), examples_seen=jnp.int32(0), params=variables['params'],
                    batch_stats=variables.get('batch_stats', {}),
                    opt_state=tx.init(variables['params']))


def random_batches(n, batch, size=16, seed=0):
  """`n` batches of `batch` random size×size RGB images with labels in 0..4 (numpy)."""
  rng = np.random.default_rng(seed)
  return [{'image': rng.normal(size=(batch, size, size, 3)).astype(np.float32),
           'label': rng.integers(0, 5, batch).astype(np.int32)} for _ in range(n)]


def sharded_run(model, tx, mesh, batches, strategy=None, bn_group_size=0, micro_batches=1):
  """Trains from the same initial weights on `batches` with `strategy` (all-reduce by
  default) on `mesh`: (state with the model's whole weights, losses)."""
  model = model.clone(bn_axis_name=group_axes(mesh.devices.shape, mesh.axis_names, bn_group_size))
  strategy = strategy or AllReduce(mesh.axis_names)
  state = init_state(model, tx, strategy, mesh, (1,) + batches[0]['image'].shape[1:],
                     jax.random.key(0))
  step = make_train_step(model, tx, mesh, strategy, micro_batches)
  losses = []
  for b in batches:
    state, metrics = step(state, to_global(mesh, b), jax.random.key(7))
    losses.append(float(metrics['loss']))
  # The model's weights whatever the strategy's layout; the optimizer state as laid out.
  return jax.device_get(state.replace(**strategy.variables(state))), losses


def reference_run(model, tx, batches):
  """Plain single-device training on the whole batch: no mesh, no collectives."""
  state = init_plain(model, tx, (1,) + batches[0]['image'].shape[1:])
  losses = []
  for b in batches:
    def loss_fn(params):
      out, new = model.apply({'params': params, 'batch_stats': state.batch_stats}, b['image'],
                             train=True, mutable=['batch_stats'])
      return loss_and_logits(out, b['label'])[0], new['batch_stats']
    (loss, stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    state = state.replace(params=optax.apply_updates(state.params, updates), batch_stats=stats,
                          opt_state=opt_state, step=state.step + 1)
    losses.append(float(loss))
  return state, losses


def assert_trees_close(a, b, **tol):
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, err_msg=jax.tree_util.keystr(path), **tol)


def learnable_batches(n, batch, seed=0, size=16):
  """Each class is a fixed pattern plus noise: a loss that falls over a few fresh batches."""
  patterns = np.random.default_rng(99).normal(size=(5, size, size, 3)).astype(np.float32)
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    labels = rng.integers(0, 5, batch).astype(np.int32)
    images = patterns[labels] + 0.5 * rng.normal(size=(batch, size, size, 3)).astype(np.float32)
    out.append({'image': images, 'label': labels})
  return out


def shard_batch(worker, position, batch=8):
  """Batch `position` of asynchronous worker `worker`'s shard: a pure function of both."""
  return learnable_batches(1, batch, seed=1000 * worker + position)[0]


def shard_batches(worker, position, batch=8):
  """Worker `worker`'s shard from batch `position` on (what a Ray worker reads)."""
  while True:
    yield shard_batch(worker, position, batch)
    position += 1


# How close asynchronous training comes to `downpour_replay` given the run's own versions.
# The replay's eager sums are not the workers' jitted ones: 2e-7 apart on one gradient.
# Replayed from its own versions instead, that difference fed chaos: in a net of ReLUs and
# BN a 1e-6 difference moves a unit across zero, and once (Ray, central, unbounded, a suite's
# second leg) one BN bias of the run and the free replay were 3.3e-4 apart after 15 steps
# where every other entry agreed to 4e-6 (before: 4.5e-6 with threads, 7.8e-6 in one
# momentum entry with Ray). From the run's versions, a log of test_async_sgd's four
# free-running workers comes to 2e-8 beyond rtol; a wrong ledger on that log is far away:
# one update a version off 2.5e-3, two neighbouring batches swapped 5.9e-3, one lr scale
# halved 1.0e-2, the last update dropped 1.1e-2 (free replays of test_async_ray's
# distributed-2-inverse log: 8.2e-4 to 9.2e-3). So at least 16 times this tolerance.
REPLAY_TOLERANCE = dict(rtol=1e-5, atol=5e-5)


def version_of(state):
  """The (params, batch_stats) a worker pulls from `state` (`downpour_replay`'s versions)."""
  return jax.device_get((state.params, state.batch_stats))


def downpour_replay(model, tx, batch_of, log, image_shape, versions=None):
  """Sequential single-device reference of asynchronous training: version k+1 = version k
  updated (its step times log[k].lr_scale) with the gradient of `batch_of(log[k])` at the
  weights and BN statistics of version log[k].version.

  `versions[v]`: the run's own (params, batch_stats) of version v (0 the initial), where
  each gradient is then taken, so the replay differs from the run by each gradient's
  rounding, summed, never by that rounding grown through the steps (see REPLAY_TOLERANCE);
  a gradient of the wrong version, batch or scale is as far off as before. The update
  itself is the replay's own chain of weights and momentum."""
  ref = init_plain(model, tx, image_shape)
  own = [(ref.params, ref.batch_stats)]
  params, opt_state = ref.params, tx.init(ref.params)
  for u in log:
    pulled, stats = (versions or own)[u.version]
    b = batch_of(u)

    def loss_fn(p):
      out, new = model.apply({'params': p, 'batch_stats': stats}, b['image'], train=True,
                             mutable=['batch_stats'])
      return optax.softmax_cross_entropy_with_integer_labels(out, b['label']).mean(), new
    grads, new = jax.grad(loss_fn, has_aux=True)(pulled)
    updates, opt_state = tx.update(grads, opt_state, params)
    updates = jax.tree.map(lambda x: x * u.lr_scale, updates)
    params = optax.apply_updates(params, updates)
    own.append((params, new['batch_stats']))
  return ref.replace(params=params, opt_state=opt_state)
