"""The faults a cluster delivers: a stop signal saves the step in flight and the same command
resumes there with the uninterrupted run's losses; a damaged checkpoint falls back to the one
before; a full or unwritable checkpoint folder, and an image folder of undecodable files, are
one line each. (Two processes stopped by SIGTERM: test_multiprocess.py.)"""
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip('tensorflow')  # jaxpar.metrics writes TensorBoard summaries with it

from jaxpar import checkpoint as checkpoint_lib  # noqa: E402
from jaxpar import metrics  # noqa: E402
from jaxpar.config import ConfigError  # noqa: E402
from jaxpar.preemption import EXIT_RESUMABLE, StopSignals  # noqa: E402
from runs import ROOT, process_env, train_losses  # noqa: E402

TIMEOUT = 600  # seconds: no run may hang the suite


def _train_command(workdir, data_dir, *overrides):
  """SqueezeNet on the digits at 16², 2 emulated devices, 8 steps, a line logged each step."""
  return [sys.executable, '-m', 'jaxpar.train', '--config',
          os.path.join(ROOT, 'configs', 'squeezenet.py'), '--workdir', str(workdir),
          f'--config.dataset.data_dir={data_dir}', '--config.mesh.shape=2',
          '--config.image_size=16', '--config.per_device_batch=8', '--config.total_steps=8',
          '--config.log_every=1', '--config.optimizer.warmup_steps=1', *overrides]


def _run(command, env=None):
  return subprocess.run(command, env=env or process_env(share_compiled=True),
                        capture_output=True, text=True, timeout=TIMEOUT, cwd=ROOT)


def _small_state(value=0.0):
  return {'w': jnp.full((64, 32), value, jnp.float32), 'b': jnp.full((32,), value),
          'step': jnp.int32(value)}


def _truncate_files(folder):
  """Every file under `folder` cut to half its size, as a disk that filled mid-copy leaves it."""
  for root, _, files in os.walk(folder):
    for name in files:
      path = os.path.join(root, name)
      os.truncate(path, os.path.getsize(path) // 2)


# ------------------------------------------------------------------ stop signals


def test_a_stop_signal_is_noted_and_a_second_waits():
  if threading.current_thread() is not threading.main_thread():
    pytest.skip('signal handlers can only be set in the main thread')
  before = signal.getsignal(signal.SIGTERM)
  stop = StopSignals().install()
  try:
    assert not stop.requested()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.1)  # the handler runs on the next bytecode of the main thread
    assert stop.requested() and stop.received == 'SIGTERM'
    os.kill(os.getpid(), signal.SIGINT)  # during the save: logged, the process lives on
    time.sleep(0.1)
    assert stop.received == 'SIGTERM'
  finally:
    stop.restore()
  assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.slow
def test_sigterm_saves_the_step_in_flight_and_the_same_command_resumes(data_dir, tmp_path):
  """SIGTERM (then a second one, as an impatient scheduler sends) after step 3, with no
  checkpoint due before step 100: the run saves the step it was at, exits 75 naming it, and
  the same command resumes there, finishes, evaluates every test example; the losses of
  both parts are the uninterrupted run's. The stopped run kept its compiled programs in the
  folder config.compilation_cache names, and the resumed run loaded its step and its
  initialisation from there (JAX logs each hit with JAX_LOG_COMPILES; the stopped run never
  evaluated, so the evaluation compiles)."""
  whole = _run(_train_command(tmp_path / 'whole', data_dir))
  assert whole.returncode == 0, whole.stderr[-3000:]

  workdir, cache = tmp_path / 'stopped', tmp_path / 'xla'
  command = _train_command(workdir, data_dir, '--config.checkpoint_every=100',
                           f'--config.compilation_cache={cache}')
  env = {**process_env(share_compiled=True), 'JAX_LOG_COMPILES': '1'}
  saved, again = _stopped_and_resumed(command, workdir, tmp_path / 'stopped.log', env=env)
  assert f'Compiled programs are kept in {cache}' in again.stderr
  for program in ('jit_step', 'jit_init'):
    assert f"Persistent compilation cache hit for '{program}'" in again.stderr, program
  reference, losses = train_losses(tmp_path / 'whole'), train_losses(workdir)
  assert sorted(losses) == list(range(1, 9))
  for step in range(1, 9):
    assert losses[step] == pytest.approx(reference[step], rel=1e-6), step
  assert all(len(losses[step]) == 1 for step in losses), saved  # resumed where it stopped


