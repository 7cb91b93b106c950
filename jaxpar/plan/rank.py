"""Time to the target of every candidate, T = K(B) × t_step + ⌊K/every⌋ × t_save, and the
ranking.

Steps K (`steps_model.BATCH`, McCandlish et al. 2018 §2.3): one serial run at batch b
reaches the target in K_b steps; with the gradient noise scale B_noise measured along it
(`noise_scale`),

    K(B) = K_min·(1 + B_noise/B),   K_min = K_b / (1 + B_noise/b)

so K(B) = K_b·(1 + B_noise/B)/(1 + B_noise/b). Where a second serial run at the largest
batch reached the target, B_noise is the one that draws K(B) through both runs
(`planner.batch_fit`) — and where K fell faster than 1/B there, which no B_noise ≥ 0 draws,
K(B) = K_b·(b/B)^α through both, α = ln(K_b/K_B)/ln(B/b) > 1 (`steps_at`'s `through`);
else it is read near the target (where the run spends its last steps), the spread of those
readings giving K's range — capped, where the run at the largest batch stopped short at
step S, by the fit through (B, S), the rows of the serial maths at B and beyond then taking
at least S steps (`planner.batch_bound`). A B_noise
that cannot be read (|G|² not above its noise) is taken as ∞: K = K_b·b/B, perfect
scaling, the optimistic bound — said in the row.

The other families' K (`steps`), each from a run the plan makes (`planner.method_runs`):

  bn_device  the sync-join candidate at N·b with BN per device run to the target: K_dev;
             every per-device row at B takes K(B) × K_dev / K(N·b) (the batch model's
             curve, moved to the measured point).
  local_sgd  K(τ) through K_1 — the sync-join row at N·b with the replicas' BN (per
             device, the run above) — and runs at the smallest and the largest τ, a line
             between each two (`period_steps`): K is not a line in τ (GoogLeNet 32², 2
             processes, loss 0.5: 156–178 steps at τ = 2, 196–244 at 8, 216–253 at 1);
             with the largest τ's run alone, the period model (`steps_model.PERIOD`)
             K(τ) = K_1·(1 + c·(τ − 1)) through K_1 and it.
  async      Downpour's updates to the target at staleness N − 1, simulated on one device
             (`probe.stale_run`): its K is that run's.

Each family's run is made at the serial run's seeds (`plan.seeds`), its K their mean and
its row's range widened by their spread (`seeds_range`): one seed's K carries that seed's
luck, which is the family's own, not the serial run's (SqueezeNet-BN 32², BN per device
on 2 processes: 143 steps at seed 0, 86–116 at seeds 1–5).

A family the plan did not measure keeps BN-over-all's K (per-device BN) and is not chosen;
a run stopped short of the target gives a lower bound on K (said in the row, not chosen).

Step time t_step ([T] eq. 4.4's t_grad plus the step's communication, the parts model of
`analysis.steptime.compare` without the trace): predicted as t_grad(device batch) + the
non-gradient work of the one-device step (t_step(1) − t_grad(b)) + the input pipeline's
work beyond the one-device step's, (t_in(B/P) − t_in(b))/cores, on the CPU backend (t_in:
the CPU seconds a process spends making a batch of that many rows, `probe.input_seconds`;
P processes; the cores this process runs on, which the step's own work keeps busy) + every
collective of the candidate's lowered program at its calibrated per-call cost
(`calibrate.CallCosts`);
then the candidates whose predicted T is close to the best are timed, and a measured step
time replaces the prediction in T. The measured ones judge the prediction:
|log(predicted/measured)|, reported next to the repetitions' own spread.

Checkpoint saves: a run that saves every `checkpoint_every` steps pays ⌊K/every⌋ saves
before its K-th step, each t_save (`probe.save_seconds` after the serial run: its steps
after a save while orbax writes in the background, less the same steps without one). The
same for every candidate of a config; it weighs more on those that need more steps.
"""
import dataclasses
import math

import numpy as np

from jaxpar.perfmodel import steps_model


