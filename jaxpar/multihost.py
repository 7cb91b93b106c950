"""Several processes as one run (jax.distributed): joining it, and failing fast when a
process is lost.

Left to itself, JAX's runtime turns a lost process into a long hang or an abort with a
C++ stack trace: a process whose Python code raised waits in jax.distributed's shutdown
barrier (up to 5 minutes) while its peers wait for it in a collective; a killed one is
noticed at the coordination service's heartbeat timeout, or sooner by gloo, which then
raises 'Connection closed by peer' or aborts. So every process here publishes a heartbeat
in the coordination service's key-value store and watches its peers': a peer silent for
`heartbeat_timeout` seconds, or one that reported its own failure, ends this process
(exit status 3) with a message naming it; an exception or abort caused by a vanished peer
waits for that verdict; a vanished coordinator (process 0, which hosts the service) is
named as such. Restarting every process with the same workdir then resumes from the last
checkpoint.
"""
import atexit
import ctypes
import json
import os
import signal
import sys
import threading
import time

import jax
from absl import logging
from jax._src import distributed as jax_distributed  # the joined run's client and ids

from jaxpar import cpu_load
from jaxpar.config import ConfigError, RunError

EXIT_PEER_LOST = 3
_PREFIX = 'jaxpar/'
_RPC_GRACE = 2.0  # seconds a key-value call may take before the service counts as gone
_COORDINATOR_LOST = ('lost contact with process 0, the coordinator: it was killed, crashed or '
                     'ran out of memory')
# How a collective fails when its peer process is gone (gloo over TCP; NCCL just waits).
_LOST_PEER_SIGNS = ('Connection closed by peer', 'Connection reset by peer', 'Broken pipe')


def join(coordinator: str, num_processes: int, process_id: int, cluster: str,
         initialization_timeout: int, heartbeat_timeout: int,
         collective_threads: str = 'idle') -> int:
  """Joins this process to a multi-process run and starts watching its peers; returns the
  number of processes (1: nothing to join, nothing started).

  An explicit `coordinator` (host:port of process 0) wins; otherwise `cluster` says which
  of JAX's cluster environments to read the coordinator, process count and id from
  ('auto': whichever is present, 'none': run alone). Must run before JAX starts its
  backend. `collective_threads='idle'`: gloo's TCP event-loop threads run at idle priority
  (`IdleGlooLoops`), 'normal' leaves them.
  """
  if coordinator:
    how, kwargs = f'coordinator {coordinator}', dict(
        coordinator_address=coordinator, num_processes=num_processes, process_id=process_id,
        cluster_detection_method='deactivate')  # explicit: no device ids from a scheduler either
  else:
    env = _cluster_env(cluster)
    if env is None or env.get_process_count() == 1:
      return 1
    how, kwargs = f'{env.__name__} environment', dict(cluster_detection_method=env.name)
  # Our watchdog reports a silent peer after `heartbeat_timeout`; JAX's own check (which
  # aborts with a stack trace) stays as the backstop, later.
  with _deadline(initialization_timeout, how):
    jax.distributed.initialize(initialization_timeout=initialization_timeout,
                               heartbeat_timeout_seconds=2 * heartbeat_timeout + 10, **kwargs)
  state = jax_distributed.global_state
  logging.info('Process %d of %d joined (%s).', state.process_id, state.num_processes, how)
  _Watchdog(state.client, state.process_id, state.num_processes, heartbeat_timeout).start()
  if collective_threads == 'idle' and state.num_processes > 1:
    IdleGlooLoops().start()
  return state.num_processes


# x86_64 epoll_wait and epoll_pwait, aarch64 epoll_pwait (/proc/<tid>/syscall's first field)
_EPOLL_SYSCALLS = {'x86_64': ('232', '281'), 'aarch64': ('22',)}


# What `IdleGlooLoops` logs when it puts a loop back at normal priority (tools that read a
# run's logs look for it: `analysis.steptime.plan_steps`).
BACK_AT_NORMAL = 'Back at normal priority'


