"""Checkpoints through orbax's CheckpointManager: save every K steps, resume from the latest.

The whole `TrainState` is saved, its `examples_seen` included, so a resumed run
continues the data stream where the interrupted one stopped. Beside it each step records
(orbax's per-step custom metadata) the config and versions that wrote it, its mesh and
processes, and the strategy's layout (`Strategy.checkpoint_layout`), so that a run on
another mesh, number of processes or server restores it too (`jaxpar/portable.py`) and
logs what changed.

The faults a cluster delivers, each ending in one line rather than a traceback:
- **A damaged checkpoint** (files missing or truncated by a full disk or a copy that died,
  metadata that does not parse): on restore, a step that fails to read is named with what
  failed, moved aside within the checkpoint folder (`<step>.damaged`, never deleted) and the
  previous step is tried; when none is left, a `ConfigError` names the folder (`train`
  exits with status 2). In several processes every process tries the same steps in the same
  order and they agree on each verdict.
- **A checkpoint that does not fit the config** (another network, widths, number of
  classes, optimizer) is not damage: a `ConfigError` of one line says what differs and what
  wrote it; nothing is renamed.
- **A full file system**: before each save the checkpoint's size (its arrays' bytes, plus
  metadata) is compared with the space free in the folder; a save that cannot fit, or that
  fails while it is written (the disk filled meanwhile, the folder became unwritable), is a
  `CheckpointError` naming the folder, sizes and cause. orbax deletes an old checkpoint only after
  a new one is complete, so the last good one stays.
"""
import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging
from orbax.checkpoint import checkpoint_managers as policies

from jaxpar import portable
from jaxpar.config import ConfigError, RunError

# Beyond the arrays' bytes: orbax's metadata (JSON of the tree, OCDBT manifests), ~100 KB
# for ResNet34's state; the margin also covers the file system's own blocks.
MARGIN_BYTES, MARGIN_FRACTION = 2**20, 0.02


class CheckpointError(RunError):
  """A checkpoint could not be written. orbax's signalling threads of the failed save keep
  waiting for it, so the process must leave with `os._exit` after saying so (`train.main`)."""


def _without_traceback(record) -> bool:
  """orbax logs each failure of a background save from every thread it touched, traceback
  and all; the line stays, the traceback goes (`CheckpointError` says what failed)."""
  if '/orbax/' in record.pathname:
    record.exc_info = record.exc_text = None
  return True


def saves_whole() -> bool:
  """Whether each replicated array is written whole, not in parts, one per replica.

  orbax's `ArrayHandler` does so by default (not where `JAX_PLATFORMS` names a GPU): each
  replica's device slices its part out of the array, a program of its own for every shape
  and part. That pays where it divides the writing among hosts. jaxpar turns it off
  - in one process, which writes everything either way: SqueezeNet's state on 8 emulated
    CPU devices took 7.8 s to save the first time (the slicing programs compiled) and 0.7 s
    after, 0.5 s and 0.3 s whole; ResNet34's 5.7 s and 1.25 s, 0.7 s and 0.5 s whole;
  - on CPUs, where compiling the parts costs more than one host writing all: 2 processes ×
    4 devices, SqueezeNet, the first save held training 3.8-4.3 s, 0.5-0.6 s whole;
  and keeps orbax's default for several processes on accelerators. (2 cores of an AMD EPYC,
  2026-11-27, jax 0.10.2, orbax-checkpoint 0.12.8, XLA's default flags.)"""
  return jax.process_count() == 1 or jax.default_backend() == 'cpu'


def _register_array_handler():
  """orbax's handler of `jax.Array` as orbax registers it, writing whole arrays where
  `saves_whole()` (elsewhere orbax's default: None). Through the registry itself, not
  `register_type_handler`, which logs a warning for the override (jaxpar's own)."""
  from orbax.checkpoint._src.metadata import array_metadata_store
  from orbax.checkpoint._src.serialization import type_handler_registry
  type_handler_registry.GLOBAL_TYPE_HANDLER_REGISTRY.add(
      jax.Array, ocp.type_handlers.ArrayHandler(
          use_replica_parallel=False if saves_whole() else None,
          array_metadata_store=array_metadata_store.Store()),  # as orbax's default has
      override=True, ignore_warnings=True)


