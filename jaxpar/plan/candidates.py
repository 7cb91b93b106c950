"""The runs a plan chooses among, and what each changes in the maths.

A candidate is a synchronous scheme ([T] ch. 3) × server ([T] ch. 4) × N devices ×
BatchNorm grouping ([Y] §3), at the config's batch sizes:

  sync-split  the config's global batch G split over N devices: every step is the serial
              step at batch G (exactly, with BN statistics over all devices).
  sync-join   b = per_device_batch on each of N devices: the serial step at B = N·b.
  servers     allreduce, central, distributed: the same update (the mean gradient), sent
              differently — only the step time differs.
  BatchNorm   'all' (bn_group_size=0: statistics over the whole batch, the serial maths)
              or 'device' (bn_group_size=1: each device's own b examples — a different
              model of the batch, which the plan does not model: its steps to the target
              are taken as those of 'all', and the row says so).

The other methods are listed as excluded, each with the reason, never silently left out.
"""
import dataclasses

SERVERS = ('allreduce', 'central', 'distributed')
SCHEMES = ('sync-split', 'sync-join')

# Config fields a plan sets: everything that belongs to another server or method is reset.
EXCLUDED = {
    'async': "Downpour's steps grow with staleness (steps_model.STALENESS), whose slope c the "
             "plan does not measure yet: run analysis.accuracy.tta --families=staleness,async",
    'local_sgd': "Local SGD's steps grow with the period τ (steps_model.PERIOD), whose slope the "
                 "plan does not measure yet: run analysis.accuracy.tta --families=period",
    'gossip': "gossip's steps to a target are not modelled: its replicas are never averaged, "
              "and as [L] writes it (gradients mixed) 2 replicas climb apart — each takes 2/3 "
              "of its partner's gradient, the difference mode's eigenvalue is −1/3 "
              "(analysis.accuracy.gossip_sim; docs/accuracy.md); run analysis.accuracy.tta "
              "--families=capacity",
}


@dataclasses.dataclass(frozen=True)
class Candidate:
  scheme: str
  server: str
  devices: int
  batch: int          # examples of one step, B
  bn: str             # 'all' | 'device' | '' (a network without BatchNorm)

  @property
  def device_batch(self) -> int:
    return self.batch // self.devices

  @property
  def exact(self) -> bool:
    """Computes the serial step at batch B (per-device BN does not)."""
    return self.bn != 'device' or self.devices == 1

  @property
  def exchange(self) -> tuple:
    """What its step sends, as a key: candidates that differ only in the batch (sync-split
    at G and sync-join at N·b, on the same server, devices and BN grouping) send the same
    collectives — the gradients' and BN's per-channel statistics', whose sizes are the
    weights' and the channels', not the batch's (tests/test_plan.py lowers such a pair) —
    so a plan lowers one program of each (`planner.make`)."""
    return self.server, self.devices, self.bn

  @property
  def label(self) -> str:
    bn = {'all': ', BN all', 'device': ', BN per device', '': ''}[self.bn]
    return f'{self.scheme} {self.server} N={self.devices} B={self.batch}{bn}'

  def overrides(self) -> dict:
    """Config paths → values that make a config run this candidate."""
    out = {'scheme': self.scheme, 'server': self.server, 'mesh.shape': (self.devices,),
           'mesh.axes': ('data',), 'sync_every': 0, 'local_sgd_warmup': 0,
           'fc_parallel': 'data', 'sparsify.capacity': 0.0, 'placement': 'auto',
           'central_schedule': 'serial',
           'bn_group_size': {'all': 0, 'device': 1, '': None}[self.bn]}
    if self.scheme == 'sync-split':
      out['global_batch'] = self.batch
    else:
      out['per_device_batch'] = self.device_batch
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
  config's global_batch (sync-split) and per_device_batch (sync-join), and
  [{'method', 'reason'}] for what is not ranked (a sync-split whose G does not divide over
  N; the methods of `EXCLUDED`). Across processes (`local`: each one's devices) N is one
  device (a run of one process) or all of them: a run on some of the processes is planned
  by launching that many."""
  has_bn = cfg.model == 'resnet34' or bool(cfg.batch_norm)
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
      groupings = ('all', 'device') if has_bn and n > 1 else ('all' if has_bn else '',)
      for server in servers:
        for bn in groupings:
          key = (n, batch, server, bn)
          if n == 1 and key in seen:  # one device: sync-split at G = sync-join at b = G
            continue
          seen.add(key)
          found.append(Candidate(scheme, server, n, batch, bn))
  excluded += [{'method': method, 'reason': reason} for method, reason in EXCLUDED.items()]
  return found, excluded
