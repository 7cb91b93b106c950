"""The plan: measure briefly, predict every candidate's time to the target, time the close
ones, choose — and apply the choice to a config (`scheme='auto'`, `plan.file`).

  1. serial run   one device at b = per_device_batch to the target: K_b, t_step(1), and
                  B_noise near the target (`probe.serial_run`; its metric within
                  `eval_share` of its time, a subset's reading at the target read
                  again on more of the split); again at `plan.seeds` − 1 further seeds
                  (`other_seeds`): K_b their mean, K's range widened by their spread. A run
                  that stops short (max_steps, a budget) extrapolates K_b
                  (`steps_model.extrapolate`), said so; one on its initial plateau or
                  stalled is one line (`steps_of`). Then once at the largest batch a
                  candidate of the serial maths computes (`large_run`): the batch model
                  through both points (`batch_fit`). t_grad and the calls' costs of an
                  earlier plan here are reused (`plan/cache.py`).
  1b. methods     each family of `plan.methods` to the target from the same weights:
                  Downpour simulated at staleness N − 1 (`async_run`, with the serial
                  run), BN per device and Local SGD at the largest and smallest period as
                  their candidates on the run's devices (`method_runs`), each again at
                  the further seeds, K their mean (`seed_mean`); `rank.steps`.
  2. t_grad       one device, every device batch a candidate computes; t_in, the input
                  pipeline's CPU a batch, at every batch a process makes
                  (`probe.input_seconds`).
  3. calls        each collective kind's per-call cost on two of the devices
                  (`call_timing.time_calls`, 4 KB and the network's weights).
  3b. work        each synchronous program on several devices: its real step at a small
                  device batch less t_grad there, timed in rounds (`strategy_work`): what
                  its strategy does beside the gradients (the exchange, packing, the
                  update, conditionals), its rows' step beside t_grad
                  (`rank.program_step`).
  4. predict      each candidate's step from its lowered program (`rank`), K(B) from the
                  batch model, T = K·t_step + the checkpoint saves before step K (each
                  timed after the serial run: `probe.save_seconds`); past a budget the
                  rows not costed yet keep their bounds (`rank.predict`).
  5. measure      the candidates within `close` of the best predicted T (at most
                  `measure_top`) trained for `measure_windows` windows of `measure_steps`
                  steps on the real input, as the run will (`probe.step_call`), in rounds
                  (a window of each in turn); re-ranked with the measured times. The
                  choice: the fastest, or by the tie rule a row that spends less (fewer
                  devices, or no cross-device BatchNorm) whose time reaches into its —
                  round by round where both were timed in the same rounds, up to
                  `tie_windows` of them where the tie rests on fewer
                  (`rank.choose`, `tie_rule`, `choose_measured`).

In one process everything runs on its devices (real accelerators or emulated CPU devices,
`mesh.emulate_cpu_devices`). Launched as several processes, as their training will be, every
process measures: the one-device work (1, t_grad on one device, and the one-device
candidates' steps) in a process of its own on process 0's cores (`one_device_in_child`),
which stays open so that phase 5 times the one-device candidates in the same rounds as the
others (`OneDeviceWindows`), the rest on all devices together, each decision on process 0's
numbers (`_Agree`); the run then reads the plan (`plan.file`).
"""
import collections
import contextlib
import dataclasses
import datetime
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
from absl import logging

from jaxpar import config as config_lib
from jaxpar.config import with_overrides
from jaxpar import user_cache
from jaxpar.perfmodel import calibrate, steps_model
from jaxpar.plan import cache as plan_cache
from jaxpar.plan import call_timing, candidates, probe, rank

PLAN_FILE = 'plan.json'
OUTCOME_FILE = 'plan_outcome.json'  # scheme=auto: the time to the target, measured


def target_of(cfg) -> probe.Target:
  """The config's target (`plan.target_loss` or `plan.target_accuracy`), checked: exactly
  one, in range."""
  loss, accuracy = cfg.plan.target_loss, cfg.plan.target_accuracy
  if bool(loss) == bool(accuracy):
    raise config_lib.ConfigError(
        f'config.plan.target_loss={loss!r}, config.plan.target_accuracy={accuracy!r}: set '
        f'exactly one (a training-set loss such as 0.3, or a test top-1 such as 0.9)')
  if loss and not (isinstance(loss, (int, float)) and loss > 0):
    raise config_lib.ConfigError(f'config.plan.target_loss={loss!r} is invalid: a positive '
                                 f'training-set loss, e.g. 0.3')
  if accuracy and not (isinstance(accuracy, (int, float)) and 0 < accuracy < 1):
    raise config_lib.ConfigError(f'config.plan.target_accuracy={accuracy!r} is invalid: a '
                                 f'test top-1 between 0 and 1, e.g. 0.9')
  return probe.Target('loss', loss) if loss else probe.Target('accuracy', accuracy)


def check(cfg) -> probe.Target:
  """The plan's fields, one line each, before anything compiles."""
  p = cfg.plan
  if not isinstance(p.budget_s, (int, float)) or p.budget_s < 0:
    raise config_lib.ConfigError(f'config.plan.budget_s={p.budget_s!r} is invalid: a positive '
                                 f'number of seconds, e.g. 600, or 0 (bounded by steps)')
  if not isinstance(p.eval_share, (int, float)) or not 0 <= p.eval_share <= 1:
    raise config_lib.ConfigError(f'config.plan.eval_share={p.eval_share!r} is invalid: the '
                                 f"share of the serial run's time its evaluations may take, "
                                 f'e.g. 0.1 (0: the whole split every time)')
  if not isinstance(p.close, (int, float)) or p.close < 1:
    raise config_lib.ConfigError(f'config.plan.close={p.close!r} is invalid: a factor of at '
                                 f'least 1 on the best predicted time, e.g. 2')
  for field in ('eval_every', 'max_steps', 'seeds', 'measure_top', 'measure_steps',
                'measure_windows', 'tie_windows'):
    if not isinstance(p[field], int) or p[field] < 1:
      raise config_lib.ConfigError(f'config.plan.{field}={p[field]!r} is invalid: a positive '
                                   f'integer')
  unknown = [m for m in p.methods if m not in candidates.METHODS]
  if unknown:
    raise config_lib.ConfigError(f'config.plan.methods={tuple(p.methods)!r}: {unknown} unknown; '
                                 f'choose from {tuple(candidates.METHODS)} (or () for none)')
  if not p.periods or any(not isinstance(t, int) or t < 2 for t in p.periods):
    raise config_lib.ConfigError(f'config.plan.periods={tuple(p.periods)!r} is invalid: Local '
                                 f'SGD periods τ of 2 or more, e.g. (2, 4, 8) (τ = 1 is '
                                 f'synchronous SGD)')
  if p.noise_batches != 0 and (not isinstance(p.noise_batches, int) or p.noise_batches < 2):
    raise config_lib.ConfigError(f'config.plan.noise_batches={p.noise_batches!r} is invalid: '
                                 f'2 or more gradients per reading of B_noise (0: none)')
  return target_of(cfg)


# =============================================================================== making a plan
def make(cfg, log=logging.info) -> dict:
  """Measures, predicts and ranks (see the module docstring); returns the plan as JSON-ready
  dict, its 'choice' the overrides of the fastest candidate."""
  planning = _Planning(cfg, log)
  planning.serial_runs()      # 1
  planning.method_runs()      # 1b
  planning.gradients()        # 2
  planning.calls()            # 3
  planning.work()             # 3b
  planning.predict()          # 4
  planning.measure()          # 5
  return planning.plan()


