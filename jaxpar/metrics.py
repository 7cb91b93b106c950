"""Reporting: console lines, a progress bar on a terminal, TensorBoard summaries.

The summaries are written with TensorFlow's `tf.summary` (as flax's `metrics.tensorboard`
writes them), not through flax's writer, whose module imports TensorBoard's hparams plugin
and with it Keras and scikit-learn: 1.5 s of every process's start (`data.tf_import`)."""
import contextlib
import resource
import sys
import time

import jax
import numpy as np
import tqdm
from absl import logging

from jaxpar import host_memory
from jaxpar.data import tf_import

# Minor page faults a step past which a window of steps says that malloc hands the step's
# temporaries back every step (`Reporter.report`): 2,000 pages of 4 KiB = 8 MB mapped and
# zeroed afresh a step; steps that keep their memory fault tens to hundreds (docs/performance.md).
FAULTS_A_STEP = 2000


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
  and `images_per_sec` are the training steps' alone. The process's minor page faults are
  counted over the same steps: from the second report on, a window of more than
  `FAULTS_A_STEP` a step under `host_memory` 'mapped' or 'system' is said once, with the
  setting that keeps the memory (`host_memory.resolve` decides before anything compiles,
  from an estimate of the step's temporaries, and can be wrong near its line).
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
    self.faults = None       # the process's minor faults when the clock last started
    self.reports = 0         # windows of steps timed so far
    self.faults_said = False

  def step(self, step: int, metrics):
    self.pending.append((step, metrics))
    self.bar.update(1)
    if self.clock is None:  # first step of this process: compiled just now
      jax.block_until_ready(metrics)
      self.clock, self.clock_step = time.perf_counter(), step
      self.faults = host_memory.minor_faults()

  @contextlib.contextmanager
  def paused(self):
    """Stops the clock for the block (an evaluation, a checkpoint), after the steps already
    dispatched have finished: their time stays the steps'."""
    if self.clock is None:
      yield
      return
    if self.pending:
      jax.block_until_ready(self.pending[-1][1])
    start, faults = time.perf_counter(), host_memory.minor_faults()
    try:
      yield
    finally:
      self.clock += time.perf_counter() - start
      self.faults += host_memory.minor_faults() - faults

  def report(self, step: int, lr: float):
    fetched = jax.device_get(self.pending)
    self.pending = []
    for s, m in fetched:
      self.history[s] = float(m['loss'])
    now, faults = time.perf_counter(), host_memory.minor_faults()
    steps = step - self.clock_step
    summary = {k: float(np.mean([m[k] for _, m in fetched])) for k in fetched[0][1]}
    summary['learning_rate'] = lr
    if steps > 0:
      summary['step_time'] = (now - self.clock) / steps
      summary['images_per_sec'] = self.global_batch / summary['step_time']
      self._faulted(step - steps + 1, step, (faults - self.faults) / steps)
      self.reports += 1  # windows of steps timed
    self.clock, self.clock_step, self.faults = now, step, faults
    self._write('train', step, summary)
    self.bar.set_postfix(loss=f"{summary['loss']:.4f}",
                         img_s=f"{summary.get('images_per_sec', 0):.0f}")

  def _faulted(self, first: int, last: int, a_step: float):
    """Says once that steps `first`-`last` faulted `a_step` pages each, where that is the
    step's temporaries mapped afresh (not the first window: a heap still growing)."""
    setting = host_memory.applied()
    if (self.faults_said or not self.reports or a_step <= FAULTS_A_STEP
        or setting not in ('mapped', 'system')):
      return
    self.faults_said = True
    logging.warning(
        "host_memory=%s: steps %d-%d faulted %.0f pages each (%.0f MB of memory mapped and "
        "zeroed afresh every step: the step's temporaries pass what malloc keeps%s); "
        "config.host_memory='keep' keeps them, in one malloc arena for every thread, which "
        "makes a step of many small operations slower where the process compiled its "
        "programs (not where a run started again loads them from the compilation cache): "
        "time both (docs/performance.md, host memory).", setting,
        first, last, a_step, a_step * resource.getpagesize() / 1e6,
        ", 64 MiB in a thread's own arena" if setting == 'mapped' else '')

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
