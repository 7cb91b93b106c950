"""When the scheduler stops the run: SIGTERM or SIGINT ends the step in flight, saves a
checkpoint of that step and exits with status 75, the same command resuming there.

Who sends what: SLURM sends SIGTERM at the time limit (and `--signal=TERM@N` N seconds
before it), Kubernetes on eviction (then SIGKILL after the grace period), a preemptible or
spot VM before it goes; Ctrl-C is SIGINT. A run that stops this way exits with
`EXIT_RESUMABLE` = 75, sysexits' EX_TEMPFAIL ("temporary failure; try again later"): a
scheduler's script requeues on it (launch/slurm.sbatch: `scontrol requeue`; Kubernetes: a
Job's `podFailurePolicy` rule on exit code 75), and tells it apart from a failure (1), a
bad config (2) or a kill (137).

- **One process**: this module's handler notes the first signal; the training loop asks
  `requested()` after each step and, once it is set, saves that step and stops.
- **Several processes** (`jax.distributed`): they must save the *same* step. JAX's
  preemption service catches SIGTERM itself (its notifier, started by
  `jax.distributed.initialize`), tells every process through the coordination service,
  and `multihost_utils.reached_preemption_sync_point(step)` turns true on all of them at
  one step (the largest step any had reached, plus one), where orbax's
  PreemptionCheckpointingPolicy saves (jaxpar.checkpoint). So SIGTERM is left to JAX, and
  SIGINT is passed on to it as a SIGTERM to this process.
- **A second signal** while stopping (saving, above all) is logged and ignored: the save
  finishes, so no checkpoint is ever half written (orbax writes a step into a temporary
  folder and renames it when complete; only SIGKILL can stop that). After the save the
  command ignores both signals to its exit (`ignore_until_exit`), so it exits 75.
"""
import os
import signal
import threading

import jax
from absl import logging

EXIT_RESUMABLE = 75  # sysexits.h EX_TEMPFAIL: saved; run the same command again to resume
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
  """Catches SIGTERM and SIGINT for the training loop, from `install()` to `restore()`."""

  def __init__(self):
    self.received = None   # the first signal's name, once one came
    self._previous = {}
    self._jax_service = False

  def install(self):
    """Takes SIGTERM and SIGINT over, after `jax.distributed.initialize` where there is one
    (its notifier takes SIGTERM then). Call again after a library that sets its own handlers
    starts (`ray.init`: Ray's driver dies on SIGTERM): the first call's previous handlers are
    the ones `restore` puts back. Off the main thread (a test training from another) it does
    nothing: Python sets handlers from the main thread only."""
    if threading.current_thread() is not threading.main_thread():
      return self
    self._jax_service = _jax_preemption_service()
    for sig in SIGNALS:
      if sig == signal.SIGTERM and self._jax_service:
        continue  # JAX's notifier has it, and agrees on the step across processes
      previous = signal.signal(sig, self._handle)
      self._previous.setdefault(sig, previous)
    return self

  def restore(self):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    self._previous = {}

  def ignore_until_exit(self):
    """SIGTERM and SIGINT ignored (SIG_IGN) from here to the process's end: for a command
    that saved and now exits 75. A Python handler would not last: the interpreter's
    finalization sets SIG_DFL again where one was set (CPython's `_PySignal_Fini`), and a
    repeated signal then killed the process (143) after its save, which a requeue on 75 does
    not retry; SIG_IGN is left as it is."""
    for sig in SIGNALS:
      signal.signal(sig, signal.SIG_IGN)
    self._previous = {}

  def requested(self) -> bool:
    """Whether this process alone should stop after the step just run (one process). With
    JAX's preemption service the processes stop at the step it agrees on instead
    (`Checkpoints.reached_preemption`)."""
    return self.received is not None and not self._jax_service

  def _handle(self, signum, frame):
    name = signal.Signals(signum).name
    if self.received is not None:
      logging.warning('%s while stopping (after %s): the checkpoint being saved is finished '
                      'first; SIGKILL would leave the previous one as the latest.', name,
                      self.received)
      return
    self.received = name
    logging.warning('%s: finishing the step in flight, then saving a checkpoint of it and '
                    'exiting (status %d: run the same command to resume).', name,
                    EXIT_RESUMABLE)
    if self._jax_service:  # SIGINT: let JAX's preemption service stop every process alike
      os.kill(os.getpid(), signal.SIGTERM)


def _jax_preemption_service() -> bool:
  """Whether JAX's preemption sync manager runs here: `jax.distributed.initialize` starts it
  unless `jax_enable_preemption_service` is off."""
  return jax.distributed.is_initialized() and bool(jax.config.jax_enable_preemption_service)