@pytest.mark.slow
@pytest.mark.parametrize('backend', ['threads', 'ray'])
def test_sigterm_stops_an_asynchronous_run_with_its_servers_state_saved(data_dir, tmp_path,
                                                                         backend):
  """Downpour, on threads or on Ray actors: the driver saves the servers' state at the step
  the signal finds, and the same command resumes there and finishes. (The order in which
  asynchronous updates arrive is not reproducible, so the losses are not compared.)"""
  if backend == 'ray':
    pytest.importorskip('ray')
  workdir = tmp_path / backend
  command = _train_command(workdir, data_dir, '--config.checkpoint_every=100',
                           '--config.scheme=async', '--config.server=central',
                           f'--config.async_sgd.backend={backend}')
  # Ray's shutdown, at the exit, sets SIGTERM's action back to the default (its failure
  # signal handler's removal): a repeat that comes then kills the process (143).
  _stopped_and_resumed(command, workdir, tmp_path / f'{backend}.log', to_exit=backend != 'ray')
  # Ray forks and execs its own programs at ray.init: JAX's warning at a fork is not printed.
  assert 'os.fork() was called' not in (tmp_path / f'{backend}.log').read_text()


def _stopped_and_resumed(command, workdir, log, to_exit=True, env=None):
  """Runs `command`, sends SIGTERM after step 3, and again every 20 ms from when it is handled
  to the exit (an impatient scheduler), or once (`to_exit` False); checks the one line, the
  exit status 75 within 5 s of that line (Kubernetes' grace period is 30 s), a checkpoint of
  the step it stopped at and nothing else; runs `command` again, which must resume there,
  finish and evaluate every test example. Returns the step saved and the resumed run (`env`:
  both runs', the tests' by default)."""
  env = env or process_env(share_compiled=True)
  with open(log, 'w') as err:
    run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                           stderr=err, text=True, cwd=ROOT)
    deadline = time.monotonic() + TIMEOUT
    while '[train] step 3/8' not in log.read_text():
      assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
      time.sleep(0.05)
    signalled = time.monotonic()
    run.send_signal(signal.SIGTERM)
    # The repeats once the first was handled (two that come while the main thread is in one
    # C call, a step, make one call of the Python handler), to the very exit.
    while 'SIGTERM: finishing the step in flight' not in log.read_text():
      assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
      time.sleep(0.01)
    last_line, repeats = None, 0
    while run.poll() is None and time.monotonic() < deadline:
      if to_exit or not repeats:
        run.send_signal(signal.SIGTERM)
        repeats += 1
      if last_line is None and 'jaxpar: SIGTERM: stopped after step' in log.read_text():
        last_line = time.monotonic()
      time.sleep(0.02)
    run.communicate(timeout=TIMEOUT)
  exited = time.monotonic()
  took = exited - signalled
  text = log.read_text()
  assert run.returncode == EXIT_RESUMABLE, text[-3000:]
  saved = [int(d) for d in os.listdir(workdir / 'checkpoints')]
  assert len(saved) == 1 and 3 <= saved[0] < 8, saved
  assert (f'jaxpar: SIGTERM: stopped after step {saved[0]}, checkpoint saved in '
          f"{workdir / 'checkpoints' / str(saved[0])}; run the same command to resume "
          f'(exit status 75).') in text
  assert 'SIGTERM while stopping' in text and 'Traceback' not in text
  assert took < 60, f'{took:.0f} s from the signal to the exit'
  assert last_line is not None and exited - last_line <= 5, (
      f'{exited - last_line:.1f} s from the last line to the exit')

  again = _run(command, env)
  assert again.returncode == 0, again.stderr[-3000:]
  assert f'Resumed from step {saved[0]}' in again.stderr
  assert 'on 360 examples' in again.stdout
  return saved[0], again


