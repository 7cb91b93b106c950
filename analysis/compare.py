"""Predicted against measured: speedup tables, plots and a recommendation from
`analysis.measure`'s JSON files.

  python -m analysis.compare resnet34.json [squeezenet.json ...] --out report/

Writes into --out:
  report.md     per network: the measured inputs (t_grad, t_comm, the α-β fit and its
                residuals), speedup against N measured next to predicted, the relative error
                of each prediction and the median per model, the volume table, and the
                recommended scheme and N for this hardware with the reason;
  speedup.csv   every row of the speedup tables;
  NET_SCHEME_SERVER.png  one per network × scheme × server, in the style of [T]'s
                Figures 6.1–6.11: measured points, predicted lines, per setting.

Speedup is [T]'s eq. 4.23, S = D·t_grad / t_train, with t_train of D batches: sync-split
D steps, sync-join D/N steps of N batches (t_iter measured per step), async the measured
time of D pushes. Two predictions:
  thesis  [T]'s equations (4.11, 4.12, 4.20, 4.21) from the measured t_grad and t_comm, as
          the thesis' `estimate.py` (central and distributed servers; the thesis has none
          for all-reduce or gossip);
  α-β     what jaxpar's step does: the measured t_grad of each device's own batch plus
          every collective of the step's lowered program, each by its α-β model
          (`analysis.collectives.collective_time`) with α and β fitted to the measured
          transfers (permutes) and all-reduces (the other collectives). Async: [T]'s
          equations with t_comm = α + P/β.
"""
import argparse
import csv
import json
import os
import sys

import numpy as np

from analysis import calibrate, collectives, equations, hlo, volume


def _median(samples) -> float:
  return float(np.median(samples))


def alpha_beta_iteration(collectives_of_step, t_grad: float, transfer, all_reduce) -> float:
  """One synchronous step by the α-β model: the device's gradient time plus every collective
  of its lowered program (`analysis.hlo`; of a conditional, the costliest branch), permutes
  timed by the point-to-point fit, the other collectives by the all-reduce fit."""
  def cost(c):
    fit = transfer if c.op == 'collective_permute' else all_reduce
    return collectives.collective_time(c.op, c.nbytes, c.group, fit.alpha, fit.beta)
  return t_grad + hlo.step_total([volume.from_row(c) for c in collectives_of_step], cost)


def _error(predicted, measured):
  return None if predicted is None else (predicted - measured) / measured


def rows(result) -> list:
  """Every measured point of one measurement file, with its predictions."""
  out = []
  d = result['batches']
  nbytes = result['network']['param_bytes']
  for setting, s in result['settings'].items():
    t_grad = {int(b): _median(v) for b, v in s['t_grad'].items()}
    t_comm, fit, all_reduce = calibrate.setting_inputs(s)
    all_reduce = all_reduce or fit
    points = [(c, 'sync') for c in s['steps']] + [(c, 'async') for c in s['async']]
    for c, kind in points:
      scheme = c['scheme'] if kind == 'sync' else 'async'
      server, n = c['server'], c['n']
      batch = result['batch'][scheme]
      if batch not in t_grad:
        continue  # no one-device time in this setting (e.g. --processes without N=1)
      own = t_grad.get(c.get('per_device_batch', batch))
      iterations = d / n if scheme == 'sync-join' else d
      if kind == 'sync':
        t_iter = _median(c['samples'])
        t_train = iterations * t_iter
      else:
        t_iter, t_train = None, _median(c['samples'])
      measured = equations.thesis_speedup(t_grad[batch], d, t_train)
      thesis = alpha_beta = None
      if t_comm is not None and server in equations.SERVERS:
        thesis = equations.estimated_speedup(scheme, server, t_grad[batch], t_comm, n, d)
      if fit is not None and kind == 'sync':
        predicted = iterations * alpha_beta_iteration(c['volume']['collectives'], own, fit,
                                                      all_reduce)
        alpha_beta = equations.thesis_speedup(t_grad[batch], d, predicted)
      elif fit is not None:
        alpha_beta = equations.estimated_speedup('async', server, t_grad[batch],
                                                 fit.predict(nbytes), n, d)
      out.append({
          'network': result['network']['model'], 'image_size': result['network']['image_size'],
          'setting': setting, 'scheme': scheme, 'server': server, 'n': n,
          't_grad': t_grad[batch], 't_comm': t_comm, 't_iter': t_iter,
          't_iter_min': min(c['samples']) if kind == 'sync' else None,
          't_iter_max': max(c['samples']) if kind == 'sync' else None,
          't_train': t_train, 'speedup': measured,
          'speedup_thesis': thesis, 'error_thesis': _error(thesis, measured),
          'speedup_alpha_beta': alpha_beta, 'error_alpha_beta': _error(alpha_beta, measured),
          'communication_share': None if own is None or t_iter is None
          else max(0.0, 1 - own / t_iter)})
  return out


def median_errors(points) -> dict:
  """{(setting, model): median |relative error|} over the points the model predicts."""
  out = {}
  for setting in sorted({p['setting'] for p in points}):
    for model in ('thesis', 'alpha_beta'):
      errors = [abs(p[f'error_{model}']) for p in points
                if p['setting'] == setting and p[f'error_{model}'] is not None]
      if errors:
        out[(setting, model)] = float(np.median(errors))
  return out


