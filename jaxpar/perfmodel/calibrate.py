"""What one collective costs inside a compiled program, calibrated from chains of calls
(timed by `jaxpar.plan.call_timing.time_calls`, which `jaxpar.plan` and
`analysis.steptime.measure` run), and the α-β fits reported beside it.

A program of k calls of one collective kind on b bytes, each call on the previous one's
result, takes on average t(k) = t_0 + k·c(b): t_0 launches and synchronises the program, c(b)
is what one more call adds where a step's program makes it. c(b) is the slope of the
least-squares line through the median time of each chain length (`per_call`) — never one
call's time, which contains t_0. Medians, as the steps it predicts are medians: on shared
cores one sample in five can hold a pause of the host 6-25× a chain's time (a chain of 32
4 KB all-reduces across processes, 6.8 ms, read once 38.6 ms), which a mean of five takes
into every call's cost (ResNet34 32², 2 processes: BatchNorm's small all-reduces costed at
34 ms a step by means, 14 ms by medians, against 9-11 ms measured between the rows with
and without them).

Between calibrated sizes c is interpolated linearly in bytes (a piecewise α-β model, so a
runtime that switches algorithm at some size is followed, not averaged); below the smallest
it is the smallest's cost (latency); beyond the largest it follows the last segment. An
all-reduce of one element (a loss's or metric's mean) has its own kind, `SCALAR`,
calibrated at 4 bytes: across processes gloo reduces one or two elements in a single
exchange (0.03 ms on loopback against 0.05 ms from 16 bytes; before gloo's event loop ran at
idle priority, 0.1 ms against a 4 ms timer tick: docs/performance.md). The
calibration runs on two devices; for a group of n > 2 devices c is scaled by the ratio of
the ring model at n and at 2 (`jaxpar.perfmodel.alpha_beta`) with the kind's α-β fit.

The α-β fit of a kind, t = α + b/β by non-negative least squares on the *relative* error
(timings are noisy in proportion to their length), is what the report prints and what the
group scaling uses; its residuals show how far the runtime is from one α and one β.
"""
import dataclasses

import numpy as np
from scipy.optimize import nnls

from jaxpar.perfmodel import alpha_beta, hlo


@dataclasses.dataclass(frozen=True)
class Fit:
  alpha: float           # seconds per message
  beta: float            # bytes per second (inf if the fit finds no size dependence)
  nbytes: tuple          # the sizes fitted ...
  seconds: tuple         # ... their measured times ...
  residuals: tuple       # ... and measured − fitted, in seconds

  def predict(self, nbytes: float) -> float:
    return self.alpha + nbytes / self.beta

  @property
  def relative_residuals(self) -> tuple:
    return tuple(r / s for r, s in zip(self.residuals, self.seconds))

  @property
  def max_relative_residual(self) -> float:
    return max(abs(r) for r in self.relative_residuals)


def fit_alpha_beta(nbytes, seconds) -> Fit:
  """α, β of t = α + b/β from (bytes, seconds) pairs: at least two distinct sizes."""
  b = np.asarray(nbytes, float)
  t = np.asarray(seconds, float)
  if b.shape != t.shape or len(np.unique(b)) < 2 or np.any(t <= 0):
    raise ValueError('fit_alpha_beta needs positive times for at least two distinct sizes')
  weights = 1 / t
  (alpha, inverse_beta), _ = nnls(np.stack([weights, b * weights], 1), t * weights)
  fitted = alpha + b * inverse_beta
  return Fit(float(alpha), float(1 / inverse_beta) if inverse_beta > 0 else float('inf'),
             tuple(b.tolist()), tuple(t.tolist()), tuple((t - fitted).tolist()))


def per_call(chains) -> tuple:
  """(c, t_0) of t(k) = t_0 + k·c, least squares through the median of each chain length's
  samples (`chains`: {k: [seconds, ...]}, at least two lengths). c is floored at a
  nanosecond: a call never costs nothing."""
  ks = sorted(chains, key=int)
  if len(ks) < 2:
    raise ValueError('per_call needs chains of at least two lengths')
  k = np.array([int(x) for x in ks], float)
  t = np.array([np.median(chains[x]) for x in ks], float)
  (t0, c), *_ = np.linalg.lstsq(np.stack([np.ones_like(k), k], 1), t, rcond=None)
  return max(float(c), 1e-9), float(t0)


