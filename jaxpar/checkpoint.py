"""Checkpoints through orbax's CheckpointManager: save every K steps, resume from the latest.

The whole `TrainState` is saved, its `examples_seen` included, so a resumed run
continues the data stream where the interrupted one stopped.
"""
import os

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies


class Checkpoints:
  def __init__(self, workdir: str, every: int, keep: int):
    # orbax wants an absolute path; a bucket (gs://...) already is one.
    root = workdir if '://' in workdir else os.path.abspath(workdir)
    self.manager = ocp.CheckpointManager(
        os.path.join(root, 'checkpoints'),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            # Every `every` steps, and when JAX signals preemption; not orbax's
            # default extra save of the very first step.
            save_decision_policy=policies.AnySavePolicy([
                policies.FixedIntervalPolicy(every), policies.PreemptionCheckpointingPolicy()])))

  def restore_latest(self, state):
    """The latest saved state (shaped and placed like `state`), or `state` if none."""
    step = self.manager.latest_step()
    if step is None:
      return state
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    return self.manager.restore(step, args=ocp.args.StandardRestore(target))

  def due(self, step: int) -> bool:
    """Whether `save(step, ...)` would save (the interval, or a preemption)."""
    return self.manager.should_save(step)

  def save(self, step: int, state, force: bool = False):
    """Saves if `step` is on the save interval (or `force`); asynchronous."""
    self.manager.save(step, args=ocp.args.StandardSave(state), force=force)

  def reached_preemption(self, step: int) -> bool:
    """True once a preemption checkpoint is saved: the run should exit and resume later."""
    return self.manager.reached_preemption(step)

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()
