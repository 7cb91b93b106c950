"""α-β cost models of the collectives behind each training scheme.

A message of b bytes between two nodes takes α + b/β: α the per-message latency
(seconds), β the link bandwidth (bytes/second). Common assumptions unless a model
says otherwise: links are full duplex (a node sends and receives at once at full
bandwidth), a node has one port (one send and one receive at a time), the buffer
splits evenly, and reduction arithmetic is free.

With t_comm = α + P/β for a network of P bytes (what the thesis measures), the
thesis' server equations are special cases: the central server's schedules give
eq. 4.4 and 4.7 exactly, and the distributed server gives eq. 4.12's
2·t_comm·(N−1)/N exactly when latency is negligible (α = 0; [T]'s 1 Gb/s links
moved 20–500 MB per transfer). For α > 0 the α-β model charges 2(N−1)·α where
the thesis charges 2(N−1)·α/N: one reason [T] found its distributed-server
estimates optimistic.
"""


def point_to_point(nbytes: float, alpha: float, beta: float) -> float:
  """One message: α + b/β. With b = P (the whole network) this is [T]'s t_comm."""
  return alpha + nbytes / beta


def ring_all_reduce(nbytes: float, n: int, alpha: float, beta: float) -> float:
  """Ring all-reduce ([L] §6): 2(N−1) steps, each a neighbour exchange of 1/N of
  the buffer (N−1 reduce-scatter steps, then N−1 all-gather steps)."""
  return reduce_scatter(nbytes, n, alpha, beta) + all_gather(nbytes, n, alpha, beta)


def reduce_scatter(nbytes: float, n: int, alpha: float, beta: float) -> float:
  """Ring reduce-scatter: N−1 steps of 1/N of the buffer; each node ends with the
  sum of its own 1/N part."""
  return (n - 1) * point_to_point(nbytes / n, alpha, beta)


def all_gather(nbytes: float, n: int, alpha: float, beta: float) -> float:
  """Ring all-gather of a buffer of `nbytes` in total (1/N per node): N−1 steps."""
  return (n - 1) * point_to_point(nbytes / n, alpha, beta)


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


def collective_time(op: str, nbytes: float, group: int, alpha: float, beta: float) -> float:
  """One collective of a lowered program (`jaxpar.plan.hlo`: op, operand bytes, devices per
  group) by the models above: a permute is one message (all pairs at once); all-reduce
  a ring; reduce-scatter and all-to-all N−1 steps of 1/N of the operand; all-gather N−1
  steps of its operand (one device's piece)."""
  if op == 'collective_permute':
    return point_to_point(nbytes, alpha, beta)
  if group <= 1:
    return 0.0
  if op == 'all_reduce':
    return ring_all_reduce(nbytes, group, alpha, beta)
  if op == 'all_gather':
    return all_gather(nbytes * group, group, alpha, beta)
  return reduce_scatter(nbytes, group, alpha, beta)  # reduce_scatter, all_to_all
