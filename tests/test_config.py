"""Bad config → one clear error naming the field, before anything compiles."""
import subprocess
import sys

import pytest

from jaxpar import config as config_lib
from jaxpar import validation
from runs import config_file


def _config(**overrides):
  c = config_lib.defaults()
  c.mesh.shape, c.mesh.axes = (2, 4), ('x', 'y')
  for key, value in overrides.items():
    parent = c
    *path, last = key.split('.')
    for part in path:
      parent = parent[part]
    parent[last] = value
  return c


def test_defaults_are_valid():
  c = _config()
  validation.validate(c)
  validation.validate_devices(c, 8, 1)


@pytest.mark.parametrize('overrides, field, hint', [
    ({'model': 'alexnet'}, 'config.model', 'resnet34'),
    ({'dataset.name': 'no_such_dataset'}, 'config.dataset.name', 'sklearn_digits'),
    ({'dataset.name': 'image_folder', 'dataset.path': '/no/such/dir'}, 'config.dataset.path',
     'sub-folder per class'),
    ({'dtype': 'float8'}, 'config.dtype', 'bfloat16'),
    ({'dataset.eval_cache_mb': -1}, 'config.dataset.eval_cache_mb', '0: read the split again'),
    ({'host_memory': 'pool'}, 'config.host_memory', "'keep', 'mapped', 'system'"),
    ({'scheme': 'hogwild'}, 'config.scheme', "'async'"),
    ({'scheme': 'async'}, 'config.server', "'central' or 'distributed'"),
    ({'scheme': 'async', 'server': 'distributed', 'placement': 'even'}, 'config.placement',
     "placement='greedy', or leave it 'auto'"),
    ({'scheme': 'async', 'server': 'central', 'central_schedule': 'parallel'},
     'config.central_schedule', "leave it 'serial'"),
    ({'scheme': 'async', 'server': 'central', 'grad_reduce_dtype': 'bfloat16'},
     'config.grad_reduce_dtype', "scheme='async'"),
    ({'scheme': 'async', 'server': 'central', 'bn_group_size': 4}, 'config.bn_group_size',
     "scheme='async'"),
    ({'scheme': 'async', 'server': 'central', 'distributed.num_processes': 2,
      'distributed.coordinator': 'localhost:1234'}, 'config.distributed.num_processes',
     "async_sgd.backend='ray'"),
    ({'scheme': 'async', 'server': 'central', 'async_sgd.backend': 'mpi'},
     'config.async_sgd.backend', "'ray'"),
    ({'scheme': 'async', 'server': 'central', 'async_sgd.max_staleness': 3},
     'config.async_sgd.max_staleness', 'at least 7'),
    ({'scheme': 'async', 'server': 'central', 'async_sgd.lr_staleness': 'sqrt'},
     'config.async_sgd.lr_staleness', "'inverse'"),
    ({'scheme': 'async', 'server': 'central', 'async_sgd.restart_workers': 2},
     'config.async_sgd.restart_workers', "backend='ray'"),
    ({'scheme': 'async', 'server': 'central', 'async_sgd.backend': 'ray',
      'async_sgd.restart_workers': -1}, 'config.async_sgd.restart_workers', '0 or more'),
    ({'scheme': 'async', 'server': 'central', 'async_sgd.cpus_per_worker': 4},
     'config.async_sgd.cpus_per_worker', "backend='ray'"),
    ({'scheme': 'async', 'server': 'central', 'async_sgd.backend': 'ray',
      'async_sgd.cpus_per_worker': -2}, 'config.async_sgd.cpus_per_worker', '0 or more'),
    ({'central_schedule': 'parallel'}, 'config.central_schedule', "server='central'"),
    ({'grad_fusion': 'bucketed'}, 'config.grad_fusion', "'one_buffer'"),
    ({'grad_fusion': 'one_buffer', 'grad_reduce': 'ring'}, 'config.grad_fusion',
     "leave 'auto'"),
    ({'grad_fusion': 'per_tensor', 'sync_every': 4}, 'config.grad_fusion',
     'Local SGD (sync_every) its averages'),
    ({'server': 'gossip', 'sparsify.capacity': 0.1, 'grad_fusion': 'one_buffer'},
     'config.grad_fusion', "sparsified gossip per tensor"),
    ({'sync_every': -1}, 'config.sync_every', '0 or a positive'),
    ({'local_sgd_warmup': 5}, 'config.local_sgd_warmup', 'set sync_every'),
    ({'sync_every': 4, 'server': 'central'}, 'config.sync_every', "server='allreduce'"),
    ({'sync_every': 4, 'bn_group_size': 1, 'grad_reduce': 'ring'}, 'config.grad_reduce',
     'does not all-reduce'),
    ({'sync_every': 4, 'bn_group_size': 8}, 'config.bn_group_size', 'set bn_group_size=1'),
    ({'local_sgd_group_size': 4}, 'config.local_sgd_group_size', 'set sync_every'),
    ({'sync_every': 4, 'local_sgd_group_size': 2}, 'config.local_sgd_group_size',
     'one of [1, 4, 8]'),
    ({'sync_every': 4, 'local_sgd_group_size': 4, 'bn_group_size': 8}, 'config.bn_group_size',
     'a divisor of 4'),
    ({'server': 'gossip', 'sync_every': 4, 'local_sgd_group_size': 4},
     'config.local_sgd_group_size', 'leave it 1'),
    ({'server': 'gossip', 'bn_group_size': 0}, 'config.bn_group_size',
     'gossip trains one replica'),
    ({'scheme': 'async', 'server': 'gossip'}, 'config.server', "'central' or 'distributed'"),
    ({'sparsify.capacity': 0.1}, 'config.sparsify.capacity', "server='gossip'"),
    ({'gossip_mix': 'weights'}, 'config.gossip_mix', "'parameters'"),
    ({'gossip_mix': 'parameters'}, 'config.gossip_mix', "server='gossip'"),
    ({'server': 'gossip', 'bn_group_size': 1, 'sparsify.capacity': 0.1,
      'gossip_mix': 'parameters'}, 'config.gossip_mix', 'sparsified gossip sends gradient'),
    ({'fc_parallel': 'pipeline'}, 'config.fc_parallel', "'auto'"),
    ({'fc_parallel': 'model'}, 'config.fc_parallel', "axes=('data', 'model')"),
    ({'fc_parallel': 'auto', 'mesh.axes': ('data', 'model'), 'model': 'squeezenet'},
     'config.fc_parallel', 'no FC layer'),
    ({'fc_parallel': 'auto', 'mesh.axes': ('data', 'model'), 'server': 'central'},
     'config.fc_parallel', 'synchronous all-reduce'),
    ({'server': 'gossip', 'bn_group_size': 1, 'sparsify.capacity': 1.5},
     'config.sparsify.capacity', '(0, 1]'),
    ({'sparsify.threshold': 0.5}, 'config.sparsify.threshold', 'set sparsify.capacity'),
    ({'sparsify.error_feedback': False}, 'config.sparsify.error_feedback',
     'set sparsify.capacity'),
    ({'server': 'gossip', 'bn_group_size': 1, 'sparsify.capacity': 0.1,
      'sparsify.threshold': -1.0}, 'config.sparsify.threshold', '>= 0'),
    ({'server': 'gossip', 'bn_group_size': 1, 'grad_reduce_dtype': 'bfloat16'},
     'config.grad_reduce_dtype', 'does not all-reduce'),
    ({'server': 'central', 'central_schedule': 'round_robin'}, 'config.central_schedule',
     "'parallel'"),
    ({'server': 'central', 'grad_reduce': 'torus2d'}, 'config.grad_reduce',
     'leave grad_reduce=psum'),
    ({'total_steps': -5}, 'config.total_steps', 'positive'),
    ({'total_steps': 0, 'num_epochs': 0.0}, 'config.num_epochs', '> 0'),
    ({'global_batch': 0}, 'config.global_batch', 'positive'),
    ({'scheme': 'sync-join', 'per_device_batch': -1}, 'config.per_device_batch', 'positive'),
    ({'mesh.axes': ('x',)}, 'config.mesh.axes', '2 distinct names'),
    ({'augment.kind': 'mixup'}, 'config.augment.kind', 'pad_crop'),
    ({'shortcut': 'identity'}, 'config.shortcut', 'zero_pad'),
    ({'model': 'vgg16e', 'image_size': 16}, 'config.image_size', 'at least 32'),
    ({'distributed.num_processes': 2}, 'config.distributed.coordinator', 'host:port'),
    ({'distributed.process_id': 3}, 'config.distributed.process_id', 'expected 0..0'),
    ({'distributed.num_processes': 3, 'distributed.coordinator': 'localhost:1234'},
     'config.distributed.num_processes', 'split evenly'),
    ({'distributed.cluster': 'pbs'}, 'config.distributed.cluster', "'slurm'"),
    ({'distributed.cluster': 'slurm', 'distributed.coordinator': 'localhost:1234'},
     'config.distributed.cluster', 'explicit distributed.coordinator'),
    ({'distributed.heartbeat_timeout': 0}, 'config.distributed.heartbeat_timeout', 'positive'),
    ({'distributed.initialization_timeout': -5}, 'config.distributed.initialization_timeout',
     'positive'),
    ({'server': 'central-ish'}, 'config.server', "'distributed'"),
    ({'server': 'distributed', 'placement': 'random'}, 'config.placement', "'greedy'"),
    ({'placement': 'greedy'}, 'config.placement', "server='distributed'"),
    ({'server': 'distributed', 'grad_reduce': 'ring'}, 'config.grad_reduce',
     'leave grad_reduce=psum'),
    ({'grad_reduce': 'tree'}, 'config.grad_reduce', "'torus2d'"),
    ({'grad_reduce': 'torus2d', 'mesh.shape': (8,), 'mesh.axes': ('d',)}, 'config.grad_reduce',
     'two mesh axes'),
    ({'grad_reduce_dtype': 'float16'}, 'config.grad_reduce_dtype', 'bfloat16'),
    ({'bn_group_size': 3}, 'config.bn_group_size', '[1, 2, 4, 8]'),
    ({'bn_group_size': -1}, 'config.bn_group_size', '[1, 2, 4, 8]'),
    ({'bn_group_size': 2, 'grad_reduce': 'torus2d'}, 'config.bn_group_size',
     "splits mesh axis 'y'"),
    ({'bn_group_size': 2, 'fc_parallel': 'model', 'mesh.axes': ('data', 'model')},
     'config.bn_group_size', "split the 'model' axis"),
    ({'model': 'vgg16e', 'bn_group_size': 4}, 'config.bn_group_size', 'config.batch_norm=True'),
    ({'optimizer.name': 'rmsprop'}, 'config.optimizer.name', "'adamw'"),
    ({'loss_scaling': 'static'}, 'config.loss_scaling', "'dynamic'"),
    ({'scheme': 'async', 'server': 'central', 'dtype': 'float16'}, 'config.dtype',
     "use 'bfloat16' or 'float32'"),
    ({'scheme': 'async', 'server': 'central', 'loss_scaling': 'dynamic'},
     'config.loss_scaling', "leave it 'auto'"),
    ({'optimizer.lr_scaling': 'cubic'}, 'config.optimizer.lr_scaling', "'sqrt'"),
    ({'optimizer.name': 'adam', 'optimizer.b2': 1.0}, 'config.optimizer.b2', '[0, 1)'),
    ({'optimizer.eps': 0.0}, 'config.optimizer.eps', '> 0'),
    ({'grad_accum_steps': 0}, 'config.grad_accum_steps', 'positive'),
    ({'scheme': 'sync-join', 'per_device_batch': 6, 'grad_accum_steps': 4},
     'config.grad_accum_steps', 'divisor of it'),
    ({'optimizer.schedule': 'step'}, 'config.optimizer.schedule', 'poly'),
    ({'optimizer.trust_coefficient': 0.0}, 'config.optimizer.trust_coefficient', '> 0'),
    ({'dataset.name': 'synthetic', 'dataset.synthetic.classes': 1},
     'config.dataset.synthetic.classes', 'at least 2'),
    ({'dataset.name': 'synthetic', 'dataset.synthetic.channels': 4},
     'config.dataset.synthetic.channels', '1 or 3'),
    ({'dataset.name': 'synthetic', 'dataset.synthetic.train_examples': 0},
     'config.dataset.synthetic.train_examples', 'positive'),
    ({'dataset.name': 'mnist_typo'}, 'config.dataset.name', "'synthetic' (random images)"),
])
def test_static_errors_name_the_field(overrides, field, hint):
  with pytest.raises(config_lib.ConfigError) as e:
    validation.validate(_config(**overrides))
  message = str(e.value)
  assert message.startswith(field + '=') and hint in message and '\n' not in message


