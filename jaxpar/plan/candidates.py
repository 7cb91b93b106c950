"""The runs a plan chooses among, and what each changes in the maths.

A candidate is a synchronous scheme ([T] ch. 3) × server ([T] ch. 4) × N devices ×
BatchNorm grouping ([Y] §3), at the config's batch sizes — or one of the methods beside
synchronous SGD, on all N devices:

  sync-split  the config's global batch G split over N devices: every step is the serial
              step at batch G (exactly, with BN statistics over all devices).
  sync-join   b = per_device_batch on each of N devices: the serial step at B = N·b.
  servers     allreduce, central, distributed: the same update (the mean gradient), sent
              differently — only the step time differs.
  BatchNorm   'all' (bn_group_size=0: statistics over the whole batch, the serial maths)
              or 'device' (bn_group_size=1: each device's own examples, PyTorch DDP's
              default — other maths, whose steps a run of that candidate measures:
              `rank.steps`).
  local-sgd   sync-join at N·b with a replica per device, averaged every τ steps ([S], [L];
              `plan.periods`; BN per device, as Local SGD's replicas keep theirs).
  async       Downpour ([T] §3.2): N workers at b each push to the central server; an
              update is one push, its gradient N − 1 versions old once they settle.

What is not ranked is listed as excluded, each with the reason, never silently left out.
"""
import dataclasses

from jaxpar.config import has_batch_norm

SERVERS = ('allreduce', 'central', 'distributed')
SCHEMES = ('sync-split', 'sync-join')

# The families a plan can measure (config plan.methods), and why each is left out without.
METHODS = {
    'bn_device': 'BN per device changes the maths; its steps are measured by a run of the '
                 "sync-join candidate (config.plan.methods has no 'bn_device')",
    'local_sgd': "Local SGD's steps grow with the period τ (steps_model.PERIOD), whose slope a "
                 "run at the largest τ measures (config.plan.methods has no 'local_sgd')",
    'async': "Downpour's steps grow with staleness (steps_model.STALENESS), measured by the "
             "staleness simulator at s = N − 1 (config.plan.methods has no 'async')",
}
EXCLUDED = {
    'gossip': "gossip's steps to a target are not modelled: its replicas are never averaged, "
              "and as [L] writes it (gradients mixed) 2 replicas climb apart — each takes 2/3 "
              "of its partner's gradient, the difference mode's eigenvalue is −1/3 "
              "(analysis.accuracy.gossip_sim; docs/accuracy.md); run analysis.accuracy.tta "
              "--families=capacity",
}


# Hierarchical Local SGD averages groups of G devices that all-reduce every step: a plan's
# candidates are on a one-axis mesh of its N devices.
HIERARCHICAL = ('hierarchical Local SGD (local_sgd_group_size G) needs a mesh of two axes with '
                '1 < G < N: the plan ranks runs on one axis of its N={n} devices; make G a '
                "host's devices and compare the runs with analysis.accuracy.tta --families=period")


@dataclasses.dataclass(frozen=True)
class Candidate:
  scheme: str
  server: str
  devices: int
  batch: int          # examples of one step, B
  bn: str             # 'all' | 'device' | '' (a network without BatchNorm)
  period: int = 0     # local-sgd: τ (0: synchronous SGD)
  backend: str = ''   # async: 'threads' (one process) | 'ray' (its workers as Ray's actors)

  @property
  def family(self) -> str:
    """'sync' (the serial maths at B, `exact`), 'bn_device', 'local_sgd' or 'async': whose
    steps model predicts its K (`rank.steps`)."""
    if self.scheme == 'async':
      return 'async'
    if self.period:
      return 'local_sgd'
    return 'sync' if self.exact else 'bn_device'

  @property
  def device_batch(self) -> int:
    return self.batch if self.scheme == 'async' else self.batch // self.devices

  @property
  def exact(self) -> bool:
    """Computes the serial step at batch B (per-device BN, Local SGD and Downpour do not)."""
    return (self.scheme != 'async' and not self.period
            and (self.bn != 'device' or self.devices == 1))

  @property
  def exchange(self) -> tuple:
    """What its step sends, as a key: candidates that differ only in the batch (sync-split
    at G and sync-join at N·b, on the same server, devices and BN grouping) send the same
    collectives — the gradients' and BN's per-channel statistics', whose sizes are the
    weights' and the channels', not the batch's (tests/test_plan.py lowers such a pair) —
    so a plan lowers one program of each (`planner.make`). Local SGD's periods differ
    only in how often the averaging's branch is taken: one program for all of them."""
    return self.server, self.devices, self.bn, bool(self.period), self.scheme == 'async'

  @property
  def label(self) -> str:
    bn = {'all': ', BN all', 'device': ', BN per device', '': ''}[self.bn]
    if self.scheme == 'async':
      return f'async {self.server} ({self.backend}) N={self.devices} b={self.batch}{bn}'
    if self.period:
      return f'local-sgd τ={self.period} N={self.devices} B={self.batch}{bn}'
    return f'{self.scheme} {self.server} N={self.devices} B={self.batch}{bn}'

  def overrides(self) -> dict:
    """Config paths → values that make a config run this candidate: on a one-axis mesh, its
    gradients summed by XLA's all-reduce (`psum`, as every candidate is timed: a 2-D torus
    needs two axes)."""
    out = {'scheme': self.scheme, 'server': self.server, 'mesh.shape': (self.devices,),
           'mesh.axes': ('data',), 'grad_reduce': 'psum', 'sync_every': 0,
           'local_sgd_warmup': 0, 'fc_parallel': 'data', 'sparsify.capacity': 0.0,
           'placement': 'auto', 'central_schedule': 'serial',
           'bn_group_size': {'all': 0, 'device': 1, '': None}[self.bn]}
    if self.scheme == 'sync-split':
      out['global_batch'] = self.batch
    else:
      out['per_device_batch'] = self.device_batch
    if self.period:
      out['sync_every'] = self.period
    if self.scheme == 'async':
      out.update({'async_sgd.backend': self.backend, 'bn_group_size': None})
    return out


