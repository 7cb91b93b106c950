"""Predicted against measured: speedup tables, held-out errors, plots and a recommendation
from `analysis.steptime.measure`'s JSON files.

  python -m analysis.steptime.compare resnet34.json [squeezenet.json ...] --out report/

Writes into --out:
  report.md     every network and setting at a glance, and in one sentence on how many the
                parts model meets the goal (held-out error ≤ 10 %, regret ≤ 1.05); then per
                network: the measured inputs (t_grad alone and under contention, t_comm,
                each collective kind's calibrated per-call costs and α-β fit), speedup
                against N measured (with the repetitions' spread) next to predicted, the
                error of each prediction, the held-out summary per model and setting
                (median |log(t_predicted / t_measured)|, the noise floor, the rank
                correlation, the regret of the model's pick), the volume table, and the
                recommendation for this hardware with its uncertainty and regret;
  speedup.csv   every row of the speedup tables;
  NET_SIZE_SCHEME_SERVER.png  one per network × scheme × server, in the style of [T]'s
                Figures 6.1–6.11: measured points with the repetitions' range, predicted
                lines, per setting.

Speedup is [T]'s eq. 4.23, S = D·t_grad / t_train, with t_grad the one-device time alone and
t_train of D batches: sync-split D steps, sync-join D/N steps of N batches (t_iter measured
per step), async the measured time of D pushes. Predictions of t_train:
  thesis     [T]'s equations (4.11, 4.12, 4.20, 4.21) fed as [T] fed them: the one-device
             t_grad and t_comm (the calibrated permute of the network's weights). Central
             and distributed servers only.
  semaphore  [T]'s access-control proposal (eq. 7.1–7.3, `equations.semaphore_training_time`)
             for the central server where jaxpar's schedule is serial (one transfer at a
             time), otherwise as `thesis`.
  parts      jaxpar's step from separately measured parts, none fitted to a step time it
             predicts: t_grad of the device's own batch under the run's contention (the
             processes computing at once), plus the step's non-gradient work, plus every
             collective of the *compiled* program at its calibrated per-call cost
             (`jaxpar.perfmodel.calibrate`; a permute of one pair as the one-way permute),
             less the overlap of collectives and compute. Where the steps were traced
             (`analysis.steptime.trace`), the non-gradient work is the step program's traced
             compute less the traced gradient program's (update, packing the buffers a
             collective sends and unpacking them, conditionals: what the N-device program
             adds) and the overlap is the trace's; in files without traces, the same scheme
             and server's N = 1 step less its t_grad, and no overlap. Not for async: Ray's
             per-push overhead is not among the parts measured, so async is judged by the
             thesis' equations alone.
  rate       a link setting predicted from the loopback (`processes`) setting alone and the
             link's rate: the parts model with loopback's t_grad, non-gradient work and
             per-call costs, each collective adding the bytes its busiest device sends ÷
             the rate. Nothing measured across the link enters it.
The N = 1 steps are not held out (untraced, they calibrate `parts`' non-gradient work);
every other point is judged by every model, and no fitted number has seen it.
"""
import argparse
import csv
import json
import math
import os
import sys

import numpy as np

from analysis.steptime import link, volume
from analysis.theory import equations
from jaxpar.perfmodel import calibrate, hlo

MODELS = ('thesis', 'semaphore', 'parts', 'rate')
MODEL_NAMES = {'thesis': 'thesis equations', 'semaphore': 'thesis + semaphore',
               'parts': 'measured parts', 'rate': 'loopback parts + link rate'}


def _median(samples) -> float:
  return float(np.median(samples))


def log_error(predicted, measured):
  """log(t_predicted / t_measured): symmetric in over- and under-prediction."""
  return None if predicted is None else math.log(predicted / measured)


def _spread(repetitions, scale: float = 1.0):
  """|log| of the largest over the smallest repetition's median: how far two independent
  measurements of the point disagree (None with one repetition)."""
  if not repetitions or len(repetitions) < 2:
    return None
  medians = [_median(r) * scale for r in repetitions]
  return math.log(max(medians) / min(medians)), medians


def _grad(s, batch, n, setting):
  """t_grad of `batch` on one device: under the contention of the N-process run where it
  was measured (processes and link settings, N > 1), else alone."""
  contended = s.get('t_grad_contended', {}).get(str(n), {})
  if setting != 'emulated' and n > 1 and str(batch) in contended:
    return _median(contended[str(batch)])
  alone = s['t_grad'].get(str(batch))
  return None if alone is None else _median(alone)