class Checkpoints:
  """`record`: what each save records beside the state (`record`: the config, versions,
  mesh, processes and the strategy's layout), JSON."""

  def __init__(self, workdir: str, every: int, keep: int, record: dict | None = None):
    _register_array_handler()
    self.record = record or {}
    if _without_traceback not in logging.get_absl_handler().filters:
      logging.get_absl_handler().addFilter(_without_traceback)
    # orbax wants an absolute path; a bucket (gs://...) already is one.
    root = workdir if '://' in workdir else os.path.abspath(workdir)
    self.directory = os.path.join(root, 'checkpoints')
    self._in_flight = None  # the step of the last save started (written in the background)
    self.manager = ocp.CheckpointManager(
        self.directory, item_handlers=ocp.StandardCheckpointHandler(),
        options=ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            # Every `every` steps, and when JAX signals preemption; not orbax's
            # default extra save of the very first step.
            save_decision_policy=policies.AnySavePolicy([
                policies.FixedIntervalPolicy(every), policies.PreemptionCheckpointingPolicy()])))

  def restore_latest(self, state):
    """The latest readable saved state, laid out like `state` (this run's initial state, in
    the layout `self.record['layout']` names), or `state` if none was ever saved. A step
    that fails to read is moved aside and the one before is tried; one that reads but does
    not fit is a `ConfigError` (nothing moved). Sets `self.restored`: the record of the
    step restored, and the changes its conversion made (`notes`)."""
    self.restored = {}
    damaged = []
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self._restore(step, state)
      except _Damaged as e:
        aside = self._move_aside(step)
        damaged.append(step)
        logging.warning('Checkpoint of step %d cannot be read (%s); moved aside to %s, '
                        'trying the one before.', step, e, aside)
        continue
      self.manager.reload()
      return restored
    self.manager.reload()
    if damaged:
      raise ConfigError(f'--workdir holds no readable checkpoint in {self.directory}: step(s) '
                        f"{', '.join(map(str, damaged))} failed to read and were moved aside "
                        f'(<step>.damaged, kept for inspection); choose another --workdir to '
                        f'start afresh.')
    return state

  def _restore(self, step: int, state):
    """Step `step` laid out like `state`; `_Damaged` if it cannot be read (every process
    agrees), `ConfigError` if it reads but does not fit."""
    saved = record = None
    try:
      saved = self.manager.item_metadata(step).tree
      record = self.manager.metadata(step).custom_metadata or {}
    except Exception as e:  # noqa: BLE001 — orbax raises what its readers raise
      failure = e
    else:
      failure = None
    _agree(step, failure)
    layout = self.record.get('layout')
    written = record.get('layout')
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    if _fits(saved, target) and (written is None or layout is None or written == layout):
      try:
        restored = self.manager.restore(step, args=ocp.args.StandardRestore(target))
      except Exception as e:  # noqa: BLE001
        failure = e
      _agree(step, failure)
      self.restored = {'step': step, 'record': record, 'notes': []}
      return restored
    mismatch = lambda why: ConfigError(
        f'the checkpoint of step {step} in {self.directory} does not fit this run: {why}. It '
        f'was written by {written_by(record)}; resume with that config (the mesh, processes '
        f'and server may differ), or choose another --workdir to start afresh.')
    if written is None or layout is None:
      raise mismatch('its arrays differ from this run\'s ('
                     + _first_difference(saved, target) + ') and it records no layout to '
                     'convert from')
    try:
      raw = self.manager.restore(step, args=ocp.args.StandardRestore(
          jax.tree.map(lambda m: np.empty(m.shape, m.dtype), saved)))
    except Exception as e:  # noqa: BLE001
      failure = e
    _agree(step, failure)
    try:
      converted, notes = portable.lay_out(portable.read(raw, written, state, layout), layout,
                                          state)
    except portable.Mismatch as e:
      raise mismatch(str(e)) from None
    self.restored = {'step': step, 'record': record,
                     'notes': [f'converted from {portable.describe(written)} to '
                               f'{portable.describe(layout)}'] + notes}
    return jax.tree.map(_placed, converted, state)

  def _move_aside(self, step: int) -> str:
    """Renames step `step`'s folder to `<step>.damaged` (numbered if taken): orbax lists only
    folders named by a step, and the files stay for whoever wants to look."""
    path = os.path.join(self.directory, str(step))
    aside = f'{path}.damaged'
    if jax.process_index() == 0 and '://' not in path:
      n = 1
      while os.path.exists(aside):
        n += 1
        aside = f'{path}.damaged-{n}'
      os.rename(path, aside)
    return aside

  def due(self, step: int) -> bool:
    """Whether `save(step, ...)` would save (the interval, or a preemption)."""
    return self.manager.should_save(step)

  def save(self, step: int, state, force: bool = False):
    """Saves if `step` is on the save interval (or `force`); asynchronous. Raises
    `CheckpointError` when the checkpoint cannot fit or the previous save failed."""
    self._check_space(step, state)
    try:
      saved = self.manager.save(step, args=ocp.args.StandardSave(state), force=force,
                                custom_metadata=self.record)
    except Exception as e:  # noqa: BLE001 — this save failed, or the one before it, still
      # in the background (orbax waits for it first): blame the one not complete.
      previous_done = self._in_flight is None or self._in_flight in self.manager.all_steps()
      raise self._failed(step if previous_done else self._in_flight, e) from None
    if saved:
      self._in_flight = step

  def _check_space(self, step: int, state):
    if '://' in self.directory:
      return
    arrays = sum(getattr(x, 'nbytes', 8) for x in jax.tree.leaves(state))
    needed = arrays * (1 + MARGIN_FRACTION) + MARGIN_BYTES
    os.makedirs(self.directory, exist_ok=True)
    free = shutil.disk_usage(self.directory).free
    if free < needed:
      raise CheckpointError(f'cannot save the checkpoint of step {step} in {self.directory}: '
                            f'it needs about {_mb(needed)} and the file system has {_mb(free)} '
                            f'free. Free space there (older checkpoints: '
                            f'config.keep_checkpoints) or choose another --workdir, then run '
                            f'the same command to resume from the last checkpoint.')

  def _failed(self, step: int, e: Exception) -> CheckpointError:
    free = (f', {_mb(shutil.disk_usage(self.directory).free)} free now'
            if '://' not in self.directory and os.path.isdir(self.directory) else '')
    return CheckpointError(f'saving the checkpoint of step {step} in {self.directory} failed: '
                           f'{type(e).__name__}: {_first_line(e)}{free}. The last complete '
                           f'checkpoint there is kept; fix the folder, then run the same command '
                           f'to resume.')

  def reached_preemption(self, step: int) -> bool:
    """True once a preemption checkpoint is saved: the run should exit and resume later."""
    return self.manager.reached_preemption(step)

  def close(self):
    """Waits for the save in flight; `CheckpointError` if it failed."""
    try:
      self.manager.wait_until_finished()
    except Exception as e:  # noqa: BLE001
      raise self._failed(self._in_flight, e) from None
    finally:
      self.manager.close()

  def latest(self) -> str:
    """The latest step's folder (for messages); '' before the first save."""
    step = self.manager.latest_step()
    return '' if step is None else os.path.join(self.directory, str(step))


