"""Several processes forming one mesh (jax.distributed over loopback, gloo collectives):
the same numbers as one process, and a lost process ends the run, which resumes."""
import json
import os
import random
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import multiprocess_checks as checks
from jaxpar import multihost
from jaxpar.mesh import make_mesh
from runs import ROOT, process_env, random_batches, train_losses

ENV = process_env()
PROCESS_TIMEOUT = 600  # seconds: no real-process run may hang the suite


def _port():
  return str(random.randint(20000, 40000))


@pytest.fixture(scope='module')
def two_processes(tmp_path_factory):
  """Every check of multiprocess_checks.py, run by 2 processes × 4 devices that join as the
  tasks of a SLURM job step do: through JAX's cluster detection (distributed.cluster='auto')."""
  out = tmp_path_factory.mktemp('two') / 'result.npz'
  slurm = {'SLURM_JOB_ID': '1', 'SLURM_STEP_NODELIST': '127.0.0.1', 'SLURM_NTASKS': '2',
           'JAX_COORDINATOR_PORT': _port()}
  procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, 'tests', 'multiprocess_checks.py'),
                             str(out)], env={**ENV, **slurm, 'SLURM_PROCID': str(i),
                                             'SLURM_LOCALID': str(i)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  logs = [p.communicate(timeout=PROCESS_TIMEOUT)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  return dict(np.load(out))


def _mesh():
  return make_mesh((2, 4), ('x', 'y'))


@pytest.mark.slow
def test_multi_megabyte_reductions_across_processes_are_exact(two_processes):
  """gloo has had silent wrong-result bugs for large buffers: every element of a 16 MB
  all-reduce (psum, ring, torus), reduce-scatter and all-gather across two processes
  equals the one-process result and numpy's sum (integer values: exact in any order)."""
  one = checks.reductions(_mesh())
  expected = one['expected_sum']
  for name in ('psum', 'ring', 'torus2d'):
    assert two_processes[f'reduce/{name}'].shape == (checks.REDUCED_SIZE,)
    np.testing.assert_array_equal(two_processes[f'reduce/{name}'], expected, err_msg=name)
    np.testing.assert_array_equal(one[name], expected, err_msg=name)
  np.testing.assert_array_equal(two_processes['reduce/reduce_scatter'], expected[:8000])
  np.testing.assert_array_equal(two_processes['reduce/all_gather'], one['all_gather'])
  np.testing.assert_array_equal(one['reduce_scatter'], expected[:8000])


def test_gloos_event_loop_runs_at_idle_priority_across_processes(two_processes):
  """multihost.join set gloo's TCP loop thread to SCHED_IDLE (found by its system call): a
  small collective no longer waits for a timer tick (docs/performance.md); the reductions and
  strategies above ran with it so, and equal one process's results. Where another process
  (a test beside this one) starved it, it went back to normal priority for a while: then
  its policy is the last one set, and the tools' wait for idle loops says no."""
  policies = two_processes['gloo_loop_policies']
  history = json.loads(str(two_processes['gloo_loop_history']))
  assert len(policies) >= 1 and history[:1] and history[0][1:] == ['idle', 'found'], history
  last = {tid: to for tid, to, _ in history}
  for tid, policy in zip(two_processes['gloo_loop_ids'], policies):
    assert policy == {'idle': os.SCHED_IDLE, 'normal': os.SCHED_OTHER}[last[tid]], history
  # what tools wait for before timing calls
  assert bool(two_processes['gloo_loops_idle']) == all(p == os.SCHED_IDLE for p in policies)


def test_a_gloo_loop_starved_by_another_process_goes_back_to_normal_priority_for_a_while():
  """At idle priority gloo's loop gets almost no time on a core another process keeps busy
  (every collective then waited 15x longer than at normal priority): process 0's
  `IdleGlooLoops` sets its loop idle, back to normal once a busy process pinned to its core
  starves it, and idle again 2 s (its `retry_s`) after that process has ended; every
  all-reduce meanwhile sums right (tests/multiprocess_starved_loop.py)."""
  port = _port()
  procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, 'tests',
                                                          'multiprocess_starved_loop.py'),
                             str(i), port], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  logs = [p.communicate(timeout=PROCESS_TIMEOUT)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  history = json.loads(re.search(r'^history (.*)$', logs[0], re.M).group(1))
  assert [(to, why.split(':')[0]) for _, to, why in history[:3]] == [
      ('idle', 'found'), ('normal', 'starved'), ('idle', 'retry')], history
  assert re.search(r"Other processes used \d+ % of a core on the cores of gloo's TCP loop ",
                   logs[0])
  calls = json.loads(re.search(r'^calls (.*)$', logs[0], re.M).group(1))
  assert calls == json.loads(re.search(r'^calls (.*)$', logs[1], re.M).group(1))


def test_the_loop_watch_judges_waits_beside_other_processes_and_backs_off_while_it_starves():
  """`IdleGlooLoops.watch` on given samples (seconds run, seconds waiting for a core, runs,
  CPU seconds of other processes on its cores): fewer than MIN_RUNS runs or MIN_WINDOW_S
  seconds since the last judgement decide nothing; a mean wait of STARVED_S or more a run
  while other processes use OTHERS_BUSY of a core sets normal priority, and the same wait
  with no other process (this process's own threads took the core) does not; idle is tried
  again after retry_s, then after twice as long while it starves again, and after retry_s
  once idle has held that long; a thread that ended is forgotten."""
  watcher = multihost.IdleGlooLoops(retry_s=10.0)
  changes = []
  watcher._set = lambda tid, idle, why: changes.append((tid, idle, why.split(':')[0])) or True
  starved, busy, runs = watcher.STARVED_S, watcher.OTHERS_BUSY, watcher.MIN_RUNS

  def fresh():  # loop 7 found at time 0
    watcher.loops[7] = multihost._Loop(base=(0.0, (0.0, 0.0, 0, 0.0)), backoff=10.0)
    total.update(t=0.0, wait=0.0, runs=0, others=0.0)

  def at(now, wait, n=runs, others=0.0):
    """The loop after `n` more runs waiting `wait` each, other processes using `others`
    cores since the last call; its idle state after the judgement."""
    total['wait'] += wait * n
    total['runs'] += n
    total['others'] += others * (now - total['t'])
    total['t'] = now
    watcher.watch(now, {7: (1.0, total['wait'], total['runs'], total['others'])})
    return watcher.loops[7].idle

  total = {}
  w = watcher.MIN_WINDOW_S
  fresh()
  assert at(w, 10 * starved, n=runs - 1, others=1) is True  # too few runs to judge
  fresh()
  assert at(0.9 * w, 10 * starved, others=1) is True  # too short a time to judge
  # A burst on the core (the kernel's, a tenth of a second) while the loop waited: over the
  # window it is below OTHERS_BUSY, and the loop stays idle.
  fresh()
  assert at(0.05 * w, 10 * starved, others=1) is True
  assert at(w, 10 * starved, others=0) is True and changes == []
  fresh()
  assert at(w, 0.9 * starved, others=1) is True and changes == []  # a short wait: judged
  assert at(2 * w, 10 * starved, others=0.9 * busy) is True and changes == []  # its own
  t = 3 * w
  assert at(t, 1.1 * starved, others=1.1 * busy) is False
  assert changes == [(7, False, 'starved')] and watcher.loops[7].retry_at == t + 10
  assert at(t + 9.9, 0, n=0) is False and at(t + 10, 0, n=0) is True  # retried after 10 s
  assert changes[-1] == (7, True, 'retry')
  t += 10 + w
  assert at(t, 10 * starved, others=1) is False and watcher.loops[7].retry_at == t + 20
  assert at(t + 20, 0, n=0) is True and watcher.loops[7].backoff == 20  # doubled
  assert at(t + 25, 0) is True  # judged idle: still idle
  assert at(t + 45, 0) is True and watcher.loops[7].backoff == 10  # held 25 s >= 20 s
  watcher.watch(t + 46, {7: None})
  assert watcher.loops == {} and len(changes) == 4


def test_retry_now_asks_for_idle_priority_at_the_next_judgement(monkeypatch):
  """A loop put back at normal priority waits for its backoff; once the busy process is
  known to be gone (`retry_now`, as `jaxpar.plan` says after its one-device process), the
  next judgement sets it idle and its backoff starts again from retry_s; a loop the system
  refused idle priority is left as it is. Without a watcher (one process, or
  collective_threads='normal') `idle_gloo_loops_again` does not wait."""
  watcher = multihost.IdleGlooLoops(retry_s=10.0)
  changes = []
  watcher._set = lambda tid, idle, why: changes.append((tid, idle, why)) or True
  sample = (1.0, 0.0, 0, 0.0)
  starved = watcher.loops[7] = multihost._Loop(base=(0.0, sample), backoff=40.0)
  starved.idle, starved.retry_at, starved.starved = False, 100.0, 2
  refused = watcher.loops[8] = multihost._Loop(base=(0.0, sample), backoff=10.0)
  refused.idle, refused.retry_at = False, float('inf')
  watcher.watch(5.0, {7: sample, 8: sample})
  assert not starved.idle and changes == []  # its backoff runs to 100 s
  watcher.retry_now()
  watcher.watch(6.0, {7: sample, 8: sample})
  assert starved.idle and starved.backoff == 10.0 and starved.since == 6.0
  assert changes == [(7, True, 'retry')] and not refused.idle
  watcher.watch(7.0, {7: sample, 8: sample})  # asked once: nothing more
  assert changes == [(7, True, 'retry')]

  def waited(timeout_s=5.0):
    raise AssertionError('waited without a watcher')
  monkeypatch.setattr(multihost, '_running', None)
  monkeypatch.setattr(multihost, 'wait_for_idle_gloo_loops', waited)
  assert multihost.idle_gloo_loops_again() is False


def test_waiting_for_idle_gloo_loops_gives_up_where_there_is_none():
  """One process has no gloo loop: the wait ends at its timeout, saying so."""
  assert multihost.wait_for_idle_gloo_loops(0.2) is False


@pytest.mark.slow
@pytest.mark.parametrize('name', checks.STRATEGIES)
def test_strategy_on_two_processes_equals_one_process(two_processes, name):
  """Three steps of each landed strategy give the same losses and weights on 2 processes ×
  4 devices as on 1 process × 8 devices — BatchNorm's statistics gathered and summed across
  the processes (`collectives.group_mean`), all-reduced in the one process."""
  assert bool(two_processes['bn_gathered'])
  one = checks.train(name, _mesh(), random_batches(3, batch=32))
  assert one['losses'][2] != one['losses'][0]
  np.testing.assert_allclose(two_processes[f'{name}/losses'], one['losses'], rtol=1e-5)
  for key, value in one.items():
    np.testing.assert_allclose(two_processes[f'{name}/{key}'], value, rtol=2e-4, atol=2e-6,
                               err_msg=key)


@pytest.mark.parametrize('fault, survivor, message', [
    ('raise', 0, 'process 0 of 2 stops: process 1 failed: RuntimeError: a bad batch.'),
    ('hang', 0, 'process 0 of 2 stops: process 1 sent no heartbeat for 5 s'),
    ('exit', 1, 'process 1 of 2 stops: lost contact with process 0, the coordinator')])
def test_a_failed_process_ends_the_other_with_its_name(fault, survivor, message):
  """A Python exception in process 1 ends it at once (no wait in jax.distributed's shutdown)
  and its peer, waiting in an all-reduce, with its error; a hung process 1 ends its peer
  at the heartbeat timeout (5 s); a lost process 0 (the coordinator) ends process 1."""
  port = _port()
  started = time.monotonic()
  procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, 'tests', 'multiprocess_fault.py'),
                             str(i), port, fault], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  try:
    logs = {survivor: procs[survivor].communicate(timeout=120)[0]}
    if fault == 'hang':
      procs[1].kill()  # it never ends by itself
    logs[1 - survivor] = procs[1 - survivor].communicate(timeout=120)[0]
  finally:
    for p in procs:
      p.kill()  # no-op for the ended ones
  assert time.monotonic() - started < 60
  assert procs[survivor].returncode == 3, logs[survivor][-3000:]
  assert message in logs[survivor], logs[survivor][-3000:]
  if fault == 'raise':
    assert procs[1].returncode == 1 and 'RuntimeError: a bad batch' in logs[1]
  assert 'never reached' not in logs[0] + logs[1]


