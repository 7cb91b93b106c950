"""Communication volume per step: what each method should send, by its equations, next
to what its lowered program sends (`jaxpar.perfmodel.hlo`) and what it reports (`sent_bytes`).

Bytes are those one device sends in one step, averaged over the devices. P_g is the
gradients' size in `grad_reduce_dtype`, P_w the weights' (float32), S the BN running
statistics'. A gap between the analytic and the program's count is a finding: the
program may hold collectives the equations leave out (BatchNorm's batch statistics
are all-reduced in the forward and backward passes; metrics are a few scalars) or pad
tensors to equal chunks.
"""
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxpar.perfmodel import hlo
from jaxpar import config as config_lib
from jaxpar.parallel import gossip
from jaxpar.collectives import nbytes
from jaxpar.models import live_taps
from jaxpar.parallel.sparsify import capacity_of


def method(cfg) -> str:
  """The row label of a config's method (`config.method`) and its variant."""
  name = config_lib.method(cfg)
  local = f' + local-sgd τ={cfg.sync_every} (exchange step)' if cfg.sync_every else ''
  if name == 'allreduce':
    dtype = '' if cfg.grad_reduce_dtype == 'float32' else f' {cfg.grad_reduce_dtype}'
    return f'allreduce {cfg.grad_reduce}{dtype}'
  return {'hybrid': f'hybrid fc_parallel={cfg.fc_parallel}',
          'local_sgd': f'local-sgd τ={cfg.sync_every}' + (
              f' groups of {cfg.local_sgd_group_size}' if cfg.local_sgd_group_size > 1 else '')
          + ' (averaging step)',
          'sparse_gossip': f'sparse gossip c={cfg.sparsify.capacity:g}{local}',
          'gossip': f'gossip{local}',
          'central': f'central {cfg.central_schedule}',
          'distributed': f'distributed {cfg.placement}'}.get(name, name)


def analytic_bytes(cfg, params, batch_stats, live=None):
  """The bytes a device sends per step by the method's equations, or None where the
  volume depends on activations inside the model (hybrid: its own `sent_bytes` counts
  them, [H] §4 counts them for its own algorithm).

  all-reduce (psum, ring: [L] §6): 2(N−1)/N·P_g. torus2d on X×Y ([Y]): each half a ring
  all-reduce over X, then 1/X of it over Y: (2(X−1)/X + 2(Y−1)/(XY))·P_g. central and
  distributed servers ([T] §3.3): N−1 gradient and N−1 weight messages per device's worth,
  (N−1)/N·(P_g + P_w) on average (central: device 0 is also a worker, so N−1 pushes,
  not [T]'s N). gossip ([L]): the gradient to two partners, 2·P_w (P_w on 2 devices, where
  both are the other device; none on one). Sparsified gossip: a message of ⌈c·size⌉ values
  and int32 indices per tensor to each partner. Local SGD ([S], [L]), an averaging step: an all-reduce of weights and BN statistics, 2(N−1)/N·(P_w + S), and
  with groups of G (hierarchical) their gradients' all-reduce, 2(G−1)/G·P_g.
  Gossip with Local SGD(p): a step that exchanges sends what gossip's does. `live`: the
  all-reduce's kernel boxes (`models.live_taps`): its P_g leaves out the taps that read
  padding only, whose gradients are zero.
  """
  shape = tuple(cfg.mesh.shape)
  n = math.prod(shape)
  p_g = nbytes(params, jnp.dtype(cfg.grad_reduce_dtype))
  p_w = nbytes(params)
  name = config_lib.method(cfg)
  if name == 'hybrid':
    return None
  if name == 'local_sgd':  # hierarchical: and the group's all-reduce of the gradients
    g = cfg.local_sgd_group_size
    return 2 * (n - 1) / n * (p_w + nbytes(batch_stats)) + 2 * (g - 1) / g * p_g
  # Gossip's messages on its costliest ring distance: one per partner (one where both
  # partners are one device: n = 2).
  partners = max(gossip.messages(n, s) for s in gossip.distances(n))
  if name == 'sparse_gossip':
    return partners * sum(capacity_of(math.prod(g.shape), cfg.sparsify.capacity)
                          * (np.dtype(g.dtype).itemsize + 4) for g in jax.tree.leaves(params))
  if name == 'gossip':
    return partners * p_w
  if name in ('central', 'distributed'):
    return (n - 1) / n * (p_g + p_w)
  if live:
    p_g = nbytes(jax.eval_shape(lambda p: live_taps.compact(p, live), params),
                 jnp.dtype(cfg.grad_reduce_dtype))
  if cfg.grad_reduce == 'torus2d':
    x, y = shape
    return (2 * (x - 1) / x + 2 * (y - 1) / (x * y)) * p_g
  return 2 * (n - 1) / n * p_g


def program_collectives(found: list, devices: int) -> list:
  """Every collective of a lowered step (`hlo.collectives`), with the bytes a device sends
  for it, as JSON."""
  return [{'op': c.op, 'shape': list(c.shape), 'dtype': c.dtype, 'group': c.group,
           'pairs': c.pairs, 'branch': [list(b) for b in c.branch],
           'bytes_per_device': hlo.bytes_per_device(c, devices)}
          for c in found]


def from_row(collective: dict) -> hlo.Collective:
  """A collective of a volume row (JSON) as `jaxpar.perfmodel.hlo` reads it."""
  return hlo.Collective(collective['op'], tuple(collective['shape']), collective['dtype'],
                        collective['group'], collective['pairs'],
                        tuple(tuple(b) for b in collective['branch']))


def row(cfg, stablehlo: str, params, batch_stats, reported=None, live=None) -> dict:
  """One line of the volume table for a config's lowered step (`live`: as `analytic_bytes`)."""
  devices = math.prod(cfg.mesh.shape)
  found = hlo.collectives(stablehlo)
  program = hlo.step_bytes(found, devices)
  analytic = analytic_bytes(cfg, params, batch_stats, live)
  return {'method': method(cfg), 'mesh': list(cfg.mesh.shape), 'devices': devices,
          'analytic_bytes': analytic, 'reported_bytes': reported, 'program_bytes': program,
          'ratio': program / analytic if analytic else None,
          'collectives': program_collectives(found, devices)}


def distinct_rows(settings) -> list:
  """The volume rows of `analysis.steptime.measure` settings (their steps on more than one device
  and the extra variants), one per method and mesh."""
  rows = [r for s in settings for r in [c['volume'] for c in s['steps'] if c['n'] > 1]
          + s['volume']]
  return list({(r['method'], tuple(r['mesh'])): r for r in rows}.values())


def markdown(rows) -> str:
  """The volume table: one line per method and mesh."""
  def mb(x):
    return '—' if x is None else f'{x / 1e6:.3f}'
  lines = ['| method | mesh | collectives | analytic MB | reported MB | program MB '
           '| program / analytic |', '|---|---|---:|---:|---:|---:|---:|']
  for r in rows:
    ratio = '—' if r['ratio'] is None else f"{r['ratio']:.4f}"
    lines.append(f"| {r['method']} | {'×'.join(map(str, r['mesh']))} | {len(r['collectives'])} "
                 f"| {mb(r['analytic_bytes'])} | {mb(r['reported_bytes'])} "
                 f"| {mb(r['program_bytes'])} | {ratio} |")
  return '\n'.join(lines)