def steps_at(k_b: float, b: float, b_noise: float, batch: float,
             through: tuple | None = None) -> float:
  """K(B) from K_b at batch b and B_noise (∞: perfect scaling). `through`: (B, K_B), the
  serial run at the larger batch B that reached the target, which B_noise's fit draws the
  model through (`planner.batch_fit`) — except where K_B is below perfect scaling's K_b·b/B
  (K fell faster than 1/B: the fit's B_noise is ∞), where K(B) = K_b·(b/B)^α between the two,
  α = ln(K_b/K_B)/ln(B/b), and perfect scaling from the nearer one outside them."""
  if not math.isfinite(b_noise):
    alpha = faster_exponent(k_b, b, through)
    if alpha is not None:
      big, k_big = through
      if batch >= big:
        return k_big * big / batch
      if batch > b:
        return k_b * (b / batch) ** alpha
    return k_b * b / batch
  return k_b * (1 + b_noise / batch) / (1 + b_noise / b)


def faster_exponent(k_b: float, b: float, through: tuple | None) -> float | None:
  """α = ln(K_b/K_B)/ln(B/b) > 1 where the run at the larger batch (`through`: (B, K_B))
  took fewer steps than perfect scaling from K_b — K fell faster than 1/B (`steps_at`) —
  else None."""
  if not through or through[1] >= k_b * b / through[0]:
    return None
  big, k_big = through
  return math.log(k_b / k_big) / math.log(big / b)


def noise_near_target(track: list, share: float = 1 / 3) -> tuple:
  """(B_noise, low, high) from the readings in the last `share` of the run (at least two,
  or all): the median and the range; (∞, ∞, ∞) where none is finite and positive (a
  reading is None, or NaN in plans written before, where |G|² was not estimable)."""
  values = [r['b_noise'] for r in track]
  tail = values[-max(2, math.ceil(len(values) * share)):]
  finite = [v for v in tail if v is not None and math.isfinite(v) and v > 0]
  if not finite:
    return math.inf, math.inf, math.inf
  return float(np.median(finite)), float(min(finite)), float(max(finite))


def steps(c, k_b: float, b: int, b_noise: float, methods: dict | None = None,
          through: tuple | None = None) -> float:
  """Candidate `c`'s K at the given B_noise: the batch model for the serial maths (`through`:
  `steps_at`'s), each other family from its run in `methods` ({family: {'K', 'batch'?,
  'period'?}}, the module docstring); a family not in `methods` as BN over all devices at
  its batch."""
  methods = methods or {}
  sync = steps_at(k_b, b, b_noise, c.batch, through)
  if c.family == 'async':
    return methods['async']['K'] if 'async' in methods else sync
  if c.bn == 'device' and 'bn_device' in methods:
    run = methods['bn_device']
    sync *= run['K'] / steps_at(k_b, b, b_noise, run['batch'], through)
  if c.family != 'local_sgd' or 'local_sgd' not in methods:
    return sync
  run = methods['local_sgd']  # with 'K_1' (`reference`): c is fitted there
  k_1 = steps(dataclasses.replace(c, period=0), k_b, b, b_noise, methods, through)
  return period_steps(run, c.period) * k_1 / run['K_1']


def period_steps(run: dict, period: int) -> float:
  """Local SGD's K at τ = `period` for its run's row (`run`: 'K_1', 'K' at 'period', and
  where measured a run at the smallest period, 'small'): the line through K_1 and the two
  measured runs, piece by piece; with one run, `steps_model.PERIOD` through K_1 and it. At
  the smallest period a run there that stopped short is a lower bound."""
  small = small_run(run)
  if small:
    return float(np.interp(period, [1, small['period'], run['period']],
                           [run['K_1'], small['K'], run['K']]))
  fitted = steps_model.PERIOD.fit([1, run['period']], [run['K_1'], run['K']])
  k = steps_model.PERIOD.predict(fitted, period)
  own = period_run(run, period)
  if own is not run and own['stopped'] != 'reached':  # the smallest period's, stopped short
    return max(k, own['K'])
  return k


def period_run(run: dict, period: int) -> dict:
  """The Local SGD run that a row at τ = `period` rests on, for choosing it: the run at the
  smallest period (`run['small']`, with the row's setting) up to that period, else the run
  at the largest. A row at τ = 2 whose own run reached the target is choosable though the
  run at τ = 8 stalled (VGG16E 32², 2 processes: τ = 2 reached in 348 steps, τ = 8 still
  on its plateau at 1,057)."""
  small = run.get('small')
  if small and small['period'] < run['period'] and period <= small['period']:
    return with_run(run, small)
  return run


