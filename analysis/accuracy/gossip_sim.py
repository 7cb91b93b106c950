"""Why gossip as [L] writes it does not learn on 2 devices: an independent simulation of its
Algorithm 2, in numpy, beside the mixing matrix's eigenvalues.

  python -m analysis.accuracy.gossip_sim --out analysis/report/gossip/simulation.json

[L]'s gossip mixes *gradients*: replica i takes the step

    w_i ← w_i − η Σ_j W_ij g_j(w_j),    W_s = (I + S^s + S^−s) / 3,

S the cyclic shift of the ring of P replicas and s = 1, 2, …, ⌊P/2⌋ in turn; a partner met
twice (P = 2, or s = P/2) counts twice. Near a minimum, g_j(w) ≈ H (w − w*) + ξ_j for every
replica, so along an eigenvector v of W_s with eigenvalue λ the replicas' deviation from
their mean, e = Σ_i v_i w_i, follows

    e ← (I − η λ H) e − η λ Σ_i v_i ξ_i :

it is pulled in by the loss's curvature only, at λ times the rate of the mean (λ = 1), and
pushed *out* where λ < 0. W_s's eigenvalues are (1 + 2 cos(2π k s / P)) / 3 ∈ [−1/3, 1]: on
P = 2 the difference mode (k = 1) has λ = −1/3 on every step — each replica takes 2/3 of its
partner's gradient and 1/3 of its own, so the two climb apart along each direction of
curvature h by a factor (1 + η h / 3) a step until the loss's non-linearity stops them. On
larger rings the distances s cycle and a mode's λ averages over the cycle to about 1/3
(for P = 4, modes k = 1, 3 average 0: no pull at all). [L] trained at η = 0.0001, where
(1 + η h / 3) stays near 1 over its 50 epochs.

Mixing *parameters* instead (decentralised SGD, Lian et al. 2017; here "adapt then combine":
w_i ← Σ_j W_ij (w_j − η g_j(w_j))) multiplies the deviation by λ itself each step, and
|λ| ≤ 1/3 < 1 for every mode but the mean: the replicas are pulled together whatever η.
With W = 1/P everywhere both forms are synchronous SGD.

This module simulates the three — all-reduce, gradient gossip ([L]) and parameter gossip —
in plain numpy (a 64-64-10 ReLU network on scikit-learn's digits, SGD, every replica its own
batches), independent of jaxpar's code, whose gossip equals a simulation of every replica
(tests/test_gossip.py). It reports each method's training loss (the replicas' mean weights
and each replica's own), the replicas' relative spread, and the closed form of the
difference mode next to the simulated one on a quadratic (tests/test_gossip_sim.py).
"""
import argparse
import datetime
import json
import os
import sys

import numpy as np

METHODS = ('allreduce', 'gossip-gradients', 'gossip-parameters')


# ==================================================================== the mixing matrix
def mixing(p: int, s: int) -> np.ndarray:
  """[L]'s W_s: 1/3 on i, i + s and i − s (mod p), a partner met twice counting twice."""
  w = np.zeros((p, p))
  for i in range(p):
    for j in (i, (i + s) % p, (i - s) % p):
      w[i, j] += 1 / 3
  return w


