"""analysis.accuracy.collapse: the mean pairwise cosine against its definition, the
classifier's input and output as the network computes them, and SqueezeNet's dead classes
counted from its classifier's pre-activations (docs/training.md)."""
import itertools

import numpy as np
import pytest

from analysis.accuracy import collapse


def test_mean_cosine_is_the_mean_over_distinct_pairs():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(5, 2, 3))
  flat = x.reshape(5, -1)
  pairs = [flat[i] @ flat[j] / np.linalg.norm(flat[i]) / np.linalg.norm(flat[j])
           for i, j in itertools.permutations(range(5), 2)]
  assert collapse.mean_cosine(x) == pytest.approx(np.mean(pairs), rel=1e-12)
  assert collapse.mean_cosine(np.ones((4, 3)) * [[1], [2], [3], [4]]) == pytest.approx(1.0)
  assert collapse.mean_cosine(np.eye(3)) == pytest.approx(0.0)


def test_squeezenets_classifier_and_its_dead_classes():
  rng = np.random.default_rng(0)
  images = rng.normal(size=(6, 32, 32, 1)).astype(np.float32)
  model = collapse.network('squeezenet')
  variables = collapse.initial_variables(model, images, 3)
  features, scores, logits = collapse.classifier_io(model, variables, images)
  assert features.shape == (6, 1, 1, 512) and scores.shape == (6, 1, 1, 10)
  # The logits are the classifier's ReLU, averaged over the (1×1) map.
  np.testing.assert_allclose(logits, np.maximum(np.asarray(scores), 0).mean((1, 2)), rtol=1e-6)
  expected = int(np.sum(np.asarray(scores).max((0, 1, 2)) <= 0))
  found, = collapse.dead_classes(32, images, [3])
  assert found == {'image_size': 32, 'seed': 3, 'images': 6, 'dead': expected, 'classes': 10}
  row = collapse.similarity('squeezenet', 32, images, seed=3)
  assert row['features_shape'] == [1, 1, 512]
  assert row['features_cosine'] == pytest.approx(collapse.mean_cosine(features), rel=1e-6)
  assert row['logits_cosine'] == pytest.approx(collapse.mean_cosine(logits), rel=1e-6)
  centred = collapse.similarity('squeezenet', 32, images + 5.0, seed=3, centered=True)
  shifted = collapse.similarity('squeezenet', 32, images - images.mean(0), seed=3)
  assert centred['features_cosine'] == pytest.approx(shifted['features_cosine'], rel=1e-5)


def test_the_tables_show_each_row():
  result = {'similarity': [
      {'network': 'resnet34', 'image_size': 32, 'features_shape': [512],
       'features_cosine': 0.9951, 'logits_cosine': 0.993},
      {'network': 'squeezenet', 'image_size': 32, 'centered': True, 'features_shape': [1, 1, 512],
       'features_cosine': 0.9861, 'logits_cosine': 0.99}],
      'dead_classes': [{'image_size': s, 'seed': k, 'dead': s // 32 + k, 'classes': 10}
                       for s in (32, 64) for k in range(3)]}
  assert collapse.similarity_table(result).splitlines()[2:] == [
      '| ResNet34 (32², eval-mode BN) | stage 4, 512 | 0.995 | 0.993 |',
      "| SqueezeNet (32², the digits' mean subtracted) | fire9, 1×1×512 | 0.986 | 0.990 |"]
  assert collapse.dead_table(result).splitlines() == [
      '| input | seeds 0–2: classes of 10 dead at init |', '|---|---|',
      '| 32² | 1, 2, 3 |', '| 64² | 2, 3, 4 |']


def test_training_counts_the_classifier_units_dead_at_the_end(data_dir):
  """At a rate of 1e-12 the trained network is its initialisation: the units dead at the end are
  those dead at init (part 2's count, seed 0), and the run's length is the preset's."""
  cfg = collapse.preset(data_dir)
  cfg.num_epochs, cfg.optimizer.base_lr, cfg.optimizer.warmup_steps = 0.1, 1e-12, 1
  found = collapse.train(cfg)
  assert found['steps'] == 3  # ⌈0.1 × 1,437 / 64⌉
  at_init, = collapse.dead_classes(32, collapse.digits(32, collapse.DEAD_IMAGES, data_dir), [0])
  assert found['classifier_dead'] == at_init['dead'] / 10 > 0
  assert 0 <= found['top1'] <= 1
  row = {'change': 'none', 'steps': 3, 'classifier_dead': 0.3, 'top1': 0.117}
  assert collapse.training_table({'training': [row]}).splitlines()[-1] == (
      '| none | 3 | 30 % | 11.7 % |')
