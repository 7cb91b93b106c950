"""Evaluation: the mean top-1, top-5 and loss over every example of a split (or of its first
`examples`), once, with the loss's standard error."""
import math
import time

import jax
import jax.numpy as jnp
from absl import logging

from jaxpar import config as config_lib
from jaxpar.data import pipeline


def evaluate(eval_step, variables, mesh, source, cfg, split: str = 'test',
             examples: int = 0, clock: list | None = None) -> dict:
  """{top1, top5, loss (means), loss_se (the loss mean's standard error, where the step sums
  squared losses), count, unreadable_files} of `split` ('test', or 'train' unaugmented: the
  training set's loss that `analysis.accuracy` targets); with `examples`, of the split's
  first `examples` only (each process its share of them) — the same ones every time.
  With `clock` (a list), each batch is waited for and `time.perf_counter()` appended: before
  the first and after each, so that its differences are the batches' times."""
  total = split_size(source, split)
  subset = 0 < examples < total
  total = examples if subset else total
  share = math.ceil(total / jax.process_count())
  per_process = config_lib.eval_batch(cfg) // jax.process_count()
  num_batches = math.ceil(share / per_process)
  sums = None
  batches = eval_batches(source, cfg, split, per_process, num_batches, share if subset else 0)
  if clock is not None:
    clock.append(time.perf_counter())
  for batch in pipeline.prefetch_to_device(batches, mesh):
    out = eval_step(variables, batch)
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
    if clock is not None:
      jax.block_until_ready(sums)
      clock.append(time.perf_counter())
  sums = jax.device_get(sums)
  count = float(sums.pop('count'))
  means = {k: float(v) / count for k, v in sums.items()}
  if 'loss_sq' in means:
    variance = max(means.pop('loss_sq') - means['loss'] ** 2, 0.0)
    means['loss_se'] = math.sqrt(variance / max(count - 1, 1))
  return {**means, 'count': count, 'unreadable_files': len(source.unreadable)}


# Replicas further apart than this (`replica_spread`: the largest distance from their mean,
# relative to its norm) have an average that none of them trained. On the digits Local SGD
# kept its replicas within 0.5 % (τ = 4; SparkNet's τ = 50, 22 steps after an average:
# 0.46 %), while gossip that mixes only gradients let them drift 10 % apart on 8 devices
# (configs/local_sgd.py:gossip_sparse: their average at chance, 10.8 % top-1, replica 0 at
# 80.6 %) and 17-19 % on 2 (docs/accuracy.md).
SPREAD_WARN = 0.05


def evaluate_model(eval_step, strategy, state, mesh, source, cfg) -> dict:
  """`evaluate` of the test split on the model `strategy.variables(state)` reads — for a
  strategy with one replica per device (`replica_spread`), the replicas' average — with
  `replica_spread` among the results. Where the replicas are more than `SPREAD_WARN`
  apart, replica 0 alone is evaluated too (`top1_replica0`, `top5_replica0`, `loss_replica0`)
  and a warning says so: their average is then not a model any replica trained."""
  results = evaluate(eval_step, strategy.variables(state), mesh, source, cfg)
  spread_of = getattr(strategy, 'replica_spread', None)
  if spread_of is None:
    return results
  results['replica_spread'] = spread = spread_of(state)
  if spread > SPREAD_WARN:
    own = evaluate(eval_step, strategy.replica_variables(state, 0), mesh, source, cfg)
    results.update({f'{k}_replica0': own[k] for k in ('top1', 'top5', 'loss')})
    logging.warning(
        'The replicas are %.1f %% apart (the largest distance from their mean, relative to '
        'its norm): their average, which is evaluated, reached top-1 %.2f %%, replica 0 alone '
        '%.2f %%. Averaging the weights keeps replicas together (Local SGD: a smaller '
        "sync_every; dense gossip: gossip_mix='parameters'); mixing only gradients lets them "
        'drift (docs/accuracy.md).', 100 * spread, 100 * results['top1'],
        100 * own['top1'])
  return results


def split_size(source, split: str) -> int:
  """The examples of `split` ('test' or 'train') across every process."""
  return source.num_test_global if split == 'test' else source.num_train_global


def eval_batches(source, cfg, split: str, batch: int, num_batches: int, take: int = 0):
  """`pipeline.eval_batches` of `split`: read, decoded and resized by tf.data at the first
  evaluation; replayed from memory at the next ones where they fit in
  `dataset.eval_cache_mb` (the same arrays: every evaluation sees the same batches).
  On a small split, building the tf.data pipeline and reading the split again cost more
  than the evaluation itself: `jaxpar.plan`'s serial run of the README's quickstart
  evaluates the digits' training split every 20 steps; its 65 evaluations took 35 s less
  (116 s -> 81 s to the same step, 2 cores of an AMD EPYC, 2026-11-28). A subset of whole
  batches (`take` a multiple of `batch`) is replayed from the whole split's kept batches
  where those are kept (`_whole_batches_of`)."""
  key = (split, batch, num_batches, cfg.image_size, cfg.augment.kind, take)
  kept = source.kept.get(key)
  if kept is None and take and take % batch == 0:
    kept = _whole_batches_of(source, key)
  if kept is not None:
    yield from kept
    return
  read = pipeline.eval_batches(source, batch=batch, num_batches=num_batches,
                               image_size=cfg.image_size, augment=cfg.augment.kind, split=split,
                               take=take)
  mib = num_batches * batch * (cfg.image_size ** 2 * source.channels * 4 + 12) / 2 ** 20
  if mib > cfg.dataset.eval_cache_mb:
    if key not in source.kept:  # said once
      source.kept[key] = None
      logging.info('Evaluation: the %s split (%.0f MiB decoded) is read at every evaluation: '
                   'above dataset.eval_cache_mb=%g.', split, mib, cfg.dataset.eval_cache_mb)
    yield from read
    return
  kept = []
  for b in read:
    kept.append(b)
    yield b
  source.kept[key] = kept  # a whole pass only
  logging.info('Evaluation: the %s split (%.1f MiB decoded) is kept in memory for the next '
               'evaluations (dataset.eval_cache_mb=%g).', split, mib, cfg.dataset.eval_cache_mb)


def _whole_batches_of(source, key: tuple):
  """A subset of whole batches (`key`'s take a multiple of its batch) as the first batches
  of the whole split kept in memory at the same batch: the same examples (each process's
  share read in order), without reading the split again; None where that is not kept."""
  split, batch, num_batches, image_size, kind, _ = key
  for (s, b, n, size, k, take), kept in source.kept.items():
    if (s, b, size, k, take) == (split, batch, image_size, kind, 0) and kept \
        and n >= num_batches:
      return kept[:num_batches]
  return None