def test_every_config_field_the_package_names_in_a_message_exists():
  """Each `config.a.b` in the package's strings (its messages, logs and docstrings) is a field
  of `defaults()`, or a function of jaxpar.config: a fix that names a field nobody can set
  is no fix (the plan's advice once named config.optimizer.learning_rate; it is base_lr)."""
  import ast
  import pathlib
  import re

  fields = config_lib.defaults()

  def exists(path: str) -> bool:
    node = fields
    for part in path.split('.'):
      if not hasattr(node, 'keys') or part not in node.keys():
        return False
      node = node[part]
    return True

  named = re.compile(r'(?<![\w.])config\.([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)')
  package = pathlib.Path(config_lib.__file__).parent
  found, missing = 0, []
  for path in sorted(package.rglob('*.py')):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Constant) and isinstance(node.value, str):
        for match in named.finditer(node.value):
          found += 1
          field = match.group(1)
          if not exists(field) and not hasattr(config_lib, field.split('.')[0]) \
              and field != 'py':  # config.py, the file
            missing.append(f'{path.relative_to(package.parent)}:{node.lineno}: config.{field}')
  assert found > 50 and not missing, missing


@pytest.mark.parametrize('overrides, chosen', [
    ({}, {'placement': 'even', 'bn_group_size': 0, 'optimizer.lr_scaling': 'linear'}),
    ({'scheme': 'async', 'server': 'distributed'}, {'placement': 'greedy', 'bn_group_size': 0}),
    ({'scheme': 'async', 'server': 'central'}, {'placement': 'even'}),
    ({'server': 'distributed'}, {'placement': 'even'}),
    ({'sync_every': 4}, {'bn_group_size': 1}),
    ({'sync_every': 4, 'local_sgd_group_size': 4}, {'bn_group_size': 4}),
    ({'server': 'gossip'}, {'bn_group_size': 1}),
    ({'server': 'gossip', 'model': 'vgg16e'}, {'bn_group_size': 0}),  # no BatchNorm
    ({'optimizer.name': 'adam'}, {'optimizer.lr_scaling': 'none'}),
    ({'optimizer.name': 'lars'}, {'optimizer.lr_scaling': 'linear'}),
    ({'dtype': 'float16'}, {'loss_scaling': 'dynamic'}),
    ({'dtype': 'bfloat16'}, {'loss_scaling': 'none'}),
    ({}, {'eval_batch': 256}),
    ({'mesh.shape': (3,), 'mesh.axes': ('data',)}, {'eval_batch': 258}),  # 3 thesis workers
    ({'mesh.shape': (2, 5)}, {'eval_batch': 260}),
    ({'mesh.shape': (3,), 'mesh.axes': ('data',), 'scheme': 'async', 'server': 'central',
      'async_sgd.backend': 'ray'}, {'eval_batch': 256}),  # the driver's one device evaluates
])
def test_method_defaults_adapt_to_the_method_and_are_logged(overrides, chosen, caplog):
  """A field left auto takes what the method needs (named in one log line); a value the
  user set stays (and is checked: test_static_errors_name_the_field)."""
  c = _config(**overrides)
  with caplog.at_level('INFO'):
    validation.validate(c)
  for field, value in chosen.items():
    assert validation._get(c, field) == value, field
  lines = [r.getMessage() for r in caplog.records if 'Defaults for this method' in r.getMessage()]
  assert len(lines) == 1 and 'optimizer.lr_scaling' in lines[0]
  validation.validate(c)  # settled: valid as it stands, nothing left to choose
  assert validation._get(c, 'optimizer.lr_scaling') == chosen.get('optimizer.lr_scaling',
                                                                  c.optimizer.lr_scaling)


