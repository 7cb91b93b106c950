"""The optimizer: masked weight decay and the warm-up + cosine schedule in steps."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxpar import config as config_lib
from jaxpar import models, optim


def _params():
  model = models.ResNet(stage_sizes=(1,), num_filters=4, num_classes=3)
  return model.init(jax.random.key(0), jnp.zeros((1, 8, 8, 3)), train=False)['params']


def test_weight_decay_only_on_kernels():
  params = _params()
  mask = optim.decay_mask(params)
  for path, decayed in jax.tree_util.tree_leaves_with_path(mask):
    name = path[-1].key
    assert decayed == (name == 'kernel'), jax.tree_util.keystr(path)


def test_schedule_warms_up_linearly_scaled_then_decays():
  c = config_lib.defaults().optimizer
  c.base_lr, c.base_batch, c.warmup_steps = 0.1, 256, 10
  lr = optim.learning_rate(c, global_batch=512, total_steps=110)
  assert lr(0) == 0 and lr(5) == pytest.approx(0.1)  # half way up to 0.2 = 0.1 × 512/256
  assert lr(10) == pytest.approx(0.2)
  assert lr(60) == pytest.approx(0.1)                # cosine half way down
  assert lr(110) == pytest.approx(0.0, abs=1e-9)


def test_update_decays_kernels_and_leaves_bn_and_biases_alone():
  c = config_lib.defaults().optimizer
  c.weight_decay, c.momentum = 0.5, 0.9
  tx = optim.make_optimizer(c, optax.constant_schedule(0.1))
  params = jax.tree.map(jnp.ones_like, _params())
  zero_grads = jax.tree.map(jnp.zeros_like, params)
  updates, _ = tx.update(zero_grads, tx.init(params), params)
  for path, u in jax.tree_util.tree_leaves_with_path(updates):
    expected = -0.1 * 0.5 * (1 + 0.9) if path[-1].key == 'kernel' else 0.0  # Nesterov's first step
    np.testing.assert_allclose(u, expected, rtol=1e-6, err_msg=jax.tree_util.keystr(path))


def test_poly_schedule_warms_up_then_decays_quadratically():
  c = config_lib.defaults().optimizer
  c.base_lr, c.base_batch, c.warmup_steps, c.schedule = 0.1, 256, 10, 'poly'
  lr = optim.learning_rate(c, global_batch=512, total_steps=110)
  assert lr(0) == 0 and lr(5) == pytest.approx(0.1)
  assert lr(10) == pytest.approx(0.2)
  assert lr(60) == pytest.approx(0.2 * 0.5**2)       # (1 − t)² half way down
  assert lr(110) == pytest.approx(0.0, abs=1e-9)


def test_one_lars_update_equals_the_hand_computation():
  """You et al. 2017 as optax and MLPerf compute it: a kernel's step is
  lr · η‖w‖/‖g + λw‖ · (g + λw); biases and BN scale/bias take lr · g, undecayed."""
  c = config_lib.defaults().optimizer
  c.name, c.weight_decay, c.trust_coefficient = 'lars', 0.01, 0.002
  c.momentum, c.nesterov = 0.9, True
  lr = 0.5
  tx = optim.make_optimizer(c, optax.constant_schedule(lr))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), _params())
  grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
  updates, _ = tx.update(grads, tx.init(params), params)
  for (path, u), w, g in zip(jax.tree_util.tree_leaves_with_path(updates),
                             jax.tree.leaves(params), jax.tree.leaves(grads)):
    w, g = np.asarray(w, np.float64), np.asarray(g, np.float64)
    if path[-1].key == 'kernel':
      d = g + 0.01 * w
      step = lr * 0.002 * np.linalg.norm(w) / np.linalg.norm(d) * d
    else:
      step = lr * g
    # First step from zero momentum; Nesterov applies it once more: (1 + m) × step.
    np.testing.assert_allclose(u, -(1 + 0.9) * step, rtol=1e-5, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize('name', ['adam', 'adamw'])
def test_adam_and_adamw_updates_equal_optax(name):
  """[T] ch. 3's Adam (α, β₁, β₂, ε): `adam` adds the L2 term λw to the gradient of the
  kernels (as torch.optim.Adam's weight_decay), `adamw` decays them apart from the
  moments (optax.adamw with the kernel mask). Three updates, moments included."""
  c = config_lib.defaults().optimizer
  c.name, c.weight_decay = name, 0.01
  lr = 0.001
  tx = optim.make_optimizer(c, optax.constant_schedule(lr))
  if name == 'adamw':
    ref = optax.adamw(lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.01, mask=optim.decay_mask)
  else:
    ref = optax.chain(optax.add_decayed_weights(0.01, optim.decay_mask),
                      optax.adam(lr, b1=0.9, b2=0.999, eps=1e-8))
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), _params())
  state, ref_state = tx.init(params), ref.init(params)
  for _ in range(3):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    updates, state = tx.update(grads, state, params)
    expected, ref_state = ref.update(grads, ref_state, params)
    for u, e in zip(jax.tree.leaves(updates), jax.tree.leaves(expected)):
      np.testing.assert_allclose(u, e, rtol=1e-6, atol=1e-9)
    params = optax.apply_updates(params, updates)


@pytest.mark.parametrize('name, scaling, expected', [
    ('sgd', 'auto', 0.2), ('lars', 'auto', 0.2), ('adam', 'auto', 0.1), ('adamw', 'auto', 0.1),
    ('adam', 'linear', 0.2), ('sgd', 'sqrt', 0.1 * 2 ** 0.5), ('sgd', 'none', 0.1)])
def test_the_peak_rate_follows_the_batch_by_the_rule(name, scaling, expected):
  c = config_lib.defaults().optimizer
  c.name, c.lr_scaling, c.base_lr, c.base_batch = name, scaling, 0.1, 256
  assert optim.peak_learning_rate(c, 512) == pytest.approx(expected)