def wire_bytes(c: hlo.Collective, devices: int) -> float:
  """Bytes the busiest device sends for collective `c`: a permute's sources each send their
  whole operand; the others as `hlo.bytes_per_device` counts them."""
  return c.nbytes if c.op == 'collective_permute' else hlo.bytes_per_device(c, devices)


def _non_gradient(s, setting, scheme, server):
  """The step's work besides the gradients, where the steps were not traced: the same
  scheme and server's N = 1 step less its t_grad (None where not measured)."""
  base = next((c for c in s['steps'] if c['n'] == 1 and (c['scheme'], c['server'])
               == (scheme, server)), None)
  alone = base and _grad(s, base['per_device_batch'], 1, setting)
  return None if not alone else max(0.0, _median(base['samples']) - alone)


def _mean(values) -> float:
  return float(np.mean(list(values)))


def traced(s, setting, c):
  """{'other', 'overlap', 'collective'} of setting `s`'s step of `c`'s scheme, server and N,
  from its traces (`analysis.steptime.trace`; means over the repetitions): its compute less
  the traced compute of the gradients of its per-device batch under the same contention
  (alone at N = 1), the overlap of its collectives with compute, its collectives' own time.
  None where either was not traced."""
  cell = next((x for x in s['steps'] if (x['scheme'], x['server'], x['n'])
               == (c['scheme'], c['server'], c['n']) and x.get('trace')), None)
  if cell is None:
    return None
  batch, n = str(cell['per_device_batch']), cell['n']
  grads = (s.get('t_grad_trace_contended', {}).get(str(n), {}) if setting != 'emulated'
           and n > 1 else s.get('t_grad_trace', {})).get(batch)
  if not grads:
    return None
  return {'other': max(0.0, _mean(t['compute'] for t in cell['trace'])
                       - _mean(g['compute'] for g in grads)),
          'overlap': _mean(t['overlap'] for t in cell['trace']),
          'collective': _mean(t['collective'] for t in cell['trace'])}


def step_parts(s, setting, c):
  """`traced` where setting `s`'s steps were traced; else the N = 1 step's non-gradient
  work (`_non_gradient`), with no overlap or traced collectives (None)."""
  return traced(s, setting, c) or {
      'other': _non_gradient(s, setting, c['scheme'], c['server']), 'overlap': None,
      'collective': None}


def _parts(s, setting, c, costs, extra=lambda x: 0.0):
  """One synchronous step by the parts model from setting `s`'s measurements (None if a
  part is missing); `extra(collective)` adds to each collective's cost."""
  own = _grad(s, c['per_device_batch'], c['n'], setting)
  parts = step_parts(s, setting, c)
  other = parts['other'] or 0.0
  if own is None:
    return None
  if c['n'] == 1:
    return own + other
  if costs is None or 'compiled' not in c:
    return None
  program = [volume.from_row(x) for x in c['compiled']]
  return (own + other - (parts['overlap'] or 0.0)
          + hlo.step_total(program, lambda x: costs.cost(x) + extra(x)))


