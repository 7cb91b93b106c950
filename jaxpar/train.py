"""Train a network of [T] data-parallel on a device mesh.

  python -m jaxpar.train --config configs/resnet34_2d.py --workdir /tmp/run
  python -m jaxpar.train --config configs/vgg16e.py:cifar10 --config.total_steps=500 --workdir ...

Reads top to bottom: config → mesh → data → model and optimizer → state →
checkpoint restore → loop (log, eval, checkpoint) → final eval.

SIGTERM or SIGINT ends the step in flight, saves it and exits with status 75 (jaxpar.preemption:
what a scheduler reads as "requeue"); a bad config is status 2, a run that cannot go on 1.
"""
import contextlib
import dataclasses
import os
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')  # before TensorFlow loads: no C++ INFO lines

from absl import app, flags, logging
from ml_collections import config_flags

from jaxpar import build, compile_cache, metrics, multihost, validation
from jaxpar import config as config_lib
from jaxpar import checkpoint as checkpoint_lib
from jaxpar.checkpoint import CheckpointError, Checkpoints
from jaxpar.data import sources
from jaxpar.evaluation import evaluate, evaluate_model
from jaxpar.metrics import Reporter
from jaxpar.plan import planner
from jaxpar.preemption import EXIT_RESUMABLE, StopSignals
from jaxpar.step import make_eval_step

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A configs/*.py file[:arg].',
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Checkpoints and TensorBoard summaries go here.')


@dataclasses.dataclass
class Result:
  eval: dict            # top1, top5, loss (means) and count of the final evaluation
  train_loss: dict      # step → loss, for every step this process ran
  step: int             # the step training stopped at
  examples_seen: int    # the data position reached
  wall_time: float      # seconds, from the config check to the end (compilation included)
  stopped_by: str = ''  # the signal that stopped the run early (SIGTERM, SIGINT), if one did
  checkpoint: str = ''  # the folder of the last checkpoint saved
  plan: dict = dataclasses.field(default_factory=dict)  # scheme='auto': time to the plan's
  # target against its prediction (`planner.TargetClock.outcome`)


def train_and_evaluate(cfg, workdir: str, warmup_from_recipe: bool = False) -> Result:
  """Trains and evaluates as the command line does. `warmup_from_recipe`: the config's
  `optimizer.warmup_steps` was not asked for, so a run too short for it shortens it
  (`validation.validate_schedule`; the command line passes whether the flag was given)."""
  stop = StopSignals()
  try:
    return _train_and_evaluate(cfg, workdir, stop, warmup_from_recipe)
  finally:
    stop.restore()


def _train_and_evaluate(cfg, workdir: str, stop: StopSignals,
                        warmup_from_recipe: bool = False) -> Result:
  started = time.perf_counter()
  # ------------------------------------------------------------------ config (and plan)
  _check_workdir(workdir)
  plan = None
  if cfg.plan.stop_at_target and cfg.scheme != 'auto':
    raise config_lib.ConfigError(
        f'config.plan.stop_at_target=True is invalid with scheme={cfg.scheme!r}: it ends a '
        f"run of scheme='auto' where its plan's target is reached; set scheme='auto' (with "
        f'plan.file or plan.target_*), or leave it False')
  if cfg.scheme == 'auto':  # jaxpar.plan measures, predicts and chooses (or plan.file)
    cfg, plan = planner.resolve(cfg, workdir)
  validation.validate(cfg)
  # ------------------------------------------------------------------ mesh
  mesh = build.mesh(cfg)
  stop.install()  # after joining the other processes: their preemption service is known

  # ------------------------------------------------------------------ data
  source = sources.open_source(cfg.dataset)
  global_batch = config_lib.global_batch(cfg)
  total_steps = config_lib.run_steps(cfg, source.num_train_global)
  if plan:
    total_steps = planner.run_length(plan, total_steps)
  validation.validate_schedule(cfg, total_steps, warmup_from_recipe)
  validation.say_batch_over_split(cfg, source.num_train_global)
  logging.info('%s, %s: global batch %d on mesh %s %s, %d steps; %d train / %d test examples.',
               cfg.model + (' with BatchNorm after each convolution (config.batch_norm=True, '
                            'not in the published network)' if cfg.batch_norm else ''),
               cfg.scheme, global_batch, tuple(cfg.mesh.shape), tuple(cfg.mesh.axes),
               total_steps, source.num_train_global, source.num_test_global)

  # ------------------------------------------------------------------ model and optimizer
  model = build.model(cfg, source.num_classes, source.channels, mesh)
  strategy = build.strategy(cfg, mesh, model)
  group = cfg.bn_group_size or config_lib.num_devices(cfg)
  norm = ('no BatchNorm' if not config_lib.has_batch_norm(cfg) else
          'BatchNorm per device' if group == 1 else f'BN groups of {group} devices')
  logging.info('Server %s: %s; %s; compute in %s; %s, %s schedule.', cfg.server,
               strategy.describe(), norm, cfg.dtype, cfg.optimizer.name, cfg.optimizer.schedule)
  tx, schedule = build.optimizer(cfg, model, source.channels, strategy, global_batch, total_steps)

  # ------------------------------------------------------------------ state
  rng_init, rng_dropout = build.seed_keys(cfg.seed)
  state = build.initial_state(cfg, model, tx, strategy, source.channels, mesh, rng_init)

  # ------------------------------------------------------------------ checkpoint restore
  record = checkpoint_lib.record(cfg, strategy, global_batch, source.num_train_global)
  checkpoints = Checkpoints(workdir, cfg.checkpoint_every, cfg.keep_checkpoints, record)
  state = checkpoints.restore_latest(state)
  first_step = int(state.step)
  if first_step:
    logging.info('Resumed from step %d (example %d).', first_step, int(state.examples_seen))
    _log_changes(checkpoints.restored, record)

  # ------------------------------------------------------------------ loop
  last_step = total_steps
  if cfg.stop_after_steps:
    last_step = min(total_steps, first_step + cfg.stop_after_steps)
  loop = build.loop(cfg, model, tx, mesh, strategy, source, state, last_step - first_step,
                    rng_dropout)
  eval_step = make_eval_step(model, mesh)
  reporter = Reporter(workdir, total_steps, first_step, global_batch)
  clock = planner.TargetClock(plan, cfg.plan.eval_every) if plan and not first_step else None
  step, stopped_by, at_target = first_step, '', False
  while step < last_step:
    state, metrics = loop(state)
    step += 1
    if step == first_step + 1:  # again: the asynchronous loop on Ray starts Ray in its
      stop.install()            # first step, and Ray's driver takes SIGTERM
      if clock:
        clock.started(metrics)
    reporter.step(step, metrics)
    if clock:
      def on_train_split():
        with reporter.paused():
          return evaluate(eval_step, strategy.variables(loop.synced(state)), mesh, source, cfg,
                          split=clock.target.split)
      clock.check(step, metrics, on_train_split)
      if clock.reached and cfg.plan.stop_at_target and not at_target:
        at_target, last_step = True, step  # saved and evaluated below, as a last step
        logging.info('Plan: the target reached: the run ends at step %d '
                     '(config.plan.stop_at_target).', step)
    if step % cfg.log_every == 0 or step == last_step:
      with clock.paused(metrics) if clock else contextlib.nullcontext():  # not in its time
        reporter.report(step, float(schedule(step - 1)))
    if cfg.eval_every and step % cfg.eval_every == 0 and step < total_steps:
      with reporter.paused():
        state = loop.synced(state)
        results = evaluate_model(eval_step, strategy, state, mesh, source, cfg)
      reporter.evaluation(step, results)
    # One process stops at the step a signal finds in flight; several stop together at the
    # step JAX's preemption service agrees on (`due` is true there, then `reached_preemption`).
    stopping = stop.requested()
    if checkpoints.due(step) or step == last_step or stopping:
      with reporter.paused():
        checkpoints.save(step, loop.synced(state), force=step == last_step or stopping)
    if stopping or checkpoints.reached_preemption(step):
      stopped_by = stop.received or 'SIGTERM'  # JAX's preemption service is told by SIGTERM
      logging.warning('%s: saved step %d; run the same command to resume.', stopped_by, step)
      break

  state = loop.synced(state)
  loop.close()
  reporter.histograms(step, loop.histograms())

  # ------------------------------------------------------------------ final eval
  results = {}
  # Stopped at the last step: evaluated on resuming (stop_after_steps, a signal).
  if (step == total_steps or at_target) and not stopped_by:
    results = evaluate_model(eval_step, strategy, state, mesh, source, cfg)
    reporter.evaluation(step, results)
  checkpoints.close()
  reporter.close()
  wall_time = time.perf_counter() - started
  logging.info('Wall time %.1f s for steps %d-%d.', wall_time, first_step, step)
  return Result(eval=results, train_loss=reporter.history, step=step,
                examples_seen=int(state.examples_seen), wall_time=wall_time,
                stopped_by=stopped_by, checkpoint=checkpoints.latest(),
                plan=clock.write(workdir, step) if clock else {})


def _log_changes(restored: dict, record: dict) -> None:
  """What changed since the checkpoint was written: its conversion, and the config."""
  for note in restored.get('notes', []):
    logging.info('Checkpoint of step %d: %s.', restored['step'], note)
  written = restored.get('record') or {}
  changed = checkpoint_lib.changes(written, record)
  if changed:
    logging.info('Changed since the checkpoint was written: %s.', '; '.join(changed))
  batch = written.get('global_batch')
  if batch and batch != record['global_batch']:
    logging.info('The global batch changed from %d to %d: the data continues at the same '
                 'example count, and the learning-rate schedule is this run\'s.', batch,
                 record['global_batch'])
  examples = written.get('train_examples')
  if examples and examples != record['train_examples']:
    logging.warning('The train split has %d examples, %d when the checkpoint was written: the '
                    'stream goes on at the same example count in the new split\'s shuffled '
                    'epochs, not with the examples the run would have read next.',
                    record['train_examples'], examples)


def _check_workdir(workdir: str) -> None:
  """The workdir exists (made if need be) and is writable; a remote path (gs://, …) is
  left to the libraries that write there."""
  if '://' in workdir:
    return
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    raise config_lib.ConfigError(f'--workdir={workdir!r} cannot be created ({e.strerror}): '
                                 f'choose a folder you can write to') from None
  if not os.access(workdir, os.W_OK | os.X_OK):
    raise config_lib.ConfigError(f'--workdir={workdir!r} is not writable: choose a folder you '
                                 f'can write to')


def main(argv):
  metrics.quiet_libraries()
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  if _WORKDIR.value is None:
    sys.exit('--workdir is required: the folder for checkpoints and TensorBoard summaries.')
  stop = StopSignals()
  try:
    cfg = _CONFIG.value
    compile_cache.apply(cfg.compilation_cache, multihost.process_count_of(**cfg.distributed))
    asked = config_flags.get_override_values(flags.FLAGS['config'])
    result = _train_and_evaluate(cfg, _WORKDIR.value, stop,
                                 warmup_from_recipe='optimizer.warmup_steps' not in asked)
  except config_lib.ConfigError as e:
    print(f'jaxpar: {e}', file=sys.stderr)
    sys.exit(2)
  except CheckpointError as e:
    print(f'jaxpar: {e}', file=sys.stderr)
    _leave(1)
  except config_lib.RunError as e:
    print(f'jaxpar: {e}', file=sys.stderr)
    sys.exit(1)
  if result.stopped_by:
    stop.ignore_until_exit()  # saved: a scheduler's repeated signal must not turn 75 into 143
    print(f'jaxpar: {result.stopped_by}: stopped after step {result.step}, checkpoint saved in '
          f'{result.checkpoint}; run the same command to resume (exit status '
          f'{EXIT_RESUMABLE}).', file=sys.stderr)
    sys.exit(EXIT_RESUMABLE)
  stop.restore()
  if result.eval:
    skipped = result.eval['unreadable_files']
    print(f"test accuracy: top-1 {result.eval['top1']:.2%}, top-5 {result.eval['top5']:.2%} "
          f"on {int(result.eval['count'])} examples"
          + (f' ({skipped} unreadable image files skipped)' if skipped else '')
          + (f" (the replicas' average; replica 0 alone: top-1 "
             f"{result.eval['top1_replica0']:.2%})" if 'top1_replica0' in result.eval else '')
          + f'; wall time {result.wall_time:.1f} s'
          + (f"; {result.plan['summary']}" if result.plan else ''))
  else:
    print(f'stopped at step {result.step}; run again with the same --workdir to resume.')


def _leave(status: int):
  """Exits now, without waiting for library threads that never end (orbax's, after a failed
  save: `CheckpointError`); what was printed or logged is flushed first."""
  sys.stdout.flush()
  sys.stderr.flush()
  logging.flush()
  os._exit(status)


def _parse_flags(argv):
  """absl's parsing, but a bad flag (or an error in a config file) is one line, not a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    message = str(e).strip().splitlines()[-1]
    print(f"jaxpar: {message.split('ConfigError: ')[-1]}", file=sys.stderr)
    sys.exit(2)
  except (AttributeError, KeyError) as e:  # ml_collections: --config.<key> that does not exist
    print(f'jaxpar: unknown config key {e}; the valid keys are in jaxpar/config.py defaults()',
          file=sys.stderr)
    sys.exit(2)


if __name__ == '__main__':
  flags.mark_flag_as_required('config')
  app.run(main, flags_parser=_parse_flags)
