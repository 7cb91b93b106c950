"""Steps to a target, K, as a function of the one thing a scheme changes — fitted on
some settings, judged on the others.

Each model is linear in two parameters (a, b) after a transform of its variable x, so a
least-squares fit on two or more settings determines it and nothing of a held-out
setting enters the fit:

  BATCH      sync-join at global batch B = N·b     K(B) = K_min·(1 + B_noise/B)
             (McCandlish et al. 2018, §2.3: a = K_min, b = K_min·B_noise; the noise
             scale measured in training, `noise_scale`, is an independent estimate)
  STALENESS  async with staleness s                 K(s) = K_0·(1 + c·s)
             (a stale gradient acts as momentum, Mitliagkas et al. 2016: at a fixed rate
             the steps grow with s, linearly to first order)
  PERIOD     Local SGD averaging every τ steps      K(τ) = K_1·(1 + c·(τ − 1))
             (each worker's steps; [S]'s M_a(b, K, τ) averaging rounds are K(τ)/τ, and
             τ = 1 is synchronous SGD)
  CAPACITY   sparsified gossip keeping a fraction   K(q) = K_1·(1 + c·log2(1/q))
             q of each gradient                     (each halving of what is sent costs
             a fixed share of steps; q = 1 is dense gossip)

Where a parameter has a sign by its meaning (K_min ≥ 0 and B_noise ≥ 0; every model's K
at its reference setting ≥ 0) the least squares are constrained to it: on the edge the
batch model becomes K = b/B (B_noise = ∞: steps fall as 1/B over the fitted range, perfect
scaling, the regime below the noise scale) instead of a negative K_min that predicts
negative steps for large batches.

The error of a prediction is |log(K_predicted/K_measured)|, as part 3's step-time models
are judged (`analysis.steptime.compare`).
"""
import dataclasses
import math
from typing import Callable, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class StepsModel:
  name: str
  variable: str
  formula: str
  feature: Callable[[float], float]   # K = a + b·feature(x)
  params: tuple[str, str]             # the names of a and of b/a, as the formula writes them
  nonnegative: tuple[bool, bool] = (True, False)  # which of a, b cannot be negative
  fixed: float | None = None          # b/a given (a = 0, K = b·feature): one parameter

  def fit(self, xs: Sequence[float], ks: Sequence[float]) -> tuple[float, float]:
    """(a, b) by least squares on the points (x, K), constrained to `nonnegative`; needs
    two distinct settings (one, with `fixed`)."""
    features = np.array([self.feature(x) for x in xs], np.float64)
    if self.fixed is not None:
      return 0.0, float(features @ np.asarray(ks, np.float64) / (features @ features))
    if len(set(features.tolist())) < 2:
      raise ValueError(f'the {self.name} model needs two or more distinct settings of '
                       f'{self.variable} to fit, got {list(xs)}')
    ks = np.asarray(ks, np.float64)
    design = np.stack([np.ones_like(features), features], axis=1)
    (a, b), *_ = np.linalg.lstsq(design, ks, rcond=None)
    if all(v >= 0 or not keep for v, keep in zip((a, b), self.nonnegative)):
      return float(a), float(b)
    # Two parameters: the constrained optimum lies on an edge, one parameter at zero.
    edges = []
    for zero in (0, 1):
      other = design[:, 1 - zero]
      value = max(float(other @ ks / (other @ other)), 0.0)
      fitted = (0.0, value) if zero == 0 else (value, 0.0)
      edges.append((float(np.sum((design @ np.array(fitted) - ks) ** 2)), fitted))
    return min(edges)[1]

  def predict(self, fitted: tuple[float, float], x: float) -> float:
    a, b = fitted
    return a + b * self.feature(x)

  def describe(self, fitted: tuple[float, float]) -> dict:
    """The formula's own parameters: e.g. {'K_min': …, 'B_noise': …}."""
    a, b = fitted
    if self.fixed is not None:
      return {self.params[0]: b, self.params[1]: self.fixed}
    return {self.params[0]: a, self.params[1]: b / a if a else math.inf if b > 0 else math.nan}


