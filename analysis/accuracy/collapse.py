"""Why the networks without normalisation stall on the digits at initialisation
(docs/training.md), measured:

  python -m analysis.accuracy.collapse --train --out analysis/report/accuracy/collapse.json

1. **Features alike for every image.** A deep ReLU network without normalisation maps
   different inputs to nearly the same feature vector at initialisation (the correlation of
   two inputs' activations grows with depth towards 1; Poole et al. 2016, Balduzzi et al.
   2017). For each network as published (ResNet34 with its BatchNorm in eval mode, i.e. the
   running statistics of initialisation), on the first 128 test digits: the mean cosine
   similarity over all pairs of images i ≠ j,

       c = (1 / (n(n−1))) Σ_{i≠j} ⟨f_i, f_j⟩ / (‖f_i‖ ‖f_j‖),

   of the last features f (the input of the classifier: the last Dense or convolution the
   network calls) and of the logits.
2. **SqueezeNet's dead classes.** Its classifier is a 1×1 convolution followed by a ReLU,
   then global average pooling; a class unit whose pre-activation is ≤ 0 at every position
   of every image scores 0 whatever the image, and (the others being ≥ 0) is never
   predicted. Counted on the first 256 test digits, at initialisation, by input size and
   seed.

3. **Nothing in the optimizer prevents it** (`--train`): the published SqueezeNet on the
   digits at 32² with the shared preset of 2026-11-23 (SGD + Nesterov momentum 0.9, 0.1 per
   256 examples, 20 warm-up steps, cosine decay, weight decay 5e-4, 8 epochs = 180 steps of
   64 on one device), and each change of `TRAINING`: the fraction of the classifier's units
   dead at the end (on the first 256 test digits) and the test top-1.

Initialisation as a run with `config.seed=seed` has it (`jaxpar.step.init_variables` with
the initialisation key of `jaxpar.build.seed_keys(seed)`, the networks' published
initialisers); the digits through jaxpar's input pipeline, unaugmented. Parts 1–2
take a minute on 2 cores, part 3 a few more.
"""
import datetime
import functools
import json
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from analysis.steptime.measure import machine, versions
from jaxpar import build
from jaxpar import config as config_lib
from jaxpar import models
from jaxpar.data import pipeline, sources
from jaxpar.step import init_variables

FLAGS = flags.FLAGS

# (network, input size, the images' mean subtracted): the rows of the similarity table.
SIMILARITY = (('squeezenet', 32, False), ('squeezenet', 32, True), ('squeezenet', 224, False),
              ('vgg16e', 32, False), ('googlenet', 32, False), ('resnet34', 32, False))
DEAD_SIZES, DEAD_SEEDS = (32, 64, 224), tuple(range(8))
SIMILARITY_IMAGES, DEAD_IMAGES = 128, 256
# Part 3: (the change to the preset, its config overrides).
TRAINING = (
    ('none (0.1 per 256, cosine, warm-up 20)', {}),
    ('learning rate 0.04 per 256', {'optimizer.base_lr': 0.04}),
    ('learning rate 0.01 per 256', {'optimizer.base_lr': 0.01}),
    ('learning rate 0.4 per 256', {'optimizer.base_lr': 0.4}),
    ('warm-up 150 steps, 0.05 per 256', {'optimizer.warmup_steps': 150,
                                         'optimizer.base_lr': 0.05}),
    ('no weight decay', {'optimizer.weight_decay': 0.0}),
    ('plain SGD (no momentum), 0.2 per 256', {'optimizer.momentum': 0.0,
                                              'optimizer.nesterov': False,
                                              'optimizer.base_lr': 0.2}),
    ('LARS, 1.0 per 256', {'optimizer.name': 'lars', 'optimizer.base_lr': 1.0}),
    ('LARS, 4.0 per 256', {'optimizer.name': 'lars', 'optimizer.base_lr': 4.0}),
    ('input 64² (3×3 last map)', {'image_size': 64}),
    ('input 64², seed 1', {'image_size': 64, 'seed': 1}),
)


def digits(image_size: int, n: int, data_dir: str = '') -> np.ndarray:
  """The first `n` (at most `DEAD_IMAGES`) test digits at `image_size`², as a run evaluates
  them; read once per size (`_test_digits`), read-only."""
  if n > DEAD_IMAGES:
    raise ValueError(f'digits: n={n} is more than the {DEAD_IMAGES} read')
  return _test_digits(image_size, data_dir)[:n]