def device_counts(available: int) -> list:
  """1, 2, 4, ... up to `available`, and `available` itself."""
  counts, n = [], 1
  while n < available:
    counts.append(n)
    n *= 2
  return counts + [available]


def enumerate_candidates(cfg, available: int, local: int | None = None) -> tuple:
  """(candidates, excluded): every synchronous candidate on 1..`available` devices at the
  config's global_batch (sync-split) and per_device_batch (sync-join); on all of them, the
  methods of `plan.methods`: Local SGD at each of `plan.periods`, Downpour on either
  server; and [{'method', 'reason'}] for what is not ranked (a sync-split whose G does not
  divide over N; a family of `METHODS` left out; hierarchical Local SGD; `EXCLUDED`).
  Across processes (`local`: each one's devices) N is one device (a run of one process) or
  all of them: a run on some of the processes is planned by launching that many."""
  has_bn = has_batch_norm(cfg)
  found, excluded, seen = [], [], set()
  counts = device_counts(available)
  if local is not None:
    excluded += [{'method': f'N={n}', 'reason': f'a run on {n} of the {available} devices is '
                  f'one of fewer processes: make its plan launching those'}
                 for n in counts if n not in (1, available)]
    counts = sorted({1, available})
  for n in counts:
    for scheme in SCHEMES:
      if scheme == 'sync-split' and cfg.global_batch % n:
        excluded.append({'method': f'sync-split N={n}',
                         'reason': f'global_batch={cfg.global_batch} does not divide over {n} '
                                   f'devices'})
        continue
      batch = cfg.global_batch if scheme == 'sync-split' else n * cfg.per_device_batch
      servers = SERVERS if n > 1 else ('allreduce',)
      groupings = (('all', 'device') if has_bn and n > 1 and 'bn_device' in cfg.plan.methods
                   else ('all' if has_bn else '',))
      for server in servers:
        for bn in groupings:
          key = (n, batch, server, bn)
          if n == 1 and key in seen:  # one device: sync-split at G = sync-join at b = G
            continue
          seen.add(key)
          found.append(Candidate(scheme, server, n, batch, bn))
  methods, n = tuple(cfg.plan.methods), available
  if n == 1:  # one device: every method is the serial run
    return found, excluded + [{'method': method, 'reason': reason}
                              for method, reason in EXCLUDED.items()]
  own = 'device' if has_bn else ''  # Local SGD's replicas and Downpour's workers: their own BN
  if 'local_sgd' in methods:
    found += [Candidate('sync-join', 'allreduce', n, n * cfg.per_device_batch, own, period=t)
              for t in sorted(set(cfg.plan.periods))]
  if 'async' in methods:
    # Downpour's workers are threads of one process, or across processes Ray's actors
    # driven by one process (validation: not SPMD processes).
    found += [Candidate('async', server, n, cfg.per_device_batch, own,
                        backend='threads' if local is None else 'ray')
              for server in ('central', 'distributed')]
  excluded += [{'method': family, 'reason': METHODS[family]} for family in METHODS
               if family not in methods and (family != 'bn_device' or has_bn)]
  if 'local_sgd' in methods:
    excluded.append({'method': 'local-sgd hierarchical', 'reason': HIERARCHICAL.format(n=n)})
  excluded += [{'method': method, 'reason': reason} for method, reason in EXCLUDED.items()]
  return found, excluded
