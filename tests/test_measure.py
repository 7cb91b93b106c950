"""analysis.measure, analysis.calibrate and analysis.compare: the α-β fit, the speedup
arithmetic, the costliest-branch count, bad arguments, and both CLIs end to end on an
emulated mesh (2 real processes: test_measure_processes.py)."""
import csv
import json
import os
import re
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import app
from jax import lax
from jax.sharding import PartitionSpec as P

from analysis import calibrate, collectives, compare, hlo, link, measure
from jaxpar import config as config_lib
from jaxpar.mesh import make_mesh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, 'PYTHONPATH': ROOT}  # with conftest's XLA_FLAGS: compiled fast
SIZES = np.geomspace(4096, 64e6, 8)


def test_alpha_beta_fit_recovers_known_values():
  exact = calibrate.fit_alpha_beta(SIZES, 2e-4 + SIZES / 3e9)
  assert exact.alpha == pytest.approx(2e-4, rel=1e-6)
  assert exact.beta == pytest.approx(3e9, rel=1e-6)
  assert max(abs(r) for r in exact.residuals) < 1e-9

  noise = 1 + 0.02 * np.random.default_rng(0).normal(size=SIZES.size)
  noisy = calibrate.fit_alpha_beta(SIZES, (2e-4 + SIZES / 3e9) * noise)
  assert noisy.alpha == pytest.approx(2e-4, rel=0.05)
  assert noisy.beta == pytest.approx(3e9, rel=0.05)
  # The residuals are the measured minus the fitted times, reported per point.
  np.testing.assert_allclose(noisy.residuals, (2e-4 + SIZES / 3e9) * noise
                             - (noisy.alpha + SIZES / noisy.beta), atol=1e-12)
  assert 0 < noisy.max_relative_residual < 0.1


def test_alpha_beta_fit_rejects_a_single_size():
  with pytest.raises(ValueError, match='two distinct sizes'):
    calibrate.fit_alpha_beta([1000, 1000], [1e-3, 1e-3])


def test_all_reduce_fit_gives_the_ring_steps_alpha():
  """A ring of two devices takes 2α + b/β: the fit reports α per step."""
  samples = [{'bytes': b, 'samples': [2 * 5e-5 + b / 1e9]} for b in SIZES]
  fit = calibrate.from_all_reduces(samples)
  assert fit.alpha == pytest.approx(5e-5, rel=1e-6)
  assert collectives.ring_all_reduce(1e6, 2, fit.alpha, fit.beta) == pytest.approx(
      2 * 5e-5 + 1e6 / 1e9)


def test_step_bytes_counts_the_costliest_branch_of_each_conditional():
  mesh = make_mesh((4,), ('d',), jax.devices()[:4])
  ring = [(j, (j + 1) % 4) for j in range(4)]

  def f(x, i):
    x = lax.switch(i[0], [lambda x: lax.ppermute(x, 'd', ring),
                          lambda x: lax.pcast(lax.psum(x, 'd'), 'd', to='varying')], x)
    return lax.psum(x, 'd')
  step = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P('d'), P()), out_specs=P()))
  found = hlo.collectives(step.lower(jnp.zeros((8, 3)), jnp.zeros(1, jnp.int32)).as_text())
  assert [(c.op, bool(c.branch)) for c in found] == [
      ('collective_permute', True), ('all_reduce', True), ('all_reduce', False)]
  # 24 bytes per device: the permute sends 24, the all-reduce 2·3/4·24 = 36 (the larger).
  assert hlo.step_bytes(found, 4) == pytest.approx(36 + 36)


