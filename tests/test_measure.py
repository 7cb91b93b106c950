"""analysis.steptime's measure, calibrate and compare: the α-β fit, the speedup arithmetic,
the costliest-branch count, bad arguments, and both CLIs end to end on an emulated mesh (2
real processes: test_measure_processes.py)."""
import csv
import json
import math
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

from analysis.steptime import compare, gaps, link, measure, timing, trace
from jaxpar.perfmodel import alpha_beta as collectives
from jaxpar.perfmodel import calibrate, hlo
from jaxpar import config as config_lib
from jaxpar import cpu_load
from jaxpar.mesh import make_mesh
from runs import ROOT, config_file, process_env

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


def test_per_call_cost_is_the_slope_of_the_chains_not_one_calls_time():
  """A program of k chained calls takes t_0 + k·c: the calibration recovers c from noisy
  synthetic means, where one call's time (t_0 + c) would be off by t_0."""
  rng = np.random.default_rng(0)
  t0, c = 5e-3, 2e-4
  chains = {str(k): list((t0 + k * c) * (1 + 0.01 * rng.normal(size=5))) for k in (1, 2, 8, 32)}
  cost, fixed = calibrate.per_call(chains)
  assert cost == pytest.approx(c, rel=0.05) and fixed == pytest.approx(t0, rel=0.05)
  assert np.mean(chains['1']) > 20 * c  # what timing one call alone would report
  with pytest.raises(ValueError, match='two lengths'):
    calibrate.per_call({'1': [1.0]})


def test_gaps_count_each_cycle_in_ticks_of_the_back_to_back_call():
  """Calls that end on q-ticks: after g of compute one costs ⌈(g + l)/q⌉·q − g; `ticks`
  takes q from the row without compute and finds every cycle on a whole tick; a cycle
  that is not (a call that ignored the ticks) is reported off by its fraction."""
  q, latency = 4e-3, 1e-4
  rows = [{'matmuls': m, 'gap_s': g, 'call_s': np.ceil((g + latency) / q) * q - g}
          for m, g in [(64, 2.5e-3), (0, 0.0), (8, 0.6e-3), (200, 9.1e-3)]]
  found = gaps.ticks(rows)
  assert found['tick_s'] == pytest.approx(q)
  assert [r['matmuls'] for r in found['rows']] == [0, 8, 64, 200]
  assert [round(r['ticks']) for r in found['rows']] == [1, 1, 1, 3]
  assert max(r['off'] for r in found['rows']) < 1e-9
  assert [r['call_s'] for r in found['rows']][1] == pytest.approx(q - 0.6e-3)
  untimed = gaps.ticks(rows + [{'matmuls': 300, 'gap_s': 11e-3, 'call_s': latency}])
  assert untimed['rows'][-1]['off'] == pytest.approx(abs(11.1 / 4 - 3))
  with pytest.raises(ValueError, match='without compute'):
    gaps.ticks(rows[:1])
  # A few matmuls' gap measuring no longer than none, or shorter (seen on a loaded machine,
  # 2 repeats): q is still the row without compute's call, and the rows keep the compute's
  # order, which `table` lines up across settings.
  tied = gaps.ticks([{'matmuls': 8, 'gap_s': 1.1e-4, 'call_s': 3.15e-3},
                     {'matmuls': 0, 'gap_s': 1.1e-4, 'call_s': 2.92e-3}])
  assert tied['tick_s'] == 2.92e-3
  inverted = gaps.ticks([{'matmuls': 0, 'gap_s': 1.2e-4, 'call_s': 2.92e-3},
                         {'matmuls': 8, 'gap_s': 1.0e-4, 'call_s': 3.15e-3}])
  assert [r['matmuls'] for r in inverted['rows']] == [0, 8]


def test_gaps_table_names_each_setting_and_the_loop_it_ran_under():
  """One row per setting in the order measured, one column per gap (the first setting's);
  a file measured under both loop priorities says which row is which, an older file (no
  'collective_threads') keeps its plain names."""
  def rows(call):
    return [{'gap_s': g, 'call_s': call} for g in (0.0, 2e-3)]
  both = {'settings': {
      'processes, gloo loop normal': {'setting': 'processes', 'rows': rows(4e-3),
                                      'collective_threads': 'normal'},
      'processes': {'setting': 'processes', 'rows': rows(5e-5), 'collective_threads': 'idle'},
      'link-1gbit': {'setting': 'link-1gbit', 'rows': rows(2.6e-4),
                     'collective_threads': 'idle'}}}
  assert gaps.table(both).splitlines() == [
      '| g (ms) | 0.0 | 2.0 |', '|---|---:|---:|',
      '| call, loopback, gloo loop normal (ms) | 4.00 | 4.00 |',
      '| call, loopback, gloo loop idle (ms) | 0.05 | 0.05 |',
      '| call, 1 Gb/s, gloo loop idle (ms) | 0.26 | 0.26 |']
  older = {'settings': {'processes': {'rows': rows(4e-3)}}}
  assert gaps.table(older).splitlines()[2] == '| call, loopback (ms) | 4.00 | 4.00 |'


def test_gaps_refuses_compute_lengths_without_the_back_to_back_row_first():
  """Every row is counted against the one without compute: --matmuls must start with 0
  (one line naming the flag, before any process starts)."""
  done = subprocess.run([sys.executable, '-m', 'analysis.steptime.gaps', '--matmuls=8,0'],
                        capture_output=True, text=True, cwd=ROOT)
  assert done.returncode == 2
  assert done.stderr.strip().splitlines()[-1].startswith(
      '--matmuls=8,0: use whole numbers, 0 first')