# ------------------------------------------------------------------ damaged checkpoints


def test_a_damaged_latest_checkpoint_is_moved_aside_and_the_one_before_restored(tmp_path):
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=3)
  for step in (1, 2, 3):
    checkpoints.save(step, _small_state(float(step)))
  checkpoints.close()
  _truncate_files(tmp_path / 'checkpoints' / '3')

  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=3)
  restored = checkpoints.restore_latest(_small_state())
  np.testing.assert_array_equal(restored['w'], 2.0)
  assert int(restored['step']) == 2
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['1', '2', '3.damaged']
  checkpoints.close()

  _truncate_files(tmp_path / 'checkpoints' / '2')
  _truncate_files(tmp_path / 'checkpoints' / '1')
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=3)
  with pytest.raises(ConfigError, match=r'--workdir holds no readable checkpoint in .*'
                                        r'checkpoints: step\(s\) 2, 1 failed to read'):
    checkpoints.restore_latest(_small_state())
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['1.damaged', '2.damaged', '3.damaged']
  checkpoints.close()


def test_a_state_replicated_on_every_device_is_saved_whole_without_compiling(tmp_path):
  """In one process orbax is not asked to cut each replicated array into a part per device
  (`checkpoint.saves_whole`): cutting compiles a program per shape and part (7.8 s
  for SqueezeNet's first save on 8 devices). Shapes no other test saves, so that a program
  compiled before cannot hide one compiled here; restored equal."""
  import jax
  from jax.sharding import NamedSharding, PartitionSpec
  mesh = jax.make_mesh((8,), ('data',), devices=jax.devices())
  state = {name: jax.device_put(jnp.arange(np.prod(shape), dtype=jnp.float32).reshape(shape),
                                NamedSharding(mesh, PartitionSpec()))
           for name, shape in (('w', (8 * 13, 3)), ('b', (8 * 7,)))}
  compiled = []

  def listen(event, seconds, **kwargs):
    if 'compile' in event:
      compiled.append(event)
  jax.monitoring.register_event_duration_secs_listener(listen)
  try:
    checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=3)
    checkpoints.save(1, state)
    checkpoints.close()
  finally:
    jax.monitoring.unregister_event_duration_listener(listen)
  assert compiled == [] and checkpoint_lib.saves_whole()
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=3)
  restored = checkpoints.restore_latest(state)
  checkpoints.close()
  for name in state:
    np.testing.assert_array_equal(restored[name], state[name])
    assert restored[name].sharding == state[name].sharding


def test_without_any_checkpoint_training_starts_afresh(tmp_path):
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=3)
  state = _small_state(5.0)
  assert checkpoints.restore_latest(state) is state
  checkpoints.close()


# ------------------------------------------------------------------ full or unwritable disks


def test_a_checkpoint_that_cannot_fit_is_one_line_before_writing(tmp_path, monkeypatch):
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=3)
  checkpoints.save(1, _small_state(1.0))
  checkpoints.close()
  full = type('Usage', (), {'total': 10**9, 'used': 10**9, 'free': 5000})()
  monkeypatch.setattr(shutil, 'disk_usage', lambda _: full)
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=1)
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r'cannot save the checkpoint of step 2 in .*checkpoints: it needs '
                           r'about 1\.0 MiB and the file system has 0\.0 MiB free'):
    checkpoints.save(2, _small_state(2.0))
  checkpoints.close()
  assert os.listdir(tmp_path / 'checkpoints') == ['1']  # keep=1, yet the last good one stays