def _fake_measurement():
  """One emulated setting with exact α-β transfers: t_grad(b) = b ms, P = 1 MB."""
  alpha, beta, nbytes = 1e-4, 1e9, 1_000_000
  transfers = [{'bytes': b, 'samples': [alpha + b / beta] * 3} for b in (1e3, 1e5, nbytes)]
  all_reduce = {'op': 'all_reduce', 'shape': [nbytes // 4], 'dtype': 'f32', 'group': 2,
                'pairs': 0, 'branch': [], 'bytes_per_device': nbytes}

  def step(scheme, n, b, t_iter, ops):
    return {'scheme': scheme, 'server': 'allreduce', 'n': n, 'per_device_batch': b,
            'samples': [t_iter] * 3, 'volume': {'collectives': ops}}
  return {
      'tool': 'analysis.measure', 'created': 'now', 'command': 'test',
      'machine': {'cpu': 'test', 'system': 'test', 'cores': 2},
      'versions': {'jax': '0', 'flax': '0'}, 'batches': 8,
      'network': {'model': 'net', 'image_size': 32, 'parameters': nbytes // 4,
                  'param_bytes': nbytes},
      'batch': {'sync-split': 32, 'sync-join': 32, 'async': 32},
      'settings': {'emulated': {
          't_grad': {'32': [0.032] * 3, '16': [0.016] * 3}, 'transfers': transfers,
          'all_reduces': [], 'async': [], 'volume': [],
          'steps': [step('sync-split', 1, 32, 0.032, []),
                    step('sync-split', 2, 16, 0.025, [all_reduce]),
                    step('sync-join', 2, 32, 0.045, [all_reduce])]}}}


def test_compare_speedups_and_predictions_by_hand():
  points = {(p['scheme'], p['n']): p for p in compare.rows(_fake_measurement())}
  # Measured, eq. 4.23: S = D·t_grad / t_train; sync-split D steps, sync-join D/N.
  assert points[('sync-split', 1)]['speedup'] == pytest.approx(1.0)
  assert points[('sync-split', 2)]['speedup'] == pytest.approx(0.032 / 0.025)
  assert points[('sync-join', 2)]['speedup'] == pytest.approx(8 * 0.032 / (4 * 0.045))
  # α-β, no all-reduce samples: the transfer fit times the ring, 2·(α + P/2/β) = 1.2 ms.
  assert points[('sync-split', 2)]['speedup_alpha_beta'] == pytest.approx(0.032 / (0.016 + 1.2e-3))
  assert points[('sync-join', 2)]['speedup_alpha_beta'] == pytest.approx(
      8 * 0.032 / (4 * (0.032 + 1.2e-3)))
  assert points[('sync-split', 2)]['error_alpha_beta'] == pytest.approx(
      (0.032 / 0.0172) / (0.032 / 0.025) - 1)
  # The thesis has no all-reduce equation.
  assert points[('sync-split', 2)]['speedup_thesis'] is None
  best = compare.recommend(list(points.values()), 'emulated')
  assert 'sync-join' in best and 'N=2' in best and '1.42×' in best


def measure_and_compare(tmp_path, data_dir, *args):
  """`analysis.measure` of SqueezeNet (sync-join, 8 per device, allreduce) with `args`, then
  `analysis.compare` of its JSON: (the JSON, measure's stderr, the report folder)."""
  out = tmp_path / 'm.json'
  proc = subprocess.run(
      [sys.executable, '-m', 'analysis.measure', '--config',
       os.path.join(ROOT, 'configs', 'squeezenet.py'), f'--config.dataset.data_dir={data_dir}',
       # The published network: the volume check counts gradients, not the BN statistics
       # that the digits recipe's BatchNorm variant also all-reduces.
       '--config.batch_norm=False',
       '--config.per_device_batch=8', f'--out={out}', '--repeats=2', '--warmup=1',
       '--batches=4', '--async_repeats=1', '--schemes=sync-join', '--servers=allreduce',
       '--async_servers=central', '--novolume', *args],
      env=ENV, capture_output=True, text=True, timeout=900, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  report = tmp_path / 'report'
  compared = subprocess.run([sys.executable, '-m', 'analysis.compare', str(out), '--out',
                             str(report)], env=ENV, capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
  assert compared.returncode == 0, compared.stderr[-3000:]
  return json.loads(out.read_text()), proc.stderr, report


def check_setting(result, name):
  """One setting's samples: t_grad, the steps at N = 1, 2, the calibration sizes up to the
  network, and the N = 2 step's volume equal to its analytic and reported bytes."""
  setting = result['settings'][name]
  assert sorted(setting['t_grad']) == ['8']  # sync-join and async: 8 per device
  assert all(len(s) == 2 for s in setting['t_grad'].values())
  assert [(c['n'], len(c['samples'])) for c in setting['steps']] == [(1, 2), (2, 2)]
  assert setting['transfers'][-1]['bytes'] == result['network']['param_bytes']
  assert len(setting['all_reduces']) == len(setting['transfers']) >= 2
  two = setting['steps'][1]['volume']
  assert two['program_bytes'] == pytest.approx(two['analytic_bytes'], rel=1e-4)  # + metrics
  assert two['reported_bytes'] == pytest.approx(two['analytic_bytes'])
  return setting


@pytest.mark.slow
def test_measure_and_compare_end_to_end_emulated(tmp_path, data_dir):
  """The emulated setting (with async); the 2-process one is in test_measure_processes.py."""
  result, stderr, report = measure_and_compare(tmp_path, data_dir, '--workers=2',
                                               '--processes=0')
  assert '[emulated] [2/2] t_train async central N=2' in stderr  # progress
  assert result['versions']['jax'] == jax.__version__ and result['machine']['cores']
  assert set(result['settings']) == {'emulated'}
  setting = check_setting(result, 'emulated')
  assert [len(a['samples']) for a in setting['async']] == [1, 1]
  text = (report / 'report.md').read_text()
  assert '| emulated | sync-join | allreduce | 2 |' in text
  assert '- **squeezenet** (emulated):' in text
  with open(report / 'speedup.csv') as f:
    assert len(list(csv.DictReader(f))) == 2 + 2  # steps and async at N = 1, 2
  assert sorted(os.listdir(report)) == ['report.md', 'speedup.csv',
                                        'squeezenet_32_async_central.png',
                                        'squeezenet_32_sync-join_allreduce.png']


def _args(**overrides):
  values = dict(out='/tmp/m.json', workers=8, processes=2, batches=128, repeats=10, warmup=2,
                async_repeats=2, schemes=['sync-split'], servers=['allreduce'],
                async_servers=['central'], links=[])
  return types.SimpleNamespace(**{**values, **overrides})


@pytest.mark.parametrize('overrides, message', [
    (dict(workers=-1), '--workers=-1: must be at least 0'),
    (dict(servers=['bogus']), "--servers: ['bogus'] unknown"),
    (dict(workers=0, processes=0), 'nothing to measure'),
    (dict(out='/no/such/folder/m.json'), 'does not exist'),
    (dict(links=['1gbps']), "--links: '1gbps' is not a link rate: write it as tc does"),
    (dict(links=['1gbit'], processes=1), '--links=1gbit times 2 or more processes'),
])
def test_measure_bad_arguments_are_usage_errors(overrides, message):
  with pytest.raises(app.UsageError, match=re.escape(message)):
    measure.check_args(_args(**overrides))


def test_measure_cli_prints_a_usage_error(tmp_path):
  proc = subprocess.run([sys.executable, '-m', 'analysis.measure', '--config',
                         os.path.join(ROOT, 'configs', 'squeezenet.py'),
                         f'--out={tmp_path}/m.json', '--workers=-1'],
                        env=ENV, capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert proc.returncode == 1 and '--workers=-1: must be at least 0' in proc.stderr


def test_measure_names_the_config_field_of_a_bad_cell(data_dir):
  """sync-split on 8 devices cannot split a batch of 12: the error names the field and
  the cell, before anything runs."""
  cfg = config_lib.defaults()
  cfg.model, cfg.global_batch, cfg.dataset.data_dir = 'squeezenet', 12, data_dir
  with pytest.raises(config_lib.ConfigError,
                     match=r'config.global_batch=12 is invalid.*N=8 cell'):
    measure.plan(cfg, 8, 0, ['sync-split'], ['allreduce'], [], False)


def test_measure_plans_each_link_as_the_processes_setting_without_async(data_dir, monkeypatch):
  """Each --links rate repeats the processes setting's steps (async on Ray stays on loopback);
  where links cannot be made (not root), one skipped line and no link setting."""
  cfg = config_lib.defaults()
  cfg.model, cfg.dataset.data_dir = 'squeezenet', data_dir
  args = (cfg, 0, 2, ['sync-join'], ['allreduce'], ['central'], False)
  monkeypatch.setattr(link, 'unavailable', lambda: None)
  runs, skipped = measure.plan(*args, ['100mbit', '1gbit'])
  assert sorted(runs) == ['link-100mbit', 'link-1gbit', 'processes']
  for rate in ('100mbit', '1gbit'):
    assert [(p, f['steps'], f['async']) for p, f in runs[f'link-{rate}']] == [
        (p, f['steps'], []) for p, f in runs['processes']]
  assert runs['processes'][0][1]['async']
  monkeypatch.setattr(link, 'unavailable', lambda: 'it needs root')
  runs, skipped = measure.plan(*args, ['1gbit'])
  assert sorted(runs) == ['processes'] and skipped == ['the emulated links 1gbit: it needs root']


def test_compare_rejects_a_file_measure_did_not_write(tmp_path):
  bogus = tmp_path / 'x.json'
  bogus.write_text('{"a": 1}')
  with pytest.raises(SystemExit) as e:
    compare.main([str(bogus), '--out', str(tmp_path / 'r')])
  assert e.value.code == 2