def distances(p: int) -> list:
  """The cycle of s: 1, 2, …, ⌊p/2⌋ (just 1 for p ≤ 3), as [L] and jaxpar's gossip."""
  return list(range(1, max(1, p // 2) + 1))


def mode_eigenvalues(p: int) -> dict:
  """{s: [λ_k for k = 0..p−1]}: W_s's eigenvalue on the ring's Fourier mode k,
  (1 + 2 cos(2π k s / p)) / 3 (W_s is circulant and symmetric)."""
  return {s: [(1 + 2 * np.cos(2 * np.pi * k * s / p)) / 3 for k in range(p)]
          for s in distances(p)}


def difference_factor(p: int, steps: int, eta: float, h: float, mode: int = 1,
                      mix: str = 'gradients') -> float:
  """The closed form: how much the replicas' deviation along Fourier mode `mode` grows in
  `steps` steps on a quadratic of curvature h without noise — Π (1 − η λ_s h) when
  gradients are mixed, Π λ_s (1 − η h) when parameters are (adapt then combine)."""
  cycle = distances(p)
  factor = 1.0
  for k in range(steps):
    lam = mode_eigenvalues(p)[cycle[k % len(cycle)]][mode]
    factor *= (1 - eta * lam * h) if mix == 'gradients' else lam * (1 - eta * h)
  return factor


# ========================================================== the network and the data
def digits(seed: int = 0):
  """scikit-learn's 1,797 digits scaled to [0, 1]: (x_train, y_train, x_test, y_test), the
  bundled dataset's split sizes (1,437 and 360), shuffled by `seed`."""
  from sklearn.datasets import load_digits
  data = load_digits()
  order = np.random.default_rng(seed).permutation(len(data.target))
  x, y = data.data[order] / 16.0, data.target[order]
  return x[:1437], y[:1437], x[1437:], y[1437:]


def init(seed: int, hidden: int = 64) -> dict:
  """He-normal weights, zero biases: 64 → hidden (ReLU) → 10."""
  rng = np.random.default_rng(seed)
  return {'w1': rng.normal(0, np.sqrt(2 / 64), (64, hidden)), 'b1': np.zeros(hidden),
          'w2': rng.normal(0, np.sqrt(2 / hidden), (hidden, 10)), 'b2': np.zeros(10)}


def loss_and_grad(params: dict, x, y):
  """Mean cross-entropy over (x, y) and its gradient (backpropagation by hand)."""
  h = x @ params['w1'] + params['b1']
  a = np.maximum(h, 0)
  logits = a @ params['w2'] + params['b2']
  logits = logits - logits.max(axis=1, keepdims=True)
  p = np.exp(logits)
  p /= p.sum(axis=1, keepdims=True)
  n = len(y)
  loss = -np.mean(np.log(p[np.arange(n), y] + 1e-12))
  d = p.copy()
  d[np.arange(n), y] -= 1
  d /= n
  da = d @ params['w2'].T
  dh = da * (h > 0)
  return loss, {'w1': x.T @ dh, 'b1': dh.sum(0), 'w2': a.T @ d, 'b2': d.sum(0)}


def accuracy(params, x, y) -> float:
  a = np.maximum(x @ params['w1'] + params['b1'], 0)
  return float(np.mean(np.argmax(a @ params['w2'] + params['b2'], axis=1) == y))


def _flat(params) -> np.ndarray:
  return np.concatenate([params[k].ravel() for k in sorted(params)])


def _combine(weights, trees) -> dict:
  return {k: sum(w * t[k] for w, t in zip(weights, trees)) for k in trees[0]}


# ======================================================================= the simulation
def simulate(method: str, p: int, eta: float, steps: int, batch: int, seed: int = 0,
             every: int = 100) -> dict:
  """Trains p replicas from one initialisation by `method` (plain SGD at rate η, each
  replica its own random batches of `batch` examples); every `every` steps records the
  training loss and test accuracy of the replicas' mean weights, the mean of the replicas'
  own training losses, and their spread: max_i ‖w_i − w̄‖ / ‖w̄‖."""
  x, y, xt, yt = digits(seed)
  replicas = [init(seed)] * p
  rngs = [np.random.default_rng(1000 * seed + i) for i in range(p)]
  cycle = distances(p)
  curve = []
  for k in range(steps + 1):
    if k % every == 0:
      mean = _combine([1 / p] * p, replicas)
      flat = _flat(mean)
      curve.append({
          'step': k, 'loss_of_mean': float(loss_and_grad(mean, x, y)[0]),
          'replica_loss': float(np.mean([loss_and_grad(r, x, y)[0] for r in replicas])),
          'accuracy_of_mean': accuracy(mean, xt, yt),
          'spread': float(max(np.linalg.norm(_flat(r) - flat) for r in replicas)
                          / np.linalg.norm(flat))})
    if k == steps:
      break
    grads = []
    for r, rng in zip(replicas, rngs):
      rows = rng.integers(0, len(y), batch)
      grads.append(loss_and_grad(r, x[rows], y[rows])[1])
    w = np.full((p, p), 1 / p) if method == 'allreduce' else mixing(p, cycle[k % len(cycle)])
    if method == 'gossip-parameters':  # adapt, then combine the replicas' new weights
      stepped = [_combine([1, -eta], [r, g]) for r, g in zip(replicas, grads)]
      replicas = [_combine(w[i], stepped) for i in range(p)]
    else:  # all-reduce (W = 1/p) or [L]'s gradient mixing
      replicas = [_combine([1, -eta], [r, _combine(w[i], grads)]) for i, r in enumerate(replicas)]
  return {'method': method, 'p': p, 'eta': eta, 'steps': steps, 'batch': batch, 'seed': seed,
          'curve': curve}


def table(runs) -> str:
  """The last point of each run: losses, accuracy and spread, per method, P and η."""
  lines = ['| P | η | method | loss of the mean weights | replicas\' own loss | test top-1 '
           '(mean weights) | spread ‖w_i − w̄‖/‖w̄‖ |', '|---:|---:|---|---:|---:|---:|---:|']
  for r in runs:
    last = r['curve'][-1]
    lines.append(f"| {r['p']} | {r['eta']:g} | {r['method']} | {last['loss_of_mean']:.3f} | "
                 f"{last['replica_loss']:.3f} | {100 * last['accuracy_of_mean']:.1f} % | "
                 f"{100 * last['spread']:.1f} % |")
  return '\n'.join(lines)


def modes_table(ps=(2, 3, 4, 8)) -> str:
  """Per ring size: W_s's eigenvalue range over the modes k ≠ 0 at each s, and each mode's
  mean over the cycle of s (the pull on the replicas' differences, relative to the mean's)."""
  lines = ['| P | s: eigenvalues λ_k, k ≠ 0 | smallest mean over the cycle |', '|---:|---|---:|']
  for p in ps:
    eig = mode_eigenvalues(p)
    shown = lambda v: f'{round(v, 2) + 0.0:+.2f}'  # no "-0.00" for a rounding error
    cells = '; '.join(f"s = {s}: " + ', '.join(shown(v) for v in vals[1:])
                      for s, vals in eig.items())
    mean = min(np.mean([eig[s][k] for s in eig]) for k in range(1, p))
    lines.append(f'| {p} | {cells} | {shown(mean)} |')
  return '\n'.join(lines)


def _sklearn_version() -> str:
  import sklearn
  return sklearn.__version__


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0],
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument('--ps', default='2,4', help='ring sizes P')
  parser.add_argument('--etas', default='0.1,0.4', help='learning rates η')
  parser.add_argument('--steps', type=int, default=3000)
  parser.add_argument('--batch', type=int, default=16, help='examples per replica and step')
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--out', help='write the runs as JSON here')
  args = parser.parse_args(argv)
  try:
    ps = [int(v) for v in args.ps.split(',')]
    etas = [float(v) for v in args.etas.split(',')]
  except ValueError:
    parser.error('--ps takes whole numbers and --etas numbers, comma-separated')
  if min(ps) < 2 or min(etas) <= 0 or args.steps < 1 or args.batch < 1:
    parser.error('--ps ≥ 2, --etas > 0, --steps and --batch ≥ 1')
  runs = []
  for p in ps:
    for eta in etas:
      for method in METHODS:
        runs.append(simulate(method, p, eta, args.steps, args.batch, args.seed))
        last = runs[-1]['curve'][-1]
        print(f"P={p} η={eta:g} {method:18s} loss(mean) {last['loss_of_mean']:.3f} "
              f"own {last['replica_loss']:.3f} spread {100 * last['spread']:.1f} %",
              file=sys.stderr, flush=True)
  print(table(runs))
  if args.out:
    os.makedirs(os.path.dirname(args.out) or '.', exist_ok=True)
    with open(args.out, 'w') as f:
      json.dump({'tool': 'analysis.accuracy.gossip_sim',
                 'created': datetime.datetime.now().isoformat(timespec='seconds'),
                 'command': ' '.join(['python -m analysis.accuracy.gossip_sim']
                                     + (argv if argv is not None else sys.argv[1:])),
                 'versions': {'python': sys.version.split()[0], 'numpy': np.__version__,
                              'scikit-learn': _sklearn_version()},
                 'runs': runs}, f, indent=1)
  return 0


if __name__ == '__main__':
  sys.exit(main())
