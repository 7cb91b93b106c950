"""α-β cost models of the collectives behind each training scheme.

A message of b bytes between two nodes takes α + b/β: α the per-message latency
(seconds), β the link bandwidth (bytes/second). Common assumptions unless a model
says otherwise: links are full duplex (a node sends and receives at once at full
bandwidth), a node has one port (one send and one receive at a time), the buffer
splits evenly, and reduction arithmetic is free.

These are the models the planner costs a lowered program's collectives with
(`collective_time`); the thesis' server iterations and [Y]'s 2-D torus in the same terms are
in `analysis/theory/alpha_beta_servers.py`.
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


def collective_time(op: str, nbytes: float, group: int, alpha: float, beta: float) -> float:
  """One collective of a lowered program (`jaxpar.perfmodel.hlo`: op, operand bytes, devices per
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