def test_an_explicit_value_is_kept():
  c = _config(**{'scheme': 'sync-join', 'server': 'distributed', 'placement': 'greedy',
                 'optimizer.name': 'adam', 'optimizer.lr_scaling': 'sqrt'})
  validation.validate(c)
  assert c.placement == 'greedy' and c.optimizer.lr_scaling == 'sqrt'
  # The evaluation's batch: unset, rounded up to the mesh (logged); set, checked against it.
  three = _config(**{'mesh.shape': (3,), 'mesh.axes': ('data',), 'scheme': 'sync-join'})
  validation.validate(three)
  validation.validate_devices(three, 3, 1)
  assert three.eval_batch == 258
  listed = _config(**{'mesh.axes': ('data',), 'scheme': 'sync-join'})
  listed.mesh.shape = [3]  # a config file's list, which the mesh reads as a tuple
  validation.validate(listed)
  assert listed.eval_batch == 258
  three = _config(**{'mesh.shape': (3,), 'mesh.axes': ('data',), 'scheme': 'sync-join',
                     'eval_batch': 256})
  validation.validate(three)
  with pytest.raises(config_lib.ConfigError,
                     match=r'^config.eval_batch=256 is invalid: use a multiple of the 3 data'):
    validation.validate_devices(three, 3, 1)
  gossip = _config(**{'server': 'gossip', 'grad_fusion': 'one_buffer'})
  validation.validate(gossip)  # gossip's permutes, like psum, can send one buffer
  assert gossip.grad_fusion == 'one_buffer'


