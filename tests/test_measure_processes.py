"""analysis.steptime.measure and analysis.steptime.compare end to end with 2 real processes
(jax.distributed over loopback, each pinned to a core; async: Ray's actors), and again across an emulated
100 Mbit/s link where root can make one. Its own file, so the suite's two workers can run
it beside the emulated case of test_measure.py."""
import csv
import os

import pytest

from analysis.steptime import link
from jaxpar.perfmodel import calibrate

from test_measure import check_setting, measure_and_compare


@pytest.mark.slow
def test_measure_and_compare_end_to_end_with_two_processes(tmp_path, data_dir):
  cache = tmp_path / 'compiled'
  result, stderr, report = measure_and_compare(tmp_path, data_dir, '--workers=0',
                                               '--processes=2', '--links=100mbit',
                                               '--repetitions=1', f'--compilation_cache={cache}')
  assert '[processes] [1/1] t_iter sync-join allreduce N=2' in stderr  # progress
  # Process 0 kept the steps' programs for the runs after it (the link's loads them).
  assert result['compilation_cache'] == str(cache)
  assert any(p.name.startswith('jit_step-') for p in cache.iterdir())
  why_not = link.unavailable()
  assert set(result['settings']) == {'processes'} | ({'link-100mbit'} if not why_not else set())
  setting = check_setting(result, 'processes', repetitions=1)
  assert setting['processes'] == 2
  assert setting['pinned_cores'] == [0, 1 % (os.cpu_count() or 1)]
  # Downpour's processes: Ray's worker and server actors, N = 1, 2, D = 4 pushes each.
  assert [(c['n'], c['backend'], len(c['samples'])) for c in setting['async']] == [
      (1, 'ray', 1), (2, 'ray', 1)]
  assert all(t > 0 for c in setting['async'] for t in c['samples'])
  assert '[processes] [2/2] t_train async central N=2' in stderr
  text = (report / 'report.md').read_text()
  assert '| processes | sync-join | allreduce | 2 |' in text
  assert '| processes | async | central | 2 |' in text
  assert '- **squeezenet** (processes):' in text
  # Each step and t_grad traced after its timing; the one-way permute calibrated.
  steps = {(c['n'], c['scheme']): c for c in setting['steps']}
  for c in steps.values():
    (t,) = c['trace']  # one repetition
    assert t['compute'] > 0 and t['overlap'] >= 0
  assert steps[(2, 'sync-join')]['trace'][0]['collective'] > 0  # its all-reduce
  assert steps[(1, 'sync-join')]['trace'][0]['collective'] == 0
  assert all(g[0]['compute'] > 0 for g in setting['t_grad_trace'].values())
  assert all(g[0]['compute'] > 0 for g in setting['t_grad_trace_contended']['2'].values())
  assert len(setting['calls']['collective_permute_one_way']) == len(
      setting['calls']['collective_permute'])
  assert [p['bytes'] for p in setting['calls'][calibrate.SCALAR]] == [4]  # one float32
  assert 'all-reduce-scalar: ' in text and ' ms a call (4 B)' in text  # no fit: its call
  assert '| processes | sync-join | allreduce | 2 |' in text.split('non-gradient work the parts '
                                                                  'model adds')[1]
  if why_not:
    assert f'[measure] skipped the emulated links 100mbit: {why_not}' in stderr
    with open(report / 'speedup.csv') as f:
      assert len(list(csv.DictReader(f))) == 4  # sync-join and async on Ray, N = 1, 2
    return
  # The link: the same steps, no async; a permute of the weights costs, per call inside a
  # program, at least the time 100 Mbit/s allows (less one token-bucket burst), loopback's
  # far less.
  linked = check_setting(result, 'link-100mbit', repetitions=1)
  assert linked['async'] == [] and '| link-100mbit | sync-join | allreduce | 2 |' in text
  nbytes = linked['calls']['collective_permute'][-1]['bytes']
  wire = (nbytes - link.burst_bytes(1e8)) * 8 / 1e8
  assert calibrate.from_calls(linked['calls']).per_call('collective_permute', nbytes) >= wire
  assert calibrate.from_calls(setting['calls']).per_call('collective_permute', nbytes) < wire / 3
  with open(report / 'speedup.csv') as f:
    assert len(list(csv.DictReader(f))) == 4 + 2  # and sync-join across the link, N = 1, 2


def test_gaps_times_calls_after_compute_across_two_processes(tmp_path):
  """`analysis.steptime.gaps` end to end on 2 real processes, two compute lengths, under
  gloo's loop as jaxpar runs it and as gloo leaves it: one row per length and setting, the
  call's cost positive, the back-to-back sizes calibrated (scalar apart), the table one row
  per setting."""
  import json
  import subprocess
  import sys

  from analysis.steptime import gaps
  out = tmp_path / 'gaps.json'
  done = subprocess.run(
      [sys.executable, '-m', 'analysis.steptime.gaps', '--matmuls=0,8', '--repeats=2',
       '--warmup=1', '--bytes=64', f'--out={out}'], capture_output=True, text=True,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))), timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(out.read_text())
  assert list(result['settings']) == ['processes, gloo loop normal', 'processes']
  for setting in result['settings'].values():
    assert [r['matmuls'] for r in setting['rows']] == [0, 8]
    assert all(r['gap_s'] >= 0 and len(r['samples_with']) == 2 for r in setting['rows'])
    assert {calibrate.SCALAR, 'all_reduce'} <= set(setting['sizes'])
  assert gaps.table(result).splitlines()[2].startswith(
      '| call, loopback, gloo loop normal (ms) |')