BATCH = StepsModel('batch', 'B', 'K(B) = K_min·(1 + B_noise/B)', lambda b: 1.0 / b,
                   ('K_min', 'B_noise'), nonnegative=(True, True))
STALENESS = StepsModel('staleness', 's', 'K(s) = K_0·(1 + c·s)', float, ('K_0', 'c'))
PERIOD = StepsModel('period', 'τ', 'K(τ) = K_1·(1 + c·(τ − 1))', lambda t: t - 1.0,
                    ('K_1', 'c'))
CAPACITY = StepsModel('capacity', 'q', 'K(q) = K_1·(1 + c·log2(1/q))',
                      lambda q: math.log2(1.0 / q), ('K_1', 'c'))
MODELS = {m.name: m for m in (BATCH, STALENESS, PERIOD, CAPACITY)}


def batch_with_noise_scale(b_noise: float) -> StepsModel:
  """The batch model with B_noise measured in training (`noise_scale`), not fitted: K_min
  alone is fitted, K(B) = K_min·(1 + B_noise/B) — one measured batch size predicts the rest."""
  return StepsModel('batch_measured_noise', 'B', 'K(B) = K_min·(1 + B_noise/B), B_noise measured',
                    lambda b: 1.0 + b_noise / b, ('K_min', 'B_noise'), fixed=b_noise)


def log_error(predicted: float, measured: float) -> float:
  return math.log(predicted / measured) if predicted > 0 and measured > 0 else math.inf


def held_out(model: StepsModel, points: Sequence[tuple[float, float]],
             fit_on: Sequence[float]) -> dict:
  """Fit on the points whose x is in `fit_on`, predict every other point.

  `points` are (x, K) pairs (several seeds: several pairs per x; the fit sees each).
  Returns {'fitted': {param: value}, 'coefficients': [a, b], 'fit_on': [...],
  'predictions': [{'x', 'measured', 'predicted', 'log_error'}, …] for the held-out x (K
  measured: the seeds' mean),
  'median_error': median |log error| over them}."""
  fit_on = set(fit_on)
  train = [(x, k) for x, k in points if x in fit_on]
  fitted = model.fit([x for x, _ in train], [k for _, k in train])
  by_x = {}
  for x, k in points:
    if x not in fit_on:
      by_x.setdefault(x, []).append(k)
  predictions = []
  for x in sorted(by_x):
    measured = float(np.mean(by_x[x]))
    predicted = model.predict(fitted, x)
    predictions.append({'x': x, 'measured': measured, 'predicted': predicted,
                        'log_error': log_error(predicted, measured)})
  errors = [abs(p['log_error']) for p in predictions]
  return {'model': model.name, 'formula': model.formula, 'fitted': model.describe(fitted),
          'coefficients': list(fitted), 'fit_on': sorted(fit_on), 'predictions': predictions,
          'median_error': float(np.median(errors)) if errors else math.nan}


def reached(curve: list, target: float):
  """The step the loss first reaches `target`, interpolated linearly in log-loss between
  the evaluation before and the first at or below it; None if it never does."""
  previous = None
  for step, loss in curve:
    if loss <= target:
      if previous is None or previous[1] <= 0 or loss <= 0:
        return float(step)
      (s0, l0), (s1, l1) = previous, (step, loss)
      if l0 <= l1:
        return float(step)
      return s0 + (s1 - s0) * (math.log(l0) - math.log(target)) / (math.log(l0) - math.log(l1))
    previous = (step, loss)
  return None


