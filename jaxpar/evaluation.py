"""Evaluation: the mean top-1, top-5 and loss over every example of a split, once."""
import math

import jax
import jax.numpy as jnp

from jaxpar.data import pipeline


def evaluate(eval_step, variables, mesh, source, cfg, split: str = 'test') -> dict:
  """{top1, top5, loss (means), count, unreadable_files} of `split` ('test', or 'train'
  unaugmented: the training set's loss that `analysis.accuracy` targets)."""
  total = source.num_test_global if split == 'test' else source.num_train_global
  per_process = cfg.eval_batch // jax.process_count()
  num_batches = math.ceil(math.ceil(total / jax.process_count()) / per_process)
  sums = None
  batches = pipeline.eval_batches(source, batch=per_process, num_batches=num_batches,
                                  image_size=cfg.image_size, augment=cfg.augment.kind,
                                  split=split)
  for batch in pipeline.prefetch_to_device(batches, mesh):
    out = eval_step(variables, batch)
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
  sums = jax.device_get(sums)
  count = float(sums.pop('count'))
  return {**{k: float(v) / count for k, v in sums.items()}, 'count': count,
          'unreadable_files': len(source.unreadable)}
