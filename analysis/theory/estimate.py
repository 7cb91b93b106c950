"""Estimate the speedup of parallel training: a drop-in for the thesis' `estimate.py` ([T] app. C.4).

  python -m analysis.theory.estimate --t-grad 0.821 --t-comm 0.811 --type sync-join \\
      --server distributed --workers 8 --batches 128 --output csv

Speedup S = D·t_grad / t_parallel (eq. 4.23) with t_parallel from eq. 4.2 + 4.11/4.12
(synchronous) or eq. 4.20/4.21 (asynchronous); see `analysis.theory.equations.training_time`.
"""
import argparse
import os
import sys

from analysis.theory import equations

HELP = {
    'type': 'training scheme: async (Downpour; eq. 4.13–4.21), sync-join (each worker a whole '
            'batch, D/N iterations; eq. 4.2 + 4.4–4.12), sync-split (each batch split in N, '
            'D iterations of t_grad/N; eq. 4.2 + 4.4–4.12)',
    'server': 'central (one parameter server: mean of best and worst case, eq. 4.11/4.20) or '
              'distributed (every worker serves 1/N of the weights, eq. 4.12/4.21)',
}


def parse_args(argv):
  p = argparse.ArgumentParser(
      prog='python -m analysis.theory.estimate', description=__doc__.split('\n\n')[0],
      formatter_class=argparse.RawDescriptionHelpFormatter,
      epilog='Equation numbers are those of Šlampa, Parallel Deep Learning (2017), ch. 4.')
  p.add_argument('--t-grad', type=float, required=True, metavar='TIME',
                 help='seconds for one worker to compute one batch\'s gradients: t_grad of eq. 4.4–4.23')
  p.add_argument('--t-comm', type=float, required=True, metavar='TIME',
                 help='seconds to move the whole network\'s weights once between two units: t_comm of '
                      'eq. 4.4–4.21 (measure it with the thesis\' transport.py, or α + P/β)')
  p.add_argument('--type', choices=equations.SCHEMES, default='sync-join', help=HELP['type'])
  p.add_argument('--server', choices=equations.SERVERS, default='central', help=HELP['server'])
  p.add_argument('--workers', type=int, default=8, metavar='N',
                 help='maximum number of workers N of eq. 4.4–4.21 (default 8)')
  p.add_argument('--batches', type=float, default=128, metavar='D',
                 help='batches D to train: D of eq. 4.13–4.23 (default 128, as in the thesis\' experiments)')
  p.add_argument('--output', choices=('single', 'csv', 'plot'), default='single',
                 help='single: the speedup S (eq. 4.23) at N workers; csv: S for 1..N separated by '
                      '";"; plot: a PNG of S vs workers (its path is printed)')
  p.add_argument('--out', metavar='PATH', default='speedup.png',
                 help='where --output plot writes its PNG (default speedup.png)')
  args = p.parse_args(argv)
  for name in ('t_grad', 't_comm'):
    if not getattr(args, name) > 0:
      p.error(f"argument --{name.replace('_', '-')}: must be > 0")
  if args.workers < 1:
    p.error('argument --workers: must be at least 1')
  if not args.batches > 0:
    p.error('argument --batches: must be > 0')
  return args


def speedups(args) -> list:
  return [equations.estimated_speedup(args.type, args.server, args.t_grad, args.t_comm, n,
                                      args.batches) for n in range(1, args.workers + 1)]


def plot(values, title: str, path: str) -> str:
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5, 3.5))
  workers = range(1, len(values) + 1)
  ax.plot(workers, values, marker='o')
  ax.plot(workers, workers, ls=':', color='grey', label='linear')
  ax.axhline(1, color='grey', lw=0.8)
  ax.set(xlabel='workers N', ylabel='speedup S (eq. 4.23)', title=title)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return os.path.abspath(path)


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  values = speedups(args)
  if args.output == 'single':
    print(f'{values[-1]:.4f}')
  elif args.output == 'csv':
    print(';'.join(f'{v:.4f}' for v in values))
  else:
    print(plot(values, f'{args.type}, {args.server} server', args.out))
  return 0


if __name__ == '__main__':
  sys.exit(main())