def _two_processes(code: str) -> list:
  """`python -c code I` for I = 0, 1 at once: their outputs, after both exited 0."""
  procs = [subprocess.Popen([sys.executable, '-c', code, str(i)], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(2)]
  logs = [p.communicate(timeout=PROCESS_TIMEOUT)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  return logs


def test_two_processes_prepare_a_fresh_data_dir_once(tmp_path):
  """Process 0 builds the digits into an empty data_dir, process 1 waits for it and then opens
  them (two building at once took minutes, and process 1 opened an empty dataset), and
  both pass their first gloo collective."""
  code = ('import sys; from jax.experimental import multihost_utils; '
          'from jaxpar import config, multihost; from jaxpar.data import sources; '
          f"multihost.join('127.0.0.1:{_port()}', 2, int(sys.argv[1]), 'none', 60, 20); "
          f"c = config.defaults().dataset; c.data_dir = {str(tmp_path / 'tfds')!r}; "
          's = sources.open_source(c); '
          "print('share', s.num_train, s.num_test, s.num_train_global, flush=True); "
          "multihost_utils.sync_global_devices('opened')")
  logs = _two_processes(code)
  assert 'Generating splits' in logs[0] and 'Generating splits' not in logs[1], logs[1][-3000:]
  assert 'share 1437 180 1437' in logs[0] and 'share 1437 180 1437' in logs[1]


def test_processes_not_joined_prepare_one_data_dir_one_at_a_time(tmp_path):
  """Two processes of one host (not one run: no barrier) open the digits in one fresh
  data_dir at once: a lock file lets one build and the other find them built (without it,
  one failed renaming its copy over the other's)."""
  code = ('from jaxpar import config; from jaxpar.data import sources; '
          f"c = config.defaults().dataset; c.data_dir = {str(tmp_path / 'tfds')!r}; "
          "print('examples', sources.open_source(c).num_train)")
  procs = [subprocess.Popen([sys.executable, '-c', code], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
  logs = [p.communicate(timeout=PROCESS_TIMEOUT)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
  assert sum('Generating splits' in log for log in logs) == 1
  assert all('examples 1437' in log for log in logs)


def test_a_process_whose_peers_never_come_gives_up_at_the_initialization_timeout():
  code = ('from jaxpar import multihost; '
          f"multihost.join('127.0.0.1:{_port()}', 2, 0, 'auto', 3, 10)")
  started = time.monotonic()
  proc = subprocess.run([sys.executable, '-c', code], env=ENV, capture_output=True, text=True,
                        timeout=120)
  assert proc.returncode == 1 and time.monotonic() - started < 30
  assert ('could not join the run (coordinator 127.0.0.1:' in proc.stderr
          and 'distributed.initialization_timeout=3 s' in proc.stderr), proc.stderr[-2000:]


def _launch(workdir, data_dir, port, fake_ssh=None):
  """2 processes training SqueezeNet on the digits for STEPS steps on a mesh of 4 (2 emulated
  devices each) at 16² (a start compiles and runs in 2/3 of the time the config's 8 devices
  at 32² take): by launch/local.sh, or by launch/gpu_cluster.sh on two "hosts" reached
  through `fake_ssh` (runs the command here)."""
  env = {**ENV, 'PYTHON': sys.executable, 'JAXPAR_PORT': port}
  script = ['local.sh', '2']
  if fake_ssh:
    script = ['gpu_cluster.sh', '127.0.0.1,127.0.0.1', '1']
    env.update(PATH=f"{fake_ssh}:{env['PATH']}", JAXPAR_DIR=ROOT)
  return subprocess.Popen(
      ['bash', os.path.join(ROOT, 'launch', script[0]), *script[1:], '--config',
       os.path.join(ROOT, 'configs', 'squeezenet.py'), '--workdir', str(workdir),
       f'--config.dataset.data_dir={data_dir}', f'--config.total_steps={STEPS}',
       "--config.mesh.shape=(4,)", '--config.image_size=16',
       '--config.optimizer.warmup_steps=1', f'--config.checkpoint_every={EVERY}',
       f'--config.keep_checkpoints={STEPS // EVERY + 1}',
       '--config.log_every=1', '--config.distributed.heartbeat_timeout=10'],
      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


# _launch's run: its length, its checkpoints' period. A step takes about 0.15 s here, and
# SIGTERM reaches both processes' sync point 1-2 s after the signal: 30 steps leave it room.
STEPS, EVERY = 48, 8


def _exited_promptly(*logs):
  """Every process's last logged line (absl's time stamp, after the save and the summaries)
  came at most 9 s before the launcher returned: nothing held a process at its exit. A
  process held by a lost peer waits `heartbeat_timeout` (10 s here) or more; a loaded 2-core
  host took 7.9 s to tear one down once (beside the suite's other worker)."""
  import datetime
  now = datetime.datetime.now()
  for log in logs:
    stamps = re.findall(r'^[IWE](\d{4} \d\d:\d\d:\d\d\.\d+) ', log.read_text(), re.M)
    last = datetime.datetime.strptime(f'{now.year}{stamps[-1]}', '%Y%m%d %H:%M:%S.%f')
    assert (now - last).total_seconds() <= 9, f'{log.name}: exited {now - last} after its last line'


def _when_logged(run, log, line):
  """Waits until `log` holds `line`, `run` still running."""
  deadline = time.monotonic() + PROCESS_TIMEOUT
  while not (log.exists() and line in log.read_text()):
    assert run.poll() is None and time.monotonic() < deadline, run.communicate()
    time.sleep(0.05)


@pytest.mark.slow
def test_a_stopped_run_resumes_a_lost_process_stops_the_other_and_a_restart_finishes(
    tmp_path, data_dir):
  """One run of 2 processes, started three times (each start costs the processes' startup
  and compilation, so one run takes all three faults in turn):

  1. SIGTERM to process 1 (launched by local.sh) after the step after the first checkpoint:
     JAX's preemption service tells process 0, both save the same step and exit 75 (so does
     local.sh);
  2. started again (launch/gpu_cluster.sh on two "hosts"), both resume from that step; kill
     -9 of process 1 two steps after the next checkpoint: process 0 stops within the
     heartbeat timeout, naming it;
  3. started again (local.sh), both resume from the last checkpoint, recompute the steps the
     lost run had taken beyond it with the losses it logged, finish and evaluate every test
     example in both processes."""
  workdir = tmp_path / 'run'
  log0, log1 = workdir / 'process_0.log', workdir / 'process_1.log'

  def checkpoints():
    return sorted(int(d) for d in os.listdir(workdir / 'checkpoints') if d.isdigit())

  # 1. SIGTERM to one process: both save one step and exit 75.
  run = _launch(workdir, data_dir, _port())
  _when_logged(run, log0, f'[train] step {EVERY + 1}/{STEPS}')
  subprocess.run(['pkill', '-TERM', '-f', '--', f'--workdir {workdir} .*process_id=1'], check=True)
  out, err = run.communicate(timeout=PROCESS_TIMEOUT)
  _exited_promptly(log0, log1)
  assert run.returncode == 75, out[-3000:] + err[-3000:]
  for i in (0, 1):
    assert f'process {i} stopped on a signal after saving a checkpoint' in err
  steps = checkpoints()
  stopped = steps[-1]  # the step the signal stopped, after the periodic checkpoints before it
  assert steps[0] == EVERY and EVERY < stopped < STEPS - EVERY, steps
  assert steps[:-1] == list(range(EVERY, stopped, EVERY)), steps
  for log in (log0, log1):
    assert f'jaxpar: SIGTERM: stopped after step {stopped}, checkpoint saved in' in log.read_text()
  first = train_losses(workdir)
  assert set(first) == set(range(1, stopped + 1)), sorted(first)

  # 2. Resumed where it stopped; process 1 killed two steps after the next checkpoint.
  fake_ssh = tmp_path / 'bin'
  fake_ssh.mkdir()
  # The "host" runs process i pinned to core i mod nproc, as local.sh pins it: the starts whose
  # losses are compared below run each process's convolutions on one thread alike.
  (fake_ssh / 'ssh').write_text(
      '#!/usr/bin/env bash\nshift  # the host\n'
      'i=$(grep -o "process_id=[0-9]*" <<<"$*" | head -1 | cut -d= -f2)\n'
      'exec taskset -c $((i % $(nproc))) bash -c "$*"\n')
  (fake_ssh / 'ssh').chmod(0o755)
  saved = (stopped // EVERY + 1) * EVERY
  run = _launch(workdir, data_dir, _port(), fake_ssh)
  _when_logged(run, log0, f'[train] step {saved + 2}/{STEPS}')
  assert f'Resumed from step {stopped}' in log0.read_text()
  subprocess.run(['pkill', '-9', '-f', '--', f'--workdir {workdir} .*process_id=1'], check=True)
  killed = time.monotonic()
  out, err = run.communicate(timeout=PROCESS_TIMEOUT)
  took = time.monotonic() - killed
  assert run.returncode == 1, out[-3000:] + err[-3000:]
  assert took < 10 + 15, f'process 0 took {took:.0f} s to stop'
  assert 'process 0 of 2 stops: process 1 sent no heartbeat' in log0.read_text()
  assert 'process 0 failed (stopped because another process was lost)' in err
  assert 'process 1 failed (killed by signal 9)' in err
  assert checkpoints()[-1] == saved and 'test accuracy' not in log0.read_text()
  second = train_losses(workdir)
  assert set(range(stopped + 1, saved + 3)) <= set(second), sorted(second)

  # 3. Resumed from the last checkpoint: the lost steps again, with the same losses.
  run = _launch(workdir, data_dir, _port())
  out, err = run.communicate(timeout=PROCESS_TIMEOUT)
  _exited_promptly(log0, log1)
  assert run.returncode == 0, out[-3000:] + err[-3000:]
  assert f'Resumed from step {saved}' in log0.read_text()
  assert 'on 360 examples' in out and 'on 360 examples' in log1.read_text()
  assert re.search(r'Process 1 of 2: 2 cpu devices \(emulated\) on core \d+ of',
                   log1.read_text())
  assert checkpoints()[-1] == STEPS
  losses = train_losses(workdir)
  assert sorted(losses) == list(range(1, STEPS + 1))
  # A step the lost run took beyond `saved`: twice, with the same loss (both starts pinned
  # each process to one core, so their sums ran in the same order: bit for bit on an Intel
  # Xeon; unpinned, the second start's convolutions summed on 2 threads and its step 18 read
  # 1.3e-4 apart once). A lost momentum or a shifted batch moves the loss by far more than 1e-5.
  for step in range(1, STEPS + 1):
    assert len(losses[step]) == (2 if step > saved and step in second else 1), step
    assert losses[step] == pytest.approx([losses[step][0]] * len(losses[step]), rel=1e-5), step
  assert losses[STEPS] != losses[1]


def test_a_value_of_process_0_reaches_every_process_and_so_does_its_error():
  """`multihost.from_process_0`: process 0 alone computes (the other's function never runs),
  every process gets its value; a ConfigError in process 0 is one in the other too, a
  RunError otherwise."""
  code = ('import sys, json; from jaxpar import multihost; from jaxpar.config import ConfigError; '
          f"multihost.join('127.0.0.1:{_port()}', 2, int(sys.argv[1]), 'none', 60, 20); "
          'me = int(sys.argv[1]); '
          "print('value', json.dumps(multihost.from_process_0('v', lambda: {'by': me, 'x': [1.5]})), flush=True)\n"
          'def bad():\n'
          "  raise ConfigError('config.plan.close=0 is invalid')\n"
          'try:\n'
          "  multihost.from_process_0('e', bad)\n"
          'except ConfigError as e:\n'
          "  print('raised', type(e).__name__, e, flush=True)\n"
          "multihost.barrier('end')")
  logs = _two_processes(code)
  for log in logs:
    assert 'value {"by": 0, "x": [1.5]}' in log, log[-3000:]
  assert 'raised ConfigError config.plan.close=0 is invalid' in logs[0]
  assert 'raised ConfigError process 0: config.plan.close=0 is invalid' in logs[1]


def _squeezenet(data_dir, steps, server, *extra):
  """The flags of a SqueezeNet run on the digits at 16² on a mesh of 4, one line a step and a
  checkpoint every 4 steps (all kept)."""
  return ['--config', os.path.join(ROOT, 'configs', 'squeezenet.py'),
          f'--config.dataset.data_dir={data_dir}', f'--config.total_steps={steps}',
          "--config.mesh.shape=(4,)", '--config.image_size=16', f'--config.server={server}',
          '--config.optimizer.warmup_steps=1', '--config.checkpoint_every=4',
          '--config.keep_checkpoints=10', '--config.log_every=1', *extra]


def _run_processes(n, workdir, flags):
  """`flags` run as `n` processes (launch/local.sh) or as one; (return code, process 0's log)."""
  if n == 1:
    done = subprocess.run([sys.executable, '-m', 'jaxpar.train', '--workdir', str(workdir),
                           *flags], env=ENV, capture_output=True, text=True, cwd=ROOT,
                          timeout=PROCESS_TIMEOUT)
    return done.returncode, done.stderr
  done = subprocess.run(['bash', os.path.join(ROOT, 'launch', 'local.sh'), str(n), '--workdir',
                         str(workdir), *flags], env={**ENV, 'PYTHON': sys.executable,
                                                     'JAXPAR_PORT': _port()},
                        capture_output=True, text=True, cwd=ROOT, timeout=PROCESS_TIMEOUT)
  logs = [(workdir / f'process_{i}.log').read_text() for i in range(n)]
  return done.returncode, '\n'.join(logs) + done.stderr


# The parts stop at 8, 12 and 16 steps: one rate for all of them (cosine follows total_steps).
SMALL_RATE = ('--config.optimizer.base_lr=0.0001', '--config.optimizer.schedule=constant')


@pytest.mark.slow
def test_two_processes_resume_as_one_and_back_and_a_damaged_checkpoint_falls_back_in_both(
    data_dir, tmp_path):
  """1. 2 processes with the distributed server train 8 steps (checkpoints 4 and 8); 2. step
  8's files truncated, 2 processes again: both fall back to step 4, and train to 8; 3. one
  process with all-reduce resumes there (the distributed server's state converted) to 12;
  4. 2 processes with the distributed server again to 16. The steps taken again after the
  fallback have the first run's losses; each part continues at the example count where the
  last stopped, and every step's loss is that of one process with all-reduce training the 16
  steps without a stop (the examples at a step do not depend on the number of processes:
  dataset.order='global'), within 2e-3: SqueezeNet-BN at 16² turns the last bit by which
  gloo's sums differ from one process's (their order) into loss differences of up to 2.4e-4
  at 1/1000 of the config's rate, constant (neighbouring batches' losses differ by
  0.5-4 %), and of 1e-3 within 2-3 steps at larger rates (the config's: at step 3; 1/100
  of it: at steps 14-15, the same from one checkpoint resumed on 1 and on 2 processes).
  The states' conversions are exact in tests/test_portable.py, on one process."""
  workdir = tmp_path / 'run'
  code, log = _run_processes(2, workdir, _squeezenet(data_dir, 8, 'distributed', *SMALL_RATE))
  assert code == 0, log[-3000:]
  folder = workdir / 'checkpoints'
  assert sorted(os.listdir(folder)) == ['4', '8']
  for root, _, files in os.walk(folder / '8'):
    for name in files:
      os.truncate(os.path.join(root, name), os.path.getsize(os.path.join(root, name)) // 2)

  code, log = _run_processes(2, workdir, _squeezenet(data_dir, 8, 'distributed', *SMALL_RATE))
  assert code == 0, log[-3000:]
  assert log.count('Checkpoint of step 8 cannot be read') == 2, log[-3000:]  # each process
  assert log.count('Resumed from step 4 ') == 2
  assert sorted(os.listdir(folder)) == ['4', '8', '8.damaged']

  code, log = _run_processes(1, workdir, _squeezenet(data_dir, 12, 'allreduce', *SMALL_RATE))
  assert code == 0, log[-3000:]
  assert 'Resumed from step 8 (example 512)' in log
  assert 'Checkpoint of step 8: converted from split (even) over 4 devices to replicated' in log
  assert "processes: 2 -> 1" in log and "server: 'distributed' -> 'allreduce'" in log

  code, log = _run_processes(2, workdir, _squeezenet(data_dir, 16, 'distributed', *SMALL_RATE))
  assert code == 0, log[-3000:]
  assert log.count('converted from replicated to split (even) over 4 devices') == 2
  assert 'on 360 examples' in log

  losses = train_losses(workdir)
  assert sorted(losses) == list(range(1, 17))
  for step in range(5, 9):  # from step 4 again, on the same batches: the same losses
    assert len(losses[step]) == 2 and losses[step][1] == pytest.approx(losses[step][0],
                                                                        rel=1e-5), step
  assert all(len(losses[step]) == 1 for step in [*range(1, 5), *range(9, 17)])
  code, log = _run_processes(1, tmp_path / 'reference',
                             _squeezenet(data_dir, 16, 'allreduce', *SMALL_RATE))
  assert code == 0, log[-3000:]
  reference = train_losses(tmp_path / 'reference')
  np.testing.assert_allclose([losses[s][-1] for s in range(1, 17)],
                             [reference[s][0] for s in range(1, 17)], rtol=2e-3)