def test_an_image_folder_without_classes_or_images_is_one_line(tmp_path):
  c = _config(**{'dataset.name': 'image_folder', 'dataset.path': str(tmp_path)})
  with pytest.raises(config_lib.ConfigError, match=r'^config.dataset.path=.*no sub-folder$'):
    validation.validate(c)
  (tmp_path / 'cat').mkdir()
  (tmp_path / 'cat' / 'notes.txt').write_text('not an image')
  with pytest.raises(config_lib.ConfigError, match=r'none of its 1 class folders holds an image'):
    validation.validate(c)
  (tmp_path / 'cat' / 'a.JPG').write_bytes(b'')
  validation.validate(c)


def test_mesh_must_match_the_device_count():
  with pytest.raises(config_lib.ConfigError, match=r'config.mesh.shape=\(2, 4\).*JAX sees 4'):
    validation.validate_devices(_config(), 4, 1)


def test_global_batch_must_divide_among_the_data_devices():
  with pytest.raises(config_lib.ConfigError, match=r'config.global_batch=100 .*multiple of 8'):
    validation.validate_devices(_config(global_batch=100), 8, 1)
  # sync-join never splits a batch: per_device_batch=3 is fine on 8 devices.
  validation.validate_devices(_config(scheme='sync-join', per_device_batch=3), 8, 1)