def rows(result) -> list:
  """Every measured point of one measurement file, with each model's prediction."""
  out = []
  d = result['batches']
  nbytes = result['network']['param_bytes']
  loopback = result['settings'].get('processes')
  loopback_costs = loopback and calibrate.setting_inputs(loopback, nbytes)[1]
  for setting, s in result['settings'].items():
    t_comm, costs = calibrate.setting_inputs(s, nbytes)
    points = [(c, 'sync') for c in s['steps']] + [(c, 'async') for c in s['async']]
    for c, kind in points:
      scheme = c['scheme'] if kind == 'sync' else 'async'
      server, n = c['server'], c['n']
      batch = result['batch'][scheme]
      if str(batch) not in s['t_grad']:
        continue  # no one-device time in this setting (e.g. --processes without N=1)
      t_grad = _median(s['t_grad'][str(batch)])
      iterations = d / n if scheme == 'sync-join' else d
      scale = iterations if kind == 'sync' else 1.0
      t_train = scale * _median(c['samples'])
      spread = _spread(c.get('repetitions'), scale)
      predicted = dict.fromkeys(MODELS)
      serial = c.get('overrides', {}).get('central_schedule', 'serial') == 'serial'
      if t_comm is not None and server in equations.SERVERS:
        predicted['thesis'] = equations.training_time(scheme, server, t_grad, t_comm, n, d)
        predicted['semaphore'] = (
            equations.semaphore_training_time(scheme, t_grad, t_comm, n, d)
            if server == 'central' and serial else predicted['thesis'])
      own = _grad(s, c.get('per_device_batch', batch), n, setting)
      found = step_parts(s, setting, c) if kind == 'sync' else {}
      if kind == 'sync':
        step = _parts(s, setting, c, costs)
        predicted['parts'] = None if step is None else iterations * step
        if setting.startswith('link-') and loopback and loopback_costs:
          bps = link.bits_per_second(setting.removeprefix('link-'))
          step = _parts(loopback, 'processes', c, loopback_costs,
                        lambda x: wire_bytes(x, n) * 8 / bps)
          predicted['rate'] = None if step is None else iterations * step
      row = {
          'network': result['network']['model'], 'image_size': result['network']['image_size'],
          'setting': setting, 'scheme': scheme, 'server': server, 'n': n,
          'held_out': not (kind == 'sync' and n == 1),
          't_grad': t_grad, 't_grad_own': own,
          't_other': found.get('other'), 't_overlap': found.get('overlap'),
          't_collective_traced': found.get('collective'),
          't_collective_calibrated': None if kind != 'sync' or costs is None or n == 1
          else costs.step([volume.from_row(x) for x in c.get('compiled', [])]),
          't_comm': t_comm,
          't_iter': _median(c['samples']) if kind == 'sync' else None,
          't_train': t_train, 'speedup': equations.thesis_speedup(t_grad, d, t_train),
          'noise': spread[0] if spread else None,
          'speedup_repetitions': [equations.thesis_speedup(t_grad, d, m) for m in spread[1]]
          if spread else None,
          'communication_share': None if own is None or kind != 'sync'
          else max(0.0, 1 - own / _median(c['samples']))}
      for model in MODELS:
        row[f't_train_{model}'] = predicted[model]
        row[f'speedup_{model}'] = (None if predicted[model] is None
                                   else equations.thesis_speedup(t_grad, d, predicted[model]))
        row[f'error_{model}'] = log_error(predicted[model], t_train)
      out.append(row)
  return out


def spearman(x, y) -> float:
  """Spearman's rank correlation of two equally long sequences (average ranks for ties);
  nan with fewer than two points or no spread."""
  from scipy.stats import spearmanr
  if len(x) < 2:
    return float('nan')
  value = spearmanr(x, y).statistic
  return float(value)


def pick(points, model: str):
  """The point `model` predicts fastest (least t_train), among those it predicts."""
  mine = [p for p in points if p[f't_train_{model}'] is not None]
  return min(mine, key=lambda p: p[f't_train_{model}']) if mine else None


def regret(points, model: str):
  """Measured t_train of the model's pick ÷ the least measured t_train of all `points`
  (1 = the model picks the measured best)."""
  chosen = pick(points, model)
  if chosen is None:
    return None
  return chosen['t_train'] / min(p['t_train'] for p in points)


def _label(p) -> str:
  return f"{p['scheme']} {p['server']} N={p['n']}"


def held_out_summary(points) -> list:
  """Per (network, setting, model): the held-out points' median |log error|, the noise floor
  (median |log| spread of their repetitions), Spearman's ρ of predicted and measured
  t_train, the model's pick and its regret over every point of the setting."""
  out = []
  settings = list(dict.fromkeys(p['setting'] for p in points))  # as measured
  keys = sorted({(p['network'], p['image_size'], p['setting']) for p in points},
                key=lambda k: (k[0], k[1], settings.index(k[2])))
  for net, size, setting in keys:
    mine = [p for p in points if (p['network'], p['image_size'], p['setting'])
            == (net, size, setting)]
    noise = [p['noise'] for p in mine if p['held_out'] and p['noise'] is not None]
    for model in MODELS:
      judged = [p for p in mine if p['held_out'] and p[f'error_{model}'] is not None]
      if not judged:
        continue
      chosen = pick(mine, model)
      out.append({
          'network': net, 'image_size': size, 'setting': setting, 'model': model,
          'points': len(judged),
          'median_log_error': float(np.median([abs(p[f'error_{model}']) for p in judged])),
          'noise_floor': float(np.median(noise)) if noise else None,
          'rank_correlation': spearman([p[f't_train_{model}'] for p in judged],
                                       [p['t_train'] for p in judged]),
          'pick': chosen and _label(chosen),
          'regret': regret(mine, model)})
  return out