def with_run(run: dict, small: dict) -> dict:
  """Local SGD's `run` with its run at the smallest period (`small`) in its place: the
  row's setting kept, the K, curve and seeds (`planner.seed_mean`) the smaller period's."""
  return {**{k: v for k, v in run.items() if k not in ('seeds', 'K_first', 'spread')},
          **small}


def small_run(run: dict) -> dict | None:
  """Local SGD's run at its smallest period (`run['small']`) where K(τ) rests on it: it
  reached the target at a period below the largest's; else None."""
  small = run.get('small')
  return (small if small and small['stopped'] == 'reached' and small['period'] < run['period']
          else None)


def each_run(methods: dict) -> list:
  """Every run of a plan's `methods` as (family, run): Local SGD's at its smallest period
  after its own, with its row's setting (batch) — for the logs and reports that list them."""
  runs = [(family, {k: v for k, v in run.items() if k != 'small'})
          for family, run in methods.items()]
  if 'small' in methods.get('local_sgd', {}):
    runs.append(('local_sgd', with_run(dict(runs)['local_sgd'], methods['local_sgd']['small'])))
  return runs


def reference(methods: dict, candidate, k_b: float, b: int, b_noise: float,
              through: tuple | None = None) -> dict:
  """`methods` with Local SGD's K_1 — the K of `candidate` (the local-sgd run's own) at
  τ = 1, sync-join with its BN grouping, at the B_noise the plan reads (`noise_near_target`'s
  median) — where its run was measured."""
  if 'local_sgd' not in methods:
    return methods
  k_1 = steps(dataclasses.replace(candidate, period=0), k_b, b, b_noise, methods, through)
  return {**methods, 'local_sgd': {**methods['local_sgd'], 'K_1': k_1}}


def anchor(own: dict, b: int) -> int:
  """The batch at which a row's K was measured, from which the batch model moves it: its
  Local SGD run's, else its BN-per-device run's (`own`: the families' runs it rests on,
  None where not run), else the serial run's b."""
  for family in ('local_sgd', 'bn_device'):
    if own.get(family) and 'batch' in own[family]:
      return own[family]['batch']
  return b


def seeds_range(spread: tuple, runs) -> tuple:
  """(low, high): the factors of K's range from seed to seed for a row resting on the
  families' `runs` (None: not measured; Local SGD's the run at the row's period,
  `period_run`): the widest of the serial seeds' `spread` and each run's own seeds'
  (`planner.seed_mean`) — a family's K is its own runs' mean, and its seeds' luck is not
  the serial run's."""
  lo, hi = spread
  for run in runs:
    if run and run.get('spread'):
      lo, hi = min(lo, run['spread'][0]), max(hi, run['spread'][1])
  return lo, hi


def choosable(row: dict) -> bool:
  """A row the plan may choose: its K modelled from what the plan measured (the serial
  maths, or a family's own run that reached the target: `rank`'s 'basis'), and its step
  one that the plan times or can time in phase 5 (Downpour on Ray's actors only where it
  was timed beside the serial run: otherwise ranked by its lower bound)."""
  return row.get('basis') is not None


def predicted_step(t_grad: float, overhead: float, comm: float, inputs: float = 0.0) -> float:
  """t_grad + the one-device step's other work at b (`overhead`) + the input pipeline's
  share beyond it at this step's batch (`inputs`, below 0 for a smaller batch) + the
  collectives (`comm`); the work beside the gradient is never below 0 (timing noise)."""
  return t_grad + max(max(overhead, 0.0) + inputs, 0.0) + comm


def program_step(t_grad: float, program: float, extra_comm: float, inputs: float) -> float:
  """A multi-device step whose program phase 3b timed (its real step at a small device
  batch less t_grad there, BatchNorm per device): t_grad + that program's measured time
  (the exchange, packing, update, conditionals — its collectives measured where the
  program makes them, not costed) + the collectives it did not make (`extra_comm`:
  BatchNorm's over devices, in the gradients' computation), at their calibrated cost + the
  input pipeline's share of this step's batch (`inputs`). The calibration of a large
  collective in a chain alone is a less faithful cost than the program's own time
  (ResNet34 32², 2 processes: the all-reduce program 72 ms in all, its collectives
  calibrated at 86). A program read below 0 (its step less t_grad, on a small network
  inside the timing noise) adds nothing."""
  return t_grad + max(program, 0.0) + max(extra_comm, 0.0) + max(inputs, 0.0)