@functools.cache
def _test_digits(image_size: int, data_dir: str) -> np.ndarray:
  c = config_lib.defaults().dataset
  c.data_dir = data_dir
  source = sources.open_source(c, shard=(0, 1))
  batches = pipeline.eval_batches(source, batch=DEAD_IMAGES, num_batches=1,
                                  image_size=image_size, augment='none')
  images = next(iter(batches))['image'][:DEAD_IMAGES]
  images.setflags(write=False)
  return images


def network(name: str):
  """The published network (no BatchNorm but ResNet34's), 10 classes."""
  return models.MODELS[name](num_classes=10, **({} if name == 'resnet34'
                                                 else {'batch_norm': False}))


def initial_variables(model, images, seed: int):
  """The network's variables as a run with `config.seed=seed` initialises them."""
  rng_init, _ = build.seed_keys(seed)
  return jax.jit(lambda: init_variables(model, (1, *images.shape[1:]), rng_init))()


def classifier_io(model, variables, images):
  """(input, output) of the last Dense or convolution the network calls: its classifier."""
  seen = []

  def record(next_fun, args, kwargs, context):
    out = next_fun(*args, **kwargs)
    if context.method_name == '__call__' and isinstance(context.module, (nn.Dense, nn.Conv)):
      seen.append((args[0], out))
    return out

  with nn.intercept_methods(record):
    logits = model.apply(variables, images, train=False)
  return seen[-1][0], seen[-1][1], logits


def mean_cosine(x) -> float:
  """Mean cosine similarity over all pairs of distinct rows of x (flattened per row)."""
  x = np.asarray(x, np.float64).reshape(len(x), -1)
  unit = x / np.linalg.norm(x, axis=1, keepdims=True)
  gram = unit @ unit.T
  n = len(x)
  return float((gram.sum() - np.trace(gram)) / (n * (n - 1)))


def similarity(name: str, image_size: int, images, seed: int = 0,
               centered: bool = False) -> dict:
  """`centered`: the images less their mean image (does centring the input help?)."""
  if centered:
    images = images - images.mean(0, keepdims=True)
  model = network(name)
  variables = initial_variables(model, images, seed)
  features, _, logits = jax.jit(lambda v, x: classifier_io(model, v, x))(variables, images)
  return {'network': name, 'image_size': image_size, 'centered': centered, 'seed': seed,
          'images': len(images),
          'features_shape': list(features.shape[1:]),
          'features_cosine': mean_cosine(features), 'logits_cosine': mean_cosine(logits)}


def dead_classes(image_size: int, images, seeds) -> list:
  """SqueezeNet's class units never positive on `images`, at each seed's initialisation."""
  model = network('squeezenet')
  # The classifier's pre-activation, its largest value over images and positions per class.
  peak = jax.jit(lambda v, x: jnp.max(classifier_io(model, v, x)[1], axis=(0, 1, 2)))
  out = []
  for seed in seeds:
    variables = initial_variables(model, images, seed)
    highest = np.asarray(peak(variables, images))
    out.append({'image_size': image_size, 'seed': seed, 'images': len(images),
                'dead': int(np.sum(highest <= 0)), 'classes': int(highest.size)})
  return out


def preset(data_dir: str = ''):
  """The published SqueezeNet on the digits with the shared preset of 2026-11-23, on one
  device: configs/squeezenet.py without its BatchNorm, 8 epochs."""
  c = config_lib.use_network(config_lib.use_dataset(config_lib.defaults(), 'digits'),
                             'squeezenet', 'digits')
  c.batch_norm, c.num_epochs = False, 8
  c.mesh.shape, c.mesh.axes = (1,), ('data',)
  c.dataset.data_dir = data_dir
  return c


def train(cfg) -> dict:
  """Trains `cfg` on one device for its epochs: {'steps', 'top1', 'classifier_dead'}."""
  from jaxpar import validation
  from jaxpar.evaluation import evaluate
  from jaxpar.mesh import make_mesh
  from jaxpar.step import make_eval_step
  validation.validate(cfg)
  source = sources.open_source(cfg.dataset, shard=(0, 1))
  mesh = make_mesh((1,), ('data',), jax.devices()[:1])
  steps = config_lib.run_steps(cfg, source.num_train_global)
  validation.validate_schedule(cfg, steps)
  model = build.model(cfg, source.num_classes, source.channels, mesh)
  method = build.strategy(cfg, mesh, model)
  tx, _ = build.optimizer(cfg, model, source.channels, method, cfg.global_batch, steps)
  rng_init, rng_dropout = build.seed_keys(cfg.seed)
  state = build.initial_state(cfg, model, tx, method, source.channels, mesh, rng_init)
  loop = build.loop(cfg, model, tx, mesh, method, source, state, steps, rng_dropout)
  for _ in range(steps):
    state, _ = loop(state)
  variables = jax.device_get(method.variables(state))
  top1 = evaluate(make_eval_step(model, mesh), variables, mesh, source, cfg)['top1']
  images = digits(cfg.image_size, DEAD_IMAGES, cfg.dataset.data_dir)
  scores = jax.jit(lambda v, x: classifier_io(model.clone(fc_axis=None), v, x)[1])(
      variables, images)
  dead = np.asarray(scores).max((0, 1, 2)) <= 0
  return {'steps': steps, 'top1': float(top1), 'classifier_dead': float(dead.mean())}


