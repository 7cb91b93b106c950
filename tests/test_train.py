"""End to end through `train_and_evaluate`: summaries, checkpoint/resume, exhaustive eval;
the reporter's step time and page faults with evaluations and checkpoints left out."""
import pytest

pytest.importorskip('tensorflow')  # jaxpar.train's summaries (jaxpar.metrics) need it

from jaxpar import config as config_lib  # noqa: E402
from jaxpar.train import train_and_evaluate  # noqa: E402


def _config(data_dir, **overrides):
  c = config_lib.defaults()
  c.model = 'squeezenet'  # has dropout: resuming must also reproduce the masks
  c.dataset.data_dir = data_dir
  c.mesh.shape, c.mesh.axes = (2, 4), ('x', 'y')
  c.scheme = 'sync-join'
  c.per_device_batch = 4
  c.eval_batch = 64       # 360 test examples: the last batch is padded
  c.total_steps = 4
  c.optimizer.warmup_steps = 1
  c.log_every = 1
  c.checkpoint_every = 2
  for k, v in overrides.items():
    c[k] = v
  return c


def _summary_tags(workdir):
  import tensorflow as tf
  tags = set()
  for path in workdir.glob('events.out.tfevents.*'):
    for event in tf.compat.v1.train.summary_iterator(str(path)):
      tags.update(v.tag for v in event.summary.value)
  return tags


@pytest.mark.slow
def test_resumed_training_reproduces_the_uninterrupted_run(data_dir, tmp_path):
  whole = train_and_evaluate(_config(data_dir), str(tmp_path / 'whole'))
  assert sorted(whole.train_loss) == [1, 2, 3, 4]
  assert whole.examples_seen == 4 * 8 * 4  # sync-join: N × per-device batch per step
  assert whole.eval['count'] == 360       # every test example, once
  assert 0 <= whole.eval['top1'] <= whole.eval['top5'] <= 1
  tags = _summary_tags(tmp_path / 'whole')
  assert {'train/loss', 'train/accuracy', 'train/learning_rate', 'train/images_per_sec',
          'train/step_time', 'eval/top1', 'eval/top5'} <= tags

  first = train_and_evaluate(_config(data_dir, stop_after_steps=2), str(tmp_path / 'split'))
  assert first.step == 2 and first.eval == {}
  second = train_and_evaluate(_config(data_dir), str(tmp_path / 'split'))
  assert sorted(second.train_loss) == [3, 4]
  for step in (1, 2):
    assert first.train_loss[step] == pytest.approx(whole.train_loss[step], rel=1e-6)
  for step in (3, 4):
    assert second.train_loss[step] == pytest.approx(whole.train_loss[step], rel=1e-6)
  assert second.eval == pytest.approx(whole.eval, rel=1e-5)


