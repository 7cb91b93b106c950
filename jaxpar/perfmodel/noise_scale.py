"""The gradient noise scale: the batch size past which larger batches stop saving steps
(McCandlish, Kaplan, Amodei et al. 2018, "An empirical model of large-batch training").

Per-example gradients have mean G and covariance Σ; the mean gradient of a batch of B
independent examples, G_B, then has

    E|G_B|² = |G|² + tr(Σ)/B                                       (their App. A.1)

so two batch sizes B_s < B_b identify both terms:

    |G|²  ≈ (B_b·|G_b|² − B_s·|G_s|²) / (B_b − B_s)
    S     ≈ (|G_s|² − |G_b|²) / (1/B_s − 1/B_b)         (S = tr Σ)

and the simple noise scale B_noise = S/|G|². In data-parallel training both batch sizes
come free: each of the N devices' gradients is a batch of b (|G_s|² = the mean of their
squared norms) and their mean a batch of N·b (|G_b|² = the squared norm of the mean).

Each estimate is unbiased; their ratio is not, and one step's estimates are noisy (|G|²
may even come out negative). As the paper does, `NoiseScale` averages |G|² and S over
steps separately (exponential moving averages) and divides last. B_noise grows as the
loss falls (the gradient shrinks, its noise does not): read it where the run is, not
once.

With B_noise the steps to a result follow K(B) = K_min·(1 + B_noise/B) and the
examples E(B) = E_min·(1 + B/B_noise) (their §2.3): `steps_model.BATCH`.
"""
import dataclasses
import math

import jax
import numpy as np


def two_batch_estimates(small_sq: float, big_sq: float, b_small: float,
                        b_big: float) -> tuple[float, float]:
  """(|G|², S) from the squared gradient norms measured at batch sizes b_small < b_big."""
  if not 0 < b_small < b_big:
    raise ValueError(f'need 0 < b_small < b_big, got {b_small} and {b_big}')
  g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
  s = (small_sq - big_sq) / (1 / b_small - 1 / b_big)
  return float(g2), float(s)


def device_norms(grads) -> tuple[float, float]:
  """(|G_s|², |G_b|²) from N ≥ 2 gradients of equal batches, stacked along a leading axis
  of every leaf (a pytree of arrays or one array): the mean squared norm of each and the
  squared norm of their mean."""
  leaves = [np.asarray(x, np.float64).reshape(np.shape(x)[0], -1)
            for x in jax.tree.leaves(grads)]
  flat = np.concatenate(leaves, axis=1)
  if flat.shape[0] < 2:
    raise ValueError('the noise scale needs the gradients of at least 2 batches')
  small = float(np.mean(np.sum(flat**2, axis=1)))
  big = float(np.sum(np.mean(flat, axis=0)**2))
  return small, big


@dataclasses.dataclass
class NoiseScale:
  """Running estimate of B_noise from one measurement per step: `update(|G_s|², |G_b|²)`.

  |G|² and S are exponential moving averages with weight `decay` on the past (bias-
  corrected, as Adam's moments, so the first updates are not pulled towards zero)."""
  b_small: float
  b_big: float
  decay: float = 0.9
  _g2: float = 0.0
  _s: float = 0.0
  _weight: float = 0.0

  def update(self, small_sq: float, big_sq: float) -> None:
    g2, s = two_batch_estimates(small_sq, big_sq, self.b_small, self.b_big)
    self._g2 = self.decay * self._g2 + (1 - self.decay) * g2
    self._s = self.decay * self._s + (1 - self.decay) * s
    self._weight = self.decay * self._weight + (1 - self.decay)

  @property
  def g2(self) -> float:
    return self._g2 / self._weight if self._weight else math.nan

  @property
  def s(self) -> float:
    return self._s / self._weight if self._weight else math.nan

  @property
  def b_noise(self) -> float:
    """S/|G|²; nan before the first update or while the averaged |G|² is not positive
    (the gradient is below its noise: any batch is "small")."""
    g2 = self.g2
    return self.s / g2 if g2 > 0 else math.nan
