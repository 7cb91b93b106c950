"""Reporting: console lines, a progress bar on a terminal, TensorBoard summaries.

The summaries are written with TensorFlow's `tf.summary` (as flax's `metrics.tensorboard`
writes them), not through flax's writer, whose module imports TensorBoard's hparams plugin
and with it Keras and scikit-learn: 1.5 s of every process's start (`data.tf_import`)."""
import contextlib
import sys
import time

import jax
import numpy as np
import tqdm
from absl import logging

from jaxpar.data import tf_import


def quiet_libraries(keep: str = '/jaxpar/'):
  """The console shows the INFO lines of files under `keep` (empty: none) and every
  library's warnings, not their INFO chatter."""
  logging.get_absl_handler().addFilter(
      lambda r: r.levelno >= logging.converter.STANDARD_WARNING
      or (keep and keep in r.pathname))


class Reporter:
  """Averages the step metrics between reports and adds throughput.

  Step metrics stay on device until a report, so the loop never waits on them.
  The clock restarts after the first step, whose time is mostly compilation, and stops
  while the loop evaluates or saves (`paused`, as big_vision's `chrono.pause`): `step_time`
  and `images_per_sec` are the training steps' alone.
  """

  def __init__(self, workdir: str, total_steps: int, first_step: int, global_batch: int):
    self.is_main = jax.process_index() == 0
    self.workdir = workdir
    self.writer = None
    if self.is_main:
      try:
        self.writer = tf_import.tensorflow().summary.create_file_writer(workdir)
      except Exception as e:  # noqa: BLE001 — as in `_summaries`
        self._give_up_summaries(e)
    self.bar = tqdm.tqdm(total=total_steps, initial=first_step, unit='step', dynamic_ncols=True,
                         disable=not (self.is_main and sys.stderr.isatty()))
    self.total_steps = total_steps
    self.global_batch = global_batch
    self.pending = []
    self.history = {}  # step → train loss, for every step run in this process
    self.clock = None

  def step(self, step: int, metrics):
    self.pending.append((step, metrics))
    self.bar.update(1)
    if self.clock is None:  # first step of this process: compiled just now
      jax.block_until_ready(metrics)
      self.clock, self.clock_step = time.perf_counter(), step

  @contextlib.contextmanager
  def paused(self):
    """Stops the clock for the block (an evaluation, a checkpoint), after the steps already
    dispatched have finished: their time stays the steps'."""
    if self.clock is None:
      yield
      return
    if self.pending:
      jax.block_until_ready(self.pending[-1][1])
    start = time.perf_counter()
    try:
      yield
    finally:
      self.clock += time.perf_counter() - start

  def report(self, step: int, lr: float):
    fetched = jax.device_get(self.pending)
    self.pending = []
    for s, m in fetched:
      self.history[s] = float(m['loss'])
    now = time.perf_counter()
    steps = step - self.clock_step
    summary = {k: float(np.mean([m[k] for _, m in fetched])) for k in fetched[0][1]}
    summary['learning_rate'] = lr
    if steps > 0:
      summary['step_time'] = (now - self.clock) / steps
      summary['images_per_sec'] = self.global_batch / summary['step_time']
    self.clock, self.clock_step = now, step
    self._write('train', step, summary)
    self.bar.set_postfix(loss=f"{summary['loss']:.4f}",
                         img_s=f"{summary.get('images_per_sec', 0):.0f}")

  def evaluation(self, step: int, results: dict):
    self._write('eval', step, results)

  def _write(self, prefix: str, step: int, values: dict):
    if not self.is_main:
      return
    text = '  '.join(f'{k} {v:.4g}' for k, v in values.items())
    message = f'[{prefix}] step {step}/{self.total_steps}  {text}'
    if self.bar.disable:
      logging.info('%s', message)
    else:
      self.bar.write(message)
    def write(tf, writer):
      with writer.as_default(step=step):
        for k, v in values.items():
          tf.summary.scalar(f'{prefix}/{k}', float(np.asarray(v)))
      writer.flush()
    self._summaries(write)

  def histograms(self, step: int, values: dict):
    """Distributions over the run (e.g. async staleness) to TensorBoard."""
    def write(tf, writer):
      with writer.as_default(step=step):
        for k, v in values.items():
          if len(v):
            tf.summary.histogram(f'train/{k}', np.asarray(v))
      writer.flush()
    self._summaries(write)

  def close(self):
    self.bar.close()
    self._summaries(lambda tf, writer: writer.close())

  def _summaries(self, write):
    """Runs `write` on the TensorBoard writer, if there still is one: summaries that cannot be
    written (a full disk, an unwritable workdir) are warned about once and given up, and
    training goes on; checkpoints say for themselves when they cannot be saved."""
    if self.writer is None:  # not process 0, or given up
      return
    try:
      write(tf_import.tensorflow(), self.writer)
    except Exception as e:  # noqa: BLE001 — TensorFlow raises what its file system raises
      self._give_up_summaries(e)

  def _give_up_summaries(self, e: Exception):
    logging.warning('TensorBoard summaries in %s cannot be written (%s: %s); training goes on '
                    'without them.', self.workdir, type(e).__name__,
                    str(e).strip().splitlines()[0] if str(e).strip() else '')
    self.writer = None