@pytest.mark.slow
def test_a_run_shorter_than_its_recipes_warmup_trains_with_a_quarter_of_it(data_dir, tmp_path):
  """`--config.total_steps=4` on a config whose digits recipe warms up for 20 steps: the
  command line did not ask for that warm-up, so the run takes a quarter of its length
  (1 step), says so and trains; asked for, it is one line and exit 2 (tests/test_config.py)."""
  import subprocess
  import sys
  from runs import ROOT, config_file, process_env
  assert config_file('squeezenet').optimizer.warmup_steps == 20
  proc = subprocess.run(
      [sys.executable, '-m', 'jaxpar.train', '--config', 'configs/squeezenet.py',
       f'--workdir={tmp_path}', f'--config.dataset.data_dir={data_dir}', '--config.mesh.shape=2',
       '--config.image_size=16', '--config.total_steps=4'],
      env=process_env(share_compiled=True), capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert ("optimizer.warmup_steps=1: the config's 20 warm-up steps do not fit a run of 4 steps"
          in proc.stderr)
  assert 'test accuracy: top-1' in proc.stdout


@pytest.mark.slow
def test_async_run_through_the_cli_applies_every_batch_and_reports_staleness(data_dir, tmp_path):
  """Downpour through `train_and_evaluate`: 8 worker threads and a distributed server apply
  each of the run's 6 batches once, evaluate, and write the staleness (resuming an async
  run: tests/test_async_sgd.py)."""
  overrides = dict(scheme='async', server='distributed', placement='greedy', image_size=16,
                   total_steps=6)
  result = train_and_evaluate(_config(data_dir, **overrides), str(tmp_path))
  assert sorted(result.train_loss) == [1, 2, 3, 4, 5, 6]
  assert result.examples_seen == 6 * 4  # one worker's batch (per_device_batch=4) per push
  assert result.eval['count'] == 360
  assert {'train/staleness', 'train/sent_bytes', 'train/loss', 'eval/top1'} <= _summary_tags(
      tmp_path)


def test_the_step_time_leaves_out_evaluations_and_checkpoints(tmp_path, monkeypatch):
  """`step_time` (and images/s) is the steps' time alone: the clock stops while the loop
  evaluates or saves, as big_vision's `chrono.pause` does."""
  import jax.numpy as jnp

  from jaxpar import metrics
  now = [0.0]
  monkeypatch.setattr(metrics.time, 'perf_counter', lambda: now[0])
  logged = []
  reporter = metrics.Reporter(str(tmp_path), total_steps=5, first_step=0, global_batch=8)
  monkeypatch.setattr(reporter, '_write', lambda prefix, step, values: logged.append(values))
  reporter.step(1, {'loss': jnp.float32(1.0)})  # the clock starts after the first step
  for step in (2, 3):
    now[0] += 0.5                               # a step
    reporter.step(step, {'loss': jnp.float32(1.0)})
    with reporter.paused():
      now[0] += 7.0                             # an evaluation or a checkpoint
  now[0] += 0.5
  reporter.step(4, {'loss': jnp.float32(1.0)})
  reporter.report(4, 0.1)
  assert logged[-1]['step_time'] == pytest.approx(0.5)
  assert logged[-1]['images_per_sec'] == pytest.approx(16.0)
  with reporter.paused():                       # nothing pending: nothing to wait for
    now[0] += 3.0
  now[0] += 0.25
  reporter.step(5, {'loss': jnp.float32(1.0)})
  reporter.report(5, 0.1)
  assert logged[-1]['step_time'] == pytest.approx(0.25)
  reporter.close()


@pytest.mark.parametrize('setting, said', [('mapped', True), ('system', True), ('keep', False)])
def test_a_step_that_faults_its_memory_in_every_step_is_said_once(tmp_path, monkeypatch,
                                                                   caplog, setting, said):
  """The process's minor faults over each window of steps, evaluations and checkpoints left
  out: a window past `FAULTS_A_STEP` a step (the step's temporaries mapped afresh) is said
  once, with the setting that keeps them — not in the first window (a heap still growing),
  not under 'keep' (whose heap only grows), not for the faults of a paused block."""
  import logging

  import jax.numpy as jnp

  from jaxpar import host_memory, metrics
  faults = [0]
  monkeypatch.setattr(host_memory, 'minor_faults', lambda: faults[0])
  monkeypatch.setattr(host_memory, '_applied', (setting, True))
  reporter = metrics.Reporter(str(tmp_path), total_steps=13, first_step=0, global_batch=8)
  monkeypatch.setattr(reporter, '_write', lambda prefix, step, values: None)

  def window(first, last, a_step, paused=0):
    for step in range(first, last + 1):
      faults[0] += a_step
      reporter.step(step, {'loss': jnp.float32(1.0)})
    with reporter.paused():
      faults[0] += paused                     # an evaluation's or a checkpoint's faults
    reporter.report(last, 0.1)

  with caplog.at_level(logging.WARNING):
    window(1, 4, 9000)                         # the first window: the heap grows
    window(5, 7, 100, paused=10 ** 6)          # a steady step; a checkpoint faulted
    window(8, 10, 5000)
    window(11, 13, 5000)
  lines = [r.getMessage() for r in caplog.records if 'faulted' in r.getMessage()]
  assert len(lines) == said, lines
  if said:
    assert lines[0].startswith(f'host_memory={setting}: steps 8-10 faulted 5000 pages each')
    assert "config.host_memory='keep'" in lines[0]
  reporter.close()
