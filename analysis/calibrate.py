"""Calibration of the α-β model (`analysis.collectives`) from measured transfers.

A transfer of b bytes takes t = α + b/β. Given the median time of transfers of several
sizes on the same pair of devices, α and 1/β are fitted by non-negative least squares
on the *relative* error, (t_i − α − b_i/β) / t_i: timings are noisy in proportion to
their length, and an unweighted fit would let the largest message decide α alone.
"""
import dataclasses

import numpy as np
from scipy.optimize import nnls


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


def from_transfers(transfers) -> Fit:
  """The point-to-point fit of `analysis.measure`'s transfer samples (their medians)."""
  return fit_alpha_beta([x['bytes'] for x in transfers],
                        [float(np.median(x['samples'])) for x in transfers])


def from_all_reduces(all_reduces) -> Fit:
  """α and β of the ring model's steps from all-reduces over two devices: a ring of two
  takes 2 steps of half the buffer, 2α + b/β, so α is half the fitted intercept. (Runtimes
  implement all-reduce with other fixed costs than a point-to-point send: gloo's are far
  higher, so each collective kind gets its own fit.)"""
  fit = from_transfers(all_reduces)
  return dataclasses.replace(fit, alpha=fit.alpha / 2)


def setting_inputs(setting: dict):
  """(t_comm, transfer fit, all-reduce fit) of one setting of `analysis.measure`'s JSON,
  each None where it was not measured (a fit needs two sizes)."""
  transfers, reduces = setting['transfers'], setting['all_reduces']
  return (float(np.median(transfers[-1]['samples'])) if transfers else None,
          from_transfers(transfers) if len(transfers) > 1 else None,
          from_all_reduces(reduces) if len(reduces) > 1 else None)
