"""The thesis' equations, the α-β cost models and the estimate CLI ([T] ch. 4, 7).

Expected values are worked out by hand in each test from the equations as the
thesis prints them, not taken from the implementation.
"""
import jax
import jax.numpy as jnp
import pytest

from analysis.theory import alpha_beta_servers as servers
from analysis.theory import equations as eq
from analysis.theory import estimate, thesis_report
from jaxpar.perfmodel import alpha_beta as cc

approx = pytest.approx


def test_synchronous_iterations():
  # t_grad 0.8, t_comm 0.1, N = 4.
  assert eq.sync_central_best(0.8, 0.1, 4) == approx(0.5 + 0.8)         # (N+1)·t_comm + t_grad
  assert eq.sync_central_worst(0.8, 0.1, 4) == approx(0.8 + 0.8)        # 2N·t_comm + t_grad
  assert eq.sync_central(0.8, 0.1, 4) == approx((1.3 + 1.6) / 2)
  assert eq.sync_distributed(0.8, 0.1, 4) == approx(2 * 0.1 * 3 / 4 + 0.8)
  assert eq.sync_distributed(0.8, 0.1, 1) == approx(0.8)                # nothing to move
  assert eq.sync_iteration_time([1.0, 3.0, 2.0]) == 3.0                 # eq. 4.3
  assert eq.sync_train_time(10, 1.5) == 15.0                            # eq. 4.2
  assert eq.computation_time(1, 2, 3) == 6                              # eq. 4.1


@pytest.mark.parametrize('scheme, server, expected', [
    # D = 128, N = 4, t_grad 0.8, t_comm 0.1; S = D·t_grad / t = 102.4 / t.
    ('sync-join', 'central', 102.4 / (32 * 1.45)),          # 32 iterations of 4.11
    ('sync-join', 'distributed', 102.4 / (32 * 0.95)),      # 32 iterations of 4.12
    ('sync-split', 'central', 102.4 / (128 * (0.7 + 1.0) / 2)),   # t_grad/N = 0.2
    ('sync-split', 'distributed', 102.4 / (128 * (0.15 + 0.2))),
])
def test_synchronous_speedups(scheme, server, expected):
  assert eq.estimated_speedup(scheme, server, 0.8, 0.1, 4, 128) == approx(expected)


def test_one_worker():
  # Central server at N = 1 still pulls and pushes: t = 2·t_comm + t_grad per batch.
  assert eq.estimated_speedup('sync-join', 'central', 1.0, 0.5, 1, 10) == approx(0.5)
  # A distributed server of one unit moves nothing: S = 1.
  for scheme in eq.SCHEMES:
    assert eq.estimated_speedup(scheme, 'distributed', 1.0, 0.5, 1, 10) == approx(1.0)


def test_async_central_best_case_is_the_servers_term():
  # t_grad 0.1, t_comm 1, N 4, D 8: worker 3 + 2·(2 + 0.1) = 7.2; server 9 + 0.1 = 9.1.
  assert eq.async_central_best_worker(0.1, 1.0, 4, 8) == approx(7.2)
  assert eq.async_central_best_server(0.1, 1.0, 4, 8) == approx(9.1)
  assert eq.async_central_best(0.1, 1.0, 4, 8) == approx(9.1)
  assert eq.async_central_worst(0.1, 1.0, 4, 8) == approx(2 * (8 + 0.1))
  assert eq.async_central(0.1, 1.0, 4, 8) == approx((9.1 + 16.2) / 2)
  assert eq.estimated_speedup('async', 'central', 0.1, 1.0, 4, 8) == approx(0.8 / 12.65)


def test_async_central_best_case_is_the_workers_term():
  # t_grad 1, t_comm 0.01, N 4, D 8: worker 0.03 + 2·1.02 = 2.07; server 0.09 + 1 = 1.09.
  assert eq.async_central_best(1.0, 0.01, 4, 8) == approx(2.07)
  assert eq.async_central(1.0, 0.01, 4, 8) == approx((2.07 + 2 * (0.08 + 1)) / 2)
  assert eq.estimated_speedup('async', 'distributed', 1.0, 0.01, 4, 8) == approx(
      8 / (2 * (2 * 0.01 * 3 / 4 + 1)))


def test_unknown_scheme_or_server():
  with pytest.raises(ValueError, match='scheme'):
    eq.training_time('sync', 'central', 1, 1, 2, 8)
  with pytest.raises(ValueError, match='server'):
    eq.training_time('async', 'ring', 1, 1, 2, 8)


def test_semaphore():
  assert eq.semaphore_transfer_time(0.2, 0) == approx(0.2)              # eq. 7.1
  assert eq.semaphore_transfer_time(0.2, 3) == approx(0.8)              # eq. 7.2, N = 4
  assert eq.semaphore_transfer_time(0.2, 3) <= eq.semaphore_bound(0.2, 4)  # eq. 7.3