class _Damaged(Exception):
  """A step's files cannot be read (the message: what failed)."""


def _agree(step: int, failure):
  """Raises `_Damaged` if reading step `step` failed here or in any other process (they
  must all fall back together, or all go on)."""
  failed = failure is not None
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    failed = bool(np.any(multihost_utils.process_allgather(np.int32(failed))))
  if failed:
    raise _Damaged(f'{type(failure).__name__}: {_first_line(failure)}' if failure
                   else 'another process could not read it')


def _leaves(tree) -> dict:
  """path → (shape, dtype name) of a state's arrays, or of orbax's metadata of one."""
  return {portable.path_name(p): (tuple(x.shape), np.dtype(x.dtype).name)
          for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _fits(saved, target) -> bool:
  """Whether the saved tree has `target`'s arrays: the same paths, shapes and dtypes."""
  return saved is not None and _leaves(saved) == _leaves(target)


def _first_difference(saved, target) -> str:
  have, want = _leaves(saved), _leaves(target)
  for key in want:
    if key not in have:
      return f"this run's {key} is not in it"
    if have[key] != want[key]:
      return f'{key} is {have[key][0]} {have[key][1]}, this run\'s {want[key][0]} {want[key][1]}'
  extra = sorted(set(have) - set(want))
  return f'it has {extra[0]}, this run has not' if extra else 'another structure'


def _placed(x, like):
  """Host value `x` as a global array laid out like `like` (in any number of processes)."""
  if not isinstance(like, jax.Array):
    return x
  x = np.asarray(x, like.dtype)
  return jax.make_array_from_callback(x.shape, like.sharding, lambda index: x[index])


def record(cfg, strategy, global_batch: int, train_examples: int) -> dict:
  """What a run's checkpoints record beside the state: its config, versions, mesh,
  processes, global batch, the train split's examples (all processes') and the strategy's
  layout (JSON)."""
  import datetime
  import platform
  from importlib import metadata
  versions = {name: metadata.version(name)
              for name in ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint')}
  return {'config': json.loads(cfg.to_json_best_effort()), 'layout': strategy.checkpoint_layout(),
          'processes': jax.process_count(), 'global_batch': int(global_batch),
          'train_examples': int(train_examples),
          'versions': {**versions, 'python': platform.python_version()},
          'written': datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}


def changes(saved: dict, now: dict) -> list:
  """What differs between the record a checkpoint was written with and this run's, as
  'key: old -> new' (config fields, versions, processes, global batch, train examples)."""
  def flat(tree, prefix=''):
    out = {}
    for k, v in (tree or {}).items():
      if isinstance(v, dict):
        out.update(flat(v, f'{prefix}{k}.'))
      else:
        out[f'{prefix}{k}'] = tuple(v) if isinstance(v, list) else v
    return out
  old, new = ({**flat(record.get('config')), **flat(record.get('versions'), 'version of '),
               'processes': record.get('processes'), 'global batch': record.get('global_batch'),
               'train examples': record.get('train_examples')} for record in (saved, now))
  if (old.get('global_batch'), new.get('global_batch')) == (old['global batch'],
                                                            new['global batch']):
    del old['global batch'], new['global batch']  # sync-split: the config's field says it
  return [f'{k}: {old.get(k)!r} -> {new.get(k)!r}' for k in sorted(set(old) | set(new))
          if old.get(k) != new.get(k) and old.get(k) is not None and k != 'written']


# The fields of a config that say what wrote a checkpoint, in one line.
WRITTEN_BY = ('model', 'dataset.name', 'scheme', 'server', 'mesh.shape', 'optimizer.name',
              'dtype')


def written_by(record: dict) -> str:
  """'model=resnet34, dataset.name=sklearn_digits, … (jax 0.10.2, 2026-12-01)' from a
  checkpoint's record; what is known of an unrecorded one."""
  config = record.get('config')
  if not config:
    return 'a run that recorded no config'
  if isinstance(config, str):
    config = json.loads(config)
  fields = []
  for name in WRITTEN_BY:
    value = config
    for part in name.split('.'):
      value = value.get(part) if isinstance(value, dict) else None
    if value is not None:
      fields.append(f'{name}={tuple(value) if isinstance(value, list) else value}')
  versions = record.get('versions', {})
  return ', '.join(fields) + (f" (jaxpar on jax {versions['jax']})" if 'jax' in versions else '')


def _first_line(e: Exception) -> str:
  text = str(e).strip()
  return text.splitlines()[0][:300] if text else ''


def _mb(n: float) -> str:
  return f'{n / 2**20:,.1f} MiB'