def recommend(points, setting: str, model: str = 'parts') -> str:
  """The scheme, server and N that `model` predicts reach D batches soonest in a setting,
  in one sentence: why, whether a rival lies within the uncertainty (the larger of the
  model's held-out error and the noise floor), and the regret where measured."""
  mine = [p for p in points if p['setting'] == setting]
  ranked = sorted((p for p in mine if p[f't_train_{model}'] is not None),
                  key=lambda p: p[f't_train_{model}'])
  if not ranked:
    model, ranked = 'measured', sorted(mine, key=lambda p: p['t_train'])
  best = ranked[0]
  t_best = best['t_train'] if model == 'measured' else best[f't_train_{model}']
  summary = {r['model']: r for r in held_out_summary(mine)}.get(model, {})
  uncertainty = max(summary.get('median_log_error') or 0.0, summary.get('noise_floor') or 0.0)
  ratio = best['t_comm'] / best['t_grad'] if best['t_comm'] else None
  ratio_text = f't_comm/t_grad = {ratio:.2f}' if ratio is not None else 't_comm not measured'
  how = f"the {best['server']} server" if best['server'] in equations.SERVERS else best['server']
  what = ('stay on one device' if best['n'] == 1
          else f"{best['scheme']} with {how} on N={best['n']}")
  key = 't_train' if model == 'measured' else f't_train_{model}'
  text = (f"**{best['network']}** ({setting}): {what} — predicted fastest by the "
          f"{MODEL_NAMES.get(model, 'measurement')}, {t_best:.3g} s for the run, "
          f"S = {best['speedup'] * best['t_train'] / t_best:.2f} "
          f"({ratio_text})")
  if len(ranked) > 1 and model != 'measured':
    rival = ranked[1]
    gap = math.log(rival[key] / t_best)
    rival_text = _label(rival)
    if gap <= uncertainty:
      text += (f'; {rival_text} is predicted only {_percent(gap)} slower, within the '
               f'uncertainty ({_percent(uncertainty)}): either')
    else:
      text += f'; the next, {rival_text}, {_percent(gap)} slower'
  measured_best = min(mine, key=lambda p: p['t_train'])
  if model != 'measured':
    text += (f". Measured: {best['t_train']:.3g} s against the best, {_label(measured_best)}, "
             f"{measured_best['t_train']:.3g} s: regret {best['t_train'] / measured_best['t_train']:.2f}.")
  else:
    text += '.'
  return text


def _fmt(x, spec='.3f'):
  return '—' if x is None else format(x, spec)


def _pct(x):
  """A log error as the percent it multiplies by: +25 % is 1.25× the measured time."""
  return '—' if x is None else _signed_pct(math.exp(x) - 1)


def _signed_pct(x: float) -> str:
  """`x` as a signed whole percentage; one that rounds to 0 is '+0%' whatever its sign (a fit
  residual of -1e-9 prints as -0% on one machine's BLAS and +0% on another's)."""
  return '+0%' if round(x * 100) == 0 else f'{x:+.0%}'


def _percent(x):
  """An unsigned |log| (an error, a spread) as a percentage: 0.22 → 25 %."""
  return '—' if x is None else f'{math.exp(x) - 1:.0%}'


def summary_table(summary) -> str:
  """`held_out_summary`'s rows as a markdown table."""
  lines = ['| setting | model | held-out points | median error | noise floor | rank ρ '
           '| pick | regret |', '|---|---|---:|---:|---:|---:|---|---:|']
  for r in summary:
    rho = '—' if math.isnan(r['rank_correlation']) else f"{r['rank_correlation']:+.2f}"
    lines.append(f"| {r['setting']} | {MODEL_NAMES[r['model']]} | {r['points']} "
                 f"| {_percent(r['median_log_error'])} | {_percent(r['noise_floor'])} "
                 f"| {rho} | {r['pick']} | {_fmt(r['regret'], '.2f')} |")
  return '\n'.join(lines)


def overview_table(results, points) -> str:
  """One row per network and setting: t_comm/t_grad, the measured best (any N) and the best
  parallel point, and per model its held-out error (the parts model's with the noise floor),
  its pick and the pick's regret — the README's table of every network."""
  summary = {(r['network'], r['image_size'], r['setting'], r['model']): r
             for r in held_out_summary(points)}
  lines = ['| network (weights; batch) | setting | t_comm / t_grad | best measured '
           '| best parallel | parts: error (noise) | parts: pick, regret '
           "| loopback + rate: error, regret | [T]'s equations: error, regret |",
           '|---|---|---:|---|---|---|---|---|---|']
  for result in results:
    net = result['network']
    for setting in result['settings']:
      key = (net['model'], net['image_size'], setting)
      mine = [p for p in points if (p['network'], p['image_size'], p['setting']) == key]
      if not mine:
        continue
      ratio = next((p['t_comm'] / p['t_grad'] for p in mine
                    if p['scheme'] == 'sync-split' and p['t_comm']), None)

      def best(candidates):
        if not candidates:
          return '—'
        p = min(candidates, key=lambda p: p['t_train'])
        return f"{_label(p)}: {p['speedup']:.2f}×"

      def judged(model):
        """(error, noise floor, pick, regret) of `model` in this setting, as printed."""
        r = summary.get((*key, model))
        return ('—',) * 4 if r is None else (
            _percent(r['median_log_error']), _percent(r['noise_floor']), r['pick'],
            _fmt(r['regret'], '.2f'))
      parts, rate, thesis = judged('parts'), judged('rate'), judged('thesis')
      lines.append(
          f"| {net['model']} ({net['param_bytes'] / 1e6:.1f} MB; "
          f"{result['batch']['sync-join']}) | {setting} | {_fmt(ratio, '.2f')} "
          f"| {best(mine)} | {best([p for p in mine if p['n'] > 1])} "
          f"| {parts[0]} ({parts[1]}) | {parts[2]}: {parts[3]} | {rate[0]}, {rate[3]} "
          f"| {thesis[0]}, {thesis[3]} |")
  return '\n'.join(lines)