def test_call_costs_interpolate_and_scale_to_the_group():
  """Between sizes the per-call cost is interpolated, below the smallest it is the smallest's,
  beyond the largest it follows the last segment; a group of 4 scales by the ring model."""
  sizes = [4096, 65536, 1 << 20]
  costs = calibrate.from_calls({
      'all_reduce': [{'bytes': b, 'chains': {'1': [1e-3 + 2 * (1e-4 + b / 1e9)],
                                             '2': [1e-3 + 4 * (1e-4 + b / 1e9)]}}
                     for b in sizes],
      'collective_permute': [{'bytes': b, 'chains': {'1': [1e-3 + 5e-5 + b / 2e9],
                                                     '8': [1e-3 + 8 * (5e-5 + b / 2e9)]}}
                             for b in sizes]})
  ring = lambda b: 2 * (1e-4 + b / 1e9)  # noqa: E731 (the all-reduce's per-call cost here)
  assert costs.per_call('all_reduce', 65536) == pytest.approx(ring(65536))
  assert costs.per_call('all_reduce', 500_000) == pytest.approx(ring(500_000))  # linear
  assert costs.per_call('all_reduce', 100) == pytest.approx(ring(4096))
  assert costs.per_call('all_reduce', 2 << 20) == pytest.approx(ring(2 << 20))
  reduce = hlo.Collective('all_reduce', (1 << 18,), 'f32', group=2)
  assert costs.cost(reduce) == pytest.approx(ring(1 << 20))
  fit = costs.fits['all_reduce']
  four = dataclasses_replace(reduce, group=4)
  assert costs.cost(four) == pytest.approx(
      ring(1 << 20) * collectives.ring_all_reduce(1 << 20, 4, fit.alpha, fit.beta)
      / collectives.ring_all_reduce(1 << 20, 2, fit.alpha, fit.beta))
  # An all-gather not calibrated is costed as an all-reduce of the gathered buffer; a
  # permute as one message of its operand; a group of one costs nothing.
  gather = hlo.Collective('all_gather', (1 << 17,), 'f32', group=2)
  assert costs.cost(gather) == pytest.approx(ring(1 << 20))
  permute = hlo.Collective('collective_permute', (1 << 18,), 'f32', pairs=2)
  assert costs.cost(permute) == pytest.approx(5e-5 + (1 << 20) / 2e9)
  assert costs.cost(dataclasses_replace(reduce, group=1)) == 0.0
  # A step: every collective outside conditionals, and each conditional's costliest branch.
  branches = [dataclasses_replace(permute, branch=((0, 0),)),
              dataclasses_replace(reduce, branch=((0, 1),))]
  assert costs.step([reduce] + branches) == pytest.approx(2 * ring(1 << 20))


def dataclasses_replace(x, **changes):
  import dataclasses
  return dataclasses.replace(x, **changes)


def test_compiled_collectives_follow_the_conditionals_branches():
  """The compiled program keeps a switch's branches as computations of their own: each
  collective there records its branch, so a step counts the costliest."""
  mesh = make_mesh((4,), ('d',), jax.devices()[:4])
  ring = [(j, (j + 1) % 4) for j in range(4)]

  def f(x, i):
    x = lax.switch(i[0], [lambda x: lax.ppermute(x, 'd', ring),
                          lambda x: lax.psum(x, 'd')], x)
    return lax.psum(x, 'd')
  step = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P('d'), P()), out_specs=P(),
                               check_vma=False))
  text = step.lower(jnp.zeros((8, 3)), jnp.zeros(1, jnp.int32)).compile().as_text()
  found = hlo.compiled_collectives(text)
  assert sorted((c.op, bool(c.branch)) for c in found) == [
      ('all_reduce', False), ('all_reduce', True), ('collective_permute', True)]
  assert len({c.branch for c in found if c.branch}) == 2
  assert hlo.step_bytes(found, 4) == pytest.approx(36 + 36)


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



def test_group_sizes_of_both_stablehlo_replica_group_forms():
  """jax < 0.11 lowers a collective's groups as a dense device list, jax >= 0.11 (under
  `jax_use_rgv3`) as mesh axes named against an `sdy.mesh` declared once: both give the devices
  in a group, whichever JAX runs the suite."""
  dense = ('  sdy.mesh @mesh = <["x"=2, "y"=4]>\n'
           '    %1 = "stablehlo.all_reduce"(%a) <{replica_groups = dense<[[0, 4], [1, 5], [2, 6], '
           '[3, 7]]> : tensor<4x2xi64>, use_global_device_ids}> ({\n'
           '    }) : (tensor<8xf32>) -> tensor<8xf32>\n')
  axes = ('  sdy.mesh @mesh_0 = <["x"=2, "y"=4]> {stablehlo.mesh = {axes = [{name = "x"}]}}\n'
          '    %1 = "stablehlo.all_reduce"(%a) <{replica_groups = #stablehlo.replica_group_mesh_axes'
          '<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = "x">, #stablehlo.axis_ref<name = '
          '"y">]>, use_global_device_ids}> ({\n'
          '    }) : (tensor<8xf32>) -> tensor<8xf32>\n'
          '    %2 = "stablehlo.all_gather"(%a) <{all_gather_dim = 0 : i64, replica_groups = '
          '#stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref<name = '
          '"y">]>, use_global_device_ids}> : (tensor<8xf32>) -> tensor<32xf32>\n')
  assert [(c.op, c.group) for c in hlo.collectives(dense)] == [('all_reduce', 2)]
  assert [(c.op, c.group) for c in hlo.collectives(axes)] == [('all_reduce', 8), ('all_gather', 4)]


def test_lowered_group_sizes_are_the_mesh_axes_sizes():
  """Whichever form the running JAX lowers to, a psum over one axis of a 2×4 mesh has groups of
  that axis' size, and one over both axes groups of 8."""
  mesh = make_mesh((2, 4), ('x', 'y'))

  def f(a):
    return lax.psum(a, 'x') + lax.psum(a, ('x', 'y')) + lax.psum(a, 'y')
  text = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(('x', 'y')), out_specs=P(('x', 'y')),
                               check_vma=False)).lower(jnp.ones(64)).as_text()
  assert [c.group for c in hlo.collectives(text)] == [2, 8, 4]


MB = 1_000_000


def _chains(cost, t0=5e-3):
  """A calibration point whose chains take t0 + k·cost exactly."""
  return {str(k): [t0 + k * cost] * 3 for k in (1, 2, 8)}