class IdleGlooLoops(threading.Thread):
  """Puts gloo's TCP event-loop threads at idle priority (SCHED_IDLE) as they appear, and
  back at normal priority while another process keeps their core busy.

  A cross-process collective on CPU goes through gloo over TCP, whose event loop
  (`gloo::transport::tcp::Loop::run`, one thread per process) calls `epoll_wait(fd, events,
  64, 10 ms)` and, while a collective is in flight, finds events ready on every call: it
  spins. When the process is pinned to one core (launch/local.sh, `measure`), the spinning
  loop holds the core the thread that must take the next step of the collective is waiting
  for, until the scheduler's tick preempts it: every small collective then takes one tick,
  4 ms at CONFIG_HZ = 250 (measured: 98 % of a pinned process's samples in that thread,
  `perf`; 16-float psum 4.00 ms a call). At SCHED_IDLE the loop runs only when nothing else
  on its core can, and is preempted at once when another thread wakes: the same psum takes
  0.08 ms (nice 19 is not enough: 3.92 ms; neither is a 0.1 ms EEVDF slice). docs/performance.md
  has the measurements.

  Idle priority has one failure: a thread of *another* process busy on the same core (a
  second job, a test beside this one) leaves the loop almost no time (SCHED_IDLE's weight
  is 3 against a normal thread's 1024), and every collective waits for it: 16 floats took
  68 ms a call, 16 MB 272 ms, against 4 and 25 ms at normal priority. The loop's own
  scheduler statistics show it (`/proc/self/task/<tid>/schedstat`: time spent runnable but
  waiting for a core, and the number of runs): without another process the loop waits at
  most 0.14 ms per run (0.01 ms for small calls), starved 2–2.7 ms. So every `period_s` the
  loop's mean wait per run since the last decision (once it has run `MIN_RUNS` times over
  at least `MIN_WINDOW_S`) is judged: `STARVED_S` or more while other processes used
  `OTHERS_BUSY` of its cores puts it back at normal priority, logged with the numbers;
  idle priority is tried again `retry_s` later, doubling while it keeps starving (up to
  `MAX_RETRY_S`), and back to `retry_s` once idle priority has held that long.

  The window is 2 s, not a fraction of one: a burst of the kernel's own work on the core
  (0.10 s of system time in 0.31 s, charged to no process of the run, while the process
  waited for its peer to compile) read as another process using 29 % of it, and put the
  loop back for 30 s in about one launch in four — where ResNet34 32²'s all-reduce step on
  2 processes took 220–245 ms a step against 105–140 ms at idle priority (2026-12-03).
  Over 2 s such a burst is 5 %; a process that keeps the core busy is still found within
  ~2 s.

  The loop thread is found by its system call: an epoll wait for 64 events with a 10 ms
  timeout (gRPC's pollers, the other epoll threads of a JAX process, wait for 100). Looked
  for every 0.1 s for the first minute (the loop starts with the first collective), then
  every 2 s; each thread found is logged once. Linux only; elsewhere it does nothing.
  """

  STARVED_S = 0.5e-3  # a mean wait for a core per run of the loop that starves it,
  OTHERS_BUSY = 0.25  # while other processes use this many cores' worth of its cores
  MIN_RUNS = 20       # runs of the loop a judgement needs (fewer: no collective in flight)
  MIN_WINDOW_S = 2.0  # and seconds (a kernel burst is not another process)
  RETRY_S = 30.0
  MAX_RETRY_S = 1800.0

  def __init__(self, retry_s: float = RETRY_S, period_s: float = 0.5):
    super().__init__(name='jaxpar-idle-gloo', daemon=True)
    self.retry_s, self.period_s = retry_s, period_s
    self.loops = {}    # tid -> _Loop
    self.history = []  # (tid, 'idle' | 'normal', why): every change made, in order
    self._stopped = threading.Event()
    self._retry = threading.Event()  # `retry_now`: taken by the watching thread

  def stop(self):
    """Ends the thread at its next wake-up; the loops keep the priority they have."""
    self._stopped.set()

  def retry_now(self):
    """Asks for idle priority again at the next judgement, for every loop put back at
    normal priority by a busy process that is known to be gone (the plan's own one-device
    process, `jaxpar.plan`), instead of after its backoff; the backoff starts again from
    `retry_s`. A loop the system refused idle priority stays as it is."""
    self._retry.set()

  def run(self):
    if not os.path.isdir('/proc/self/task') or not hasattr(os, 'SCHED_IDLE'):
      return
    global _running
    _running = self
    started = last_search = time.monotonic()
    while True:
      now = time.monotonic()
      if now - started < 60 or now - last_search >= 2.0:
        self.poll()
        last_search = now
      self.watch(now, {tid: _sample(tid) for tid in list(self.loops)})
      if self._stopped.wait(0.1 if now - started < 60 else self.period_s):
        return

  def poll(self) -> list:
    """Sets every gloo loop thread not seen before to SCHED_IDLE; returns those it set."""
    found = []
    for tid in gloo_loop_threads():
      if tid in self.loops:
        continue
      loop = self.track(tid)
      if loop is None:  # ended since it was seen
        continue
      if self._set(tid, idle=True, why='found'):
        logging.info('gloo\'s TCP loop thread %d runs at idle priority (SCHED_IDLE): a '
                     'small collective across processes no longer waits for a timer tick '
                     '(distributed.collective_threads=normal leaves it).', tid)
        found.append(tid)
      else:  # not allowed here: left as it is, never tried again
        loop.idle, loop.retry_at = False, float('inf')
    return found

  def track(self, tid: int):
    """Starts watching loop thread `tid`, taken to be at idle priority now: its `_Loop`, or
    None if the thread has ended."""
    sample = _sample(tid)
    if sample is None:
      return None
    loop = self.loops[tid] = _Loop(base=(time.monotonic(), sample), backoff=self.retry_s)
    return loop

  def watch(self, now: float, stats: dict):
    """One judgement of every known loop, from `stats`: tid -> `_sample(tid)` (seconds run,
    seconds waiting for a core, runs, CPU seconds other processes used on its cores), None
    for a thread that has ended."""
    if self._retry.is_set():
      self._retry.clear()
      for loop in self.loops.values():
        if not loop.idle and loop.retry_at != float('inf'):
          loop.retry_at, loop.backoff = now, self.retry_s
    for tid, stat in stats.items():
      loop = self.loops[tid]
      if stat is None:  # the thread ended (its communicator was destroyed)
        del self.loops[tid]
        continue
      if not loop.idle:
        if now >= loop.retry_at and self._set(tid, idle=True, why='retry'):
          loop.idle, loop.base, loop.since = True, (now, stat), now
          logging.info('gloo\'s TCP loop thread %d: idle priority tried again after %.0f s.',
                       tid, loop.backoff)
        continue
      then, base = loop.base
      runs = stat[2] - base[2]
      if runs < self.MIN_RUNS or now - then < self.MIN_WINDOW_S:
        continue
      wait = (stat[1] - base[1]) / runs
      others = (stat[3] - base[3]) / (now - then)  # cores' worth
      loop.base = (now, stat)
      if wait < self.STARVED_S or others < self.OTHERS_BUSY:
        if now - loop.since >= loop.backoff:
          loop.backoff = self.retry_s  # held as long as the last retry waited: reset
        continue
      if not self._set(tid, idle=False, why=f'starved: {wait * 1e3:.2f} ms a run, other '
                                              f'processes {others:.2f} cores'):
        continue
      loop.idle = False
      if loop.starved:
        loop.backoff = min(2 * loop.backoff, self.MAX_RETRY_S)
      loop.starved += 1
      loop.retry_at = now + loop.backoff
      (logging.warning if loop.starved == 1 else logging.info)(
          'Other processes used %.0f %% of a core on the cores of gloo\'s TCP loop thread %d '
          'over the last %.1f s, and at idle priority it waited %.2f ms for a core each of its '
          f'%d runs: every collective across processes waits for it. {BACK_AT_NORMAL} '
          '(a small collective may wait for a 4 ms timer tick); idle priority is tried again '
          'in %.0f s.', others * 100, tid, now - then, wait * 1e3, runs, loop.backoff)

  def _set(self, tid: int, idle: bool, why: str) -> bool:
    try:
      os.sched_setscheduler(tid, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
    except OSError as e:
      if idle and why == 'found':
        logging.warning('gloo\'s TCP loop thread %d could not be set to idle priority (%s); '
                        'small collectives across processes may wait for a timer tick.', tid, e)
      return False
    self.history.append((tid, 'idle' if idle else 'normal', why))
    return True


class _Loop:
  """What `IdleGlooLoops` knows of one loop thread."""

  def __init__(self, base, backoff: float):
    self.idle = True
    self.base = base         # (time, its `_sample`) at the last judgement
    self.since = base[0]     # when idle priority was last set
    self.backoff = backoff   # seconds at normal priority before idle is tried again
    self.retry_at = 0.0
    self.starved = 0         # times it starved at idle priority


_running = None  # the IdleGlooLoops of this process, once it runs


def _sample(tid: int):
  """(seconds run, seconds runnable but waiting for a core, runs) of one thread of this
  process (its /proc schedstat), and the CPU seconds other processes have used on the cores
  it may run on (`cpu_load`: those cores' busy time less this process's); None if the
  thread has ended."""
  try:
    with open(f'/proc/self/task/{tid}/schedstat') as f:
      run, wait, runs = f.read().split()[:3]
    clock = cpu_load.cpu_clock(cores=os.sched_getaffinity(tid), children=False)
  except (OSError, ValueError):
    return None
  others = clock[0] - clock[1] if clock is not None else 0.0
  return int(run) / 1e9, int(wait) / 1e9, int(runs), others


def gloo_loop_history() -> list:
  """Every priority change `IdleGlooLoops` made in this process: (thread id, 'idle' or
  'normal', why), in order; empty where it does not run."""
  return list(_running.history) if _running is not None else []


def idle_gloo_loops_again(timeout_s: float = 5.0) -> bool:
  """After a busy process beside this one has ended: `IdleGlooLoops.retry_now`, then
  `wait_for_idle_gloo_loops`; True if every gloo loop of this process is at idle priority
  (False at once where no `IdleGlooLoops` runs: one process, `distributed.collective_threads
  ='normal'`, not Linux; False after `timeout_s` where another process still keeps a loop's
  core busy)."""
  if _running is None:
    return False
  _running.retry_now()
  return wait_for_idle_gloo_loops(timeout_s)


def wait_for_idle_gloo_loops(timeout_s: float = 5.0) -> bool:
  """Waits, with no collective in flight, until `IdleGlooLoops` has set every gloo loop
  thread of this process to idle priority; True if it has (False after `timeout_s`: where
  there is no loop, or one is back at normal priority because another process keeps its
  core busy). The poller sees a loop thread only while it waits in epoll,
  which a spinning loop seldom does: calls timed right after a process's first collective
  can still wait for ticks. Tools that time small calls call this after one collective."""
  deadline = time.monotonic() + timeout_s
  while True:
    loops = gloo_loop_threads()
    try:
      if loops and all(os.sched_getscheduler(t) == os.SCHED_IDLE for t in loops):
        return True
    except OSError:  # a thread ended between the two reads
      pass
    if time.monotonic() > deadline:
      return False
    time.sleep(0.05)


def gloo_loop_threads(tasks: str = '/proc/self/task') -> list:
  """This process's threads waiting in gloo's TCP event loop now (see `IdleGlooLoops`)."""
  import platform
  calls = _EPOLL_SYSCALLS.get(platform.machine(), ())
  found = []
  for tid in os.listdir(tasks):
    try:
      with open(f'{tasks}/{tid}/syscall') as f:
        fields = f.read().split()
    except OSError:  # the thread ended
      continue
    if len(fields) > 4 and fields[0] in calls and int(fields[3], 16) == 64 \
        and int(fields[4], 16) == 10:
      found.append(int(tid))
  return found


def process_count_of(coordinator: str, num_processes: int, cluster: str, **_) -> int:
  """How many processes a run of these `config.distributed` fields joins, before joining:
  the explicit count with a coordinator, else the cluster environment's, else 1."""
  if coordinator:
    return num_processes
  env = _cluster_env(cluster)
  return env.get_process_count() if env is not None else 1


def _cluster_env(cluster: str):
  """JAX's detector of the named cluster (the first present one for 'auto'), or None."""
  if cluster == 'none':
    return None
  # jax.distributed.initialize() has no public "is there a cluster?" query; its detectors do.
  from jax._src import clusters
  for env in clusters.ClusterEnv._cluster_types:
    if cluster == env.name or (cluster == 'auto' and not env.opt_in_only_method):
      if env.is_env_present():
        return env
  if cluster != 'auto':
    raise ConfigError(f'config.distributed.cluster={cluster!r} is invalid: no {cluster} '
                      f"environment is present here; use 'auto' (whichever is present), "
                      f"'none', or an explicit distributed.coordinator")
  return None


class _deadline:
  """JAX aborts a join that times out with 'DEADLINE_EXCEEDED' and a C++ stack trace; this
  says what went wrong a moment before."""

  def __init__(self, seconds: int, how: str):
    self.timer = threading.Timer(max(seconds - 1, 1), _stop, args=(
        f'could not join the run ({how}) within distributed.initialization_timeout='
        f'{seconds} s: check that every process was started with the same coordinator and '
        f'process count, and that the coordinator\'s port is reachable', 1))
    self.timer.daemon = True

  def __enter__(self):
    self.timer.start()

  def __exit__(self, *exc):
    self.timer.cancel()


class _Watchdog(threading.Thread):
  """Heartbeats into the coordination service's key-value store and watches the peers'."""

  def __init__(self, client, me: int, count: int, timeout: float):
    super().__init__(name='jaxpar-watchdog', daemon=True)
    self.client, self.me, self.count, self.timeout = client, me, count, timeout
    self.interval = min(max(timeout / 10, 0.2), 5.0)
    self.finished = threading.Event()
    self.contact = time.monotonic()  # of the last answer from the coordination service
    self.previous_hook = sys.excepthook
    sys.excepthook = self._uncaught
    # gloo ends a process with abort() when a peer vanishes mid-message (an uncaught
    # C++ exception: 'Received data size doesn't match expected size'), and JAX's
    # runtime when it loses the coordinator. A Python signal handler would never run
    # (it waits for the main thread, which waits in the collective), so a C-level one
    # holds the aborting thread while the watchdog names the lost process; if it finds
    # none within the timeout, the abort proceeds.
    self._on_abort = ctypes.CFUNCTYPE(None, ctypes.c_int)(self._aborting)
    ctypes.CDLL(None).signal(signal.SIGABRT, self._on_abort)
    atexit.register(self._done)  # after jax.distributed's shutdown: runs before it

  def run(self):
    last = {p: (None, time.monotonic()) for p in range(self.count) if p != self.me}
    beat = 0
    while not self.finished.wait(self.interval):
      beat += 1
      try:
        self.client.key_value_set(f'{_PREFIX}beat/{self.me}', str(beat), allow_overwrite=True)
        entries = dict(self.client.key_value_dir_get(_PREFIX))
      except Exception as e:  # the coordination service lives in process 0
        if not self.finished.is_set() and jax_distributed.global_state.client is not None:
          _stop(f'{_COORDINATOR_LOST} ({type(e).__name__}: {str(e).splitlines()[0]})')
        return
      now = self.contact = time.monotonic()
      for peer, (seen, since) in list(last.items()):
        if f'{_PREFIX}done/{peer}' in entries:
          del last[peer]
        elif f'{_PREFIX}failed/{peer}' in entries:
          _stop(f"process {peer} failed: {entries[f'{_PREFIX}failed/{peer}']}")
        elif entries.get(f'{_PREFIX}beat/{peer}') != seen:
          last[peer] = (entries.get(f'{_PREFIX}beat/{peer}'), now)
        elif now - since > self.timeout:
          _stop(f'process {peer} sent no heartbeat for {now - since:.0f} s '
                f'(distributed.heartbeat_timeout={self.timeout}): it was killed, crashed, '
                f'ran out of memory or hangs')

  def _uncaught(self, kind, value, traceback):
    """This process failed: the traceback as usual, then tell the peers and leave at once
    (jax.distributed's shutdown would wait for them while they wait for us). Unless a
    collective broke because a peer vanished (gloo: 'Connection closed by peer'): then
    the peer is the one to name, once its heartbeat is overdue."""
    if any(sign in str(value) for sign in _LOST_PEER_SIGNS):
      self._await_verdict(f'A collective failed ({str(value).splitlines()[0][:200]})')
    self.previous_hook(kind, value, traceback)
    self._tell('failed', f'{kind.__name__}: {value}'.splitlines()[0][:300])
    _flush_and_exit(1)

  def _aborting(self, signum):
    self._await_verdict(f'Aborting (signal {signum})')

  def _await_verdict(self, what: str):
    """Waits while the watchdog looks for a lost process (and ends this one if it finds
    it). The watchdog's calls hanging means the coordination service is gone."""
    logging.error('%s; waiting up to %d s for a lost process to miss its heartbeat.', what,
                  self.timeout)
    deadline = time.monotonic() + self.timeout + 3 * self.interval
    while self.is_alive() and time.monotonic() < deadline:
      if self.me != 0 and time.monotonic() - self.contact > 2 * self.interval + _RPC_GRACE:
        _stop(_COORDINATOR_LOST)
      time.sleep(0.1)

  def _done(self):
    self.finished.set()
    self._tell('done', '1')

  def _tell(self, what: str, value: str):
    """Publishes this process's `what` to the peers, unless the coordination service is
    gone (its calls would then hang)."""
    def publish():
      try:
        self.client.key_value_set(f'{_PREFIX}{what}/{self.me}', value, allow_overwrite=True)
      except Exception:  # nobody left to tell
        pass
    call = threading.Thread(target=publish, daemon=True)
    call.start()
    call.join(2 * self.interval + _RPC_GRACE)


# A step every process takes may last hours (preparing a dataset); the watchdog ends the
# wait at once if a peer is lost, so the barriers themselves need no shorter limit.
_BARRIER_MS = 24 * 3600 * 1000


def process_0_first(name: str, fn):
  """`fn()` in process 0, then in the others, all leaving together: a directory every process
  shares is prepared once, node-local ones each their own, and no two processes write one
  at the same time. The waits are barriers of the coordination service: the first gloo
  collective (orbax's, creating the checkpoint directory) gives up after 30 s, far less
  than building a dataset takes. Without a joined run, just `fn()`."""
  state = jax_distributed.global_state
  if state.client is None or state.num_processes == 1:
    return fn()
  result = fn() if state.process_id == 0 else None
  state.client.wait_at_barrier(f'{_PREFIX}{name}/first', _BARRIER_MS)
  if state.process_id != 0:
    result = fn()
  state.client.wait_at_barrier(f'{_PREFIX}{name}/all', _BARRIER_MS)
  return result


def from_process_0(name: str, fn):
  """`fn()`'s value (JSON-serialisable) computed in process 0 only and handed to every
  process through the coordination service: a measurement whose outcome shapes what every
  process compiles next must be one number everywhere, not each process's own. An error in
  process 0 is raised in every process (a `ConfigError` as one, anything else as
  `RunError`, with its message; process 0 re-raises its own). `name`: unique within the
  run. Without a joined run, just `fn()`."""
  state = jax_distributed.global_state
  if state.client is None or state.num_processes == 1:
    return fn()
  key = f'{_PREFIX}from0/{name}'
  if state.process_id == 0:
    try:
      value = fn()
    except BaseException as e:
      state.client.key_value_set(key, json.dumps({'error': str(e),
                                                  'config': isinstance(e, ConfigError)}))
      raise
    state.client.key_value_set(key, json.dumps({'value': value}))
    return value
  got = json.loads(state.client.blocking_key_value_get(key, _BARRIER_MS))
  if 'error' in got:
    raise (ConfigError if got['config'] else RunError)(f'process 0: {got["error"]}')
  return got['value']


def barrier(name: str):
  """Every process of a joined run waits here for the others: a barrier of the coordination
  service, not a collective — a peer still compiling (or loading from a compilation cache
  what this one compiled) may lag by more than gloo's 30 s for a first collective. `name`:
  unique within the run. Without a joined run, nothing."""
  state = jax_distributed.global_state
  if state.client is not None and state.num_processes > 1:
    state.client.wait_at_barrier(f'{_PREFIX}{name}', _BARRIER_MS)


def _stop(reason: str, status: int = EXIT_PEER_LOST):
  """Ends this process from any thread, even while its main thread waits in a collective."""
  state = jax_distributed.global_state
  who = (f'process {state.process_id} of {state.num_processes}' if state.client
         else 'this process')
  message = (f'jaxpar: {who} stops: {reason}.' + (
      ' Restart every process with the same --workdir to resume from the last checkpoint.'
      if status == EXIT_PEER_LOST else ''))
  logging.error('%s', message)
  _flush_and_exit(status)


def _flush_and_exit(status: int):
  logging.flush()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(status)


def describe_process() -> str:
  """'Process 1 of 2: 4 cpu devices (emulated) on core 1 of 2.': what this process really
  has, which the global device count does not say."""
  devices = jax.local_devices()
  cores = sorted(os.sched_getaffinity(0))
  kind = devices[0].platform
  emulated = ' (emulated)' if kind == 'cpu' and len(devices) > 1 else ''
  return (f'Process {jax.process_index()} of {jax.process_count()}: {len(devices)} {kind} '
          f'device{"s" if len(devices) > 1 else ""}{emulated} on core{"s" if len(cores) > 1 else ""} '
          f'{_ranges(cores)} of {os.cpu_count()}.')


def _ranges(cores) -> str:
  """[0, 1, 2, 5] → '0-2,5'."""
  spans, start = [], cores[0]
  for prev, core in zip(cores, cores[1:] + [None]):
    if core != prev + 1:
      spans.append(f'{start}-{prev}' if prev > start else f'{start}')
      start = core
  return ','.join(spans)
