"""The thesis' timing and speedup equations ([T] ch. 4 and 7; docs/sources.md), SparkNet's
speedup models ([S], §5) and [H]'s FC-layer communication volumes (§4).

Symbols as in the thesis: `t_grad` is one worker's time for one batch's gradients,
`t_comm` the time to move the whole network's weights once between two units, `n`
the number of workers N, `d` the number of batches D. Weight-update time and
set-up/tear-down are neglected, as in the thesis. D/N is a real division: the
thesis' D = 128 on N = 3 workers is 42.67 batches each, on average.
"""


# --------------------------------------------------------------------------- [T] §4.1
def computation_time(t_prepare: float, t_train: float, t_finish: float) -> float:
  """eq. 4.1: t_comp = t_prepare + t_train + t_finish."""
  return t_prepare + t_train + t_finish


def sync_train_time(iterations: float, t_iter: float) -> float:
  """eq. 4.2: synchronous training is I iterations of t_iter each."""
  return iterations * t_iter


def sync_iteration_time(per_unit_times) -> float:
  """eq. 4.3: an iteration lasts as long as its slowest unit (server or worker)."""
  return max(per_unit_times)


def sync_central_best(t_grad: float, t_comm: float, n: int) -> float:
  """eq. 4.4–4.6: the server sends to one worker at a time and overlaps; the last
  worker waits (N−1)·t_comm, pulls, computes, pushes: (N+1)·t_comm + t_grad."""
  return (n + 1) * t_comm + t_grad


def sync_central_worst(t_grad: float, t_comm: float, n: int) -> float:
  """eq. 4.7–4.9: all N transfers at once, each N times slower: 2N·t_comm + t_grad."""
  return 2 * n * t_comm + t_grad


def sync_central(t_grad: float, t_comm: float, n: int) -> float:
  """eq. 4.10–4.11: the estimate is the mean of the best and the worst case."""
  return (sync_central_best(t_grad, t_comm, n) + sync_central_worst(t_grad, t_comm, n)) / 2


def sync_distributed(t_grad: float, t_comm: float, n: int) -> float:
  """eq. 4.12: weights in N equal parts over duplex links: 2·t_comm·(N−1)/N + t_grad."""
  return 2 * t_comm * (n - 1) / n + t_grad


# --------------------------------------------------------------------------- [T] §4.2
def async_central_best_worker(t_grad: float, t_comm: float, n: int, d: float) -> float:
  """eq. 4.13: the last worker to start: (N−1)·t_comm + (D/N)·(2·t_comm + t_grad)."""
  return (n - 1) * t_comm + d / n * (2 * t_comm + t_grad)


def async_central_best_server(t_grad: float, t_comm: float, n: int, d: float) -> float:
  """eq. 4.14: the server's link carries every transfer: (D+1)·t_comm + t_grad."""
  del n  # N·(D/N) transfers: N cancels
  return (d + 1) * t_comm + t_grad


def async_central_best(t_grad: float, t_comm: float, n: int, d: float) -> float:
  """eq. 4.15: the slower of the last worker (4.13) and the server (4.14)."""
  return max(async_central_best_worker(t_grad, t_comm, n, d),
             async_central_best_server(t_grad, t_comm, n, d))


def async_central_worst(t_grad: float, t_comm: float, n: int, d: float) -> float:
  """eq. 4.16–4.18: every transfer shares the link with N: (D/N)·(2N·t_comm + t_grad)."""
  return d / n * (2 * n * t_comm + t_grad)


def async_central(t_grad: float, t_comm: float, n: int, d: float) -> float:
  """eq. 4.19–4.20: the mean of the best (4.15) and the worst (4.16) case."""
  return (async_central_best(t_grad, t_comm, n, d) + async_central_worst(t_grad, t_comm, n, d)) / 2


def async_distributed(t_grad: float, t_comm: float, n: int, d: float) -> float:
  """eq. 4.21: (D/N)·(2·t_comm·(N−1)/N + t_grad)."""
  return d / n * (2 * t_comm * (n - 1) / n + t_grad)


# --------------------------------------------------------------------------- [T] §4.3
def speedup(t_serial: float, t_parallel: float) -> float:
  """eq. 4.22: S = t_serial / t_parallel."""
  return t_serial / t_parallel


def thesis_speedup(t_grad: float, d: float, t_parallel: float) -> float:
  """eq. 4.23: S = D·t_grad / t_parallel (the serial run computes D gradients)."""
  return speedup(d * t_grad, t_parallel)


SCHEMES = ('async', 'sync-join', 'sync-split')
SERVERS = ('central', 'distributed')


def training_time(scheme: str, server: str, t_grad: float, t_comm: float, n: int,
                  d: float) -> float:
  """Training time of D batches on N workers, as the thesis' `estimate.py` computes it.

  sync-join: D/N iterations (each consumes N batches), eq. 4.2 with 4.11 or 4.12.
  sync-split: D iterations, each worker computing the gradient of 1/N of a batch,
  taken as t_grad/N ([T] §4.3), eq. 4.2 with 4.11 or 4.12.
  async: eq. 4.20 (central) or 4.21 (distributed).
  """
  if scheme not in SCHEMES:
    raise ValueError(f'scheme={scheme!r}: choose one of {SCHEMES}')
  if server not in SERVERS:
    raise ValueError(f'server={server!r}: choose one of {SERVERS}')
  if scheme == 'async':
    return (async_central if server == 'central' else async_distributed)(t_grad, t_comm, n, d)
  iteration = sync_central if server == 'central' else sync_distributed
  if scheme == 'sync-join':
    return sync_train_time(d / n, iteration(t_grad, t_comm, n))
  return sync_train_time(d, iteration(t_grad / n, t_comm, n))