class _Planning:
  """One plan in the making: the phases of the module docstring in order, each a method
  that reads what the phases before it measured (attributes) and adds its own."""

  def __init__(self, cfg, log):
    from jaxpar import validation
    from jaxpar.data import sources
    self.cfg, self.log = cfg, log
    self.target = check(cfg)
    self.p = p = cfg.plan
    self.started = time.perf_counter()
    # budget_s = 0: bounded by steps (the serial runs' max_steps, phase 5's windows), so the
    # time follows what a step and an evaluation of this network cost.
    self.deadline = self.started + p.budget_s if p.budget_s else math.inf
    self.agree = _Agree()
    self.processes = jax.process_count()
    self.phases, self._marked = {}, self.started
    self.programs = {}  # {work_key: phase 3b's row}: each multi-device program timed
    self.alone_windows = None  # process 0 of several: the one-device process, left open
    self.source = sources.open_source(cfg.dataset)
    self.meta = self.source.meta
    # The devices the run would use (its mesh), of those this process sees; across processes
    # the run's mesh is all of them (and one device is a run of one process).
    self.available = min(config_lib.num_devices(cfg), jax.device_count())
    self.found, self.excluded = candidates.enumerate_candidates(
        cfg, self.available, jax.local_device_count() if self.processes > 1 else None)
    self.found, refused = runnable(cfg, self.found)
    self.excluded += refused
    self.b = cfg.per_device_batch
    log(f'Plan: {len(self.found)} candidates on up to {self.available} '
        f'{jax.default_backend()} devices ({_setting(self.available)}) to '
        f'{self.target.describe()}, {_budget(p)}; excluded: '
        f"{', '.join(e['method'] for e in self.excluded)}.")
    for reason, labels in itertools.groupby(refused, key=lambda e: e['reason']):
      log(f"Plan: not ranked, their runs cannot take this config: "
          f"{', '.join(e['method'] for e in labels)} ({reason}).")
    # The serial maths on one device, for the serial runs and every measurement after them.
    self.one = with_overrides(cfg, {**probe.one_device_overrides(cfg, self.b),
                                    'total_steps': p.max_steps})
    validation.validate(self.one)
    # What an earlier plan of this network measured on this machine, with these versions
    # (`plan/cache.py`): t_grad, and in one process the calls' costs.
    self.keyed = plan_cache.key(self.one, probe.machine(), probe.versions(),
                                jax.default_backend(), _setting(self.available)) \
        if p.cache else None
    self.entry = self.agree(plan_cache.load(user_cache.folder('plan'), self.keyed)
                            if self.keyed else {})
    self.reused = plan_cache.t_grad_of(self.entry)
    if self.entry:
      log(f"Plan: reusing t_grad at {len(self.reused)} device batches"
          + (" and the calls' costs" if self.entry.get('calls') and self.processes == 1
             else '')
          + f" measured {self.entry['created']} (same machine, versions and network: "
          f"config.plan.cache).")

  def mark(self, phase):
    """The seconds since the last phase ended: where planning went."""
    now = time.perf_counter()
    self.phases[phase], self._marked = now - self._marked, now

  def since(self) -> str:
    return f'{time.perf_counter() - self.started:.0f} s'

  def past_deadline(self) -> bool:
    """Process 0's clock decides, as it decides what is costed and timed."""
    return self.agree(time.perf_counter() > self.deadline)

  def past_preparing(self, ahead: float = 0.0) -> bool:
    """Phases 2-4 stop short of the deadline by what timing one candidate takes in phase 5
    (compiling its step, as the serial run's first step did, and its windows), which phase 5
    does even past it: so a plan keeps to its budget. `ahead`: the seconds the next piece of
    work is expected to take (phase 3b: the last program's), not started past it either."""
    return self.agree(time.perf_counter() + ahead > self.deadline - self.reserve)

  # ------------------------------------------------------------- 1. the serial run
  def serial_runs(self):
    """With t_grad at every one-device batch; across processes in a process of its own on
    process 0's cores (`one_device`), which also times the one-device candidates' steps."""
    from jaxpar import multihost
    p, b, one, log = self.p, self.b, self.one, self.log
    serial_deadline = self.started + p.budget_s / 2 if p.budget_s else math.inf
    log(f'Plan: serial run at batch {b} on one device (B_noise from {p.noise_batches} '
        f'gradients every {p.eval_every} steps).')
    singles = fresh_singles({c.device_batch for c in self.found if c.devices == 1}, b,
                            self.reused)
    # Across processes a one-device run is a process of its own, and so is Downpour on
    # Ray's actors (its driver): both timed in the process that makes the serial run.
    self.timed_alone = ([c for c in self.found if c.devices == 1 or c.backend == 'ray']
                        if self.processes > 1 else [])
    # The batch model's second point: the largest batch a candidate of the serial maths takes.
    large = max(c.batch for c in self.found if c.exact)
    # The network's initial weights, made once: every state and gradient below starts there.
    self.variables = probe.initial_variables(one, self.meta)
    if self.processes > 1:
      def in_child():
        measured, self.alone_windows = one_device_in_child(
            one, self.target, singles, self.timed_alone, serial_deadline, log,
            self.available, large)
        return measured
      self.alone = multihost.from_process_0('plan/one-device', in_child)
    else:
      self.alone = measure_one_device(one, self.source, self.meta, self.target, singles, [],
                                      serial_deadline, log, self.variables, self.available,
                                      large)
    self.serial = serial = self.alone['serial']
    k_b, self.how = steps_of(serial, self.target)
    self.check_k = judged(serial, self.target, self.how)
    if self.check_k:
      log(f"Plan: K_b extrapolated {self.check_k['ratio']:.1f}× beyond the serial run; "
          + ('trusted: ' if self.check_k['trusted'] else 'beyond what the plan can predict: ')
          + self.check_k['why'] + '.')
    reached = self.how == 'reached'
    self.k_b, self.spread = seed_spread({**serial, 'K': k_b}) if reached else (k_b, (1.0, 1.0))
    if serial.get('seeds'):
      log(f"Plan: K at seeds {one.seed}, " + ', '.join(str(s['seed']) for s in serial['seeds'])
          + ': ' + ', '.join([f"{serial['K']:.0f}"] + [said_k(s) for s in serial['seeds']])
          + f' steps: K_b = {self.k_b:.0f} ({self.spread[0] * self.k_b:.0f}–'
          f'{self.spread[1] * self.k_b:.0f}).')
    self.noise = (rank.noise_near_target(serial['noise']) if serial['noise']
                  else (math.inf,) * 3)
    self._batch_model(reached)
    self.mark('serial')

  def _batch_model(self, reached: bool):
    """The batch model's second point, where the run at the large batch gives one."""
    noise, large = self.noise, self.alone.get('large')
    self.fitted = batch_fit(self.k_b, self.b, large) if reached else None
    self.through = None
    if self.fitted is not None:  # two measured points: the model through both, not the noise scale
      self.through = (large['batch'], large['K'])
      alpha = rank.faster_exponent(self.k_b, self.b, self.through)
      self.log(f"Plan: K at batch {large['batch']}: {large['K']:.0f} steps; the batch "
               f'model through it and K_b: ' + (
                   f'B_noise = {self.fitted:.1f}' if alpha is None else
                   f'K fell faster than 1/B, K(B) = K_b·(b/B)^α with α = {alpha:.2f}')
               + f' (the gradient noise scale read {noise[0]:.1f}).')
      noise = (self.fitted,) * 3
    self.short = batch_bound(self.k_b, self.b, large) if reached else None
    if self.short:  # a run at B short of the target: K(B) at least its steps, B_noise at most so
      self.log(f"Plan: the run at batch {self.short[1]} stopped ({large['stopped']}) at step "
               f"{self.short[2]:.0f} short of the target: K there at least that, B_noise at "
               f"most {self.short[0]:.1f} (the gradient noise scale read {noise[0]:.1f}).")
      noise = tuple(min(x, self.short[0]) for x in noise)
    self.noise = noise

  # ------------------------------------------------------------- 1b. the methods' runs
  def method_runs(self):
    """Downpour's steps simulated with the serial run; BN per device and Local SGD each a
    run of its candidate on the run's devices (`method_runs`)."""
    p, serial, log = self.p, self.serial, self.log
    methods = {'async': self.alone['async']} if self.alone.get('async') else {}
    # Within three quarters of a budget; across processes process 0's clock decides.
    methods_deadline = self.started + 0.75 * p.budget_s if p.budget_s else math.inf
    methods.update(method_runs(self.one, self.source, self.target,
                               {**serial, 'K': serial['K'] and self.k_b}, self.found,
                               lambda: self.agree(time.perf_counter() > methods_deadline), log,
                               self.variables, self.agree))
    self.mark('methods')
    local = next((c for c in self.found if c.family == 'local_sgd'), None)
    if local:
      methods = rank.reference(methods, local, self.k_b, self.b, self.noise[0], self.through)
    if methods:
      log(f"Plan [{self.since()}]: the methods' steps: " + ', '.join(
          family + (f" τ={run['period']}" if 'period' in run else '') + f" {run['K']:.0f}"
          + said_seeds(run)
          + ('' if run['stopped'] == 'reached' else f" (at least: {run['stopped']})")
          for family, run in rank.each_run(methods)) + '.')
    self.methods = methods
    self.t_one = (float(np.median(serial['step_seconds'])) if serial['step_seconds']
                  else None)
    self.saves = {'every': self.cfg.checkpoint_every, 'seconds': serial['save_seconds']}
    log(f'Plan [{self.since()}]: K_b = {self.k_b:.0f} steps at b = {self.b} ({self.how}), '
        f'B_noise = {self.noise[0]:.1f} ({self.noise[1]:.1f}–{self.noise[2]:.1f}), one-device '
        f"step {1e3 * (self.t_one or 0):.2f} ms, a checkpoint save "
        f"{self.saves['seconds']:.2f} s (one every {self.saves['every']} steps).")
    self.reserve = (serial.get('first_step_s') or 0.0) + (
        p.measure_windows * p.measure_steps + 2) * (self.t_one or 0.0)

  # ------------------------------------------------------------- 2. t_grad per device batch
  def gradients(self):
    """On N devices at once where a candidate computes on N (emulated CPU devices share
    cores; across processes each process computes on its own devices at once)."""
    from jaxpar import multihost
    b, log = self.b, self.log
    needed = {(c.device_batch, c.devices) for c in self.found} | {(b, 1)}
    fresh = {(int(batch), 1): s for batch, s in self.alone['t_grad'].items()}

    def timed(key):
      call = probe.gradient_call(with_overrides(self.one, {'per_device_batch': key[0]}),
                                 self.meta, key[0], key[1] // self.processes, self.variables)
      multihost.barrier(f'plan/t_grad/{key}')
      return self.agree(float(np.median(call_timing.timed(call, self.p.measure_steps, 2))))

    for key in again_on_several(needed, self.reused):
      if not self.past_preparing():
        fresh[key] = timed(key)
    reused, speeds = at_host_speed(self.reused, fresh, b)
    self.host_speed, self.host_speeds = speeds.get(1, 1.0), speeds
    if any(f != 1.0 for f in speeds.values()):
      log("Plan: the reused t_grad at the host's speed now: " + ', '.join(
          f'on {n} device{"s" if n > 1 else ""} × {f:.3f}' for n, f in sorted(speeds.items()))
          + f' (t_grad at b={b} on one device {fresh[b, 1] * 1e3:.2f} ms now, '
          f'{self.reused[b, 1] * 1e3:.2f} ms when they were measured).')
    t_grad = {k: v for k, v in reused.items() if k in needed}
    t_grad.update(fresh)
    self.estimated = set()  # past the budget: t_grad scaled from the nearest measured one
    for key in sorted(k for k in needed if k[1] > 1 and k not in t_grad):
      if self.past_preparing():
        self.estimated.add(key)
        continue
      t_grad[key] = timed(key)
    self.cores = (len(os.sched_getaffinity(0)) if jax.default_backend() == 'cpu' else None)
    self.measured_t_grad = dict(t_grad)
    for key in self.estimated:
      t_grad[key] = estimate_t_grad(self.measured_t_grad, key, self.processes, self.cores)
    if self.estimated:
      log(f'Plan: the budget was spent: t_grad at {len(self.estimated)} device batches scaled '
          f'from the nearest measured one (' + ', '.join(
              f'b={k[0]} on {k[1]}' for k in sorted(self.estimated)) + ').')
    self.t_grad = t_grad
    self.overhead = (self.t_one - t_grad[b, 1]) if self.t_one else 0.0
    log(f'Plan [{self.since()}]: t_grad ' + ', '.join(
        f'b={k[0]} on {k[1]}: {v * 1e3:.2f} ms' for k, v in t_grad.items())
        + f'; non-gradient work of the one-device step {self.overhead * 1e3:.2f} ms'
        + negative_overhead(self.overhead, self.t_one))
    self._input_seconds()
    self.mark('t_grad')

  def _input_seconds(self):
    """The input pipeline's share of a step grows with the batch this process makes: t_in at
    each such batch (a step at B/P rows pays t_in(B/P) − t_in(b) beyond the one-device step
    at b), on the CPU backend spread over this process's cores (`inputs_of`); not on an
    accelerator, whose steps the host's batch-making overlaps."""
    self.t_in = {}
    if self.cores:
      self.t_in = {n: self.agree(probe.input_seconds(self.one, self.source, n))
                   for n in sorted({self.b} | {_rows(c, self.processes) for c in self.found})}
      self.log(f'Plan [{self.since()}]: input pipeline, CPU a batch: '
               + ', '.join(f'{n} rows {v * 1e3:.2f} ms' for n, v in self.t_in.items())
               + f' (over {self.cores} cores: a step beside it pays its share).')
    else:
      self.log('Plan: the input pipeline not timed: the host makes batches while the '
               'accelerator computes.')

  def inputs_of(self, c, whole: bool = False) -> float:
    """The input pipeline's share of c's step beyond the one-device step's at b (whose
    measured step holds t_in(b)), or all of it (`whole`: a step built from parts that hold
    none, `rank.program_step`)."""
    if not self.cores:
      return 0.0
    return (self.t_in[_rows(c, self.processes)] - (0.0 if whole else self.t_in[self.b])) \
        / self.cores

  # ------------------------------------------------------------- 3. the collectives' costs
  def calls(self):
    from jaxpar import build, multihost
    self.costs, self.calls_timed, self.param_bytes, self.partial_calls = None, None, 0, False
    if self.processes > 1 and self.cfg.distributed.collective_threads == 'idle':
      # The one-device process ran on process 0's cores: gloo's loop there went back to
      # normal priority (`multihost.IdleGlooLoops`), for 30 s or more after it ended. Idle
      # again before the calls are timed, as in the run: else a small call is calibrated
      # waiting for timer ticks (a 4 KB all-reduce 2.3 ms a call instead of 0.2-0.3, and
      # every 2-process SqueezeNet-BN candidate predicted too slow to be timed).
      if not multihost.idle_gloo_loops_again():
        self.log("Plan: gloo's TCP loop is not at idle priority (another process keeps its "
                 'core busy): small collectives are timed waiting for a timer tick.')
    if self.available > 1:
      from jaxpar.collectives import nbytes
      from jaxpar.mesh import make_mesh
      one, meta = self.one, self.meta
      params = build.abstract_variables(one, build.model(
          one, meta['num_classes'], meta['channels'],
          make_mesh((1,), ('data',), jax.devices()[:1])), meta['channels'])['params']
      self.param_bytes = nbytes(params)
      sizes = sorted({4096, max(4096, self.param_bytes // 8 * 8)})
      # Across processes the calls are the link's, measured every time.
      calls = self.entry.get('calls') if self.processes == 1 else None
      self.partial_calls = not calls and self.past_preparing()
      if self.partial_calls:  # the kinds every other one can be costed as
        self.log('Plan: the budget was spent: the calls calibrated for all-reduce and permute '
                 'only (the other kinds costed as all-reduce).')
        calls = self.agree(call_timing.time_calls(sizes, repeats=3, warmup=1,
                                                  ops=call_timing.LEAST))
      self.calls_timed = calls or self.agree(call_timing.time_calls(sizes, repeats=5,
                                                                    warmup=1))
      self.costs = calibrate.from_calls(self.calls_timed)
      self.log(f'Plan [{self.since()}]: per-call costs ' + ', '.join(
          f"{kind} {pts[-1][0]:,} B {pts[-1][1] * 1e3:.3f} ms"
          for kind, pts in self.costs.points.items()))
    self.mark('calls')

  # ------------------------------------------------------------- 3b. the strategies' own work
  def work(self):
    """What a candidate's program does beside its gradients — the exchange, packing and
    unpacking its buffers, the update on them, conditionals, per-device copies — is not the
    one-device step's: its real step at a small device batch less t_grad there, timed in
    rounds (`strategy_work`), is its rows' step beside t_grad (`rank.program_step`)."""
    self.work_rows = strategy_work(self.one, self.found, self.meta, self.variables,
                                   self.costs, self.p, self.past_preparing, self.agree, self.log)
    self.programs = {(r['server'], r['devices'], r['period']): r for r in self.work_rows}
    if self.work_rows:
      self.log(f"Plan [{self.since()}]: the strategies' programs beside their gradients, "
               f'each its step at b={PROGRAM_BATCH} a device less t_grad there (their '
               'collectives calibrated at): ' + ', '.join(
                   f"{r['server']} N={r['devices']}" + (f" τ={r['period']}" if r['period']
                                                        else '')
                   + f" {r['program_s'] * 1e3:.2f} ms ({r['collectives_s'] * 1e3:.2f})"
                   for r in self.work_rows) + '.')
    self.mark('work')
    if self.keyed and jax.process_index() == 0:
      plan_cache.store(user_cache.folder('plan'), self.keyed, self.measured_t_grad,
                       self.calls_timed if self.processes == 1 and not self.partial_calls
                       else None)

  # ------------------------------------------------------------- 4. predict every candidate
  def predict(self):
    """Lowering a candidate's step to read its collectives takes seconds; its time to the
    target without them — K(B)·(t_grad + the step's other work) — is known already:
    `rank.predict` lowers and costs in that order, leaving a candidate whose bound is beyond
    `close` × the best so far at its bound (costed below only if measuring brings the field
    within it). Candidates that differ only in the batch send the same collectives
    (`Candidate.exchange`): one of each is lowered (the 2-device SqueezeNet plan: 6 programs,
    not 12)."""
    self.calls_of, self.sent = {}, {}
    self.alone_rows = {c: self.alone['windows'][c.label] for c in self.timed_alone
                       if c.label in self.alone['windows']}
    rows = rank.predict(self.found,
                        lambda c: rank.steps(c, self.k_b, self.b, self.noise[0], self.methods,
                                             self.through),
                        self.bound, self.cost, self.p.close, self.past_preparing)
    for row in rows:
      c = row['candidate']
      if c in self.alone_rows:  # timed already: costed (no collectives)
        self.cost(row)
        row['t_measured'] = self.alone_rows[c]
        if c.label in self.alone['served']:  # its loop left open: timed again in phase 5
          self.calls_of[c] = AloneCall(self.alone_windows, c.label)
      if (row['candidate'].device_batch, row['candidate'].devices) in self.estimated:
        row['t_grad_estimated'] = True  # noted by `rank.rank` while its step is not measured
    by = collections.Counter(r.get('pruned') for r in rows)
    self.log(f'Plan [{self.since()}]: {len(rows)} candidates predicted, '
             f"{by['bound']} of them by a bound without their collectives (beyond "
             f'{self.p.close:g} × the best)'
             + (f", {by['budget']} so as the budget was spent" if by['budget'] else '') + '.')
    self.rows = rows
    self.mark('predict')

  def bound(self, c) -> float:
    """A candidate's step without its collectives."""
    if c.family == 'async':
      return async_update(c, self.t_grad, self.overhead, None, 0)
    return self.step(c, 0.0)

  def step(self, c, comm: float) -> float:
    """A synchronous candidate's step with collectives that cost `comm` (calibrated): built
    on its program's time where phase 3b timed it (`rank.program_step`: the collectives that
    program makes are in that time), else on the one-device step's other work."""
    program = self.programs.get(work_key(c)) if c.devices > 1 else None
    if program:
      return rank.program_step(self.t_grad[c.device_batch, c.devices], program['program_s'],
                               comm - program['collectives_s'], self.inputs_of(c, whole=True))
    return rank.predicted_step(self.t_grad[c.device_batch, c.devices], self.overhead, comm,
                               self.inputs_of(c))

  def cost(self, row):
    """A row's step predicted with its collectives, each at its calibrated cost."""
    from jaxpar import validation
    c = row['candidate']
    if c.family == 'async':  # not one program: the workers' gradients, a pull and a push each
      if c.backend == 'threads':  # its loop timed in phase 5 where close
        cfg_c = with_overrides(self.one, c.overrides())
        validation.validate(cfg_c)
        self.calls_of[c] = probe.step_call(cfg_c, self.meta, self.source, self.variables,
                                           lower=False)[1]
      row['collectives'] = 0
      row['t_predicted'] = async_update(c, self.t_grad, self.overhead, self.costs,
                                        self.param_bytes)
      row.pop('pruned', None)
      return
    if c in self.alone_rows:  # one device of several processes: timed alone, no collectives
      collectives = []
    else:
      cfg_c = with_overrides(self.one, c.overrides())
      validation.validate(cfg_c)
      lowered, self.calls_of[c] = probe.step_call(cfg_c, self.meta, self.source,
                                                  self.variables, lower=c.exchange not in self.sent)
      collectives = self.sent.setdefault(c.exchange, lowered)
    row['collectives'] = len(collectives)
    # Local SGD's average is a conditional taken one step in τ.
    comm = (self.costs.step(collectives, 1 / c.period if c.period else 1.0)
            if self.costs and collectives else 0.0)
    row['t_predicted'] = self.step(c, comm)
    row.pop('pruned', None)

  # ------------------------------------------------------------- 5. time the close ones
  def rerank(self) -> list:
    return rank.rank(self.rows, self.k_b, self.b, self.noise, self.saves, self.spread,
                     self.methods, fitted=self.fitted is not None,
                     beyond=self.short and self.short[1:], through=self.through)

  def measure(self):
    ranked = time_the_close_ones(self.rows, self.rerank, self.calls_of, self.cost, self.p,
                                 self.past_deadline, self.agree, self.log, self.started)
    ranked, choice, why = choose_measured(ranked, self.rerank, self.cost, self.calls_of,
                                          self.p, self.past_deadline, self.agree, self.log,
                                          self.started)
    if why:
      self.log(f'Plan: {why}.')
    self.calls_of.clear()
    if self.alone_windows:
      self.alone_windows.close()
    self.ranked, self.choice, self.why = ranked, choice, why
    self.mark('measure')

  # ------------------------------------------------------------- the plan
  def plan(self) -> dict:
    from jaxpar import host_memory
    p, b, choice, ranked, saves = self.p, self.b, self.choice, self.ranked, self.saves
    elapsed = time.perf_counter() - self.started
    self.log('Plan: planning took ' + ', '.join(f'{k} {v:.0f} s' for k, v in self.phases.items())
             + f' = {elapsed:.0f} s' + (f' (budget {p.budget_s:g} s).' if p.budget_s else '.'))
    # The one-device step at b is its own prediction's input: not judged.
    errors = [abs(math.log(r['t_predicted'] / np.median(r['t_measured']))) for r in ranked
              if r.get('t_measured') and (r['candidate'].devices, r['candidate'].batch) != (1, b)]
    entry, reused = self.entry, self.reused
    plan = {
        'tool': 'jaxpar.plan',
        'created': datetime.datetime.now().isoformat(timespec='seconds'),
        'machine': probe.machine(), 'versions': probe.versions(),
        'network': self.cfg.model, 'image_size': self.cfg.image_size,
        'dataset': self.cfg.dataset.name,
        'devices': self.available, 'processes': self.processes,
        'backend': jax.default_backend(), 'host_memory': host_memory.applied(),
        'setting': _setting(self.available),
        'target': self.target.to_dict(), 'budget_s': p.budget_s, 'planning_s': elapsed,
        # Phases 2-4 stopped this much short of a budget: timing one candidate in phase 5.
        'budget_reserve_s': self.reserve if p.budget_s else None,
        'phases_s': self.phases,  # the phases' seconds, in order (the module docstring's 1-5)
        # What planning cost, as a share of the training it plans.
        'planning_per_training': elapsed / choice['T'][0] if choice['T'][0] > 0 else None,
        'serial': self._serial_json(),
        'methods': self.methods,
        't_grad': [{'batch': k[0], 'devices': k[1], 'seconds': v,
                    **({'estimated': True} if k in self.estimated else {})}
                   for k, v in self.t_grad.items()],
        'overhead_s': self.overhead,
        'strategy_work': self.work_rows,  # each program beside its gradients, timed
        'input_s': {'rows': [{'rows': n, 'seconds': v} for n, v in self.t_in.items()],
                    'cores': self.cores},
        'calls': self.calls_timed, 'saves': saves,
        'reused': {'created': entry['created'],
                   't_grad': sorted(k for k in reused if k in self.t_grad),
                   'host_speed': self.host_speed,  # the reused t_grad's factor: `at_host_speed`
                   'host_speeds': {str(n): f for n, f in self.host_speeds.items()},
                   'calls': bool(entry.get('calls')) and self.processes == 1} if entry else None,
        'step_prediction_error': {'median_abs_log': float(np.median(errors)) if errors else None,
                                  'measured': len(errors)},
        'candidates': [_row_json(r) for r in ranked],
        'choice_rank': ranked.index(choice) + 1,
        'choice_reason': self.why,
        'excluded': self.excluded,
        'choice': _row_json(choice),
    }
    self.log(f"Plan: {elapsed:.0f} s; choice {choice['candidate'].label}: {choice['K'][0]:.0f} "
             f"steps × {choice['t_step'][0] * 1e3:.2f} ms + {choice['saves']} saves × "
             f"{saves['seconds']:.2f} s = {choice['T'][0]:.2f} s to the target "
             f"({choice['T'][1]:.2f}–{choice['T'][2]:.2f}).")
    return plan

  def _serial_json(self) -> dict:
    serial, noise = self.serial, self.noise
    return {'batch': self.b, 'K': self.k_b, 'K_how': self.how, 'curve': serial['curve'],
            'noise': serial['noise'], 't_step': self.t_one,
            'B_noise': [x if math.isfinite(x) else None for x in noise],  # ∞: none
            'stopped': serial['stopped'], 'progress': serial.get('progress'),
            'metric': serial.get('metric'), 'seeds': serial.get('seeds', []),
            'K_spread': list(self.spread), 'K_backtest': self.check_k,
            'large': self.alone.get('large'),
            'B_noise_how': 'fitted' if self.fitted is not None else
            'bounded' if self.short else 'measured' if serial['noise'] else 'none'}


def _budget(p) -> str:
  if p.budget_s:
    return f'within {p.budget_s:g} s'
  return (f'bounded by steps ({p.max_steps} serial steps a seed, {p.seeds} seed'
          f"{'s' if p.seeds > 1 else ''}; config.plan.budget_s=0)")


def steps_of(serial: dict, target) -> tuple:
  """(K_b, how): the serial run's steps to the target — 'reached', or 'extrapolated' from a
  curve that stopped short while falling (`steps_model.extrapolate`). A curve still on its
  initial plateau, stalled, or with no gradient left (`probe.vanished`), is one `RunError`
  saying which and what to change."""
  if serial['K'] is not None:
    return serial['K'], 'reached'
  last = serial['curve'][-1]
  verdict = serial['progress']  # `steps_model.progress`, as the serial run judged it
  if verdict == 'no_gradient':
    steps = ' and '.join(str(n['step']) for n in serial['noise'][-probe.VANISHED_READINGS:])
    raise config_lib.RunError(
        f"jaxpar.plan: the serial run's gradients are zero at steps {steps} (every batch "
        f"probed), its {target.shown(last[1])}: no unit passes a gradient back (e.g. "
        f"ReLUs every example leaves negative), so no number of steps reaches the target; "
        f"train another network or setting (a BatchNorm variant: config.batch_norm=True; a "
        f"lower config.optimizer.base_lr)")
  if verdict == 'plateau':
    raise config_lib.RunError(
        f"jaxpar.plan: the serial run's {target.kind} is still on its initial plateau after "
        f"{last[0]} steps ({target.shown(last[1])}: {target.measures()} not yet 5 % below its "
        f"start or chance): nothing to extrapolate from; raise config.plan.max_steps (or "
        f"config.plan.budget_s, or set it to 0: bounded by steps)")
  k = steps_model.extrapolate(serial['curve'], target.threshold) if verdict == 'falling' else None
  if k is None:
    raise config_lib.RunError(
        f"jaxpar.plan: the serial run's {target.kind} stopped falling towards the target "
        f"(no new best value in its last evaluations; {target.shown(last[1])} at step "
        f"{last[0]}): choose a nearer target, or another learning rate "
        f"(config.optimizer.base_lr)")
  return k, 'extrapolated'


def judged(serial: dict, target, how: str):
  """An extrapolated K judged on the serial curve's own later points
  (`steps_model.backtest`), or None where K was reached."""
  return steps_model.backtest(serial['curve'], target.threshold) if how == 'extrapolated' else None


def _setting(available: int) -> str:
  """What the devices are: emulated CPU devices share the process's cores, so their N > 1
  step times include that contention (right for one host's CPU, not for a cluster's);
  across processes, how many and each one's devices and cores."""
  cores = len(os.sched_getaffinity(0))
  backend = jax.default_backend()
  if jax.process_count() > 1:
    local = jax.local_device_count()
    return (f'{jax.process_count()} processes × {local} {backend} device'
            f'{"s" if local > 1 else ""}'
            + (f', {cores} core{"s" if cores > 1 else ""} each' if backend == 'cpu' else ''))
  if backend == 'cpu' and available > 1:
    return f'{available} emulated CPU devices sharing {cores} core{"s" if cores > 1 else ""}'
  return f'{available} {backend} device{"s" if available > 1 else ""}'


class _Agree:
  """Process 0's value of a measurement, in every process (`multihost.from_process_0`):
  what the processes compile and time next depends on it, so it must be one value. Each
  call under a name of its own; in one process, the value itself."""

  def __init__(self):
    self.calls = 0

  def __call__(self, value):
    from jaxpar import multihost
    self.calls += 1
    return multihost.from_process_0(f'plan/agree/{self.calls}', lambda: value)


# =============================================================================== one device
def measure_one_device(one, source, meta, target, batches, timed, deadline, log,
                       variables=None, devices: int = 1, large: int = 0,
                       keep: dict | None = None) -> dict:
  """Phase 1 and the one-device part of phase 2: the serial run of `one` (the one-device
  config, until the target, `plan.max_steps` or `deadline`), t_grad at each of `batches`
  on one device, and — for a plan across processes, whose one-device candidates run as
  a process of their own — the steps of `timed` ([(label, overrides)]) timed as phase 5
  does (windows in turn). JSON-ready: {'serial', 't_grad': {batch: s}, 'windows': {label:
  [s, ...]}, 'async': Downpour's run (`async_run`), 'large': the run at `large`
  (`large_run`), 'served': the labels whose loops `keep` took}. `variables`: the network's initial weights (`probe.initial_variables`),
  made here without them; `devices`: the run's N (its Downpour has N workers); `keep`: a
  dict that takes the timed one-device loops ({label: call}) open, for phase 5 to time
  again in turn with the other candidates (`one_device.serve`), where they would be closed."""
  p = one.plan
  if variables is None:
    variables = probe.initial_variables(one, meta)
  serial = probe.serial_run(one, source, target, eval_every=p.eval_every,
                            max_steps=p.max_steps, deadline=deadline,
                            noise_batches=p.noise_batches, log=log, variables=variables,
                            eval_share=p.eval_share)
  serial['seeds'] = other_seeds(one, source, target, serial, deadline, log)
  stale = async_run(one, source, target, serial, devices, deadline, log, variables)
  at_large = large_run(one, source, target, serial, large, deadline, log, variables)
  t_grad = {}
  for batch in batches:
    call = probe.gradient_call(with_overrides(one, {'per_device_batch': batch}), meta, batch, 1,
                               variables)
    t_grad[str(batch)] = float(np.median(call_timing.timed(call, p.measure_steps, 2)))
  configs = {label: with_overrides(one, overrides) for label, overrides in timed}
  ray = {label: c for label, c in configs.items() if config_lib.on_ray(c)}
  windows = timed_windows({k: c for k, c in configs.items() if k not in ray}, meta, source,
                          variables, log, 'one device: {label}: {ms:.2f} ms a step', keep)
  # Trained as one process given the host (`_check_processes`): its actors spread over
  # every core, not only this process's.
  for label, cfg_c in ray.items():  # one at a time: each run's actors take the cores
    if _spent(deadline, log, f"timing {label} on Ray's actors"):
      break
    try:
      os.sched_setaffinity(0, range(os.cpu_count() or 1))
      windows.update(timed_windows({label: cfg_c}, meta, source, variables, log,
                                   "{label} on Ray's actors: {ms:.2f} ms an update"))
    except Exception as e:  # Ray missing or failing: the row keeps its bound, never chosen
      log(f"Plan: {label} on Ray's actors not timed ({type(e).__name__}: {e}).")
  return {'serial': serial, 't_grad': t_grad, 'windows': windows, 'async': stale,
          'large': at_large, 'served': sorted(keep or {})}


def timed_windows(configs: dict, meta, source, variables, log, said: str,
                  keep: dict | None = None) -> dict:
  """{label: [seconds a step of each window]} of each config of `configs` ({label: config}):
  its training loop warmed up (compiled, its input started; Downpour: two pushes of every
  worker), then `plan.measure_windows` windows of `plan.measure_steps` steps, the configs in
  turn; each one's median said in the log (`said`, with {label} and {ms}). Every loop is
  closed (Ray's actors stopped) even where one fails — or, where all were timed and `keep`
  is a dict, left open in it ({label: call})."""
  from jaxpar import validation
  calls, windows = {}, {}
  try:
    for label, cfg_c in configs.items():
      validation.validate(cfg_c)
      calls[label] = probe.step_call(cfg_c, meta, source, variables, lower=False)[1]
      calls[label](2 * config_lib.num_devices(cfg_c) if cfg_c.scheme == 'async' else 2)
      windows[label] = []
    labels = list(calls)
    p = configs[labels[0]].plan if labels else None
    for label in in_turns(labels, p.measure_windows if labels else 0):
      windows[label].append(calls[label](p.measure_steps))
    if keep is not None:
      keep.update(calls)
      calls = {}
  finally:
    for call in calls.values():
      call.close()
  for label in windows:
    log('  ' + said.format(label=label, ms=np.median(windows[label]) * 1e3) + '.')
  return windows


def in_turns(items: list, rounds: int):
  """`items` `rounds` times over, round w starting at item w (mod their number): timed
  windows taken in turn, so that a machine whose speed drifts favours none of them."""
  for w in range(rounds if items else 0):
    yield from items[w % len(items):] + items[:w % len(items)]


def _spent(deadline, log, what: str) -> bool:
  """Whether a run would start past its deadline (a time, or a callable that decides:
  across processes process 0's clock); said in the log, naming the run left out."""
  spent = deadline() if callable(deadline) else time.perf_counter() > deadline
  if spent:
    log(f'Plan: the budget was spent: {what} not run.')
  return spent


def other_seeds(one, source, target, serial: dict, deadline: float, log) -> list:
  """K at `plan.seeds` − 1 further seeds (other initial weights and data order), each a
  serial run to the target without B_noise readings, at most twice the first run's K
  (beyond: K taken as that cap, a lower bound; one the budget's clock stopped is kept, left
  out of K_b: `counted`): [{'seed', 'K', 'stopped', 'curve'}]; none where the first run did
  not reach the target (nothing to repeat within reach)."""
  p = one.plan
  if serial['K'] is None or p.seeds < 2:
    return []
  cap = _cap(serial, p)
  out = []
  for i in range(1, p.seeds):
    seed = one.seed + i
    if _spent(deadline, log, f'the serial run at seed {seed}'):
      break
    log(f'Plan: serial run at seed {seed} (K\'s spread from seed to seed), at most {cap} steps.')
    run = probe.serial_run(with_overrides(one, {'seed': seed}), source, target,
                           eval_every=serial['metric']['every'], max_steps=cap,
                           deadline=deadline, noise_batches=0, log=log,
                           eval_share=p.eval_share, time_saves=False)
    out.append({'seed': seed, 'K': run['K'] if run['K'] is not None else float(cap),
                'stopped': run['stopped'], 'curve': run['curve']})
  return out


def spacing(serial: dict, judged: int) -> dict:
  """How often a further run (the large batch, a family's) reads the target's metric: as
  often as the training it predicts judges the target (`judged`: `plan.eval_every`, the
  `TargetClock`'s spacing), where the serial run's metric cost spaced its own evaluations
  further — K is interpolated between two evaluations, and SqueezeNet-BN 32² at B = 64 read
  every 40 steps, 6.7 at step 40 (its plateau) and 0.43 at 80: K 78, where training judging
  every 20 reached at 57–80 (mean 71). Never more often: a first reading below a target near
  the plateau comes sooner the more often a noisy curve is read (a run at 64 read every 2
  steps reached loss 2.2 at 13, faster than 1/B from the serial run's 93 at 16). Its stall
  is judged over the serial run's steps (`steps_model.progress`'s 5 evaluations at its
  spacing): GoogLeNet 32² at 64 read every 10 steps left its plateau at 50 and bounced for
  the next 50. Keyword arguments of `probe.serial_run`."""
  every = serial['metric']['every']
  return {'eval_every': min(every, judged), 'stall_steps': 5 * every}


def counted(seeds: list) -> list:
  """The runs at further seeds that say something of K: not those the budget's clock
  stopped short of the target ('time': K is at least their last step, which says nothing of
  the method; ResNet34 16², a 420 s budget: seed 1 stopped at step 357 of a cap of 795, seed
  0 had reached at 397, and the cap taken as its K made K_b 596). One that stalled or ran to
  its cap counts as the cap, a lower bound (`_method_result`)."""
  return [s for s in seeds if s.get('stopped') != 'time']


def said_k(run: dict) -> str:
  """A run's K for the log: its steps, or where the budget's clock stopped it, that and the
  step it stopped at (left out: `counted`)."""
  if run.get('stopped') != 'time':
    return f"{run['K']:.0f}"
  last = run['curve'][-1][0] if run.get('curve') else 0
  return f'>{last:.0f} (stopped by the budget\'s clock: left out)'


def seed_spread(serial: dict) -> tuple:
  """(K_b, (low, high)): the mean K of the seeds that say something of it (`counted`) and
  their range as factors of it; (K, (1, 1)) with one seed."""
  ks = [serial['K']] + [s['K'] for s in counted(serial.get('seeds', []))]
  mean = float(np.mean(ks))
  return mean, (min(ks) / mean, max(ks) / mean)


def _cap(serial: dict, p) -> int:
  """The steps a further run may take (another seed, a method, the large batch): twice the
  serial run's K, within `plan.max_steps` (beyond: K taken as the cap, a lower bound)."""
  return min(p.max_steps, math.ceil(2 * serial['K']))


def _method_result(run: dict, cap: int, **setting) -> dict:
  return {**setting, 'K': run['K'] if run['K'] is not None else float(cap),
          'stopped': run['stopped'], 'curve': run['curve']}


def large_run(one, source, target, serial: dict, batch: int, deadline: float, log,
              variables=None) -> dict | None:
  """The serial maths at the largest batch a candidate computes, on one device, to the
  target: with K_b it fixes the batch model's two parameters (`batch_fit`). Evaluated
  as `spacing` says — as often as the training judges the target, a stall judged over
  the serial run's steps (GoogLeNet at 32², B = 64, evaluated every 10 steps, left its plateau at step 50
  and bounced for the next 50; it reaches the target at ~280). {'batch', 'K', 'stopped',
  'curve'}; None without a larger batch, or where the
  serial run did not reach the target."""
  p = one.plan
  b = one.per_device_batch
  if not batch or batch <= b or serial['K'] is None:
    return None
  cap = _cap(serial, p)
  if _spent(deadline, log, f'the serial run at batch {batch}'):
    return None
  log(f'Plan: serial run at batch {batch} on one device (the batch model\'s second point), '
      f'at most {cap} steps.')
  run = probe.serial_run(with_overrides(one, {'per_device_batch': batch}), source, target,
                         **spacing(serial, p.eval_every), max_steps=cap, deadline=deadline,
                         noise_batches=0, log=log,
                         variables=variables, eval_share=p.eval_share, time_saves=False,
                         name=f'batch {batch}')
  return _method_result(run, cap, batch=batch)


def batch_fit(k_b: float, b: int, large: dict | None) -> float | None:
  """B_noise of the batch model through (b, K_b) and the large-batch run's (B, K)
  (`steps_model.BATCH`, constrained: ∞ where K fell as fast as 1/B or faster, perfect
  scaling; 0 where it did not fall); None without a large run that reached the target
  (`batch_bound` reads one that stopped short)."""
  if not large or large['stopped'] != 'reached':
    return None
  return _through(k_b, b, large['batch'], large['K'])


def batch_bound(k_b: float, b: int, large: dict | None) -> tuple | None:
  """A large-batch run that stopped short of the target took at least its last evaluated
  step S at B: K(B) ≥ S. K(B) falls as B_noise grows (B > b), so B_noise is at most the fit
  through (B, S) — the noise scale's readings are capped there — and where S ≥ K_b the
  model (which never takes more steps at a larger batch) cannot reach S at all: the rows at
  B and beyond are lower bounds. (B_noise's bound, B, S); None without such a run."""
  if not large or large['stopped'] == 'reached' or not large.get('curve'):
    return None
  steps = float(large['curve'][-1][0])
  return _through(k_b, b, large['batch'], steps), large['batch'], steps


def _through(k_b: float, b: int, batch: int, k: float) -> float:
  k_min, slope = steps_model.BATCH.fit([b, batch], [k_b, k])
  if k_min <= 0:
    return math.inf
  return slope / k_min


def async_run(one, source, target, serial: dict, devices: int, deadline: float, log,
              variables=None) -> dict | None:
  """Downpour's updates to the target with N = `devices` workers: `probe.stale_run` at
  staleness N − 1 on one device, from the serial run's weights and batches ({'K',
  'staleness', 'stopped', 'curve'}), again at its further seeds (`seed_mean`); None where
  `plan.methods` has no 'async', on one device, where the serial run did not reach the
  target (nothing to compare within reach), or where the budget's clock stopped its first
  run (`measured_runs`)."""
  p = one.plan
  if 'async' not in p.methods or devices < 2 or serial['K'] is None:
    return None
  cap = _cap(serial, p)
  out = None
  for seed in range(one.seed, one.seed + max(p.seeds, 1)):
    at = '' if seed == one.seed else f' at seed {seed}'
    if out and out['stopped'] != 'reached' or _spent(deadline, log,
                                                        f"Downpour's simulated run{at}"):
      break
    log(f'Plan: Downpour with {devices} workers: the serial run at staleness {devices - 1} '
        f'(simulated on one device){at}, at most {cap} steps.')
    run = probe.stale_run(with_overrides(one, {'seed': seed}), source, target, devices - 1,
                          eval_every=serial['metric']['every'], max_steps=cap,
                          deadline=deadline, log=log,
                          variables=variables if seed == one.seed else None,
                          eval_share=p.eval_share)
    result = _method_result(run, cap, staleness=devices - 1)
    if out is None:
      if not measured_runs({'async': result}, log):
        return None
      out = result
    else:
      out.setdefault('seeds', []).append({'seed': seed, **result})
  return seed_mean(out) if out else None


def method_runs(one, source, target, serial: dict, found: list, deadline, log,
                variables, agree=None) -> dict:
  """The families of `plan.methods` trained on the run's devices (every process's), each
  from the serial run's initial weights and seed to the target: BN per device as the
  sync-join candidate at N·b ({'K', 'batch'}), Local SGD at the largest of `plan.periods`
  ({'K', 'period', 'batch'}) and, where they differ, at the smallest ('small': {'K',
  'period', 'stopped', 'curve'}: GoogLeNet 32² on 2 processes reached loss 0.5 in 156–178
  steps at τ = 2, 196–244 at τ = 8, 216–253 at τ = 1, where a line through τ = 1 and 8 put
  τ = 2 at 266); with 'stopped' and 'curve'. Each again at the serial run's further seeds
  (`plan.seeds`, from each seed's own initial weights), all families at a seed before any at
  the next, so that a budget spent leaves each family a seed: K their mean (`seed_mean`);
  a family short of the target at the first seed is not run again (its K a lower bound).
  Those the candidates do not have, those whose first run the budget's clock stopped
  (`measured_runs`), and all where the serial run did not reach the target, are left out.
  `agree`: process 0's value in every process (`_Agree`), for the runs' metric subsets."""
  p, out = one.plan, {}
  if serial['K'] is None:
    return out
  cap = _cap(serial, p)
  runs = {}
  for c in found:
    if c.family == 'bn_device' and c.scheme == 'sync-join' and c.server == 'allreduce':
      runs.setdefault('bn_device', c)
    if c.family == 'local_sgd' and c.period == max(p.periods):
      runs.setdefault('local_sgd', c)
  # Local SGD's K is not a line in τ: measured at the smallest period too, the same row's
  # (its run last: a budget spent before it leaves the line through the largest).
  small = (dataclasses.replace(runs['local_sgd'], period=min(p.periods))
           if 'local_sgd' in runs else None)
  if small in found and small.period < max(p.periods):
    runs['local_sgd_small'] = small
  first = {}  # each family's run at the first seed, its further seeds' beside it
  for seed, family in itertools.product(range(one.seed, one.seed + max(p.seeds, 1)), runs):
    if seed != one.seed and (first.get(family) or {}).get('stopped') != 'reached':
      continue  # not run at the first seed, or short there: a lower bound at any seed
    c = runs[family]
    name = _run_name(family, c.period)
    at = '' if seed == one.seed else f' at seed {seed}'
    if _spent(deadline, log, f'{c.label} (its steps: {name}{at})'):
      break
    log(f'Plan: {c.label} to the target (its steps: {name}{at}), at most {cap} steps.')
    run = probe.serial_run(with_overrides(one, {**c.overrides(), 'seed': seed}), source,
                           target, **spacing(serial, p.eval_every), max_steps=cap,
                           deadline=deadline, noise_batches=0, log=log,
                           variables=variables if seed == one.seed else None,
                           eval_share=p.eval_share, time_saves=False, name=name + at,
                           agree=agree)
    result = _method_result(run, cap, batch=c.batch, **({'period': c.period} if c.period else {}))
    if seed == one.seed:
      first[family] = result
    else:
      first[family].setdefault('seeds', []).append({'seed': seed, **result})
  out = {family: seed_mean(run) for family, run in measured_runs(first, log).items()}
  if 'local_sgd_small' in out and 'local_sgd' not in out:
    out.pop('local_sgd_small')
  if 'local_sgd_small' in out:
    out['local_sgd']['small'] = {k: v for k, v in out.pop('local_sgd_small').items()
                                 if k != 'batch'}
  return out


def _run_name(family: str, period) -> str:
  """A family's run as the log names it: Local SGD's at the smallest period with τ."""
  return family if family != 'local_sgd_small' else f'local_sgd τ={period}'


def measured_runs(first: dict, log) -> dict:
  """The families' runs at the first seed (`first`) less those the budget's clock stopped
  short of the target: K is at least their last step, which says nothing of the method (a
  run of Local SGD stopped at step 20 by a 420 s budget was once taken as the cap's 1,193
  steps, "at least"); their rows are ranked as a family not measured (never chosen), said."""
  for family, run in first.items():
    if run['stopped'] == 'time':
      log(f"Plan: the {_run_name(family, run.get('period'))} run's steps {said_k(run)}: "
          'not measured.')
  return {family: run for family, run in first.items() if run['stopped'] != 'time'}


def seed_ks(run: dict) -> list:
  """A family's K at each seed it was run at (`seed_mean`), the first seed's first."""
  return [run.get('K_first', run['K'])] + [s['K'] for s in run.get('seeds', [])]


def said_seeds(run: dict) -> str:
  """' (the mean of K0, K1, …)' for a family's run at several seeds (`seed_mean`), else ''."""
  return (' (the mean of ' + ', '.join(f'{k:.0f}' for k in seed_ks(run)) + ')'
          if run.get('seeds') else '')


def seed_mean(run: dict) -> dict:
  """A family's run at its first seed with its runs at further seeds ('seeds': the serial
  run's further seeds, the same row, from that seed's initial weights and data order), as
  one: 'K' their mean, 'K_first' the first seed's, 'spread' (low, high) their range as
  factors of the mean — the row's own, not the serial seeds' (SqueezeNet-BN 32², BN per
  device on 2 processes: 143 steps at seed 0, 86–116 at seeds 1–5, 114 the mean of all six:
  one seed's K carries its luck). A further seed that stopped short of the target by the
  budget's clock ('time') says nothing of the method and is left out (`counted`); one that
  stalled or ran to the cap counts as the cap (`_method_result`) and makes the run's
  'stopped' (the mean a lower bound, the row not chosen). One seed: the run as it was."""
  seeds = counted(run.get('seeds', []))
  if not seeds:
    return {k: v for k, v in run.items() if k != 'seeds'}
  mean, spread = seed_spread({'K': run['K'], 'seeds': seeds})
  short = next((s['stopped'] for s in [run] + seeds if s['stopped'] != 'reached'), 'reached')
  slim = [{k: v for k, v in s.items() if k in ('seed', 'K', 'stopped', 'curve')}
          for s in seeds]
  return {**run, 'K': mean, 'K_first': run['K'], 'spread': spread, 'stopped': short,
          'seeds': slim}


def fresh_singles(batches: set, b: int, reused: dict) -> list:
  """The one-device batches whose t_grad the serial run's process times: those no earlier
  plan measured (`reused`), and always b — the one-device step's other work is its step less
  t_grad at b, and two readings from different sittings differ by the host's drift
  (ResNet34 32², 2 processes, t_grad at b from an earlier plan: that work came out 5 and 38
  ms in two plans half an hour apart, 17-18 ms where both were timed together)."""
  return sorted(x for x in set(batches) | {b} if x == b or (x, 1) not in reused)


def at_host_speed(reused: dict, fresh: dict, b: int) -> tuple:
  """(t_grad reused from an earlier plan at the host's speed now, {devices: factor}): the
  entries on n devices × t_grad now ÷ as it was at a batch timed again on n (`fresh`: b on
  one device, `fresh_singles`; one batch on each n > 1, `again_on_several`), else at (b, 1).
  These shared cores take the same program up to 1.8× as long from one hour to the next
  (ResNet34 32², t_grad at b = 16 on both cores: 55.7 ms in a plan, 66-102 ms within one
  ten-minute launch hours later); a reused t_grad left at its sitting's speed set the
  multi-device rows against a one-device row timed now. One process alone and two at once
  do not move alike: SqueezeNet-BN 32², a day apart, t_grad at 16 on one device read 0.76 ×
  and the 2-process steps 0.96 × (phase 5). Stored again so (`cache.store`), an entry's
  values stay at one speed. Unscaled (1.0) where neither reading is there."""
  factors = {}
  for n in sorted({k[1] for k in reused}):
    again = sorted(k for k in fresh if k[1] == n and (n > 1 or k[0] == b)
                   and reused.get(k, 0) > 0)
    if again:
      factors[n] = fresh[again[0]] / reused[again[0]]
  one = factors.get(1, 1.0)
  return {k: v * factors.get(k[1], one) for k, v in reused.items()}, factors


def negative_overhead(overhead: float, step: float | None, noise: float = 0.1) -> str:
  """The end of the t_grad line: '.', or why a negative non-gradient share (the gradients
  alone timed longer than the whole one-device step) is taken as 0 — within `noise` of the
  step, the timing's noise; beyond it, the two measurements disagree, and the line says so
  rather than calling it noise."""
  if overhead >= 0:
    return '.'
  if not step or -overhead <= noise * step:
    return ' (negative: within the timing noise, taken as 0).'
  return (f' (negative: the gradients alone took {-overhead / step:.0%} longer than the whole '
          f'step, beyond the timing noise of {noise:.0%}: the two measurements disagree; taken '
          f"as 0. Under host_memory='keep' a program compiled in the process runs slower than "
          f'one loaded from the compilation cache: docs/performance.md).')


def again_on_several(needed: set, reused: dict) -> list:
  """The multi-device t_grad a plan that reuses them times again: on each device count, the
  smallest batch it needs of those reused — the host's speed on n devices at once
  (`at_host_speed`)."""
  out = {}
  for batch, n in sorted(k for k in needed if k[1] > 1 and k in reused):
    out.setdefault(n, (batch, n))
  return sorted(out.values())


def one_device_in_child(one, target, batches, timed, deadline, log, devices: int = 1,
                        large: int = 0) -> tuple:
  """`measure_one_device` in a process of its own (`python -m jaxpar.plan.one_device`, on
  this process's cores): in a run of several processes, data, evaluation and meshes are
  every process's, and a one-device run is a run of one process. Its progress goes to
  stderr; a failure is one `RunError`. Returns (its measurements, `OneDeviceWindows`:
  the process left open with its timed loops; None where it timed none)."""
  from jaxpar import host_memory
  with tempfile.TemporaryDirectory() as folder:
    spec = os.path.join(folder, 'spec.json')
    out = os.path.join(folder, 'out.json')
    results, sent = os.pipe()
    with open(spec, 'w') as f:
      # The planning process's malloc setting: every candidate is timed in one.
      one = with_overrides(one, {'host_memory': host_memory.applied() or one.host_memory})
      json.dump({'config': one.to_json(), 'target': target.to_dict(), 'batches': batches,
                 'timed': [[c.label, c.overrides()] for c in timed],
                 'seconds': deadline - time.perf_counter(), 'out': out,
                 'devices': devices, 'large': large, 'results_fd': sent}, f)
    log(f'Plan: the one-device measurements in a process of their own ({len(timed)} '
        f'one-device candidates timed there).')
    child = subprocess.Popen([sys.executable, '-m', 'jaxpar.plan.one_device', spec],
                             stdout=sys.stderr, stdin=subprocess.PIPE, text=True,
                             pass_fds=(sent,))
    os.close(sent)
    windows = OneDeviceWindows(child, os.fdopen(results))
    ready = windows.reply()  # 'serving' (its loops open) or 'done' (it exits)
    if ready is None or not os.path.exists(out):
      windows.close()
      raise config_lib.RunError(f'jaxpar.plan: the one-device measurements failed (exit '
                                f'{child.returncode}; their output is above)')
    with open(out) as f:
      measured = json.load(f)
  if ready != 'serving':
    windows.close()
    windows = None
  return measured, windows


class OneDeviceWindows:
  """The one-device process (`one_device_in_child`) left open after its measurements, its
  one-device candidates' loops warm: `window(label, steps)` times one more window there
  (seconds a step) while this process waits — so that phase 5 takes the one-device rows'
  windows in the same rounds as the rest (a host whose speed drifts moves them alike).
  The protocol (`one_device.serve`): a JSON line [label, steps] on its stdin, a line back
  on `results`; `close()` ends its stdin, and so the process."""

  def __init__(self, child, results):
    self.child, self.results = child, results

  def reply(self):
    return self.results.readline().strip() or None

  def window(self, label: str, steps: int) -> float:
    try:
      self.child.stdin.write(json.dumps([label, steps]) + '\n')
      self.child.stdin.flush()
    except OSError:
      pass  # it has exited: said below
    got = self.reply()
    if got is None:
      try:
        code = self.child.wait(timeout=60)
      except subprocess.TimeoutExpired:
        code = None
      raise config_lib.RunError(f'jaxpar.plan: the one-device process ended (exit {code}) '
                                f'while timing {label}; its output is above')
    return float(got)

  def close(self) -> None:
    try:
      self.child.stdin.close()
    except OSError:
      pass
    self.results.close()
    try:
      self.child.wait(timeout=120)
    except subprocess.TimeoutExpired:
      self.child.kill()
      self.child.wait()


class AloneCall:
  """A one-device candidate's loop in the one-device process, called as phase 5 calls a
  loop: `call(steps)` → seconds a step (process 0's, handed to every process: the others
  wait meanwhile); `close()` leaves it open for a later round (the process ends with the
  plan's phase 5). `windows`: None in the processes other than 0."""

  def __init__(self, windows: OneDeviceWindows | None, label: str):
    self.windows, self.label, self.calls = windows, label, 0

  def __call__(self, steps: int) -> float:
    from jaxpar import multihost
    self.calls += 1
    return multihost.from_process_0(f'plan/alone/{self.label}/{self.calls}',
                                    lambda: self.windows.window(self.label, steps))

  def close(self) -> None:
    pass


def async_update(c, t_grad: dict, overhead: float, costs, param_bytes: int) -> float:
  """Downpour's seconds an update with N workers computing at once: each worker's step —
  t_grad at b on N devices, the one-device step's other work, a pull of the weights and a
  push of its gradient (each a permute of the weights at the calibrated per-call cost) —
  over N, its pushes interleaved with the others' ([T] §3.2; the server's apply taken as
  part of the step's other work)."""
  send = 2 * costs.per_call('collective_permute', param_bytes) if costs and param_bytes else 0.0
  return rank.predicted_step(t_grad[c.device_batch, c.devices], overhead, send) / c.devices


def estimate_t_grad(measured: dict, key: tuple, processes: int, cores: int | None) -> float:
  """t_grad at `key` = (device batch, devices) where the budget left it unmeasured, from the
  measured {(batch, devices): seconds}: the nearest batch (in log) on as many devices, or
  else on one device, scaled in proportion to the batch; from one device, a process's
  devices computing at once on `cores` cores take ⌈devices a process / cores⌉ times as
  long (emulated CPU devices share the cores; one device a process: as alone)."""
  batch, devices = key
  same = [k for k in measured if k[1] == devices] or [k for k in measured if k[1] == 1]
  if not same:
    raise ValueError(f'no t_grad measured to scale to {key} from')
  near = min(same, key=lambda k: (abs(math.log(k[0] / batch)), -k[0]))
  seconds = measured[near] * batch / near[0]
  if near[1] == 1 and devices > 1:
    local = max(devices // processes, 1)
    seconds *= math.ceil(local / cores) if cores else 1
  return seconds


def work_key(c) -> tuple:
  """Candidates whose strategies do the same work beside the gradients: the server, the
  devices and Local SGD's period (the batch and BatchNorm's grouping change what the
  gradients cost, not what the update does)."""
  return c.server, c.devices, c.period


PROGRAM_BATCH = 4  # b₀: the device batch at which phase 3b times each program's real step


def program_overrides(c, batch: int = PROGRAM_BATCH) -> dict:
  """Config paths → values for candidate c's real step at `batch` a device (b₀,
  `PROGRAM_BATCH`), BatchNorm over each device's batch (as t_grad computes it: BN's
  collectives, where c has them, are costed apart)."""
  out = dict(c.overrides())
  if 'global_batch' in out:
    out['global_batch'] = batch * c.devices
  else:
    out['per_device_batch'] = batch
  if out.get('bn_group_size') == 0:
    out['bn_group_size'] = 1
  return out


def in_rounds(calls: dict, rounds: int, windows, tag: str) -> dict:
  """{name: seconds a step, one a round} of `calls` ({name: (call, steps a call)}): each
  called once first (it compiles), then every one timed once a round for `rounds` rounds,
  in turn (`in_turns`), the median of `windows(steps)` calls a timing; every process at
  once (barriers named by `tag`)."""
  from jaxpar import multihost
  for i, (call, _) in enumerate(calls.values()):
    multihost.barrier(f'{tag}/compile/{i}')
    call()
  samples = collections.defaultdict(list)
  for i, name in enumerate(in_turns(list(calls), rounds)):
    call, steps = calls[name]
    multihost.barrier(f'{tag}/{i}')
    samples[name].append(float(np.median(call_timing.timed(call, windows(steps), 0))) / steps)
  return samples


def strategy_work(one, found, meta, variables, costs, p, past_deadline, agree, log) -> list:
  """Rows for the plan, one per program: for each synchronous candidate on several devices
  (one per `work_key`), what its step takes beside its gradients — the exchange, packing
  and unpacking, the update, conditionals, and what computing the gradients into those
  buffers costs beyond t_grad — read as its real step at a small device batch b₀
  (`PROGRAM_BATCH`, `program_overrides`) less t_grad(b₀, N): `program_s`, which its rows'
  steps take in place of costing those collectives (`rank.program_step`). This work is
  taken as per weight, not per example: at 4 and 16 a device it differed by less than its
  rounds' spread (ResNet34 32², 2 processes, five rounds: the distributed server's 153 and
  175 ms, its rounds 138–192; the all-reduce step's 65 and 77, which may hide a share
  that grows with the batch: `analysis.steptime.program_batch`), while the same program
  with its gradients stood in for (`probe.stand_in_gradients`) misses the backward pass
  writing them into the server's buffers (120 ms). The steps (whole periods of Local
  SGD, whose average is a branch taken one step in τ), t_grad(b₀, N) and the one-device
  program are timed in `plan.measure_windows` rounds, in turn (`in_rounds`: a host whose
  speed drifts moves them alike), each program less the t_grad of its round; the median
  over rounds. One program at a time: each compiled, timed in its rounds and let go before
  the next (ResNet34 16² on 8 emulated devices: its 12 programs held at once took the
  process to 22 GB, one at a time to 17 GB — the central server's on 8 devices, whose
  rounds keep 0.77 GB of temporaries a device where the all-reduce's keep 0.17). Beside
  it `collectives_s`, its collectives' calibrated cost, `one_device_s`, the program with
  its gradients stood in for on one device of each process at once, and `seconds`, the
  program's own work as the calibrated model reads it — program − collectives − one
  device, below 0 where the calibration overstates the collectives. A program is not
  started where the last one's seconds (its compiling and rounds) would take the plan past
  its budget (`past_deadline(ahead)`; the first always is): the rest are not compiled (their
  rows costed by the calibration), said so."""
  from jaxpar import validation
  todo = {}
  for c in found:
    if c.devices > 1 and c.family != 'async':
      todo.setdefault(work_key(c), c)
  if not todo or costs is None:
    return []
  untimed = ('their rows costed by the calibrated collectives and the one-device step\'s '
             'other work')
  if past_deadline():
    log(f"Plan: the budget was spent: the strategies' programs not timed ({untimed}).")
    return []
  b0, processes = PROGRAM_BATCH, jax.process_count()
  alone = probe.update_call(one, meta, variables, jax.local_devices()[:1])[1]
  t_grads = {n: probe.gradient_call(with_overrides(one, {'per_device_batch': b0}), meta, b0,
                                    max(n // processes, 1), variables)
             for n in sorted({key[1] for key in todo})}
  rounds = max(p.measure_windows, 1)
  rows, last = [], 0.0
  for i, (key, c) in enumerate(sorted(todo.items(),
                                      key=lambda kv: (kv[0][1], kv[0][0], kv[0][2]))):
    if past_deadline(last):
      log(f'Plan: the budget was spent: {len(todo) - len(rows)} strategies\' programs '
          f'not timed ({untimed}).')
      break
    started = time.perf_counter()
    cfg_c = with_overrides(one, program_overrides(c))
    validation.validate(cfg_c)
    steps = max(c.period, 1)
    collectives, call = probe.update_call(cfg_c, meta, variables, repeats=steps,
                                          gradients=True)
    # {name: (call, steps a call)}: this program beside t_grad and the one-device program.
    samples = in_rounds({'alone': (alone, 1), 't_grad': (t_grads[key[1]], 1),
                         'program': (call, steps)}, rounds,
                        lambda steps: max(1, -(-p.measure_steps // (steps * rounds))),
                        f'plan/work/{i}')
    del call  # its state and program let go before the next is made
    t_grad = samples['t_grad']
    program = agree(float(np.median([s - g for s, g in zip(samples['program'], t_grad)])))
    on_one = agree(float(np.median(samples['alone'])))
    comm = costs.step(collectives, 1 / c.period if c.period else 1.0)
    rows.append({'server': c.server, 'devices': c.devices, 'period': c.period,
                 'seconds': program - comm - on_one, 'program_s': program,
                 'collectives_s': comm, 'one_device_s': on_one, 'batch': b0,
                 'step_s': agree(float(np.median(samples['program']))),
                 't_grad_s': agree(float(np.median(t_grad)))})
    last = agree(time.perf_counter() - started)
  return rows


def _rows(c, processes: int) -> int:
  """The rows of a step's batch one process makes: one device is a run of one process."""
  return c.batch if c.devices == 1 else c.batch // processes


def _leader(ranked: list) -> dict:
  """The leader: the fastest candidate the plan may choose (`rank.choosable`: its steps
  predicted from what the plan measured, its step timed where it is close). A family whose
  steps were not measured is ranked, not chosen (ResNet34 at 16² took 198 steps with BN per
  device where BN over all devices took 135)."""
  return next(r for r in ranked if rank.choosable(r))


def _fastest_measured(ranked: list, timed_here=None):
  """The fastest candidate the plan may choose whose step was measured, or None; with
  `timed_here` (calls by candidate), of those that can be timed again here."""
  return next((r for r in ranked if rank.choosable(r) and r.get('t_measured')
               and (timed_here is None or r['candidate'] in timed_here)), None)


def costed_ahead_of(choice: dict, ranked: list, cost, rerank) -> list:
  """Measured steps slower than predicted can leave a row that is never timed (BN per
  device: not chosen) ahead of the choice by its bound alone, its collectives not costed:
  those rows are costed (`cost(row)`) and the rows ranked again (`rerank()`), so that every
  row ranked ahead of the choice is ranked by a prediction. Costing adds collectives: such
  rows only move back, and the choice stays. Returns the ranking."""
  uncosted = [r for r in ranked[:ranked.index(choice)] if r.get('pruned')]
  for row in uncosted:
    cost(row)
  return rerank() if uncosted else ranked


def tie_rule(leader: dict, ranked: list, cost, rerank) -> tuple:
  """`rank.choose` with every row ranked ahead of its choice ranked by a prediction
  (`costed_ahead_of`, again after each choice that costing moved: costing only moves rows
  back, so it ends). Returns (ranking, choice, reason)."""
  while True:
    choice, why = rank.choose(ranked, leader)
    costed = costed_ahead_of(choice, ranked, cost, rerank)
    if costed is ranked:
      return ranked, choice, why
    ranked = costed


def choose_measured(ranked, rerank, cost, calls_of, p, past_deadline, agree, log,
                    started) -> tuple:
  """The choice after phase 5's rounds: the leader — the fastest row the plan may choose,
  or where the budget stopped measuring before it, the fastest measured — or a row that
  spends less tied with it (`tie_rule`). Where the tie's row was not timed in the same
  rounds as the leader (or not timed) and can be here, the two are timed side by side
  (`_measure`) and the rule applied again, the leader again the fastest measured: a row
  timed apart (one device, in phase 1's process) is compared round by round, not by ranges
  taken at other times. A tie round by round on fewer than `p.tie_windows` rounds has the
  leader and the rows tied with it on those rounds timed in more, up to that many, and the
  rule applied on them all. Returns (ranking, choice, reason; '' for the leader)."""
  leader = _leader(ranked)
  if not leader.get('t_measured'):
    leader = _fastest_measured(ranked) or leader
  ranked, choice, why = tie_rule(leader, ranked, cost, rerank)
  leader_here = leader['candidate'] in calls_of
  if why and choice['candidate'] in calls_of and not past_deadline() and (
      not choice.get('t_measured') or (leader_here and rank.paired(choice, leader) is None)):
    _measure([leader, choice] if leader_here else [choice], calls_of, p, past_deadline, agree,
             log, started)
    ranked = rerank()
    leader = _fastest_measured(ranked) or leader
    ranked, choice, why = tie_rule(leader, ranked, cost, rerank)
  # A tie judged round by round on few rounds: one slow window moves a quartile of three
  # (GoogLeNet 32², 2 processes: Local SGD τ = 4's rounds at 0.97, 0.96 and 1.10 × one
  # device's time to the target made 0.97–1.04, a tie, where it trained 14 % faster on
  # each of 3 seeds). The leader and the tied rows paired with it are timed in more rounds,
  # up to `tie_windows`, and the rule applied again on them all.
  n = rank.rounds(choice, leader) if why else 0
  more = [r for r in rank.tied_rows(ranked, leader) if rank.rounds(r, leader) == n
          and r['candidate'] in calls_of]
  if 0 < n < p.tie_windows and more and leader['candidate'] in calls_of and not past_deadline():
    log(f'Plan [{time.perf_counter() - started:.0f} s]: the tie with {leader["label"]} rests '
        f'on {n} rounds: ' + ', '.join(r['label'] for r in [leader] + more)
        + f' timed in {p.tie_windows - n} more.')
    _time_windows([leader] + more, p.tie_windows - n, calls_of, p, agree, log, started)
    ranked = rerank()
    # The leader's further windows may put it behind a row that was not in the tie
    # (SqueezeNet-BN 32², 2 processes: the leader's 9 windows read 52.7 ms a step where its
    # first 3 read 42.4, behind a 2-process row timed at 25.6; against the old leader the
    # tie rule took one device, 24 % slower than that row trained): the rule is applied
    # against the fastest measured row now.
    leader = _fastest_measured(ranked) or leader
    ranked, choice, why = tie_rule(leader, ranked, cost, rerank)
  return ranked, choice, why


def time_the_close_ones(rows, rerank, calls_of, cost, p, past_deadline, agree, log,
                        started) -> list:
  """Phase 5: times the candidates it may choose predicted within `p.close` of the best (at most
  `p.measure_top`), side by side — windows taken in turn, so that a machine whose speed
  drifts (a shared host) moves every measured candidate alike — until the leader
  (`_leader`) is a measured one: candidates that measuring moves ahead are timed in turn
  with the fastest measured one that can be timed here. Only candidates that can be chosen
  (`rank.choosable`) are timed. A row timed already where it runs alone (a one-device
  candidate of a plan across processes, in its own process) is timed again in these rounds
  where it has a call in `calls_of` (the one-device process left open: `AloneCall`) — the
  close one of those that spends least always, beside the first `measure_top` — and keeps
  its earlier windows otherwise. `rerank()` ranks `rows` (with their measurements);
  returns the last ranking."""
  ranked = rerank()
  best = _leader(ranked)['T'][0]
  group = [r for r in ranked if rank.choosable(r) and r['T'][0] <= p.close * best
           and _to_time(r, calls_of)]
  group = group[:p.measure_top] or [r for r in [_leader(ranked)] if _to_time(r, calls_of)]
  # The close row that spends least, where it was timed apart (one device, in phase 1's
  # process, minutes before: a host that drifts may have read it slow), joins the rounds
  # beyond measure_top, so that the tie rule can pair it with the leader.
  apart = [r for r in ranked if rank.choosable(r) and r['T'][0] <= p.close * best
           and r.get('t_measured') and _to_time(r, calls_of)]
  cheapest = min(apart, key=lambda r: (rank.spend(r['candidate']), r['T'][0]), default=None)
  if group and cheapest is not None and all(r is not cheapest for r in group):
    group.append(cheapest)
  # A row the budget left at its bound has no step yet: cost it before it is timed (past
  # the budget only the first, the one `_measure` still times).
  for i, row in enumerate(group):
    if row.get('pruned') and (i == 0 or not past_deadline()):
      cost(row)
  while True:  # each round measures at least one exact candidate not yet measured: it ends
    group = _measure(group, calls_of, p, past_deadline, agree, log, started)
    ranked = rerank()
    if _leader(ranked).get('t_measured'):
      return ranked
    measured = _fastest_measured(ranked)
    if past_deadline() and measured:
      log('Plan: budget spent before the fastest predicted candidate was measured: the choice '
          'is the fastest measured one.')
      return ranked
    while True:  # measuring moved the field within a pruned bound: cost it, rank again
      ahead = [r for r in ranked if rank.choosable(r) and not r.get('t_measured')
               and (measured is None or r['T'][0] < measured['T'][0])]
      ahead = ahead[:max(1, p.measure_top - 1)]
      if not any(r.get('pruned') for r in ahead):
        break
      for row in ahead:
        if row.get('pruned'):
          cost(row)
      ranked = rerank()
    beside = _fastest_measured(ranked, calls_of)
    group = ahead + ([beside] if beside else [])


def _to_time(row: dict, calls_of: dict) -> bool:
  """Whether phase 5 has yet to time `row`: not measured, or measured apart from its rounds
  (in the one-device process, before them) and timeable in them."""
  return not row.get('t_measured') or ('timed_in' not in row and row['candidate'] in calls_of)


def whole_periods(steps: int, period: int) -> int:
  """A timed window's steps: `steps`, or for Local SGD (`period` τ > 1) the fewest whole
  periods that hold as many — its average is one step in τ, and a window of 10 steps at
  τ = 8 holds one average or two (ResNet34 32²: 87, 95 and 109 ms a step in three
  windows)."""
  return -(-steps // period) * period if period > 1 else steps


def _measure(group, calls_of, p, past_deadline, agree, log, started) -> list:
  """Times each row of `group` (its windows in turn across the group, `measure_windows`
  each, replacing any earlier measurement): the rows measured, each marked with the
  rounds it was timed in ('timed_in', one number for this call: window w of every row
  so marked was taken in round w — `rank.choose` compares such rows round by round).
  Across processes every window's time and the deadline's verdict are process 0's
  (`agree`)."""
  rounds = next(_ROUNDS)
  chosen = []
  for row in group:
    if chosen and past_deadline():
      log('Plan: budget spent; the other candidates keep their predicted step times.')
      break
    calls_of[row['candidate']](2)  # compiles, starts the input pipeline
    row['t_measured'], row['timed_in'] = [], rounds
    chosen.append(row)
  _time_windows(chosen, p.measure_windows, calls_of, p, agree, log, started, opened=True)
  return chosen


def _time_windows(rows, windows, calls_of, p, agree, log, started, opened=False) -> None:
  """`windows` more windows of each row (`opened`: its call compiled and started by the
  caller; else first here), taken in turn, appended to its 't_measured'; then each call
  closed and its median logged."""
  if not opened:
    for row in rows:
      calls_of[row['candidate']](2)
  for row in in_turns(rows, windows):
    steps = whole_periods(p.measure_steps, row['candidate'].period)
    row['t_measured'].append(agree(calls_of[row['candidate']](steps)))
  for row in rows:
    calls_of[row['candidate']].close()
    log(f"Plan [{time.perf_counter() - started:.0f} s]: measured {row['candidate'].label}: "
        f"{np.median(row['t_measured']) * 1e3:.2f} ms a step over {len(row['t_measured'])} "
        f"windows (predicted {row['t_predicted'] * 1e3:.2f}).")


_ROUNDS = itertools.count(1)  # numbers `_measure`'s calls: each one's rounds told apart


def _row_json(row: dict) -> dict:
  c = row['candidate']
  out = {'label': c.label, 'scheme': c.scheme, 'server': c.server, 'devices': c.devices,
         'batch': c.batch, 'bn': c.bn, 'period': c.period, 'backend': c.backend,
         'family': c.family, 'exact': c.exact, 'basis': row.get('basis'),
         'choosable': rank.choosable(row), 'overrides': c.overrides(),
         'K': row['K'], 't_predicted': row['t_predicted'], 't_step': row['t_step'],
         'saves': row['saves'], 'T': row['T'], 'T_own': row['T_own'],
         'notes': row['notes'],
         'collectives': row['collectives']}
  if row.get('t_measured'):
    out['t_measured'] = list(row['t_measured'])
  if 'timed_in' in row:  # phase 5's rounds it was timed in (absent: timed apart from them)
    out['timed_in'] = row['timed_in']
  if row.get('pruned'):  # its collectives not costed: T is a lower bound ('bound', 'budget')
    out['pruned'] = row['pruned']
  return out


def table(plan: dict) -> str:
  """The plan's ranked candidates as Markdown (`rank.table` of its JSON rows)."""
  return rank.table(plan['candidates'], plan.get('choice_rank', 1))


# =============================================================================== using a plan
def read(path: str) -> dict:
  try:
    with open(path) as f:
      plan = json.load(f)
    plan['choice']['overrides']
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise config_lib.ConfigError(
        f'config.plan.file={path!r} is not a plan ({type(e).__name__}: {e}): make one with '
        f'python -m jaxpar.plan --config ... --out {path}') from None
  return plan


def apply(cfg, plan: dict, quiet: bool = False):
  """`cfg` with the plan's choice: its overrides (mesh, scheme, server, batch, BN groups, the
  gradients' sum) and the learning rate constant after warm-up as in the serial run whose
  steps the plan predicts (each change of the config's own setting logged, unless `quiet`)."""
  say = (lambda *args: None) if quiet else logging.info
  overrides = {k: tuple(v) if isinstance(v, list) else v
               for k, v in plan['choice']['overrides'].items()}
  # Every candidate is timed with XLA's all-reduce on a one-axis mesh (plans made before
  # their choice said so too).
  overrides.setdefault('grad_reduce', 'psum')
  if cfg.grad_reduce != overrides['grad_reduce']:
    say('Plan: grad_reduce=%r -> %r on its mesh of %s, the sum its candidates were timed '
        'with.', cfg.grad_reduce, overrides['grad_reduce'], tuple(overrides['mesh.shape']))
  if cfg.optimizer.schedule != 'constant':
    say("Plan: optimizer.schedule=%r -> 'constant' (after %d warm-up steps): the plan "
        'predicts the steps of a constant rate.', cfg.optimizer.schedule,
        cfg.optimizer.warmup_steps)
  overrides['optimizer.schedule'] = 'constant'
  made = plan.get('host_memory')  # None: a plan made before it was recorded
  if cfg.host_memory == 'auto' and made:
    say('Plan: host_memory=auto -> %r, the setting its steps were timed in.', made)
    overrides['host_memory'] = made
  return with_overrides(cfg, overrides)


def runnable(cfg, found) -> tuple:
  """(kept, refused): the candidates whose run, as `apply` makes it from `cfg`, passes the
  checks that run makes of its config (no devices, nothing compiled), and one
  {'method', 'reason'} for each that does not — a setting of the config its method cannot
  take (e.g. gradients sent in bfloat16, which Local SGD never sends) — so that the plan
  ranks only what it can train; across processes a run of one device, or Downpour's on
  Ray's actors, is one process. None kept: the first reason, as one line."""
  from jaxpar import validation
  kept, refused, first = [], [], None
  for c in found:
    run = apply(cfg, {'choice': {'overrides': c.overrides()}}, quiet=True)
    if one_process(c.devices, c.backend):
      run = with_overrides(run, probe.ONE_PROCESS)
    try:
      validation.validate(run, quiet=True)  # the methods' defaults: the run logs its own
      kept.append(c)
    except config_lib.ConfigError as e:
      first = first or f'{e} (in the run of the candidate {c.label}, config.scheme=\'auto\')'
      refused.append({'method': c.label, 'reason': str(e)})
  if not kept:
    raise config_lib.ConfigError(first)
  return kept, refused


def run_length(plan: dict, total_steps: int) -> int:
  """The planned run's length: the config's, or 1.25 × the predicted steps' upper end where
  that is longer (logged)."""
  longest = math.ceil(plan['choice']['K'][2] * 1.25)
  if total_steps < longest:
    logging.info("Plan: %d steps -> %d (1.25 x the predicted steps' upper end).", total_steps,
                 longest)
  return max(total_steps, longest)


def prepare(cfg):
  """Before a plan is made in this process: the config checked as the synchronous run the
  candidates are (one line per bad field, nothing compiled), freed memory kept, the other
  processes joined (`config.distributed`, as `build.mesh` does) and this process's share of
  the mesh's CPU devices emulated. Returns that synchronous config."""
  from jaxpar import build, multihost, validation
  from jaxpar import mesh as mesh_lib
  sync = with_overrides(cfg, {'scheme': 'sync-join'} if cfg.scheme == 'auto' else {})
  validation.validate(with_overrides(sync, {}))  # settles `auto` fields of a copy only
  # Sized by the largest device batch a candidate computes (sync-split on one device: the
  # config's global batch; sync-join: per_device_batch): every candidate is timed in this
  # one setting, and the run takes it (`apply`).
  build.keep_freed_memory(sync, batch=max(cfg.global_batch, cfg.per_device_batch))
  processes = multihost.join(**cfg.distributed)
  if cfg.mesh.emulate_cpu_devices:
    mesh_lib.emulate_cpu_devices(max(1, config_lib.num_devices(cfg) // processes))
  return sync


def resolve(cfg, workdir: str):
  """For `scheme='auto'`: (the config the plan chose, the plan). Reads `plan.file`, or makes
  the plan on this process's devices and writes it to `workdir/plan.json`."""
  if cfg.plan.file:
    plan = read(cfg.plan.file)
  else:
    if cfg.distributed.coordinator or cfg.distributed.num_processes > 1:
      raise config_lib.ConfigError(
          "config.scheme='auto' across processes needs config.plan.file: make the plan with "
          'the same processes first (e.g. launch/local.sh 2 --module jaxpar.plan --workdir '
          'LOGS --config ... --target_loss 0.5 --out plan.json)')
    plan = make(prepare(cfg))
    path = os.path.join(workdir, PLAN_FILE)
    os.makedirs(workdir, exist_ok=True)
    with open(path, 'w') as f:
      json.dump(plan, f, indent=1)
    logging.info('Plan written to %s.', path)
  _check_processes(cfg, plan)
  chosen = apply(cfg, plan)
  saves = plan.get('saves')  # None: a plan made before saves were timed
  if saves and saves['every'] != cfg.checkpoint_every:  # T as this run saves
    c, made = plan['choice'], saves['every']
    saves = {**saves, 'every': cfg.checkpoint_every}
    plan = {**plan, 'saves': saves, 'choice': {
        **c, 'saves': rank.saves_before(c['K'][0], saves),
        'T': rank.time_to_target(c['K'], c['t_step'], saves)}}
    logging.info('Plan: made for a checkpoint every %d steps, run with one every %d: its '
                 'time to the target counts %d saves of %.2f s.', made,
                 cfg.checkpoint_every, plan['choice']['saves'], saves['seconds'])
  c = plan['choice']
  logging.info('Plan: training with %s; predicted %.0f steps, %.2f s to %s (range %.2f–%.2f s).',
               c['label'], c['K'][0], c['T'][0], probe.Target(**plan['target']).describe(),
               c['T'][1], c['T'][2])
  return chosen, plan


def one_process(devices: int, backend: str) -> bool:
  """Whether a choice trains as one process, whatever processes made its plan: one device,
  or Downpour's workers as Ray's actors (its driver one device)."""
  return devices == 1 or backend == 'ray'


def _check_processes(cfg, plan: dict) -> None:
  """A plan made across processes is trained as its choice runs: one device as one process,
  all devices with the processes it was made with (where this run's count is configured)."""
  from jaxpar import multihost
  made = plan.get('processes', 1)
  if made == 1:
    return
  choice, run = plan['choice'], multihost.process_count_of(**cfg.distributed)
  alone = one_process(choice['devices'], choice.get('backend', ''))
  if alone and run > 1:
    raise config_lib.ConfigError(
        f"config.plan.file={cfg.plan.file!r} chose one process ({choice['label']}): run "
        f'jaxpar.train as one process (without launch/local.sh or config.distributed)')
  if not alone and run != made:
    raise config_lib.ConfigError(
        f"config.plan.file={cfg.plan.file!r} chose {choice['devices']} devices over the "
        f'{made} processes it was made with: launch {made} processes (e.g. launch/local.sh '
        f'{made} ...)')


class TargetClock:
  """A planned run's measured time to its target: training time from the end of its first
  step (whose call compiles) to the first evaluation at or past the target, evaluations
  and the summaries' writing (`paused`) excluded, checkpoint saves included — what the
  plan's T = K·t_step + saves·t_save predicts."""

  def __init__(self, plan: dict, every: int):
    self.target = probe.Target(**plan['target'])
    self.choice, self.every = plan['choice'], every
    self.elapsed, self.mark, self.reached = 0.0, None, None
    self.curve = []  # (step, metric, training seconds) at each evaluation

  def started(self, state) -> None:
    jax.block_until_ready(state)
    self.mark = time.perf_counter()

  @contextlib.contextmanager
  def paused(self, metrics):
    """The block (a report: its summaries written) outside the time, after the steps
    dispatched have finished. The first report sets up TensorFlow's summary ops: 0.3-0.4 s,
    a tenth of SqueezeNet's time to loss 0.5 at 32², on no step the plan times."""
    if self.reached or self.mark is None:
      yield
      return
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    try:
      yield
    finally:
      self.mark += time.perf_counter() - start

  def check(self, step: int, state, evaluate) -> None:
    """At every `every`-th step until reached: stops the clock, evaluates, restarts it. The
    step and time of reaching are interpolated between this evaluation and the one before
    in log-metric (`steps_model.reached`), the evaluations' spacing otherwise rounding K."""
    if self.reached or self.mark is None or step % self.every:
      return
    jax.block_until_ready(state)
    self.elapsed += time.perf_counter() - self.mark
    value = self.target.metric(evaluate())
    self.curve.append((step, value, self.elapsed))
    if value <= self.target.threshold:
      at = steps_model.reached([(s, v) for s, v, _ in self.curve[-2:]], self.target.threshold)
      if len(self.curve) > 1:
        (s0, _, e0), (s1, _, e1) = self.curve[-2:]
        seconds = e0 + (e1 - e0) * (at - s0) / (s1 - s0)
      else:
        seconds = self.elapsed
      self.reached = (at, seconds)
      logging.info('Plan: %s reached at step %.0f after %.2f s of training (predicted %.0f '
                   'steps, %.2f s; range %.2f–%.2f s).', self.target.describe(), at, seconds,
                   self.choice['K'][0], self.choice['T'][0], self.choice['T'][1],
                   self.choice['T'][2])
    self.mark = time.perf_counter()

  def write(self, workdir: str, step: int) -> dict:
    """The outcome, also written to `workdir/plan_outcome.json` (process 0)."""
    out = self.outcome(step)
    if jax.process_index() == 0 and '://' not in workdir:
      with open(os.path.join(workdir, OUTCOME_FILE), 'w') as f:
        json.dump({**out, 'choice': self.choice['label'], 'target': self.target.to_dict()}, f,
                  indent=1)
    return out

  def _saves(self) -> str:
    n = self.choice.get('saves')
    return f", {n} checkpoint save{'s' if n > 1 else ''}" if n else ''

  def outcome(self, step: int) -> dict:
    """{'summary': one line, 'step', 'seconds' (None: not reached), 'predicted_steps',
    'predicted_seconds', 'curve': [step, metric, training seconds] at each evaluation}."""
    c = self.choice
    out = {'step': None, 'seconds': None, 'predicted_steps': c['K'][0],
           'predicted_seconds': c['T'][0],
           'curve': [list(point) for point in self.curve]}  # (step, metric, seconds)
    if self.reached:
      out.update(step=self.reached[0], seconds=self.reached[1], summary=(
          f"time to the target {self.reached[1]:.2f} s at step {self.reached[0]:.0f} "
          f"(planned {c['T'][0]:.2f} s, {c['K'][0]:.0f} steps{self._saves()})"))
    else:
      out['summary'] = (f"target not reached in {step} steps (planned {c['K'][0]:.0f} steps, "
                        f"{c['T'][0]:.2f} s{self._saves()})")
    return out