def test_accumulation_needs_equal_micro_batches_on_every_device():
  with pytest.raises(config_lib.ConfigError, match=r'config.grad_accum_steps=3 .*divisor of 16'):
    validation.validate_devices(_config(global_batch=128, grad_accum_steps=3), 8, 1)
  validation.validate_devices(_config(global_batch=128, grad_accum_steps=4), 8, 1)


def test_sync_join_consumes_n_times_the_per_device_batch():
  assert config_lib.global_batch(_config(scheme='sync-join', per_device_batch=3)) == 24
  assert config_lib.global_batch(_config(scheme='sync-split', global_batch=24)) == 24


def test_async_consumes_one_workers_batch_per_step():
  c = _config(scheme='async', server='central', per_device_batch=5)
  validation.validate(c)
  assert config_lib.global_batch(c) == 5


def _thesis(arg):
  return config_file('thesis', arg)


@pytest.mark.parametrize('net', ['vgg16e', 'googlenet', 'squeezenet', 'resnet34'])
@pytest.mark.parametrize('scheme', ['sync-join', 'sync-split', 'async'])
@pytest.mark.parametrize('server', ['central', 'distributed'])
def test_every_cell_of_the_thesis_grid_is_a_valid_config(net, scheme, server):
  for workers, iterations in ((1, 128), (4, 128 if scheme != 'sync-join' else 32),
                              (8, 128 if scheme != 'sync-join' else 16)):
    c = _thesis(f'net={net},scheme={scheme},server={server},workers={workers}')
    validation.validate(c)
    validation.validate_devices(c, workers, 1)
    validation.validate_schedule(c, c.total_steps)  # the warm-up fits the shortest cell
    assert c.total_steps == iterations
    # D = 128 batches of d = 32, whatever the scheme and N.
    assert c.total_steps * config_lib.global_batch(c) == 128 * 32


@pytest.mark.parametrize('arg, hint', [
    ('net=squeezenet,workers=0', 'workers=\'0\' is invalid'),
    ('netz=squeezenet', "with keys \\['net'"),
    ('data=imagenet', 'digits or caltech256'),
])
def test_thesis_config_arguments_are_checked(arg, hint):
  with pytest.raises(config_lib.ConfigError, match=hint):
    _thesis(arg)