def test_semaphore_training_time_is_the_best_case():
  # t_grad 0.8, t_comm 0.1, N = 4, D = 128: the last pull waits 4·t_comm, its push t_comm.
  assert eq.semaphore_training_time('sync-join', 0.8, 0.1, 4, 128) == approx(32 * (0.5 + 0.8))
  assert eq.semaphore_training_time('sync-split', 0.8, 0.1, 4, 128) == approx(128 * (0.5 + 0.2))
  assert eq.semaphore_training_time('sync-join', 0.8, 0.1, 4, 128) < eq.training_time(
      'sync-join', 'central', 0.8, 0.1, 4, 128)  # below the mean with the worst case
  assert eq.semaphore_training_time('async', 0.8, 0.1, 4, 128) == approx(
      eq.async_central_best(0.8, 0.1, 4, 128))
  with pytest.raises(ValueError, match='scheme'):
    eq.semaphore_training_time('ring', 0.8, 0.1, 4, 128)


def test_sparknet():
  assert eq.sparknet_naive_speedup(2.0, 20.0, 5) == approx(2 / (0.4 + 20))
  assert eq.sparknet_naive_speedup(2.0, 20.0, 10**9) <= 2.0 / 20.0 + 1e-9  # ≤ C/S
  assert eq.sparknet_tau(20.0, 2.0) == approx(50)   # [S]: S ≈ 20 s, C ≈ 2 s → τ = 50
  assert eq.sparknet_averaging_speedup(1000, 2.0, 50, 20.0, 8) == approx(2000 / (120 * 8))


def test_fc_volumes_of_vgg16e():
  from jaxpar.models import VGG16E
  params = jax.eval_shape(lambda: VGG16E(num_classes=1000).init(
      {'params': jax.random.key(0), 'dropout': jax.random.key(0)}, jnp.zeros((1, 224, 224, 3)),
      train=False))['params']
  layers = eq.fc_layer_shapes(params)
  assert [(k, n) for _, k, n in layers] == [(25088, 4096), (4096, 4096), (4096, 1000)]
  volumes = [eq.fc_data_parallel_volume(k, n) for _, k, n in layers]
  assert volumes == [25088 * 4096 + 4096, 4096 * 4096 + 4096, 4096 * 1000 + 1000]
  assert [round(v / 1e6, 2) for v in volumes] == [102.76, 16.78, 4.10]  # [H]'s figures
  assert eq.fc_model_parallel_volume(25088, 4096, 1, 2) == 3 * 25088 * 2 + 2 * 4096 * 2
  # FC6 at batch 1 on 2 workers: model parallel; FC8 at batch 64 on 8: data parallel.
  assert eq.fc_prefers_model_parallel(25088, 4096, 1, 2)
  assert not eq.fc_prefers_model_parallel(4096, 1000, 64, 8)
  for m, r in [(1, 2), (16, 4), (64, 8), (300, 1)]:  # the rule agrees with the volumes
    for _, k, n in layers:
      assert eq.fc_prefers_model_parallel(k, n, m, r) == (
          eq.fc_model_parallel_volume(k, n, m, r) < eq.fc_data_parallel_volume(k, n))
  # Batch 64 per worker on 8 workers: FC6 and FC7 model-parallel, FC8 data-parallel.
  plan = eq.fc_parallelism_plan(params, 64, 8)
  assert [row[-1] for row in plan] == ['model', 'model', 'data']
  assert plan[2][3:5] == (4096 * 1000 + 1000, 3 * 64 * 4096 * 8 + 2 * 64 * 1000 * 8)


# ------------------------------------------------------------------ α-β models
ALPHA, BETA, P = 1e-4, 1.25e8, 80e6   # 100 µs, 1 Gb/s, an 80 MB network


def test_ring_collectives():
  assert cc.ring_all_reduce(8e6, 4, 1e-5, 1e9) == approx(6 * (1e-5 + 2e6 / 1e9))
  assert cc.reduce_scatter(8e6, 4, 1e-5, 1e9) == approx(3 * (1e-5 + 2e6 / 1e9))
  assert cc.all_gather(8e6, 4, 1e-5, 1e9) == approx(3 * (1e-5 + 2e6 / 1e9))
  assert cc.ring_all_reduce(8e6, 1, 1e-5, 1e9) == 0


def test_torus2d_has_lower_latency_than_one_ring():
  # 2×4: phase = max(ring(P/2, 2), ring(P/2, 4)) = 6·(α + P/8/β); twice.
  assert servers.torus2d_all_reduce(P, 2, 4, ALPHA, BETA) == approx(2 * 6 * (ALPHA + P / 8 / BETA))
  # 16×16 against one ring of 256: 60 latency steps instead of 510.
  torus = servers.torus2d_all_reduce(1e3, 16, 16, ALPHA, float('inf'))
  ring = cc.ring_all_reduce(1e3, 256, ALPHA, float('inf'))
  assert torus == approx(60 * ALPHA) and ring == approx(510 * ALPHA)