# The calibrated kind a program's collective is costed as; a permute of one pair, as
# `ONE_WAY` where that was calibrated (files before it: as the exchange).
ONE_WAY = 'collective_permute_one_way'
# An all-reduce of one element, as `SCALAR` where that was calibrated (files before it: as
# any all-reduce, at the smallest calibrated size's cost).
SCALAR = 'all_reduce_scalar'
KIND = {'collective_permute': 'collective_permute', 'all_reduce': 'all_reduce',
        'all_gather': 'all_gather', 'reduce_scatter': 'reduce_scatter',
        'all_to_all': 'reduce_scatter'}


@dataclasses.dataclass(frozen=True)
class CallCosts:
  """Per-call costs of each collective kind: {kind: ((bytes, seconds per call), ...)}
  measured on two devices, sizes increasing."""
  points: dict

  @property
  def fits(self) -> dict:
    return {kind: fit_alpha_beta(*zip(*pts)) for kind, pts in self.points.items()
            if len({b for b, _ in pts}) > 1}

  def per_call(self, kind: str, nbytes: float) -> float:
    """One call of `kind` on `nbytes` between two devices (see the module docstring)."""
    pts = self.points[kind]
    b = np.array([x for x, _ in pts], float)
    c = np.array([y for _, y in pts], float)
    if nbytes <= b[0] or len(b) == 1:
      return float(c[0])
    if nbytes >= b[-1]:
      slope = (c[-1] - c[-2]) / (b[-1] - b[-2])
      return float(c[-1] + max(slope, 0.0) * (nbytes - b[-1]))
    return float(np.interp(nbytes, b, c))

  def cost(self, c: hlo.Collective) -> float:
    """One collective of a compiled program (`jaxpar.perfmodel.hlo`): its kind's per-call cost at
    the buffer it moves (an all-gather's result, the others' operand), scaled from two
    devices to its group."""
    kind = KIND[c.op]
    if c.op == 'collective_permute' and c.pairs == 1 and ONE_WAY in self.points:
      kind = ONE_WAY  # one device sends, one receives (a central server's transfer)
    if c.op == 'all_reduce' and c.size == 1 and SCALAR in self.points:
      kind = SCALAR  # a loss's or metric's mean: gloo reduces one element far faster
    if kind not in self.points:
      kind = 'all_reduce' if c.op != 'collective_permute' else kind
    full = c.nbytes * c.group if c.op == 'all_gather' else c.nbytes
    if c.op != 'collective_permute' and c.group <= 1:
      return 0.0
    two = self.per_call(kind, full)
    if c.op == 'collective_permute' or c.group == 2:
      return two
    fit = self.fits.get(kind)
    if fit is None:
      return two
    piece = full / c.group if c.op == 'all_gather' else full
    ring = alpha_beta.collective_time(c.op, piece, c.group, fit.alpha, fit.beta)
    pair = alpha_beta.collective_time(c.op, full / 2 if c.op == 'all_gather' else full, 2,
                                       fit.alpha, fit.beta)
    return two * ring / pair

  def step(self, found, taken: float = 1.0) -> float:
    """Σ of `cost` over a step's collectives (of a conditional, the costliest branch, in
    the share `taken` of the steps)."""
    return hlo.step_total(found, self.cost, taken=taken)


def from_calls(calls: dict) -> CallCosts:
  """The per-call costs of `time_calls`' calibration ({kind: [{'bytes', 'chains'}]}),
  each size's `per_call` slope."""
  return CallCosts({kind: tuple((p['bytes'], per_call(p['chains'])[0]) for p in points)
                    for kind, points in calls.items() if points})


def setting_inputs(setting: dict, param_bytes: int):
  """(t_comm, CallCosts) of one setting of `analysis.steptime.measure`'s JSON, (None, None) where
  nothing was calibrated: t_comm is [T]'s transfer of the network's weights, here the
  calibrated permute of `param_bytes`."""
  if not setting.get('calls'):
    return None, None
  costs = from_calls(setting['calls'])
  return costs.per_call('collective_permute', param_bytes), costs