def test_thesis_config_rejects_a_bad_cell_by_field():
  with pytest.raises(config_lib.ConfigError, match='config.central_schedule'):
    validation.validate(_thesis('server=distributed,schedule=parallel'))


def test_warmup_must_fit_in_the_run():
  with pytest.raises(config_lib.ConfigError,
                     match='config.optimizer.warmup_steps=50 .* at most 39'):
    validation.validate_schedule(_config(), 40)


@pytest.mark.parametrize('total_steps, synchronous, said', [
    (30, 0, 'config.sync_every=50: the run ends after 30 steps, before the first average (at '
            'step 50): each replica trains alone after step 0'),
    (60, 20, 'a period of at most 40 averages them within the run'),
    (20, 20, 'config.local_sgd_warmup=20: all 20 steps of the run are synchronous'),
    (70, 20, None), (50, 0, None)])
def test_a_local_sgd_period_the_run_ends_before_is_said(total_steps, synchronous, said, caplog):
  """SparkNet's τ = 50 in a run of 30 steps never averages its replicas: said, not refused
  (the evaluation reads their mean)."""
  c = _config(sync_every=50, local_sgd_warmup=synchronous)
  c.optimizer.warmup_steps = 0
  with caplog.at_level('WARNING'):
    validation.validate_schedule(c, total_steps)
  lines = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert (len(lines) == 1 and said in lines[0]) if said else not lines


@pytest.mark.parametrize('scheme, train_examples, said', [
    ('sync-split', 64, ''), ('sync-split', 63, 'config.global_batch=64) from a train split of 63'),
    ('sync-join', 15, 'A batch of 16 examples (config.per_device_batch=2) from a train split of '
                      '15'),
    ('async', 1, 'config.per_device_batch=2) from a train split of 1'), ('async', 2, '')])
def test_a_batch_larger_than_the_train_split_is_said(scheme, train_examples, said, caplog):
  """A small image folder under a preset's batch: every batch repeats examples."""
  c = _config(scheme=scheme, global_batch=64, per_device_batch=2)
  with caplog.at_level('WARNING'):
    validation.say_batch_over_split(c, train_examples)
  lines = [r.getMessage() for r in caplog.records if r.levelname == 'WARNING']
  assert (len(lines) == 1 and said in lines[0]) if said else not lines


@pytest.mark.parametrize('total_steps, warmup', [(40, 10), (50, 12), (3, 0), (51, 50)])
def test_a_recipes_warmup_too_long_for_the_run_becomes_a_quarter_of_it(total_steps, warmup):
  """Not asked for (the config's own 50 steps), a warm-up that does not fit the run is cut
  to a quarter of it; one that fits stays."""
  c = _config()
  validation.validate_schedule(c, total_steps, warmup_from_recipe=True)
  assert c.optimizer.warmup_steps == warmup


@pytest.mark.parametrize('flag, error', [
    ('--config.model=alexnet', "jaxpar: config.model='alexnet' is invalid: choose one of "
                               "['googlenet', 'resnet34', 'squeezenet', 'vgg16e']"),
    ('--config.no_such_key=3', "jaxpar: unknown config key \"'no_such_key'\"; the valid keys "
                               "are in jaxpar/config.py defaults()"),
    ('--config=configs/resnet34_2d.py:mnist', "jaxpar: config file argument 'mnist' is invalid: "
     "choose one of ['digits', 'cifar10', 'imagenet2012', 'caltech256']"),
    # Asked for on the command line, a warm-up as long as the run is refused (the recipe's
    # own is shortened: tests/test_train.py).
    ('--config.total_steps=20 --config.optimizer.warmup_steps=20',
     'jaxpar: config.optimizer.warmup_steps=20 is invalid: must be below the run length of 20 '
     'steps: set it to at most 19'),
])
def test_cli_prints_one_line_and_exits_nonzero(tmp_path, flag, error):
  proc = subprocess.run(
      [sys.executable, '-m', 'jaxpar.train', '--config', 'configs/resnet34_2d.py', *flag.split(),
       f'--workdir={tmp_path}'],
      capture_output=True, text=True, timeout=300,
      cwd=__file__.rsplit('/tests/', 1)[0])
  assert proc.returncode == 2
  assert 'Traceback' not in proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith('jaxpar:')]
  assert errors == [error]