# What a step-time model is for, judged on held-out points: a median error of at most 10 %,
# and a pick at most 5 % slower than the measured best.
GOAL_ERROR, GOAL_REGRET = 0.10, 1.05


def overview_summary(points) -> str:
  """`overview_table` in one sentence: on how many settings the parts model meets the goal
  (each miss named, with the loopback-plus-rate model's error there), the range of its picks'
  regret, and how far [T]'s equations are off and their worst regret."""
  summary = held_out_summary(points)
  by = {(r['network'], r['image_size'], r['setting'], r['model']): r for r in summary}
  parts = [r for r in summary if r['model'] == 'parts']
  thesis = [r for r in summary if r['model'] == 'thesis']
  if not parts:
    return 'No setting has held-out points for the parts model.'

  def met(r):  # as the table prints them: a whole percent, a regret to two places
    return (round((math.exp(r['median_log_error']) - 1) * 100) <= round(GOAL_ERROR * 100)
            and r['regret'] is not None and round(r['regret'], 2) <= GOAL_REGRET)

  def span(values, fmt):
    lo, hi = fmt(min(values)), fmt(max(values))
    return lo if lo == hi else f'{lo}–{hi}'
  misses = []
  for r in (r for r in parts if not met(r)):
    rate = by.get((r['network'], r['image_size'], r['setting'], 'rate'))
    misses.append(f"{r['network']} at {r['setting']}, {_percent(r['median_log_error'])}, regret "
                  f"{_fmt(r['regret'], '.2f')}" + (
                      f" (the loopback-plus-rate model: {_percent(rate['median_log_error'])})"
                      if rate else ''))
  regrets = [r['regret'] for r in parts if r['regret'] is not None]
  text = (f'The parts model meets the goal (≤ {GOAL_ERROR:.0%} held out, regret ≤ '
          f"{GOAL_REGRET:.2f}) on {len(parts) - len(misses)} of {len(parts)} "
          f"setting{'' if len(parts) == 1 else 's'}"
          + (f"; {'the miss' if len(misses) == 1 else 'the misses'}: {'; '.join(misses)}"
             if misses else '')
          + (f"; its picks' regret is {span(regrets, lambda x: f'{x:.2f}')}" if regrets else ''))
  if thesis:
    worst = max((r['regret'] for r in thesis if r['regret'] is not None), default=None)
    text += (f". [T]'s equations are off by "
             f"{span([r['median_log_error'] for r in thesis], _percent)}"
             + (f' with regret up to {worst:.2f}' if worst is not None else ''))
  return text + '.'