def test_a_save_that_fails_while_written_names_its_step_and_cause(tmp_path):
  """A save that fails in the background (here: orbax's writer raising as a full disk makes
  it) is reported by the next save, naming the step that failed."""
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=3)
  checkpoints.save(1, _small_state(1.0))
  checkpoints.close()

  class Failing:
    def __getattr__(self, name):
      return getattr(real, name)

    def save(self, step, **_):
      raise ValueError('RESOURCE_EXHAUSTED: Failed to write 3049 bytes: No space left on '
                       'device\nmore lines of a traceback')
  checkpoints = checkpoint_lib.Checkpoints(str(tmp_path), every=1, keep=3)
  real, checkpoints.manager = checkpoints.manager, Failing()
  with pytest.raises(checkpoint_lib.CheckpointError,
                     match=r'^saving the checkpoint of step 2 in .*checkpoints failed: '
                           r'ValueError: RESOURCE_EXHAUSTED: Failed to write 3049 bytes: No '
                           r'space left on device, [\d.,]+ MiB free now\. The last complete'):
    checkpoints.save(2, _small_state(2.0))
  checkpoints.manager = real
  checkpoints.close()


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_keeps_nothing_half_written(data_dir, tmp_path):
  """The workdir on a 3 MB tmpfs: the first checkpoint (about 6 MiB) cannot fit."""
  mount = tmp_path / 'small'
  mount.mkdir()
  made = subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=3m', 'tmpfs', str(mount)],
                        capture_output=True, text=True)
  if made.returncode != 0:
    pytest.skip(f'cannot mount a tmpfs here (root needed): {made.stderr.strip()}')
  try:
    run = _run(_train_command(mount / 'run', data_dir, '--config.checkpoint_every=2'))
    assert run.returncode == 1, run.stderr[-3000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith('jaxpar:')]
    assert len(lines) == 1 and re.match(
        r"jaxpar: cannot save the checkpoint of step 2 in .*/run/checkpoints: it needs about "
        r"[\d.]+ MiB and the file system has [\d.]+ MiB free", lines[0]), run.stderr[-3000:]
    assert 'Traceback' not in run.stderr
    assert os.listdir(mount / 'run' / 'checkpoints') == []
  finally:
    subprocess.run(['umount', str(mount)], check=True)


def test_summaries_that_cannot_be_written_are_warned_about_once(tmp_path, monkeypatch):
  reporter = metrics.Reporter(str(tmp_path), total_steps=4, first_step=0, global_batch=8)
  calls = []

  def full(*args, **kwargs):
    calls.append(args)
    raise OSError(28, 'No space left on device')
  monkeypatch.setattr(reporter.writer, 'flush', full)
  warnings = []
  monkeypatch.setattr(metrics.logging, 'warning', lambda *a: warnings.append(a[0] % a[1:]))
  for step in (1, 2):
    reporter.step(step, {'loss': jnp.float32(1.0)})
    reporter.report(step, 0.1)
  reporter.evaluation(2, {'top1': 0.5})
  reporter.close()
  assert len(calls) == 1 and len(warnings) == 1
  assert warnings[0].startswith(f'TensorBoard summaries in {tmp_path} cannot be written '
                                f'(OSError: [Errno 28] No space left on device)')
  assert sorted(reporter.history) == [1, 2]


# ------------------------------------------------------------------ unreadable images


def test_an_image_folder_without_a_readable_image_is_one_line(tmp_path):
  for cls, name in (('a', '1.jpg'), ('b', '2.png')):
    (tmp_path / cls).mkdir()
    (tmp_path / cls / name).write_bytes(b'x')
  run = _run([sys.executable, '-m', 'jaxpar.train', '--config',
              os.path.join(ROOT, 'configs', 'squeezenet.py'), '--workdir', str(tmp_path / 'w'),
              '--config.dataset.name=image_folder', f'--config.dataset.path={tmp_path}'])
  assert run.returncode == 2, run.stderr[-3000:]
  assert (f"jaxpar: config.dataset.path='{tmp_path}' holds no readable image: all 2 image files "
          f"tried failed to decode and were skipped (e.g. a/1.jpg, b/2.png)") in run.stderr
  assert 'Traceback' not in run.stderr