def _fake_measurement():
  """One 2-process setting, P = 1 MB, D = 8, batch 32; per call: permute 1e-4 + b/1e9,
  all-reduce 2e-4 + b/0.5e9 (inside chains with a 5 ms launch); t_grad(32) 32 ms alone,
  40 ms with both processes computing, t_grad(16) 16/20 ms."""
  calls = {'collective_permute': [{'bytes': b, 'chains': _chains(1e-4 + b / 1e9)}
                                  for b in (1e4, MB)],
           'all_reduce': [{'bytes': b, 'chains': _chains(2e-4 + b / 0.5e9)} for b in (1e4, MB)]}

  def op(name, **kw):
    return {'op': name, 'shape': [MB // 4], 'dtype': 'f32', 'group': kw.get('group', 0),
            'pairs': kw.get('pairs', 0), 'branch': [], 'bytes_per_device': MB}

  def step(scheme, server, n, b, repetitions, compiled):
    return {'scheme': scheme, 'server': server, 'n': n, 'per_device_batch': b,
            'overrides': {'central_schedule': 'serial'},
            'samples': [x for r in repetitions for x in r], 'repetitions': repetitions,
            'compiled': compiled, 'volume': {'collectives': compiled}}
  permute = op('collective_permute', pairs=1)
  return {
      'tool': 'analysis.steptime.measure', 'created': 'now', 'command': 'test',
      'machine': {'cpu': 'test', 'system': 'test', 'cores': 2},
      'versions': {'jax': '0', 'flax': '0'}, 'batches': 8,
      'network': {'model': 'net', 'image_size': 32, 'parameters': MB // 4, 'param_bytes': MB},
      'batch': {'sync-split': 32, 'sync-join': 32, 'async': 32},
      'settings': {'processes': {
          't_grad': {'32': [0.032] * 3, '16': [0.016] * 3},
          't_grad_contended': {'2': {'32': [0.040] * 3, '16': [0.020] * 3}},
          'calls': calls, 'async': [], 'volume': [],
          'steps': [step('sync-split', 'allreduce', 1, 32, [[0.034] * 3] * 2, []),
                    step('sync-split', 'allreduce', 2, 16, [[0.022] * 3, [0.024] * 3],
                         [op('all_reduce', group=2)]),
                    step('sync-join', 'central', 1, 32, [[0.036] * 3] * 2, []),
                    step('sync-join', 'central', 2, 32, [[0.047] * 3, [0.049] * 3],
                         [permute, permute])]}}}


def test_compare_predictions_held_out_errors_and_regret_by_hand():
  points = {(p['scheme'], p['n']): p for p in compare.rows(_fake_measurement())}
  split1, split2 = points[('sync-split', 1)], points[('sync-split', 2)]
  join1, join2 = points[('sync-join', 1)], points[('sync-join', 2)]
  # Measured, eq. 4.23: S = D·t_grad / t_train; sync-split D steps, sync-join D/N.
  assert split2['t_train'] == pytest.approx(8 * 0.023)
  assert join2['speedup'] == pytest.approx(8 * 0.032 / (4 * 0.048))
  assert join2['noise'] == pytest.approx(np.log(0.049 / 0.047))
  # Parts: contended t_grad + the N = 1 step's non-gradient work + calibrated calls.
  assert split1['t_other'] == pytest.approx(0.002) and join1['t_other'] == pytest.approx(0.004)
  assert split2['t_train_parts'] == pytest.approx(8 * (0.020 + 0.002 + 2e-4 + MB / 0.5e9))
  assert join2['t_train_parts'] == pytest.approx(4 * (0.040 + 0.004 + 2 * (1e-4 + MB / 1e9)))
  assert split2['error_parts'] == pytest.approx(np.log(split2['t_train_parts'] / (8 * 0.023)))
  assert not split1['held_out'] and split2['held_out']
  # The thesis (t_comm = the permute of P = 1.1 ms), and its semaphore for a serial server.
  t_comm = 1e-4 + MB / 1e9
  assert join2['t_train_thesis'] == pytest.approx(
      4 * (((3 * t_comm) + (4 * t_comm)) / 2 + 0.032))  # eq. 4.11, mean of 4.4 and 4.7
  assert join2['t_train_semaphore'] == pytest.approx(4 * (3 * t_comm + 0.032))  # eq. 7.1–7.2
  assert split2['t_train_thesis'] is None  # no all-reduce equation in the thesis
  # Held out: the two N = 2 points. Parts picks sync-join (184.8 ms predicted, 192 measured)
  # while sync-split measured 184 ms: regret 192/184, ρ = −1.
  summary = {r['model']: r for r in compare.held_out_summary(list(points.values()))}
  parts = summary['parts']
  assert parts['points'] == 2
  assert parts['median_log_error'] == pytest.approx(
      np.median([abs(split2['error_parts']), abs(join2['error_parts'])]))
  assert parts['noise_floor'] == pytest.approx(np.median([np.log(24 / 22), np.log(49 / 47)]))
  assert parts['rank_correlation'] == pytest.approx(-1.0)
  assert parts['pick'] == 'sync-join central N=2'
  assert parts['regret'] == pytest.approx(0.192 / 0.184)
  assert summary['thesis']['points'] == 1 and summary['thesis']['regret'] == pytest.approx(
      0.192 / 0.184)
  text = compare.recommend(list(points.values()), 'processes')
  assert 'sync-join with the central server on N=2' in text
  assert 'sync-split allreduce N=2 is predicted only 5% slower, within the uncertainty (7%)' in text
  assert 'regret 1.04' in text


def test_compare_takes_non_gradient_work_and_overlap_from_the_traces_by_hand():
  """Traced steps: the non-gradient work is the step's traced compute less the traced
  gradients' of its batch under the same contention (alone at N = 1), the trace's overlap
  is subtracted, and a one-way permute is costed as the calibrated one-way permute."""
  result = _fake_measurement()
  s = result['settings']['processes']
  s['calls']['collective_permute_one_way'] = [
      {'bytes': b, 'chains': _chains(5e-5 + b / 2e9)} for b in (1e4, MB)]
  s['t_grad_trace'] = {'32': [{'compute': 0.031, 'collective': 0.0, 'overlap': 0.0}] * 2}
  s['t_grad_trace_contended'] = {'2': {'32': [{'compute': 0.039, 'collective': 0.0,
                                               'overlap': 0.0}] * 2}}
  for cell in s['steps']:
    if cell['server'] == 'central':  # two repetitions' traces: their means are used
      cell['trace'] = ([{'compute': 0.0335, 'collective': 0.0, 'overlap': 0.0}] * 2
                       if cell['n'] == 1 else
                       [{'compute': 0.047, 'collective': 0.004, 'overlap': 0.001},
                        {'compute': 0.049, 'collective': 0.006, 'overlap': 0.003}])
  points = {(p['scheme'], p['n']): p for p in compare.rows(result)}
  join1, join2 = points[('sync-join', 1)], points[('sync-join', 2)]
  assert join1['t_other'] == pytest.approx(0.0335 - 0.031)  # not the step less t_grad (4 ms)
  assert join2['t_other'] == pytest.approx(0.048 - 0.039)
  assert join2['t_overlap'] == pytest.approx(0.002)
  assert join2['t_collective_traced'] == pytest.approx(0.005)
  one_way = 5e-5 + MB / 2e9  # the two pairs=1 permutes, not the exchange's 1e-4 + MB/1e9
  assert join2['t_collective_calibrated'] == pytest.approx(2 * one_way)
  assert join2['t_train_parts'] == pytest.approx(4 * (0.040 + 0.009 - 0.002 + 2 * one_way))
  # Untraced steps keep the N = 1 difference; t_comm stays the exchange ([T]'s eq.).
  assert points[('sync-split', 2)]['t_other'] == pytest.approx(0.002)
  assert points[('sync-split', 2)]['t_overlap'] is None
  assert join2['t_comm'] == pytest.approx(1e-4 + MB / 1e9)
  table = compare.parts_table(list(points.values())).splitlines()
  assert len(table) == 2 + 2  # the traced steps only
  assert '| processes | sync-join | central | 2 | 48.0 | 40.0 | 9.0 | 2.0 | 5.0 | 1.1 |' in table


def test_trace_times_are_exclusive_and_overlap_is_across_threads_by_hand():
  """A conditional holding a fusion and an all-reduce on one thread, a fusion on another
  that runs during the all-reduce: each µs counted once, the collective apart, and the
  overlap the 20 µs in which the other thread computed."""
  def event(name, ts, dur, tid=1):
    return {'name': name, 'ts': ts, 'dur': dur, 'pid': 7, 'tid': tid, 'ph': 'X'}
  events = [event('conditional.1', 0, 100), event('fusion.2', 10, 30),
            event('all-reduce.3', 50, 40), event('fusion.4', 60, 20, tid=2),
            event('fusion.5', 200, 10, tid=2)]
  summary = trace.summarize(events, {'all-reduce.3'}, calls=2)
  assert summary['compute'] == pytest.approx((30 + 30 + 20 + 10) * 1e-6 / 2)
  assert summary['collective'] == pytest.approx(40e-6 / 2)
  assert summary['overlap'] == pytest.approx(20e-6 / 2)
  # Without a peer thread computing, no overlap; a collective nested deeper still counts.
  alone = trace.summarize([e for e in events if e['tid'] == 1], {'all-reduce.3'}, calls=1)
  assert alone == {'compute': pytest.approx(60e-6), 'collective': pytest.approx(40e-6),
                   'overlap': 0.0}


def test_trace_finds_the_collectives_of_every_computation():
  text = """HloModule jit_step
%branch.1 (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %ppermute.6 = f32[4]{0} collective-permute(%p), channel_id=1, source_target_pairs={{0,1}}
}
ENTRY %main.2 (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  %all-reduce-start.3 = f32[8]{0} all-reduce-start(%x), replica_groups={{0,1}}, to_apply=%add
  %all-reduce-done.4 = f32[8]{0} all-reduce-done(%all-reduce-start.3)
  %reduce_scatter.5 = f32[4]{0} reduce-scatter(%x), replica_groups={{0,1}}, dimensions={0}
  ROOT %fusion.7 = f32[8]{0} fusion(%all-reduce-done.4), kind=kLoop, calls=%fused
}"""
  assert trace.collective_names(text) == {'ppermute.6', 'all-reduce-start.3',
                                          'all-reduce-done.4', 'reduce_scatter.5'}


def test_a_one_way_permute_is_costed_as_the_calibrated_one_way_permute():
  calls = {'collective_permute': [{'bytes': b, 'chains': _chains(1e-4 + b / 1e9)}
                                  for b in (1e4, MB)]}
  one, exchange = (hlo.Collective('collective_permute', (MB // 4,), 'f32', pairs=p)
                   for p in (1, 2))
  without = calibrate.from_calls(calls)
  assert without.cost(one) == pytest.approx(1e-4 + MB / 1e9)  # files before the one-way kind
  calls[calibrate.ONE_WAY] = [{'bytes': b, 'chains': _chains(4e-5 + b / 3e9)} for b in (1e4, MB)]
  costs = calibrate.from_calls(calls)
  assert costs.cost(one) == pytest.approx(4e-5 + MB / 3e9)
  assert costs.cost(exchange) == pytest.approx(1e-4 + MB / 1e9)


def test_a_scalar_all_reduce_is_costed_as_the_calibrated_scalar():
  """One element (a loss's mean) at the scalar kind's cost; two elements, and every
  all-reduce of files without the scalar kind, at the all-reduce's (below its smallest
  size: the smallest's)."""
  calls = {'all_reduce': [{'bytes': b, 'chains': _chains(4e-3 + b / 1e9)} for b in (4096, MB)]}
  scalar, pair = (hlo.Collective('all_reduce', shape, 'f32', group=2) for shape in ((), (2,)))
  without = calibrate.from_calls(calls)
  assert without.cost(scalar) == pytest.approx(4e-3 + 4096 / 1e9)
  calls[calibrate.SCALAR] = [{'bytes': 4, 'chains': _chains(1e-4)}]
  costs = calibrate.from_calls(calls)
  assert costs.cost(scalar) == pytest.approx(1e-4)
  assert costs.cost(pair) == pytest.approx(4e-3 + 4096 / 1e9)
  assert calibrate.SCALAR not in costs.fits  # one size: no α-β fit
  assert timing.SCALAR in timing.CALIBRATED


def test_compare_overview_has_a_row_per_network_and_setting_by_hand():
  """The report's (and README's) table of every network: t_comm/t_grad, the measured best and
  best parallel point, each model's held-out error, pick and regret."""
  result = _fake_measurement()
  points = compare.rows(result)
  summary = {r['model']: r for r in compare.held_out_summary(points)}
  parts, thesis = summary['parts'], summary['thesis']
  # Measured: sync-split N=2 is fastest, 8 × 23 ms: S = 8 × 32 / 184 = 1.39; t_comm/t_grad =
  # 1.1 ms / 32 ms; parts and the thesis pick sync-join central N=2 (192 ms): regret 1.04.
  table = compare.overview_table([result], points).splitlines()
  assert len(table) == 3
  assert table[2] == (
      f'| net (1.0 MB; 32) | processes | {(1e-4 + MB / 1e9) / 0.032:.2f} '
      '| sync-split allreduce N=2: 1.39× | sync-split allreduce N=2: 1.39× '
      f"| {compare._percent(parts['median_log_error'])} ({compare._percent(parts['noise_floor'])}) "
      '| sync-join central N=2: 1.04 | —, — '
      f"| {compare._percent(thesis['median_log_error'])}, 1.04 |")


def test_compare_overview_summary_counts_the_settings_that_meet_the_goal(monkeypatch):
  """The overview in one sentence (README): a setting meets the goal when the parts model's
  held-out error is at most 10 % and its pick's regret at most 1.05; each miss is named with
  the loopback-plus-rate model's error there; [T]'s errors as a range and its worst regret."""
  def row(setting, model, error, regret):
    return {'network': 'net', 'image_size': 32, 'setting': setting, 'model': model,
            'median_log_error': math.log1p(error), 'regret': regret}
  rows = [row('processes', 'parts', 0.10, 1.05),  # on both bounds: met
          row('processes', 'thesis', 0.16, 1.25),
          row('link-1gbit', 'parts', 0.14, 1.00),  # error over: a miss
          row('link-1gbit', 'rate', 0.03, 1.00),
          row('link-1gbit', 'thesis', 1.43, 1.00),
          row('link-100mbit', 'parts', 0.02, 1.06),  # regret over: a miss, no rate model
          row('link-100mbit', 'thesis', 0.30, 1.10)]
  monkeypatch.setattr(compare, 'held_out_summary', lambda points: rows)
  assert compare.overview_summary([]) == (
      'The parts model meets the goal (≤ 10% held out, regret ≤ 1.05) on 1 of 3 settings; the '
      'misses: net at link-1gbit, 14%, regret 1.00 (the loopback-plus-rate model: 3%); net at '
      "link-100mbit, 2%, regret 1.06; its picks' regret is 1.00–1.06. [T]'s equations are off "
      'by 16%–143% with regret up to 1.25.')
  monkeypatch.setattr(compare, 'held_out_summary', lambda points: rows[:2])
  assert compare.overview_summary([]).startswith(
      "The parts model meets the goal (≤ 10% held out, regret ≤ 1.05) on 1 of 1 setting; its "
      "picks' regret is 1.05.")


def test_compare_predicts_a_link_from_loopback_and_the_rate():
  """The rate model: a link setting's step from the loopback setting's parts alone, each
  collective adding the bytes its busiest device sends ÷ the rate; nothing measured across
  the link enters it."""
  result = _fake_measurement()
  linked = json.loads(json.dumps(result['settings']['processes']))
  linked['calls'] = {kind: [{**p, 'chains': {k: [9.0] * 3 for k in p['chains']}}
                            for p in points] for kind, points in linked['calls'].items()}
  result['settings']['link-100mbit'] = linked
  points = {(p['setting'], p['scheme'], p['n']): p for p in compare.rows(result)}
  wire = MB * 8 / 1e8
  assert points[('link-100mbit', 'sync-join', 2)]['t_train_rate'] == pytest.approx(
      4 * (0.040 + 0.004 + 2 * (1e-4 + MB / 1e9 + wire)))
  assert points[('link-100mbit', 'sync-split', 2)]['t_train_rate'] == pytest.approx(
      8 * (0.020 + 0.002 + 2e-4 + MB / 0.5e9 + wire))  # a ring of 2 sends the buffer once
  assert points[('processes', 'sync-join', 2)]['t_train_rate'] is None


def test_compare_join_penalty_is_the_step_difference_less_the_gradients_by_hand():
  """sync-join − sync-split of one server and N, split into the gradients of the larger
  per-device batch (contended t_grad: 40 − 20 ms) and the rest, beside the noise."""
  result = _fake_measurement()
  steps = result['settings']['processes']['steps']
  steps.append({**steps[1], 'scheme': 'sync-join', 'per_device_batch': 32,
                'repetitions': [[0.046] * 3, [0.050] * 3], 'samples': [0.046] * 3 + [0.050] * 3})
  (row,) = compare.join_penalty(compare.rows(result))  # central has no sync-split point
  assert (row['server'], row['n']) == ('allreduce', 2)
  assert row['step'] == pytest.approx(0.048 - 0.023)
  assert row['gradient'] == pytest.approx(0.040 - 0.020)
  assert row['residual'] == pytest.approx(0.005)
  assert row['noise'] == pytest.approx(np.hypot(0.048 * (0.050 / 0.046 - 1),
                                                0.023 * (0.024 / 0.022 - 1)))
  assert '| processes | allreduce | 2 | +25.0 | +20.0 | +5.0 |' in compare.join_penalty_table([row])
  # Rows of several runs side by side: a first column names each row's run.
  table = compare.join_penalty_table([row | {'run': 'keep'}], 'host_memory').splitlines()
  assert table[0].startswith('| host_memory | setting |') and table[1].startswith('|---|---|')
  assert table[2].startswith('| keep | processes | allreduce | 2 | +25.0 |')


def test_compare_regret_and_log_error_on_a_small_table():
  """regret and rank correlation straight from a hand-made table of predicted and measured
  times."""
  table = [{'t_train': t, 't_train_parts': p, 'scheme': s, 'server': 'x', 'n': 2}
           for s, t, p in (('a', 1.0, 1.2), ('b', 2.0, 1.1), ('c', 3.0, 3.5))]
  assert compare.regret(table, 'parts') == pytest.approx(2.0)  # picks b (1.1), measured 2.0
  assert compare.spearman([1.2, 1.1, 3.5], [1.0, 2.0, 3.0]) == pytest.approx(0.5)
  assert compare.log_error(1.25, 1.0) == pytest.approx(np.log(1.25))
  assert compare._percent(np.log(1.25)) == '25%'


def measure_and_compare(tmp_path, data_dir, *args):
  """`analysis.steptime.measure` of SqueezeNet (sync-join, 8 per device, allreduce) with
  `args`, then `analysis.steptime.compare` of its JSON: (the JSON, measure's stderr, the report folder)."""
  out = tmp_path / 'm.json'
  proc = subprocess.run(
      [sys.executable, '-m', 'analysis.steptime.measure', '--config',
       os.path.join(ROOT, 'configs', 'squeezenet.py'), f'--config.dataset.data_dir={data_dir}',
       # The published network: the volume check counts gradients, not the BN statistics
       # that the digits recipe's BatchNorm variant also all-reduces.
       '--config.batch_norm=False',
       '--config.per_device_batch=8', f'--out={out}', '--repeats=2', '--warmup=1',
       '--rounds=1', '--steps_per_round=2', '--calibrate_up_to=1', '--calibration_sizes=2',
       '--batches=4', '--async_repeats=1', '--schemes=sync-join', '--servers=allreduce',
       '--async_servers=central', '--novolume', *args],
      env=process_env(share_compiled='--processes=0' in args), capture_output=True,
      text=True, timeout=900, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  report = tmp_path / 'report'
  compared = subprocess.run([sys.executable, '-m', 'analysis.steptime.compare', str(out), '--out',
                             str(report)], env=process_env(), capture_output=True, text=True,
                            timeout=300, cwd=ROOT)
  assert compared.returncode == 0, compared.stderr[-3000:]
  return json.loads(out.read_text()), proc.stderr, report


def check_setting(result, name, repetitions):
  """One setting's samples: t_grad, the steps at N = 1, 2 (1 round × 2 steps, in each
  repetition), the calibration up to the network, and the N = 2 step's volume equal to its
  analytic and reported bytes."""
  setting = result['settings'][name]
  assert sorted(setting['t_grad']) == ['8']  # sync-join and async: 8 per device
  assert all(len(s) == 2 * repetitions for s in setting['t_grad'].values())
  assert [(c['n'], len(c['samples']), [len(r) for r in c['repetitions']])
          for c in setting['steps']] == [(n, 2 * repetitions, [2] * repetitions)
                                         for n in (1, 2)]
  assert sorted(setting['calls']) == sorted(timing.CALIBRATED)  # every kind, one-way permute too
  for kind, points in setting['calls'].items():
    largest = 4 if kind == timing.SCALAR else result['network']['param_bytes'] // 8 * 8
    assert [p['bytes'] for p in points][-1] == largest  # the scalar: 4 bytes only
    assert all({'1', '2'} <= set(p['chains']) for p in points)
  two = setting['steps'][1]
  assert two['volume']['program_bytes'] == pytest.approx(two['volume']['analytic_bytes'],
                                                         rel=1e-4)  # + metrics
  assert two['volume']['reported_bytes'] == pytest.approx(two['volume']['analytic_bytes'])
  assert {c['op'] for c in two['compiled']} == {'all_reduce'}  # the compiled program's
  return setting


@pytest.mark.slow
def test_measure_and_compare_end_to_end_emulated(tmp_path, data_dir):
  """The emulated setting (with async); the 2-process one is in test_measure_processes.py."""
  result, stderr, report = measure_and_compare(tmp_path, data_dir, '--workers=2',
                                               '--processes=0', '--repetitions=2')
  assert '[emulated] [2/2] t_train async central N=2' in stderr  # progress
  assert result['versions']['jax'] == jax.__version__ and result['machine']['cores']
  assert set(result['settings']) == {'emulated'}
  setting = check_setting(result, 'emulated', repetitions=2)
  assert [len(a['samples']) for a in setting['async']] == [2, 2]  # one run per repetition
  text = (report / 'report.md').read_text()
  assert '| emulated | sync-join | allreduce | 2 |' in text
  assert '| emulated | measured parts | 1 |' in text  # the held-out summary
  assert '- **squeezenet** (emulated):' in text
  with open(report / 'speedup.csv') as f:
    assert len(list(csv.DictReader(f))) == 2 + 2  # steps and async at N = 1, 2
  assert sorted(os.listdir(report)) == ['report.md', 'speedup.csv',
                                        'squeezenet_32_async_central.png',
                                        'squeezenet_32_sync-join_allreduce.png']


def _args(**overrides):
  values = dict(out='/tmp/m.json', workers=8, processes=2, batches=128, repeats=10, warmup=2,
                async_repeats=2, rounds=10, steps_per_round=3, repetitions=2,
                calibrate_up_to=10.0, calibration_sizes=6, schemes=['sync-split'], servers=['allreduce'],
                async_servers=['central'], links=[], trace_calls=3)
  return types.SimpleNamespace(**{**values, **overrides})


@pytest.mark.parametrize('overrides, message', [
    (dict(workers=-1), '--workers=-1: must be at least 0'),
    (dict(servers=['bogus']), "--servers: ['bogus'] unknown"),
    (dict(workers=0, processes=0), 'nothing to measure'),
    (dict(repetitions=0), '--repetitions=0: must be at least 1'),
    (dict(calibration_sizes=1), '--calibration_sizes=1: must be at least 2'),
    (dict(trace_calls=-1), '--trace_calls=-1: must be at least 0'),
    (dict(out='/no/such/folder/m.json'), 'does not exist'),
    (dict(links=['1gbps']), "--links: '1gbps' is not a link rate: write it as tc does"),
    (dict(links=['1gbit'], processes=1), '--links=1gbit times 2 or more processes'),
])
def test_measure_bad_arguments_are_usage_errors(overrides, message):
  with pytest.raises(app.UsageError, match=re.escape(message)):
    measure.check_args(_args(**overrides))


def test_measure_cli_prints_a_usage_error(tmp_path):
  proc = subprocess.run([sys.executable, '-m', 'analysis.steptime.measure', '--config',
                         os.path.join(ROOT, 'configs', 'squeezenet.py'),
                         f'--out={tmp_path}/m.json', '--workers=-1'],
                        env=process_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
  assert proc.returncode == 1 and '--workers=-1: must be at least 0' in proc.stderr


def test_measure_names_the_config_field_of_a_bad_cell(data_dir):
  """sync-split on 8 devices cannot split a batch of 12: the error names the field and
  the cell, before anything runs."""
  cfg = config_lib.defaults()
  cfg.model, cfg.global_batch, cfg.dataset.data_dir = 'squeezenet', 12, data_dir
  with pytest.raises(config_lib.ConfigError,
                     match=r'config.global_batch=12 is invalid.*N=8 cell'):
    measure.plan(cfg, 8, 0, ['sync-split'], ['allreduce'], [], False)


@pytest.mark.parametrize('name, arg, groups', [('squeezenet', 'digits', 0),
                                               ('thesis', 'net=resnet34', 0),
                                               ('resnet34_2d', 'digits', 4)])
def test_measure_plans_every_server_and_variant_of_the_shipped_configs(name, arg, groups,
                                                                       data_dir):
  """Each cell keeps the config's BatchNorm groups where they fit (resnet34_2d's groups of
  4 on 4 devices; unset: all devices), and gossip,
  in the default --servers, gets its own per-device BN instead of an error; ResNet34's FC
  layers are found through its partial (the hybrid variant)."""
  cfg = config_file(name, arg)
  cfg.dataset.data_dir = data_dir
  runs, skipped = measure.plan(cfg, 4, 2, list(measure.SYNC_SCHEMES), list(config_lib.SERVERS),
                               list(measure.ASYNC_SERVERS), True)
  emulated = runs['emulated'][0][1]
  assert {c['server'] for c in emulated['steps']} == set(config_lib.SERVERS)
  gossip = next(c for c in emulated['steps'] if c['server'] == 'gossip' and c['n'] == 4)
  assert gossip['overrides']['bn_group_size'] == 1  # settled: the children do not validate
  allreduce = next(c for c in emulated['steps'] if c['server'] == 'allreduce' and c['n'] == 4)
  assert allreduce['overrides']['bn_group_size'] == groups
  two = next(c for c in emulated['steps'] if c['server'] == 'allreduce' and c['n'] == 2)
  assert two['overrides']['bn_group_size'] == (0 if groups == 4 else groups)  # 4 > N: all
  labels = [v['label'] for v in emulated['volume']]
  assert ('hybrid' in labels) == (name != 'squeezenet') and 'local SGD' in labels


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


def test_rounds_interleave_every_cell_in_one_order_per_round():
  """Every cell compiled (warmed) before any is timed; each round times every cell, in a
  permutation drawn from the round's number (the same on every process)."""
  log = []
  cells = [lambda i=i: log.append(i) for i in range(4)]
  samples = timing.time_in_rounds(lambda: cells, rounds=3, steps_per_round=2, warmup=1)
  assert log[:4] == [0, 1, 2, 3] and [len(x) for x in samples] == [6] * 4
  rounds = [log[4 + 12 * r:4 + 12 * (r + 1)] for r in range(3)]
  for r, calls in enumerate(rounds):  # each cell once untimed, twice timed, in the round's order
    assert calls[::3] == timing.round_order(4, r) and calls == [i for i in calls[::3]
                                                                for _ in range(3)]
  assert len({tuple(timing.round_order(4, r)) for r in range(3)}) > 1
  assert timing.round_order(4, 7) == timing.round_order(4, 7)
  # Groups under a memory budget: consecutive, each at least one cell.
  assert timing.groups([3, 3, 3, 10, 1], budget=6) == [[0, 1], [2], [3], [4]]


def test_children_share_one_compilation_cache_per_run(tmp_path, monkeypatch):
  monkeypatch.setenv('JAX_COMPILATION_CACHE_DIR', '/elsewhere')
  run = measure.compilation_cache('run', str(tmp_path))
  assert run == str(tmp_path / 'xla_cache') and os.path.isdir(run)
  kept = measure.compilation_cache(str(tmp_path / 'kept'), str(tmp_path / 'unused'))
  assert kept == str(tmp_path / 'kept') and os.path.isdir(kept)
  assert measure._child_env(run)['JAX_COMPILATION_CACHE_DIR'] == run
  off = measure.compilation_cache('off', str(tmp_path))
  assert off == '' and 'JAX_COMPILATION_CACHE_DIR' not in measure._child_env(off)
  assert measure._child_env()['JAX_COMPILATION_CACHE_DIR'] == '/elsewhere'  # not measure's


def test_repetitions_are_joined_and_kept():
  def rep(x):
    return {'t_grad': {'8': [x]}, 't_grad_contended': {'2': {'8': [2 * x]}},
            'calls': {'all_reduce': [{'bytes': 4096, 'chains': {'1': [x], '2': [2 * x]}}]},
            'steps': [{'n': 2, 'samples': [x, x]}], 'async': [], 'volume': []}
  joined = measure.combine([rep(1.0), rep(3.0)])
  assert joined['repetitions'] == 2
  assert joined['t_grad'] == {'8': [1.0, 3.0]}
  assert joined['t_grad_contended'] == {'2': {'8': [2.0, 6.0]}}
  assert joined['steps'] == [{'n': 2, 'samples': [1.0, 1.0, 3.0, 3.0],
                              'repetitions': [[1.0, 1.0], [3.0, 3.0]]}]
  assert joined['calls']['all_reduce'][0]['chains'] == {'1': [1.0, 3.0], '2': [2.0, 6.0]}


def test_compare_rejects_a_file_measure_did_not_write(tmp_path):
  bogus = tmp_path / 'x.json'
  bogus.write_text('{"a": 1}')
  with pytest.raises(SystemExit) as e:
    compare.main([str(bogus), '--out', str(tmp_path / 'r')])
  assert e.value.code == 2


def test_other_work_during_a_run_is_recorded_and_named_in_a_warning(tmp_path, capsys,
                                                                     monkeypatch):
  """/proc/stat's busy time less this process tree's: what other work took from the run (the
  whole machine's, or some cores' as gloo's loop watch reads it: jaxpar.cpu_load)."""
  stat = tmp_path / 'stat'
  stat.write_text('cpu  100 5 50 1000 20 3 2 7 0 0\ncpu0 50 2 25 500 10 1 1 3 0 0\n'
                  'cpu1 50 3 25 500 10 2 1 4 0 0\nintr 5 6\n')
  hz = os.sysconf('SC_CLK_TCK')
  busy, own = cpu_load.cpu_clock(str(stat))
  assert busy == pytest.approx((100 + 5 + 50 + 3 + 2) / hz) and own > 0
  assert cpu_load.cpu_clock(str(stat), cores={1})[0] == pytest.approx((50 + 3 + 25 + 2 + 1) / hz)
  assert cpu_load.cpu_clock(str(stat), cores={0, 1})[0] == pytest.approx(busy)
  assert cpu_load.cpu_clock(str(stat), children=False)[1] <= own
  assert cpu_load.cpu_clock(str(tmp_path / 'absent')) is None
  assert measure.other_cpu is cpu_load.other_cpu and measure.cpu_clock is cpu_load.cpu_clock
  assert measure.other_cpu((10.0, 4.0), (16.0, 7.0)) == pytest.approx(3.0)
  assert measure.other_cpu((10.0, 4.0), (10.5, 5.0)) == 0.0  # clock grains: never below 0
  assert measure.other_cpu(None, (1.0, 1.0)) is None
  monkeypatch.setattr(measure, 'OTHER_LOAD', [])
  measure._record_load('loopback', 2, 20.0, 1.0)  # 5 % of a core: recorded only
  measure._record_load('link-1gbit', 2, 20.0, 4.0)  # 20 %
  err = capsys.readouterr().err
  assert err.count('WARNING') == 1 and '20% of a core during the link-1gbit run with 2' in err
  assert [r['other_cpu_s'] for r in measure.OTHER_LOAD] == [1.0, 4.0]


def test_plan_steps_judges_each_row_with_and_without_the_programs_own_work():
  """`analysis.steptime.plan_steps` by hand: the rows it trains (all devices, not Downpour,
  not left at a bound; or those named), a step time from the clock's readings (the first
  interval left out), each row's errors with and without its program's own work, on one
  launch and on the median of several (the launches' spread its range and `run_noise`)."""
  from analysis.steptime import plan_steps
  row = lambda label, devices, family='sync', server='allreduce', period=0, **kw: {
      'label': label, 'devices': devices, 'family': family, 'server': server,
      'period': period, 't_predicted': 0.12, **kw}
  plan = {'devices': 2, 'candidates': [
      row('one', 1), row('two', 2), row('async', 2, 'async'), row('far', 2, pruned='bound'),
      row('local τ=8', 2, 'local_sgd', period=8)],
      'strategy_work': [{'server': 'allreduce', 'devices': 2, 'period': 0, 'seconds': 0.02}]}
  assert plan_steps.rows_to_run(plan) == [1, 4]
  assert plan_steps.rows_to_run(plan, ['τ=8']) == [4]
  assert plan_steps.rows_to_run(plan, ['tw', 'far', 'one']) == [1]  # 'one' is on 1 device
  # Readings at steps 16, 32, 48, 64: 0.1 s a step, then 0.15 and 0.1; the first interval
  # (0.3 s a step) left out.
  curve = [[16, 2.3, 1.0], [32, 2.2, 5.8], [48, 2.1, 8.2], [64, 2.0, 9.8]]
  assert plan_steps.step_seconds(curve) == pytest.approx((0.125, 0.1, 0.15))
  assert plan_steps.step_seconds(curve[:3]) is None
  judged = plan_steps.judged(plan, plan['candidates'][1], [(0.125, 0.1, 0.15)])
  assert judged['own_work_s'] == 0.02 and judged['predicted_without_work_s'] == pytest.approx(0.1)
  assert judged['error'] == pytest.approx(abs(math.log(0.12 / 0.125)))
  assert judged['error_without_work'] == pytest.approx(math.log(0.125 / 0.1))
  assert judged['noise'] == pytest.approx(math.log(1.5) / 2) and judged['run_noise'] is None
  local = plan_steps.judged(plan, plan['candidates'][4], [None])  # no own work measured: 0
  assert local['own_work_s'] == 0.0 and local['error'] is None
  text = plan_steps.table({'rows': [judged, local]})
  assert '| two | 20.0 | 120.0 | 4% | 100.0 | 22% | 125.0 (100.0–150.0) |' in text
  # Three launches (one gave too few readings): the median of their steps, their range.
  three = plan_steps.judged(plan, plan['candidates'][1],
                            [(0.10, 0.099, 0.101), None, (0.14, 0.13, 0.15), (0.12, 0.11, 0.13)])
  assert three['measured_s'] == pytest.approx(0.12) and three['runs_s'] == [0.10, 0.14, 0.12]
  assert three['measured_range_s'] == [0.10, 0.14] and three['error'] == pytest.approx(0.0)
  assert three['run_noise'] == pytest.approx(math.log(1.4) / 2)
  assert three['noise'] == pytest.approx(math.log(0.15 / 0.13) / 2)  # the launches' median
  result = {'network': 'googlenet', 'image_size': 32, 'setting': '2 processes',
            'link': 'loopback', 'created': '2026-12-03T01:00:00', 'rows': [three, judged],
            'median_error': 0.02, 'median_error_without_work': 0.2, 'median_noise': 0.05,
            'median_run_noise': 0.08}
  assert ('median error 2% with the programs\' own work, 20% without it; the steps\' own '
          'noise 5% within a launch, 8% between launches of a row') in plan_steps.table(result)
  # At the host's speed: launches at 1.25× and 1.1× the plan's t_grad (a launch without a
  # step, or without a reading after it, is left out): measured ÷ (0.12 × factor) is
  # 0.14 / 0.15 and 0.12 / 0.132, their median's |log| the error.
  fast = plan_steps.judged(plan, plan['candidates'][1],
                           [(0.10, 0.099, 0.101), None, (0.14, 0.13, 0.15), (0.12, 0.11, 0.13)],
                           speeds=[None, 1.0, 1.25, 1.1])
  ratios = [0.14 / 0.15, 0.12 / 0.132]
  assert fast['host_speed'] == [1.25, 1.1]
  assert fast['error_at_host_speed'] == pytest.approx(abs(math.log(np.median(ratios))))
  assert three['error_at_host_speed'] is None and three['host_speed'] is None
  text = plan_steps.table({**result, 'rows': [fast], 'host_speed': [1.1, 1.25],
                           'median_error_at_host_speed': 0.03})
  assert text.splitlines()[0].endswith("| error at the host's speed |")
  assert text.splitlines()[2].endswith(f"| {fast['error_at_host_speed']:.0%} |")
  assert ("At the host's speed of each launch (t_grad timed beside it): median error 3%; the "
          "host ran at 1.10–1.25× the plan's t_grad.") in text
  # The plan's t_grad that the host's speed is read against: at its serial batch, all devices.
  speed_plan = {'serial': {'batch': 16}, 'devices': 2,
                't_grad': [{'batch': 16, 'devices': 1, 'seconds': 0.05},
                           {'batch': 16, 'devices': 2, 'seconds': 0.06}]}
  assert plan_steps.planned_speed(speed_plan) == 0.06
  with pytest.raises(ValueError, match='no t_grad at its serial batch 16 on its 4 devices'):
    plan_steps.planned_speed({**speed_plan, 'devices': 4})


def test_plan_steps_marks_a_launch_whose_gloo_loop_left_idle_priority(tmp_path):
  """A launch whose gloo loop went back to normal priority (the warning
  `multihost.IdleGlooLoops` logs, in any process's log) is marked; one without is not; the
  table says how many launches of a row were."""
  from analysis.steptime import plan_steps
  (tmp_path / 'process_0.log').write_text('I1203 gloo\'s TCP loop thread 7 runs at idle '
                                          'priority (SCHED_IDLE)\n')
  (tmp_path / 'process_1.log').write_text('step 16\n')
  assert not plan_steps.left_idle_priority(str(tmp_path))
  (tmp_path / 'process_1.log').write_text(
      'W1203 Other processes used 29 % of a core ... Back at normal priority (a small '
      'collective may wait for a 4 ms timer tick); idle priority is tried again in 30 s.\n')
  assert plan_steps.left_idle_priority(str(tmp_path))
  assert not plan_steps.left_idle_priority(str(tmp_path / 'none'))
  row = {'label': 'two', 'own_work_s': 0.0, 'predicted_s': 0.1, 'error': 0.0,
         'predicted_without_work_s': 0.1, 'error_without_work': 0.0, 'measured_s': 0.1,
         'measured_range_s': [0.1, 0.2], 'launches_at_normal_priority': 1}
  assert "100.0 (100.0–200.0), 1 launch(es) with gloo's loop at normal priority |" in \
      plan_steps.table({'rows': [row]})


def test_program_batch_reads_each_program_as_its_step_less_t_grad_round_by_round():
  """`analysis.steptime.program_batch.summarize` by hand: per round, the step at each batch
  less that round's t_grad at that batch on as many devices; the medians; Local SGD labelled
  by its period; the stand-in program's median beside."""
  from analysis.steptime import program_batch
  from jaxpar.plan.candidates import Candidate
  dist = Candidate('sync-join', 'distributed', 2, 32, 'device')
  local = Candidate('sync-join', 'allreduce', 2, 32, 'device', period=8)
  samples = {'t_grad b=4 N=2': [0.02, 0.04, 0.03], 't_grad b=16 N=2': [0.06, 0.12, 0.07],
             'distributed N=2 b=4': [0.20, 0.24, 0.21], 'distributed N=2 b=16': [0.24, 0.30, 0.26],
             'distributed N=2 stand-in': [0.14, 0.15, 0.13],
             'allreduce N=2 τ=8 b=4': [0.05, 0.07, 0.06], 'allreduce N=2 τ=8 b=16': [0.09, 0.15, 0.1],
             'allreduce N=2 τ=8 stand-in': [0.03, 0.03, 0.04]}
  rows = program_batch.summarize(samples, [dist, local], [4, 16])
  d, l = rows
  assert d['program'] == 'distributed N=2' and l['program'] == 'allreduce N=2 τ=8'
  assert d['rounds_s'][4] == pytest.approx([0.18, 0.20, 0.18])
  assert d['program_s'] == pytest.approx({4: 0.18, 16: 0.18})  # medians of (.18 .18 .19)
  assert l['program_s'][4] == pytest.approx(0.03) and l['program_s'][16] == pytest.approx(0.03)
  assert d['stand_in_s'] == pytest.approx(0.14) and d['step_s'][16] == pytest.approx(0.26)