def predict(candidates, steps, step_bound, cost, close: float, spent=lambda: False) -> list:
  """Rows ({'candidate', 't_predicted', 'collectives'}) for every candidate, costed in order
  of the bound T ≥ steps(c) · step_bound(c) (its step without collectives): `cost(row)` adds
  a row's collectives and predicted step time, unless the bound is already beyond `close` ×
  the best predicted T so far — such a row can be neither the choice nor among the timed
  ones, and keeps the bound ('pruned': 'bound', no collectives) until `cost` is called on it.
  Once `spent()` (the plan's budget), the rows not costed yet keep their bounds alike
  ('pruned': 'budget'); the first is always costed."""
  rows, best = [], math.inf
  for c in sorted(candidates, key=lambda c: steps(c) * step_bound(c)):
    row = {'candidate': c}
    if steps(c) * step_bound(c) > close * best:
      row.update(pruned='bound', collectives=None, t_predicted=step_bound(c))
    elif rows and spent():
      row.update(pruned='budget', collectives=None, t_predicted=step_bound(c))
    else:
      cost(row)
      best = min(best, steps(c) * row['t_predicted'])
    rows.append(row)
  return rows


def saves_before(k: float, saves: dict | None) -> int:
  """Checkpoints saved before step `k` by a run that saves every `saves['every']` steps."""
  return int(k // saves['every']) if saves and saves.get('every') else 0


def time_to_target(k: list, t_step: list, saves: dict | None) -> list:
  """T [mid, low, high] = K × t_step + ⌊K/every⌋ × t_save, for K and t_step [mid, low,
  high]; `saves` {'every': steps, 'seconds': t_save} or None (no saves)."""
  t_save = saves['seconds'] if saves else 0.0
  return [ki * ti + saves_before(ki, saves) * t_save for ki, ti in zip(k, t_step)]


def rank(rows: list, k_b: float, b: int, noise: tuple, saves: dict | None = None,
         spread: tuple = (1.0, 1.0), methods: dict | None = None,
         fitted: bool = False, beyond: tuple | None = None,
         through: tuple | None = None) -> list:
  """Adds to each row ({'candidate': Candidate, 't_predicted', 't_measured'?: [seconds]})
  its 'label', steps 'K' [mid, low, high] (`steps`; the range: B_noise's, widened by the
  seeds' `spread` of K_b, (low, high) as factors of it, or by its family's runs' own where
  wider: `seeds_range`), its 'basis' (the family whose
  measured K it rests on, None where it has none: `choosable`), step time 't_step' [mid,
  low, high] (measured if it was, else predicted), 'saves' (checkpoints before the K-th
  step, `saves`: {'every', 'seconds'}), 'T' [mid, low, high], 'T_own' (T's range without
  the seeds' spread: what `choose` compares), 'T_rounds' (T at each measured window, at
  each of B_noise's three readings: what `choose` pairs) and 'notes'; returns the rows
  by T, fastest first. `methods`: the families' runs (`planner.method_runs`), Local SGD's
  with its reference K_1 (`reference`); `fitted`: `noise` is the batch model's fit through
  two measured runs (`planner.batch_fit`), not the gradient noise scale's reading;
  `beyond`: (B, S), a run at batch B that stopped short of the target at step S
  (`planner.batch_bound`): rows of the serial maths at B or more take at least S steps, a
  lower bound, never chosen; `through`: (B, K_B), the run at B that reached it (`steps_at`)."""
  b_noise, low, high = noise
  methods = methods or {}
  for row in rows:
    c = row['candidate']
    row['label'] = c.label
    ks = [steps(c, k_b, b, x, methods, through) for x in (b_noise, low, high)]
    # The families whose runs the row's K rests on, each its run (Local SGD's at its period).
    own = {f: methods.get(f) for f in ('bn_device', 'local_sgd', 'async') if f == c.family
           or (f == 'bn_device' and c.bn == 'device' and c.devices > 1)}
    if own.get('local_sgd'):
      own['local_sgd'] = period_run(own['local_sgd'], c.period)
    lo, hi = seeds_range(spread, own.values())
    row['K'] = [ks[0], min(ks) * lo, max(ks) * hi]
    own_k = [ks[0], min(ks), max(ks)]  # without the seeds' spread: the tie rule's (`own_range`)
    short = beyond is not None and c.batch >= beyond[0] and c.family == 'sync'
    if short:
      row['K'] = [max(k, beyond[1]) for k in row['K']]
      own_k = [max(k, beyond[1]) for k in own_k]
      ks = [max(k, beyond[1]) for k in ks]
    if any(run and run['stopped'] != 'reached' for run in own.values()):
      # A run stopped short of the target bounds its K from below: no seed's spread under it.
      row['K'][1] = max(row['K'][1], min(ks))
    measured = row.get('t_measured')
    if measured:
      t = [float(np.median(measured)), float(min(measured)), float(max(measured))]
    else:
      t = [row['t_predicted']] * 3
    row['t_step'] = t
    row['saves'] = saves_before(row['K'][0], saves)
    row['T'] = time_to_target(row['K'], t, saves)
    row['T_own'] = time_to_target(own_k, t, saves)
    # Each window's T at each B_noise reading (b_noise, low, high): `choose` pairs them.
    row['T_rounds'] = [time_to_target(ks, [w] * 3, saves) for w in measured or []]
    notes, row['basis'] = [], 'sync'
    for family, run in own.items():
      if run is None:
        row['basis'] = None
        notes.append({'bn_device': 'BN per device changes the maths: K taken as with BN over '
                                   'all devices; ranked, never chosen',
                      'local_sgd': "Local SGD's period not measured: K taken as τ = 1's; "
                                   'ranked, never chosen',
                      'async': "Downpour's staleness not measured: K taken as the serial "
                               "maths'; ranked, never chosen"}[family])
      elif run['stopped'] != 'reached':
        row['basis'] = None
        at = f" at τ = {run['period']}" if family == 'local_sgd' else ''
        notes.append(f"K at least the {family} run's {run['K']:.0f} steps{at} (it stopped: "
                     f"{run['stopped']}); ranked, never chosen")
      elif row['basis'] is not None:
        row['basis'] = family
    if short:
      row['basis'] = None
      notes.append(f'K at least the {beyond[1]:.0f} steps a run at batch {beyond[0]} took '
                   'short of the target; ranked, never chosen')
    if c.family == 'async':
      if row['basis'] is not None:
        notes.append(f"K: updates at staleness {methods['async']['staleness']}, simulated")
      if c.backend == 'ray' and not measured:
        notes.append("Downpour on Ray's actors not timed: its step predicted without Ray's "
                     "own cost of a call (a lower bound); ranked, not chosen")
        row['basis'] = None
      elif c.backend == 'ray':
        notes.append("an update timed on Ray's actors, the driver a process of its own on "
                     "the host's cores")
    elif c.family == 'local_sgd' and row['basis'] is not None:
      run = methods['local_sgd']
      small = small_run(run)
      if small and run['stopped'] != 'reached':
        notes.append(f"K(τ) through K_1 {run['K_1']:.0f} and the run at τ = "
                     f"{small['period']} ({small['K']:.0f} steps); the run at τ = "
                     f"{run['period']} stopped ({run['stopped']}) at {run['K']:.0f}")
      elif small:
        notes.append(f"K(τ) through K_1 {run['K_1']:.0f} and the runs at τ = "
                     f"{small['period']} ({small['K']:.0f} steps) and {run['period']} "
                     f"({run['K']:.0f}), a line between each two")
      else:
        notes.append(f"K(τ) = K_1·(1 + c·(τ − 1)), K_1 {run['K_1']:.0f}, τ = "
                     f"{run['period']}: {run['K']:.0f} steps measured"
                     + (f" (τ = {run['small']['period']}'s run stopped: "
                        f"{run['small']['stopped']})" if 'small' in run else ''))
    if not math.isfinite(b_noise) and c.batch != b and c.family != 'async':
      notes.append(('K through the two measured runs, falling faster than 1/B'
                    if faster_exponent(k_b, b, through) is not None
                    else 'B_noise ∞ through the two measured runs: K at perfect scaling')
                   if fitted
                   else 'B_noise not measurable: K at perfect scaling (optimistic)')
    elif not fitted and beyond is None and c.batch != anchor(own, b) and c.family != 'async':
      # No run at a larger batch pinned the curve (the budget spent before it, or none
      # larger than b): K moved by the noise scale's reading alone from the batch of the run
      # it rests on. ResNet34 16² within 420 s: K 79 at 64 from BN per device's run at 32
      # and B_noise 794 (its readings 406–655,211); trained, the row had not reached the
      # target at step 140.
      notes.append(f'K at batch {c.batch} from the gradient noise scale alone (no run at a '
                   'larger batch measured it)')
    if row.get('pruned') == 'budget':
      notes.append('collectives not costed: the budget was spent; T is at least this bound')
    elif row.get('pruned'):
      notes.append('collectives not costed: T is at least this bound, beyond the close ones')
    elif not measured and c.backend != 'ray':
      notes.append('step time predicted, not measured')
    if row.get('t_grad_estimated') and not measured:
      notes.append(f't_grad at b={c.device_batch} on {c.devices} devices scaled from the '
                   'nearest measured one: the budget was spent')
    row['notes'] = notes
  return sorted(rows, key=lambda r: r['T'][0])


def spend(c) -> tuple:
  """What candidate `c` spends, to compare: its devices, then whether BatchNorm's statistics
  are sent across them (over all devices, where there are several)."""
  return c.devices, c.devices > 1 and c.bn == 'all'


def cheaper(c, than) -> bool:
  """Whether candidate `c` spends less than `than` (`spend`): fewer devices, or as many
  without BatchNorm's statistics sent across them."""
  return spend(c) < spend(than)


def own_range(row: dict) -> list:
  """A row's T range as `choose` compares it: without the seeds' spread of K ('T_own',
  where `rank` made it; 'T' otherwise)."""
  return row.get('T_own', row['T'])


def rounds(row: dict, leader: dict) -> int:
  """How many rounds phase 5 timed `row` and `leader` in together: the windows both have
  where they share 'timed_in' (window w of each taken in round w; two rows timed in more
  rounds after the rest — `planner.choose_measured` — share the first ones with the
  rest), else 0."""
  if row.get('timed_in') is None or row.get('timed_in') != leader.get('timed_in'):
    return 0
  return min(len(row.get('T_rounds') or ()), len(leader.get('T_rounds') or ()))


def paired(row: dict, leader: dict) -> list | None:
  """[low, high]: `row`'s time to the target over `leader`'s where phase 5 timed both in
  the same rounds (`rounds`): at each of B_noise's readings (which K of every row
  shares), the ratio of the two rows' T round by round, the middle half of those ratios
  (numpy's quartiles: a round that a host pause slowed moves them half as far as it
  moves the extremes); the lowest quartile and the highest of the readings. None where
  the two were not timed together."""
  n = rounds(row, leader)
  if not n:
    return None
  mine, theirs = row['T_rounds'][:n], leader['T_rounds'][:n]
  quartiles = [np.percentile([a[x] / b[x] for a, b in zip(mine, theirs)], [25, 75])
               for x in range(len(mine[0]))]
  return [float(min(q[0] for q in quartiles)), float(max(q[1] for q in quartiles))]


def tied(row: dict, leader: dict) -> bool:
  """Whether `row`'s time to the target may be no longer than `leader`'s within the plan's
  own uncertainty: timed in the same rounds, its ratio to the leader's reaches 1
  (`paired`); else its range reaches into the leader's (`own_range`: its low end at or
  below the leader's high end)."""
  ratio = paired(row, leader)
  if ratio is not None:
    return ratio[0] <= 1.0
  return own_range(row)[1] <= own_range(leader)[2]


def tied_rows(ranked: list, leader: dict) -> list:
  """The rows `choose` may take over `leader`: costed rows it may choose (`choosable`)
  that spend less (`cheaper`) and are `tied` with it."""
  return [r for r in ranked if choosable(r) and not r.get('pruned')
          and cheaper(r['candidate'], leader['candidate']) and tied(r, leader)]


def dominated(row: dict, rows: list) -> bool:
  """Whether another of `rows` spends no more than `row` (`spend`) and is predicted no
  slower, one of the two strictly: a row the plan would never take over it."""
  mine = (spend(row['candidate']), row['T'][0])
  return any(r is not row and spend(r['candidate']) <= mine[0] and r['T'][0] <= mine[1]
             and (spend(r['candidate']), r['T'][0]) != mine for r in rows)


def choose(ranked: list, leader: dict) -> tuple:
  """The choice and why: `leader` (the fastest row the plan may choose) — unless a cheaper
  row (`cheaper`: fewer devices, or no cross-device BatchNorm) that the plan may choose
  (`choosable`), costed, is `tied` with it: the difference is inside the plan's own
  uncertainty, and what the leader would spend buys nothing certain.

  Rows timed in the same rounds of phase 5 are compared round by round (`paired`): a host
  whose speed drifts or pauses moves both rows' windows of a round alike, and what is
  left is the difference itself (ResNet34 32², 2 processes: Local SGD τ = 8's windows of
  108, 112 and 126 ms a step made a range that swallowed its 15 % win over one device,
  whose 77–81 ms were timed apart, before the rounds). Rows not timed together are
  compared by their ranges, leaving out the seeds' spread of K (`own_range`): it scales
  every row's K alike — a seed that needs more steps on one device needs more on two
  (ResNet34 32², loss 0.5, 3 seeds: one device 192, 157, 165 steps, Local SGD τ = 8 on 2
  processes 112, 95, 108, the same seed fastest for both) — so it cannot tell two rows
  apart; with it, a row measured faster on every seed (9.7 s against 11.3 s) lost to the
  tie. What is left: each row's B_noise range and its step's measured spread.

  Only rows no other costed row beats on both counts are taken (not `dominated`: spending
  no more and predicted no slower): a tied row behind a cheaper untied one is not, and
  the untied row is not tied — the tie reaches no row that is not itself tied with the
  leader (else a wide range behind it — BN per device's K from its family's seeds — would
  take one device whose own range lies wholly above the leader's). Of those tied, the one
  that spends least (`spend`), the fastest of equals; so every row ranked ahead of the
  choice spends more. The reason names the rows, the margin and the ranges or
  ratios. Returns (row, reason; '' for the leader)."""
  costed = [r for r in ranked if choosable(r) and not r.get('pruned')]
  close = [r for r in tied_rows(ranked, leader) if not dominated(r, costed)]
  if not close:
    return leader, ''
  row = min(close, key=lambda r: (spend(r['candidate']), r['T'][0]))
  n, m = leader['candidate'].devices, row['candidate'].devices
  spent = (f"{m} device{'s' if m > 1 else ''} instead of {n}" if m < n
           else 'BatchNorm per device instead of over all devices')
  margin = row['T'][0] / leader['T'][0] - 1
  mine, theirs = own_range(row), own_range(leader)
  shared = "; without the seeds' spread, which both share" if 'T_own' in leader else ''
  ratio = paired(row, leader)
  if ratio is not None:
    overlap = (f"timed in the same {rounds(row, leader)} rounds, its time to the target "
               f"came to {ratio[0]:.2f}–{ratio[1]:.2f}× the leader's (the middle half of "
               f"the rounds)")
  else:
    overlap = 'the ranges overlap'
  return row, (f"{row['label']} chosen over {leader['label']}: {spent}, {margin:+.0%} "
               f"predicted time to the target ({row['T'][0]:.2f} s, range {mine[1]:.2f}–"
               f"{mine[2]:.2f}, against {leader['T'][0]:.2f} s, {theirs[1]:.2f}–"
               f"{theirs[2]:.2f}{shared}): {overlap}, so "
               + ('the extra devices buy' if m < n else "BatchNorm's exchange buys")
               + ' no certain gain')


def table(rows: list, choice: int = 1) -> str:
  """The ranked rows (`rank`'s, or a plan file's) as a Markdown table, the choice's rank
  (1-based) marked."""
  lines = ['| rank | candidate | K steps (range) | step ms: predicted / measured | '
           'time to target s (range) | notes |', '|---:|---|---|---|---|---|']
  for i, r in enumerate(rows, 1):
    measured = (f"{r['t_step'][0] * 1e3:.2f} ({r['t_step'][1] * 1e3:.2f}–"
                f"{r['t_step'][2] * 1e3:.2f})" if r.get('t_measured') else '—')
    lines.append(f"| {i}{' (choice)' if i == choice else ''} | {r['label']} | "
                 f"{r['K'][0]:.0f} ({r['K'][1]:.0f}–{r['K'][2]:.0f}) | "
                 f"{r['t_predicted'] * 1e3:.2f} / {measured} | "
                 f"{r['T'][0]:.2f} ({r['T'][1]:.2f}–{r['T'][2]:.2f}) | "
                 f"{'; '.join(r['notes'])} |")
  return '\n'.join(lines)