@pytest.mark.parametrize('name', ['resnet34_2d', 'vgg16e', 'googlenet', 'squeezenet'])
@pytest.mark.parametrize('arg', ['digits', 'cifar10', 'imagenet2012'])
def test_config_files_are_valid(name, arg):
  c = config_file(name, arg)
  assert c.model == name.split('_')[0]
  validation.validate(c)
  validation.validate_devices(c, config_lib.num_devices(c), 1)


@pytest.mark.parametrize('arg, devices, every', [('post_local', 8, 4), ('sparknet', 5, 50),
                                                 ('gossip_sparse', 8, 16)])
def test_local_sgd_configs_are_valid(arg, devices, every):
  c = config_file('local_sgd', arg)
  validation.validate(c)
  validation.validate_devices(c, devices, 1)
  assert c.sync_every == every


def test_unknown_config_argument():
  with pytest.raises(config_lib.ConfigError, match="'mnist' is invalid: choose one of"):
    config_lib.use_dataset(config_lib.defaults(), 'mnist')


def test_async_refuses_a_cluster_of_several_processes():
  """A cluster's environment may bring several processes that the config did not name."""
  c = _config(scheme='async', server='central')
  validation.validate_devices(c, 8, 1)
  with pytest.raises(config_lib.ConfigError, match=r"config.scheme='async' .*2 processes"):
    validation.validate_devices(c, 8, 2)


def test_async_on_ray_runs_its_driver_on_one_device():
  """The workers are Ray's actors: this process needs one device, whatever the mesh."""
  c = _config(scheme='async', server='central', **{'async_sgd.backend': 'ray'})
  validation.validate(c)
  assert config_lib.driver_devices(c) == 1 and config_lib.num_devices(c) == 8
  validation.validate_devices(c, 1, 1)
  validation.validate_devices(c, 8, 1)  # one process: the driver's mesh is the first device