def test_central_server_schedules_are_the_thesis_cases():
  t_comm = ALPHA + P / BETA
  for n in (1, 2, 5, 8):
    assert servers.central_server_sync_iteration(P, n, ALPHA, BETA, 0.7, 'serial') == approx(
        eq.sync_central_best(0.7, t_comm, n))                          # eq. 4.4
    assert servers.central_server_sync_iteration(P, n, ALPHA, BETA, 0.7, 'parallel') == approx(
        eq.sync_central_worst(0.7, t_comm, n))                         # eq. 4.7
  with pytest.raises(ValueError):
    servers.central_server_sync_iteration(P, 2, ALPHA, BETA, 0.7, 'random')


def test_distributed_server_is_the_thesis_equation_without_latency():
  for n in (1, 2, 5, 8):
    assert servers.distributed_server_sync_iteration(P, n, 0.0, BETA, 0.7) == approx(
        eq.sync_distributed(0.7, P / BETA, n))                         # eq. 4.12, α = 0
    # With latency, the thesis charges 2(N−1)α/N where the ring pays 2(N−1)α.
    gap = (servers.distributed_server_sync_iteration(P, n, ALPHA, BETA, 0.7)
           - eq.sync_distributed(0.7, ALPHA + P / BETA, n))
    assert gap == approx(2 * (n - 1) * ALPHA * (1 - 1 / n))


def test_gossip_round():
  assert servers.gossip_round(P, ALPHA, BETA) == approx(2 * (ALPHA + P / BETA))
  assert servers.gossip_round(P, ALPHA, BETA, partners=1) == approx(ALPHA + P / BETA)
  assert cc.point_to_point(P, ALPHA, BETA) == approx(ALPHA + P / BETA)


# ------------------------------------------------------------------ estimate CLI
ARGS = ['--t-grad', '0.8', '--t-comm', '0.1', '--type', 'sync-join', '--server', 'distributed',
        '--workers', '4', '--batches', '128']


def test_cli_single(capsys):
  assert estimate.main(ARGS + ['--output', 'single']) == 0
  assert float(capsys.readouterr().out) == approx(102.4 / 30.4, abs=1e-4)


def test_cli_csv(capsys):
  estimate.main(ARGS + ['--output', 'csv'])
  values = [float(v) for v in capsys.readouterr().out.strip().split(';')]
  expected = [n * 0.8 / (2 * 0.1 * (n - 1) / n + 0.8) for n in (1, 2, 3, 4)]  # N·t_grad / eq. 4.12
  assert values == approx(expected, abs=1e-4)


def test_cli_plot(capsys, tmp_path):
  out = tmp_path / 's.png'
  estimate.main(ARGS + ['--output', 'plot', '--out', str(out)])
  assert capsys.readouterr().out.strip() == str(out)
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.parametrize('argv, message', [
    (['--t-comm', '0.1'], '--t-grad'),
    (['--t-grad', 'fast', '--t-comm', '0.1'], 'invalid float value'),
    (['--t-grad', '1', '--t-comm', '0.1', '--type', 'sync'], 'invalid choice'),
    (['--t-grad', '1', '--t-comm', '-2'], '--t-comm: must be > 0'),
    (['--t-grad', '1', '--t-comm', '1', '--workers', '0'], '--workers: must be at least 1'),
])
def test_cli_usage_errors(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    estimate.main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert 'usage:' in err and message in err and 'Traceback' not in err


def test_thesis_report(tmp_path):
  path = thesis_report.report(str(tmp_path))
  text = open(path).read()
  for network in thesis_report.TABLE_6_1:
    assert (tmp_path / f'speedup_{network.lower()}.png').exists()
    assert f'## {network}' in text
  # The thesis: SqueezeNet with sync-split and a central server is fastest at 4 workers.
  squeeze = thesis_report.predictions(*thesis_report.TABLE_6_1['SqueezeNet'])
  values = squeeze[('sync-split', 'central')]
  assert values.index(max(values)) + 1 == 4
  # VGG16E: no parallel setting beats one worker.
  vgg = thesis_report.predictions(*thesis_report.TABLE_6_1['VGG16E'])
  assert max(v for values in vgg.values() for v in values[1:]) < 1
  # The summary (docs/theory.md): the same findings, one row a network.
  rows = {line.split(' | ')[0][2:]: line for line in thesis_report.summary_table().splitlines()[2:]}
  assert 'no parallel setting beats one worker' in rows['VGG16E']
  assert '| 1.88× at N = 4 |' in rows['SqueezeNet'] and '7.43× with async' in rows['SqueezeNet']
  assert text == thesis_report.markdown()  # the file is the markdown the report checks