def recommend(points, setting: str) -> str:
  """The scheme and N with the highest measured speedup in a setting, and why, in one
  sentence."""
  mine = [p for p in points if p['setting'] == setting]
  best = max(mine, key=lambda p: p['speedup'])
  ratio = best['t_comm'] / best['t_grad'] if best['t_comm'] else None
  ratio_text = f't_comm/t_grad = {ratio:.2f}' if ratio is not None else 't_comm not measured'
  if best['n'] == 1:
    parallel = max((p for p in mine if p['n'] > 1), key=lambda p: p['speedup'], default=None)
    why = (f"the best parallel run ({parallel['scheme']}, {parallel['server']}, N={parallel['n']}) "
           f"reaches only {parallel['speedup']:.2f}×" if parallel else 'nothing parallel ran')
    return (f"**{best['network']}** ({setting}): stay on one device — its fastest step "
            f"({best['scheme']}, {best['server']}) measured S = {best['speedup']:.2f} "
            f"and {why}, because communication costs more than the devices save "
            f"({ratio_text}).")
  share = best['communication_share']
  share_text = f'; {share:.0%} of its step is not gradient computation' if share is not None \
      else ''
  how = f"the {best['server']} server" if best['server'] in equations.SERVERS else best['server']
  return (f"**{best['network']}** ({setting}): {best['scheme']} with {how} "
          f"on N={best['n']}, the highest measured speedup, {best['speedup']:.2f}× "
          f"({ratio_text}{share_text}).")


def _fmt(x, spec='.3f'):
  return '—' if x is None else format(x, spec)


def _pct(x):
  return '—' if x is None else f'{x:+.0%}'


def markdown(results, points) -> str:
  lines = ['# Predicted against measured', '']
  for result in results:
    m, v = result['machine'], result['versions']
    net = result['network']
    lines += [f"## {net['model']}, {net['image_size']}² ({net['parameters']:,} parameters, "
              f"{net['param_bytes'] / 1e6:.1f} MB)", '',
              f"Measured {result['created']} on {m['cpu'] or m['system']} ({m['cores']} cores), "
              f"jax {v['jax']}, flax {v['flax']}: `{result['command']}`. D = {result['batches']} "
              f"batches; batch {result['batch']['sync-split']} (sync-split, split N ways), "
              f"{result['batch']['sync-join']} per device (sync-join, async).", '',
              '| setting | t_grad (s) | t_comm (s) | transfer α (s) | β (GB/s) | residuals '
              '| all-reduce α (s) | β (GB/s) | residuals |',
              '|---|---:|---:|---:|---:|---|---:|---:|---|']
    for setting, s in result['settings'].items():
      batch = str(result['batch']['sync-split'])
      t_grad = _median(s['t_grad'][batch]) if batch in s['t_grad'] else None
      t_comm, *fits = calibrate.setting_inputs(s)
      cells = []
      for fit in fits:
        cells += ([f'{fit.alpha:.2e}', f'{fit.beta / 1e9:.2f}',
                   ', '.join(f'{r:+.0%}' for r in fit.relative_residuals)] if fit
                  else ['—'] * 3)
      lines.append(f"| {setting} | {_fmt(t_grad, '.4f')} | {_fmt(t_comm, '.4f')} | "
                   + ' | '.join(cells) + ' |')
    mine = [p for p in points if p['network'] == net['model']
            and p['image_size'] == net['image_size']]
    lines += ['', '| setting | scheme | server | N | t_iter (s) | S measured | S thesis | error '
              '| S α-β | error |', '|---|---|---|---:|---:|---:|---:|---:|---:|---:|']
    for p in mine:
      t_iter = (f"{p['t_iter']:.4f} ({p['t_iter_min']:.4f}–{p['t_iter_max']:.4f})"
                if p['t_iter'] is not None else f"D pushes: {p['t_train']:.2f}")
      lines.append(f"| {p['setting']} | {p['scheme']} | {p['server']} | {p['n']} | {t_iter} "
                   f"| {p['speedup']:.2f} | {_fmt(p['speedup_thesis'], '.2f')} "
                   f"| {_pct(p['error_thesis'])} | {_fmt(p['speedup_alpha_beta'], '.2f')} "
                   f"| {_pct(p['error_alpha_beta'])} |")
    errors = median_errors(mine)
    lines += ['', 'Median |relative error| of the predicted speedup: ' + '; '.join(
        f"{setting} {'thesis equations' if model == 'thesis' else 'α-β model'} {e:.0%}"
        for (setting, model), e in errors.items()) + '.', '']
    unique = volume.distinct_rows(result['settings'].values())
    if unique:
      lines += ['Communication volume per step and device (`analysis.volume`):', '',
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
  for net, size, scheme, server in keys:
    mine = [p for p in points if (p['network'], p['image_size'], p['scheme'], p['server'])
            == (net, size, scheme, server)]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    for setting in sorted({p['setting'] for p in mine}):
      ps = sorted((p for p in mine if p['setting'] == setting), key=lambda p: p['n'])
      color, marker = styles.get(setting, ('tab:green', '^'))
      ns = [p['n'] for p in ps]
      ax.plot(ns, [p['speedup'] for p in ps], marker, color=color, label=f'{setting}: measured')
      for model, line in (('thesis', '--'), ('alpha_beta', '-')):
        values = [p[f'speedup_{model}'] for p in ps]
        if all(v is not None for v in values):
          ax.plot(ns, values, line, color=color, lw=1,
                  label=f"{setting}: {'thesis eq.' if model == 'thesis' else 'α-β'}")
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


def parse_args(argv):
  p = argparse.ArgumentParser(prog='python -m analysis.compare',
                              description=__doc__.split('\n\n')[0])
  p.add_argument('measurements', nargs='+', metavar='MEASUREMENTS.json',
                 help='files written by python -m analysis.measure')
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
    if not isinstance(result, dict) or result.get('tool') != 'analysis.measure':
      p.error(f'{path}: not a file written by python -m analysis.measure')
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
