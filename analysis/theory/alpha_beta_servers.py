"""The thesis' server iterations, [L]'s gossip round and [Y]'s 2-D torus all-reduce in α-β
terms, on the collectives of `jaxpar.perfmodel.alpha_beta` (a message of b bytes takes
α + b/β).

With t_comm = α + P/β for a network of P bytes (what the thesis measures), the
thesis' server equations are special cases: the central server's schedules give
eq. 4.4 and 4.7 exactly, and the distributed server gives eq. 4.12's
2·t_comm·(N−1)/N exactly when latency is negligible (α = 0; [T]'s 1 Gb/s links
moved 20–500 MB per transfer). For α > 0 the α-β model charges 2(N−1)·α where
the thesis charges 2(N−1)·α/N: one reason [T] found its distributed-server
estimates optimistic.
"""
from jaxpar.perfmodel.alpha_beta import all_gather, point_to_point, reduce_scatter, ring_all_reduce


def torus2d_all_reduce(nbytes: float, x: int, y: int, alpha: float, beta: float) -> float:
  """[Y]'s 2-D gradient summation on an X×Y torus (docs/sources.md).

  Each tensor splits into two halves. Phase 1 all-reduces one half along the X
  rings while the other half goes along the Y rings; phase 2 swaps dimensions.
  Assumes each node can drive its X and its Y links at once (two ports, one per
  dimension), so a phase lasts as long as its slower ring.
  """
  phase = max(ring_all_reduce(nbytes / 2, x, alpha, beta),
              ring_all_reduce(nbytes / 2, y, alpha, beta))
  return 2 * phase


def central_server_sync_iteration(nbytes: float, n: int, alpha: float, beta: float,
                                  t_grad: float, schedule: str) -> float:
  """A synchronous iteration through one parameter server (one port).

  serial: the server talks to one worker at a time and overlaps transfers with the
  workers' computation; the last worker waits N−1 transfers, pulls, computes and
  pushes — [T] eq. 4.4. parallel: the server talks to all N at once and its link is
  shared, so each pull and each push lasts N transfers — [T] eq. 4.7.
  """
  t = point_to_point(nbytes, alpha, beta)
  if schedule == 'serial':
    return (n - 1) * t + t + t_grad + t
  if schedule == 'parallel':
    return n * t + t_grad + n * t
  raise ValueError(f"schedule={schedule!r}: choose 'serial' or 'parallel'")


def distributed_server_sync_iteration(nbytes: float, n: int, alpha: float, beta: float,
                                      t_grad: float) -> float:
  """A synchronous iteration with every worker the server of 1/N of the weights
  ([T] §3.3.3): send each gradient part to its owner (a reduce-scatter), then the
  owners send the updated parts to everyone (an all-gather)."""
  return reduce_scatter(nbytes, n, alpha, beta) + t_grad + all_gather(nbytes, n, alpha, beta)


def gossip_round(nbytes: float, alpha: float, beta: float, partners: int = 2) -> float:
  """[L]'s gossip: each worker exchanges its whole gradient with two partners,
  r = (i+s) mod P and l = (i−s) mod P. With one duplex port the two exchanges run
  one after the other: 2·(α + P/β), independent of the number of workers; where r = l
  (2 workers, or s = P/2) one exchange, `partners` = 1 (`jaxpar.parallel.gossip.messages`)."""
  return partners * point_to_point(nbytes, alpha, beta)