def settings_table(result, points) -> str:
  """One network's settings side by side (analysis/report/measured/findings.md): t_grad of the sync-split
  batch alone and under the N = 2 run's contention, [T]'s t_comm, the calibrated one-way
  permute and all-reduce of the whole gradient and a scalar all-reduce (per call), each
  server's sync-join speedup at N = 2 and the best sync-split one."""
  nbytes = result['network']['param_bytes']
  batch = result['batch']['sync-split']
  servers = list(dict.fromkeys(p['server'] for p in points if p['scheme'] == 'sync-join'))
  def ms(x):
    return '—' if x is None else f'{x * 1e3:.{0 if x >= 0.1 else 1 if x >= 1e-3 else 2}f} ms'
  mb = f'{nbytes / 1e6:.1f} MB'
  lines = [f'| setting | t_grad({batch}) alone → contended | t_comm ({mb} permute, per call) '
           f'| one-way permute of {mb} | all-reduce of {mb}, per call | scalar all-reduce | '
           + ' | '.join(f'sync-join N = 2: {v}' for v in servers) + ' | best sync-split N = 2 |',
           '|---|' + '---:|' * (5 + len(servers) + 1)]
  for setting, s in result['settings'].items():
    mine = [p for p in points if p['setting'] == setting]
    if not mine:
      continue
    alone = s['t_grad'].get(str(batch))
    contended = s.get('t_grad_contended', {}).get('2', {}).get(str(batch))
    grad = ms(alone and _median(alone)) + (f' → {ms(_median(contended))}' if contended else '')
    t_comm, costs = calibrate.setting_inputs(s, nbytes)

    def call(kind, size):
      return ms(costs.per_call(kind, size)) if costs and kind in costs.points else '—'

    def speedup(candidates):
      p = max(candidates, key=lambda p: p['speedup'], default=None)
      return '—' if p is None else f"{p['speedup']:.2f}×"
    joins = [speedup([p for p in mine if p['scheme'] == 'sync-join' and p['n'] == 2
                      and p['server'] == v]) for v in servers]
    best = max((p for p in mine if p['scheme'] == 'sync-split' and p['n'] == 2),
               key=lambda p: p['speedup'], default=None)
    split = '—' if best is None else f"{best['speedup']:.2f}× ({best['server']})"
    lines.append(f"| {setting} | {grad} | {ms(t_comm)} | {call(calibrate.ONE_WAY, nbytes)} | "
                 f"{call('all_reduce', nbytes)} | {call(calibrate.SCALAR, 4)} | "
                 + ' | '.join(joins) + f' | {split} |')
  return '\n'.join(lines)


def join_penalty(points) -> list:
  """What a sync-join step costs beyond a sync-split step of the same server and N, per
  setting: the measured difference of their steps next to the difference of their
  gradient times (each at its per-device batch, under the run's contention), and the
  residual beside the noise (the two points' repetition spreads in seconds, in quadrature)."""
  out = []
  for join in points:
    if join['scheme'] != 'sync-join' or join['n'] < 2 or join['t_iter'] is None:
      continue
    split = next((p for p in points if p['scheme'] == 'sync-split' and all(
        p[k] == join[k] for k in ('network', 'image_size', 'setting', 'server', 'n'))), None)
    if split is None or None in (split['t_iter'], join['t_grad_own'], split['t_grad_own']):
      continue
    step = join['t_iter'] - split['t_iter']
    grad = join['t_grad_own'] - split['t_grad_own']
    noise = [p['t_iter'] * (math.exp(p['noise']) - 1) for p in (join, split) if p['noise']]
    out.append({k: join[k] for k in ('network', 'image_size', 'setting', 'server', 'n')}
               | {'step': step, 'gradient': grad, 'residual': step - grad,
                  'noise': math.hypot(*noise) if len(noise) == 2 else None})
  return out


def join_penalty_table(rows_, run: str | None = None) -> str:
  """`join_penalty`'s rows as a markdown table, in milliseconds; with `run` a column of
  that header first, from each row's 'run' (rows of several measure runs side by side)."""
  ms = lambda x: '—' if x is None else f'{x * 1e3:+.1f}'
  first = (f'| {run} ', '|---') if run else ('', '')
  lines = [first[0] + '| setting | server | N | sync-join − sync-split step (ms) '
           '| of it, gradients (ms) | residual (ms) | noise (ms) |',
           first[1] + '|---|---|---:|---:|---:|---:|---:|']
  lines += [(f"| {r['run']} " if run else '')
            + f"| {r['setting']} | {r['server']} | {r['n']} | {ms(r['step'])} "
            f"| {ms(r['gradient'])} | {ms(r['residual'])} "
            f"| {_fmt(r['noise'] and r['noise'] * 1e3, '.1f')} |" for r in rows_]
  return '\n'.join(lines)


def parts_table(points) -> str:
  """The traced parts of every synchronous step (`traced`), in milliseconds."""
  ms = lambda x: '—' if x is None else f'{x * 1e3:.1f}'
  lines = ['| setting | scheme | server | N | t_iter | t_grad (own batch) | non-gradient work '
           '| overlap | collectives, traced | collectives, calibrated |',
           '|---|---|---|---:|---:|---:|---:|---:|---:|---:|']
  lines += [f"| {p['setting']} | {p['scheme']} | {p['server']} | {p['n']} | {ms(p['t_iter'])} "
            f"| {ms(p['t_grad_own'])} | {ms(p['t_other'])} | {ms(p['t_overlap'])} "
            f"| {ms(p['t_collective_traced'])} | {ms(p['t_collective_calibrated'])} |"
            for p in points if p['t_overlap'] is not None]
  return '\n'.join(lines)


