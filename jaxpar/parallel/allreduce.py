"""Synchronous data parallelism's reduction ([T] eq. 3.12): the mean of the devices' gradients.

With sync-split every device holds 1/N of the batch, so the mean of the N local
mean-gradients is the gradient of the whole batch: the step equals sequential
training. With sync-join the same mean is [T]'s ∇W = (1/N) Σ ∇W_i.
"""
from jax import lax


def mean_all_reduce(axes):
  """Gradient reduction for `make_train_step`: `pmean` over the data axes."""
  def reduce(grads):
    return lax.pmean(grads, axes)
  return reduce