def extrapolate(curve: list, target: float):
  """Where a curve that has not reached `target` would, by the power law log(metric) =
  a + p·log(step) fitted to its later half (steps > 0); None if it does not fall."""
  points = [(s, m) for s, m in curve if s > 0 and m > 0]
  points = points[len(points) // 2:]
  if len(points) < 2 or target <= 0:
    return None
  x = np.log([s for s, _ in points])
  y = np.log([m for _, m in points])
  slope, intercept = np.polyfit(x, y, 1)
  if slope >= 0:
    return None
  return float(math.exp((math.log(target) - intercept) / slope))


def progress(curve: list, chance: float | None = None, tolerance: float = 0.05,
             patience: int = 5) -> str:
  """What a serial run's curve [(step, metric), …] (the first at step 0) says so far:

    'plateau'  no evaluation yet more than `tolerance` (relative) below the lower of its
               start and `chance` (the metric of a guess: ln C for the loss of C classes):
               the initial plateau a network may sit on before it learns (GoogLeNet with
               its auxiliary heads on the digits stays at ln 10 for its first ~60 steps;
               with BatchNorm's running averages the loss can read far above it early on):
               not a failure, and nothing to extrapolate from;
    'stalled'  a metric that is not finite, or — after going below the plateau — no new
               lowest value in its last max(`patience`, a third of its) evaluations: a run
               that will not reach a target below where it is;
    'falling'  otherwise.
  """
  values = [m for _, m in curve]
  if not all(math.isfinite(v) for v in values):
    return 'stalled'
  floor = (1 - tolerance) * min(values[0], chance if chance is not None else values[0])
  left = next((i for i, v in enumerate(values) if v < floor), None)
  if left is None:
    return 'plateau'
  since = values[left:]
  recent = max(patience, math.ceil(len(since) / 3))
  if len(since) > recent and min(since[-recent:]) >= min(since[:-recent]):
    return 'stalled'
  return 'falling'


def backtest(curve: list, target: float, tolerance: float = 0.25) -> dict:
  """How far this curve's own extrapolation can be trusted, judged on points no fit saw: K
  extrapolated to `target` from the whole curve is `ratio` × its last step S; the same
  extrapolation from the curve's first S/ratio steps, to the lowest metric it went on to
  reach, is compared with the step that reached it. {'K', 'ratio', 'fit_to', 'predicted',
  'measured', 'error' (|log|), 'trusted': error ≤ `tolerance`, 'why'}; 'K' None where the
  curve does not fall, 'error' None where the early part has too few points to fit (at
  least 4 evaluations after step 0): then not trusted."""
  k = extrapolate(curve, target)
  out = {'K': k, 'ratio': None, 'fit_to': None, 'predicted': None, 'measured': None,
         'error': None, 'trusted': False}
  if k is None:
    return {**out, 'why': 'the curve does not fall'}
  last = curve[-1][0]
  ratio = k / last
  fit_to = last / ratio
  early = [(s, m) for s, m in curve if s <= fit_to * (1 + 1e-9)]
  out.update(ratio=ratio, fit_to=fit_to)
  if sum(1 for s, _ in early if s > 0) < 4:
    return {**out, 'why': f'the target is {ratio:.1f}× beyond the run; its first 1/{ratio:.1f} '
                          f'has {len(early)} evaluations, too few to test the same reach on'}
  level = min(m for s, m in curve[len(early):])
  measured = reached(curve, level)
  predicted = extrapolate(early, level)
  if predicted is None or measured is None:
    return {**out, 'why': 'the early curve does not fall'}
  error = abs(math.log(predicted / measured))
  trusted = error <= tolerance
  return {**out, 'predicted': predicted, 'measured': measured, 'error': error,
          'trusted': trusted,
          'why': (f'fitted to the first {fit_to:.0f} steps, the same extrapolation put '
                  f'{level:.3g} at step {predicted:.0f}; the run reached it at {measured:.0f} '
                  f"({error:.0%} off{', within' if trusted else ', beyond'} "
                  f'{tolerance:.0%})')}