def markdown(results, points) -> str:
  lines = ['# Predicted against measured', '',
           'Every network and setting at a glance (held out as in the sections below; the '
           'noise floor in brackets):', '', overview_table(results, points), '',
           overview_summary(points), '']
  for result in results:
    m, v = result['machine'], result['versions']
    net = result['network']
    lines += [f"## {net['model']}, {net['image_size']}² ({net['parameters']:,} parameters, "
              f"{net['param_bytes'] / 1e6:.1f} MB)", '',
              f"Measured {result['created']} on {m['cpu'] or m['system']} ({m['cores']} cores), "
              f"jax {v['jax']}, flax {v['flax']}: `{result['command']}`. D = {result['batches']} "
              f"batches; batch {result['batch']['sync-split']} (sync-split, split N ways), "
              f"{result['batch']['sync-join']} per device (sync-join, async); "
              f"{result.get('repetitions', 1)} repetitions of {result.get('rounds', '?')} rounds "
              f"× {result.get('steps_per_round', '?')} steps per point.", '',
              '| setting | t_grad alone (s) | t_grad contended (s) | t_comm (s) '
              '| calibrated kind: α (s), β (GB/s), fit residuals; a kind of one size: its call |',
              '|---|---:|---:|---:|---|']
    for setting, s in result['settings'].items():
      batch = str(result['batch']['sync-split'])
      t_grad = _median(s['t_grad'][batch]) if batch in s['t_grad'] else None
      contended = '; '.join(f'{_median(v):.4f} (batch {b}, P={p})'
                            for p, bs in s.get('t_grad_contended', {}).items()
                            for b, v in bs.items()) or '—'
      t_comm, costs = calibrate.setting_inputs(s, net['param_bytes'])
      fits = '; '.join([f"{kind.replace('_', '-')}: {f.alpha:.2e}, {f.beta / 1e9:.2f}, "
                        + ' '.join(_signed_pct(r) for r in f.relative_residuals)
                        for kind, f in costs.fits.items()]
                       + [f"{kind.replace('_', '-')}: {pts[0][1] * 1e3:.2f} ms a call "
                          f"({pts[0][0]:,} B)" for kind, pts in costs.points.items()
                          if kind not in costs.fits]) if costs else '—'
      lines.append(f"| {setting} | {_fmt(t_grad, '.4f')} | {contended} | {_fmt(t_comm, '.4f')} "
                   f"| {fits} |")
    mine = [p for p in points if p['network'] == net['model']
            and p['image_size'] == net['image_size']]
    lines += ['', '| setting | scheme | server | N | t_iter (s) | S measured (repetitions) | '
              + ' | '.join(f'S {m} | error' for m in MODELS) + ' |',
              '|---|---|---|---:|---:|---:|' + '---:|---:|' * len(MODELS)]
    for p in mine:
      t_iter = (f"{p['t_iter']:.4f}" if p['t_iter'] is not None
                else f"D pushes: {p['t_train']:.2f}")
      reps = ('' if not p['speedup_repetitions']
              else ' (' + ', '.join(f'{x:.2f}' for x in p['speedup_repetitions']) + ')')
      cells = ' | '.join(f"{_fmt(p[f'speedup_{m}'], '.2f')} | {_pct(p[f'error_{m}'])}"
                         for m in MODELS)
      lines.append(f"| {p['setting']} | {p['scheme']} | {p['server']} | {p['n']}"
                   f"{'' if p['held_out'] else '†'} | {t_iter} | {p['speedup']:.2f}{reps} "
                   f"| {cells} |")
    lines += ['', '† one device: not held out (where the steps were not traced, it '
              "calibrates the parts model's non-gradient work). An error is t_predicted / "
              't_measured − 1.', '',
              'Held out (every point but †): median |log(t_predicted / t_measured)| as a '
              'percentage, next to the noise floor (the median spread between repetitions); '
              "Spearman's ρ of predicted against measured time; each model's pick (least "
              'predicted time) and its regret (its measured time ÷ the best measured).', '',
              summary_table(held_out_summary(mine)), '']
    if any(p['t_collective_traced'] is not None for p in mine):
      lines += ["The parts of each step from its trace (`analysis.steptime.trace`), in ms: "
                'the non-gradient work the parts model adds, the overlap it subtracts, and '
                "the collectives' own time in the trace (waiting for the peer included) next "
                'to their calibrated cost, which the model uses:', '',
                parts_table(mine), '']
    penalty = join_penalty(mine)
    if penalty:
      lines += ['What a sync-join step costs beyond the sync-split step of the same server '
                'and N: the gradients of its larger per-device batch (measured under the '
                "run's contention) and the residual, next to the two points' noise:", '',
                join_penalty_table(penalty), '']
    unique = volume.distinct_rows(result['settings'].values())
    if unique:
      lines += ['Communication volume per step and device (`analysis.steptime.volume`):', '',
                volume.markdown(unique), '']
    lines += ['Recommendation:', '']
    for setting in result['settings']:
      if any(p['setting'] == setting for p in mine):
        lines.append(f'- {recommend(mine, setting)}')
    lines.append('')
  return '\n'.join(lines)