def test_an_unusable_workdir_is_one_line_before_anything_compiles(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  proc = subprocess.run(
      [sys.executable, '-m', 'jaxpar.train', '--config', 'configs/resnet34_2d.py',
       f'--workdir={blocker}/run'], capture_output=True, text=True, timeout=300,
      cwd=__file__.rsplit('/tests/', 1)[0])
  assert proc.returncode == 2 and 'Traceback' not in proc.stderr
  errors = [line for line in proc.stderr.splitlines() if line.startswith('jaxpar:')]
  assert errors == [f"jaxpar: --workdir='{blocker}/run' cannot be created (Not a directory): "
                    f"choose a folder you can write to"]


@pytest.mark.parametrize('download', [True, False])
def test_an_unprepared_dataset_offline_is_one_line_in_seconds(tmp_path, monkeypatch, download):
  """No download is tried where the internet cannot be reached (or downloads are off): the
  line says how to prepare the data elsewhere."""
  import time

  from jaxpar.data import sources
  monkeypatch.setattr(sources, '_online', lambda: False)
  c = config_lib.defaults().dataset
  c.name, c.data_dir, c.download = 'cifar10', str(tmp_path), download
  started = time.perf_counter()
  with pytest.raises(config_lib.ConfigError) as e:
    sources.open_source(c)
  assert time.perf_counter() - started < 10
  message = str(e.value)
  assert message.startswith("config.dataset.name='cifar10' is not prepared in ")
  assert '`tfds build cifar10 --data_dir DIR`' in message and '\n' not in message
  assert ('config.dataset.download=False' in message) != download


@pytest.mark.parametrize('overrides, words', [
    ({}, 'all-reduces gradients (psum, tensors under 64 KiB in one buffer) in float32'),
    ({'grad_fusion': 'per_tensor'}, 'all-reduces gradients (psum) in float32'),
    ({'grad_fusion': 'one_buffer', 'grad_reduce_dtype': 'bfloat16'},
     'all-reduces gradients (psum, one buffer) in bfloat16'),
    ({'scheme': 'sync-join', 'server': 'central'}, 'gradients to the central server'),
    ({'server': 'distributed'}, 'reduce-scatters gradients in float32'),
    ({'server': 'gossip'}, 'mixes gradients with two ring neighbours'),
    ({'server': 'gossip', 'gossip_mix': 'parameters', 'sync_every': 4},
     'mixes parameters with two ring neighbours, exchanging every 4 steps after 0'),
    ({'server': 'gossip', 'sparsify.capacity': 0.25, 'sparsify.threshold': 0.001},
     'mixes sparsified gradients (|g| > 0.001, at most 25% of each tensor, error feedback)'),
    ({'sync_every': 4}, 'averages the replicas every 4 steps after 0 synchronous'),
    ({'scheme': 'async', 'server': 'central'}, '8 workers push gradients to the central server'),
    ({'fc_parallel': 'auto', 'mesh.axes': ('data', 'model'), 'model': 'vgg16e'},
     "split over 'model'"),
])
def test_each_method_says_what_it_exchanges(overrides, words):
  """The run's log line reads the strategy's own description (no per-method branch in
  train.py); it names what the chosen method sends."""
  import jax

  from jaxpar import build
  from jaxpar.mesh import make_mesh
  c = _config(**overrides)
  validation.validate(c)
  mesh = make_mesh(c.mesh.shape, c.mesh.axes, devices=jax.devices()[:8])
  described = build.strategy(c, mesh, build.model(c, 10, 3, mesh)).describe()
  assert words in described, described


@pytest.mark.parametrize('overrides, fix', [
    ({'server': 'gossip'}, 'gossip_mix=parameters'),
    ({'server': 'gossip', 'sparsify.capacity': 0.25}, 'server=allreduce'),
    ({'server': 'gossip', 'gossip_mix': 'parameters'}, None),
])
def test_two_device_gradient_gossip_warns_with_the_method_s_own_fix(overrides, fix, caplog):
  """On 2 devices gradient gossip's replicas climb apart (docs/accuracy.md): the strategy
  warns once, naming a fix its method accepts (sparsified gossip cannot mix parameters)."""
  import jax

  from jaxpar import build
  from jaxpar.mesh import make_mesh
  c = _config(**overrides)
  c.mesh.shape, c.mesh.axes = (2,), ('data',)
  validation.validate(c)
  mesh = make_mesh((2,), ('data',), devices=jax.devices()[:2])
  with caplog.at_level('WARNING'):
    build.strategy(c, mesh, build.model(c, 10, 3, mesh))
  warned = [r.getMessage() for r in caplog.records if 'climb apart' in r.getMessage()]
  if fix is None:
    assert not warned
  else:
    assert len(warned) == 1 and fix in warned[0], warned
    assert ('gossip_mix' in warned[0]) == (fix == 'gossip_mix=parameters')


def test_a_tfds_dataset_without_tensorflow_is_one_line_naming_the_fix(monkeypatch):
  """Where TensorFlow Datasets does not import (a GPU image with JAX and PyTorch only), a
  dataset read through it is refused in one line saying so, not called 'not a TFDS
  dataset'; 'synthetic' needs none."""
  monkeypatch.setitem(sys.modules, 'tensorflow_datasets', None)  # `import` now fails
  with pytest.raises(config_lib.ConfigError) as e:
    validation.validate(_config())
  message = str(e.value)
  assert message.startswith("config.dataset.name='sklearn_digits' is invalid: reading it needs "
                            'TensorFlow Datasets, which does not import here (')
  assert "'synthetic'" in message and 'pip install -e .' in message and '\n' not in message
  validation.validate(_config(**{'dataset.name': 'synthetic'}))


def test_the_run_length_is_total_steps_or_the_epochs_at_the_global_batch():
  """By hand: 8 epochs of the digits' 1,437 training images at 64 a step are 179.6 steps, so
  180; sync-join's global batch is N × the device batch; `total_steps` wins."""
  c = config_lib.with_overrides(config_lib.defaults(), {
      'scheme': 'sync-split', 'global_batch': 64, 'num_epochs': 8.0})
  assert config_lib.run_steps(c, 1437) == 180
  join = config_lib.with_overrides(c, {'scheme': 'sync-join', 'mesh.shape': (4,),
                                       'mesh.axes': ('data',), 'per_device_batch': 32})
  assert config_lib.run_steps(join, 1437) == 90  # 11,496 / 128 = 89.8
  assert config_lib.run_steps(config_lib.with_overrides(c, {'total_steps': 50}), 1437) == 50
  assert c.global_batch == 64 and config_lib.defaults().global_batch == 128  # a copy