def measure_training(data_dir: str = '', settings=TRAINING) -> list:
  out = []
  for change, overrides in settings:
    cfg = preset(data_dir)
    cfg.update_from_flattened_dict(overrides)
    out.append({'change': change, 'overrides': overrides, **train(cfg)})
    print(f"{change}: {out[-1]}", file=sys.stderr)
  return out


def measure(data_dir: str = '', similarity_rows=SIMILARITY, dead_sizes=DEAD_SIZES,
            dead_seeds=DEAD_SEEDS, training=()) -> dict:
  rows = [similarity(name, size, digits(size, SIMILARITY_IMAGES, data_dir), centered=centered)
          for name, size, centered in similarity_rows]
  dead = [row for size in dead_sizes
          for row in dead_classes(size, digits(size, DEAD_IMAGES, data_dir), dead_seeds)]
  return {'tool': 'analysis.accuracy.collapse',
          'created': datetime.datetime.now().isoformat(timespec='seconds'),
          'command': ' '.join(['python -m analysis.accuracy.collapse'] + sys.argv[1:]),
          'machine': machine(), 'versions': versions(),
          'similarity': rows, 'dead_classes': dead,
          **({'training': measure_training(data_dir, training)} if training else {})}


_FEATURES = {'squeezenet': 'fire9', 'vgg16e': 'FC', 'googlenet': 'pool', 'resnet34': 'stage 4'}
_NAMES = {'squeezenet': 'SqueezeNet', 'vgg16e': 'VGG16E', 'googlenet': 'GoogLeNet',
          'resnet34': 'ResNet34'}


def similarity_table(result) -> str:
  lines = ['| network | last features | cosine at init | logits\' cosine |',
           '|---|---|---:|---:|']
  for r in result['similarity']:
    bn = (', eval-mode BN' if r['network'] == 'resnet34' else '') + (
        ", the digits' mean subtracted" if r.get('centered') else '')
    shape = '×'.join(map(str, r['features_shape']))
    lines.append(f"| {_NAMES[r['network']]} ({r['image_size']}²{bn}) | "
                 f"{_FEATURES[r['network']]}, {shape} | {r['features_cosine']:.3f} | "
                 f"{r['logits_cosine']:.3f} |")
  return '\n'.join(lines)


def dead_table(result) -> str:
  by_size = {}
  for r in result['dead_classes']:
    by_size.setdefault(r['image_size'], []).append(r)
  seeds = [r['seed'] for r in next(iter(by_size.values()))]
  classes = result['dead_classes'][0]['classes']
  lines = [f'| input | seeds {seeds[0]}–{seeds[-1]}: classes of {classes} dead at init |',
           '|---|---|']
  for size, rows in sorted(by_size.items()):
    lines.append(f"| {size}² | {', '.join(str(r['dead']) for r in rows)} |")
  return '\n'.join(lines)


def training_table(result) -> str:
  lines = ['| change to the preset | steps | classifier dead | top-1 |', '|---|---:|---:|---:|']
  for r in result['training']:
    lines.append(f"| {r['change']} | {r['steps']} | {100 * r['classifier_dead']:.0f} % | "
                 f"{100 * r['top1']:.1f} % |")
  return '\n'.join(lines)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  result = measure(FLAGS.data_dir, training=TRAINING if FLAGS.train else ())
  print(similarity_table(result) + '\n\n' + dead_table(result)
        + ('\n\n' + training_table(result) if FLAGS.train else ''))
  if FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  flags.DEFINE_string('out', '', 'Also write the results as JSON here.')
  flags.DEFINE_string('data_dir', '', "TFDS data_dir of the bundled digits (TFDS's default).")
  flags.DEFINE_bool('train', False, 'Also train the published SqueezeNet under each change of '
                    'the preset (part 3).')
  app.run(main)