def write_csv(points, path: str) -> None:
  fields = list(points[0]) if points else ['network']
  with open(path, 'w', newline='') as f:
    writer = csv.DictWriter(f, fields)
    writer.writeheader()
    writer.writerows(points)


def plot(points, folder: str) -> list:
  """One PNG per network × scheme × server; returns their paths."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  paths = []
  keys = sorted({(p['network'], p['image_size'], p['scheme'], p['server']) for p in points})
  styles = {'emulated': ('tab:grey', 'o'), 'processes': ('tab:blue', 's')}
  others = iter(['tab:green', 'tab:red', 'tab:purple', 'tab:brown'])
  for net, size, scheme, server in keys:
    mine = [p for p in points if (p['network'], p['image_size'], p['scheme'], p['server'])
            == (net, size, scheme, server)]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for setting in list(dict.fromkeys(p['setting'] for p in mine)):
      ps = sorted((p for p in mine if p['setting'] == setting), key=lambda p: p['n'])
      if setting not in styles:
        styles[setting] = (next(others, 'tab:olive'), '^')
      color, marker = styles[setting]
      ns = [p['n'] for p in ps]
      measured = [p['speedup'] for p in ps]
      # The repetitions' range: the noise band each prediction is judged against.
      low = [m - min(p['speedup_repetitions'] or [m]) for m, p in zip(measured, ps)]
      high = [max(p['speedup_repetitions'] or [m]) - m for m, p in zip(measured, ps)]
      ax.errorbar(ns, measured, yerr=[low, high], fmt=marker, color=color, capsize=3,
                  label=f'{setting}: measured')
      for model, line in (('thesis', '--'), ('semaphore', '-.'), ('parts', '-'),
                          ('rate', (0, (3, 1, 1, 1, 1, 1)))):
        values = [p[f'speedup_{model}'] for p in ps]
        if model == 'semaphore' and values == [p['speedup_thesis'] for p in ps]:
          continue  # the same line as the thesis'
        if all(v is not None for v in values):
          ax.plot(ns, values, linestyle=line, color=color, lw=1,
                  label=f'{setting}: {MODEL_NAMES[model]}')
    top = max(p['n'] for p in mine)
    ax.plot([1, top], [1, top], ':', color='black', lw=0.8, label='linear')
    ax.set(xlabel='workers N', ylabel='speedup S (eq. 4.23)', xticks=sorted({p['n'] for p in mine}),
           title=f'{net} {size}², {scheme}, {server}')
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(folder, f'{net}_{size}_{scheme}_{server}.png')
    fig.savefig(path, dpi=100)
    plt.close(fig)
    paths.append(path)
  return paths


# The measurement's tool field: its module, and its name before analysis/ was split by job.
MEASURE_TOOLS = ('analysis.steptime.measure', 'analysis.measure')


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m analysis.steptime.compare',
                              description=__doc__.split('\n\n')[0])
  p.add_argument('measurements', nargs='+', metavar='MEASUREMENTS.json',
                 help='files written by python -m analysis.steptime.measure')
  p.add_argument('--out', required=True, metavar='DIR', help='folder for report.md, speedup.csv '
                 'and the PNGs (created if missing)')
  args = p.parse_args(argv)
  results = []
  for path in args.measurements:
    try:
      with open(path) as f:
        result = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      p.error(f'{path}: cannot read a measurement ({e})')
    if not isinstance(result, dict) or result.get('tool') not in MEASURE_TOOLS:
      p.error(f'{path}: not a file written by python -m analysis.steptime.measure')
    results.append(result)
  return args, results


def main(argv=None) -> int:
  args, results = parse_args(sys.argv[1:] if argv is None else argv)
  os.makedirs(args.out, exist_ok=True)
  points = [p for r in results for p in rows(r)]
  text = markdown(results, points)
  with open(os.path.join(args.out, 'report.md'), 'w') as f:
    f.write(text)
  write_csv(points, os.path.join(args.out, 'speedup.csv'))
  paths = plot(points, args.out)
  print(text)
  print(f"wrote {os.path.join(args.out, 'report.md')}, speedup.csv and {len(paths)} plots")
  return 0


if __name__ == '__main__':
  sys.exit(main())