def estimated_speedup(scheme: str, server: str, t_grad: float, t_comm: float, n: int,
                      d: float) -> float:
  """eq. 4.23 applied to `training_time`."""
  return thesis_speedup(t_grad, d, training_time(scheme, server, t_grad, t_comm, n, d))


# --------------------------------------------------------------------------- [T] §7.2
def semaphore_transfer_time(t_comm: float, waiting: int) -> float:
  """eq. 7.1–7.2: with a semaphore queue at the server, a transfer that finds
  `waiting` workers ahead of it ends after (waiting + 1)·t_comm (t_comm if none)."""
  return (waiting + 1) * t_comm


def semaphore_bound(t_comm: float, n: int) -> float:
  """eq. 7.3: t_sem ≤ t_par = N·t_comm, the time of N simultaneous transfers."""
  return n * t_comm


def semaphore_training_time(scheme: str, t_grad: float, t_comm: float, n: int,
                            d: float) -> float:
  """Training time of D batches through a central server whose semaphore lets one transfer
  through at a time (jaxpar's `central_schedule='serial'`).

  Synchronous: the last worker's pull waits for the N−1 ahead of it, N·t_comm (eq. 7.2);
  its push finds the queue empty, t_comm (eq. 7.1): (N+1)·t_comm + t_grad an iteration,
  [T]'s best case (eq. 4.4), never the worst (eq. 4.7), which eq. 7.3 bounds. D/N
  iterations (sync-join) or D of t_grad/N (sync-split). Asynchronous: transfers never
  overlap, so the best case of eq. 4.15 holds."""
  if scheme == 'async':
    return async_central_best(t_grad, t_comm, n, d)
  if scheme not in SCHEMES:
    raise ValueError(f'scheme={scheme!r}: choose one of {SCHEMES}')
  grad = t_grad / n if scheme == 'sync-split' else t_grad
  iterations = d / n if scheme == 'sync-join' else d
  t_iter = semaphore_transfer_time(t_comm, n - 1) + grad + semaphore_transfer_time(t_comm, 0)
  return sync_train_time(iterations, t_iter)


# --------------------------------------------------------------------------- [S] §5
def sparknet_naive_speedup(c: float, s: float, k: int) -> float:
  """[S]: synchronous SGD on K workers, C = C(b) one minibatch's gradient time,
  S the time to broadcast and collect the parameters: C / (C/K + S) ≤ C/S."""
  return c / (c / k + s)


def sparknet_averaging_speedup(n_a: float, c: float, tau: int, s: float, m_a: float) -> float:
  """[S]: model averaging every τ steps: N_a(b)·C / ((τ·C + S)·M_a(b, K, τ)),
  N_a serial iterations and M_a averaging rounds to reach accuracy a."""
  return n_a * c / ((tau * c + s) * m_a)


def sparknet_tau(s: float, c: float) -> float:
  """[S]'s rule of thumb τ ≈ 5·S/C: communication stays a small fraction of a round."""
  return 5 * s / c


# --------------------------------------------------------------------------- [H] §4
def fc_data_parallel_volume(k: int, n: int) -> int:
  """[H]: values moved for an FC layer (K inputs, N outputs) trained data-parallel:
  its weights and biases, K·N + N."""
  return k * n + n


def fc_model_parallel_volume(k: int, n: int, m: int, r: int) -> int:
  """[H]: values moved model-parallel (per-worker batch M, R workers):
  inputs gathered, input gradients reduced (3·M·K·R) and outputs exchanged both
  ways (2·M·N·R)."""
  return 3 * m * k * r + 2 * m * n * r


def fc_prefers_model_parallel(k: int, n: int, m: int, r: int) -> bool:
  """[H]'s rule: model parallel moves less when M·R < (K+1)·N / (3K + 2N)."""
  return m * r < (k + 1) * n / (3 * k + 2 * n)


def fc_layer_shapes(params) -> list:
  """(name, K, N) of every Dense layer in a flax parameter tree, in order."""
  shapes = []

  def visit(tree, prefix):
    for name, sub in tree.items():
      path = f'{prefix}/{name}' if prefix else name
      if isinstance(sub, dict) or hasattr(sub, 'items'):
        kernel = sub.get('kernel')
        if kernel is not None and len(kernel.shape) == 2:
          shapes.append((path, *kernel.shape))
        else:
          visit(sub, path)
  visit(params, '')
  return shapes


def fc_parallelism_plan(params, per_worker_batch: int, workers: int) -> list:
  """[H]'s choice for each Dense layer of a network: (name, K, N, data-parallel
  volume, model-parallel volume, 'model' or 'data'), in values moved per step."""
  plan = []
  for name, k, n in fc_layer_shapes(params):
    model = fc_prefers_model_parallel(k, n, per_worker_batch, workers)
    plan.append((name, k, n, fc_data_parallel_volume(k, n),
                 fc_model_parallel_volume(k, n, per_worker_batch, workers),
                 'model' if model else 'data'))
  return plan
