"""The independent simulation of gossip (analysis/accuracy/gossip_sim.py): its mixing matrix is
the one jaxpar's exchange applies, its closed form for the replicas' difference mode matches
the rule stepped by hand on a quadratic, and on the digits [L]'s gradient mixing drives 2
replicas apart where mixing their parameters keeps them together."""
import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from analysis.accuracy import gossip_sim
from jaxpar.mesh import make_mesh
from jaxpar.parallel import gossip


@pytest.mark.parametrize('n', [2, 3, 4, 8])
def test_the_simulations_mixing_is_jaxpars_exchange(n):
  assert gossip_sim.distances(n) == gossip.distances(n)
  mesh = make_mesh((n,), ('data',))
  for s in gossip_sim.distances(n):
    exchange = jax.jit(jax.shard_map(lambda g: gossip.gossip_mean(g, 'data', s), mesh=mesh,
                                     in_specs=P('data'), out_specs=P('data')))
    # Row i of the identity is device i's "gradient": the exchange returns W_s itself.
    np.testing.assert_allclose(exchange(np.eye(n, dtype=np.float32)), gossip_sim.mixing(n, s),
                               rtol=1e-6)
    np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(gossip_sim.mixing(n, s))),
                               np.sort(gossip_sim.mode_eigenvalues(n)[s]), atol=1e-12)


@pytest.mark.parametrize('mix', ['gradients', 'parameters'])
@pytest.mark.parametrize('n', [2, 4])
def test_the_difference_mode_follows_its_closed_form(n, mix):
  """Replicas on a quadratic ½ h w² start along the ring's first Fourier mode (cos 2πi/n);
  stepped by the rule, their mode coefficient is the closed form's factor."""
  eta, h, steps = 0.3, 2.0, 7
  v = np.cos(2 * np.pi * np.arange(n) / n)
  w = v.copy()
  cycle = gossip_sim.distances(n)
  for k in range(steps):
    mixing = gossip_sim.mixing(n, cycle[k % len(cycle)])
    w = w - eta * mixing @ (h * w) if mix == 'gradients' else mixing @ (w - eta * h * w)
  np.testing.assert_allclose(w @ v / (v @ v),
                             gossip_sim.difference_factor(n, steps, eta, h, 1, mix), rtol=1e-12)
  if n == 2 and mix == 'gradients':  # λ = −1/3 on every step: the replicas climb apart
    assert gossip_sim.difference_factor(n, steps, eta, h) == pytest.approx((1 + eta * h / 3) ** 7)


def test_on_the_digits_gradient_gossip_drives_two_replicas_apart():
  runs = {m: gossip_sim.simulate(m, 2, 0.1, 600, 16)['curve'][-1] for m in gossip_sim.METHODS}
  assert runs['allreduce']['spread'] == 0 and runs['allreduce']['loss_of_mean'] < 0.5
  assert runs['gossip-gradients']['spread'] > 0.2
  assert runs['gossip-gradients']['loss_of_mean'] > runs['allreduce']['loss_of_mean'] + 0.5
  assert runs['gossip-parameters']['spread'] < 0.01
  assert runs['gossip-parameters']['loss_of_mean'] == pytest.approx(
      runs['allreduce']['loss_of_mean'], rel=0.1)


def test_bad_arguments_are_one_line(capsys):
  with pytest.raises(SystemExit) as e:
    gossip_sim.main(['--ps', '1'])
  assert e.value.code == 2 and '--ps ≥ 2' in capsys.readouterr().err
