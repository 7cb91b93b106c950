"""The input benchmarks: input and train step for one config on a generated JPEG folder, and
the ImageNet stream's images/s on k cores beside the GPU steps' appetite."""
import os

import pytest

from jaxpar import config as config_lib
from jaxpar.data import dali
from analysis.benchmarks import input_bench, input_rate


def test_input_bench_on_generated_jpegs(tmp_path, monkeypatch):
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))  # the decode check's cache
  input_bench.write_jpeg_folder(str(tmp_path / 'jpegs'), 24, size=64, classes=3)
  assert sorted(os.listdir(tmp_path / 'jpegs')) == ['class_0', 'class_1', 'class_2']
  c = config_lib.use_dataset(config_lib.defaults(), 'caltech256')
  c.dataset.path = str(tmp_path / 'jpegs')
  c.model, c.image_size, c.global_batch, c.eval_batch = 'squeezenet', 32, 8, 8
  c.optimizer.warmup_steps = 1
  result = input_bench.measure(c, batches=3, steps=1)
  assert result['dataset'] == 'image_folder' and result['augment'] == 'inception_crop'
  assert result['input_images_per_s'] > 0 and result['step_images_per_s'] > 0


@pytest.mark.parametrize('which', ['tf', pytest.param('dali', marks=pytest.mark.skipif(
    not dali.available(), reason="NVIDIA DALI is not installed (pip install -e '.[dali]')"))])
def test_input_rate_writes_imagenet_shapes_and_times_the_stream_on_k_cores(tmp_path,
                                                                          monkeypatch, which):
  monkeypatch.setenv('HOME', str(tmp_path / 'home'))
  images = input_rate.write_images(str(tmp_path / 'jpegs'), 10, classes=2)
  assert images['count'] == 10 and images['mean_bytes'] > 0
  assert images['mean_pixels'] == sum(h * w for h, w in input_rate.SHAPES) / 5
  rates = input_rate.measure(str(tmp_path / 'jpegs'), rounds=1, batches=1, max_cores=1,
                             which=which)
  assert list(rates) == [1] and rates[1]['median'] > 0 and len(rates[1]['samples']) == 1


def test_the_input_rate_tables_on_hand_made_rates():
  result = {'rates': {'1': {'median': 500.0, 'interval': [480.0, 520.0]},
                      '2': {'median': 800.0, 'interval': [700.0, 900.0]}}}
  lines = input_rate.table(result).splitlines()
  assert lines[2] == '| 1 | 500 [480–520] | 500 | 1.00× |'
  assert lines[3] == '| 2 | 800 [700–900] | 400 | 1.60× |'
  gpu = {'device_kind': 'NVIDIA H200', 'network': 'resnet34', 'dtype': 'bfloat16',
         'global_batch': 64, 'created': '2026-11-29T10:00:00',
         'steps': [{'step': 'jaxpar shard_map', 'images_per_s': 6000.0}]}
  lines = input_rate.cores_needed(result, [gpu]).splitlines()
  assert 'at 400 images/s a core' in lines[0]
  assert lines[2] == '| H200 | resnet34 | bfloat16 | 64 | 6,000 | 15 | 2026-11-29 |'


def test_the_hosts_table_puts_each_host_and_pipeline_on_a_line():
  machine = {'cpu': 'Intel(R) Xeon(R) Processor', 'cores': 16, 'accelerators': ['NVIDIA H200']}
  rates = {'1': {'median': 180.0, 'interval': [176.0, 182.0]},
           '8': {'median': 1320.0, 'interval': [1073.0, 1343.0]},
           '16': {'median': 1181.0, 'interval': [1100.0, 1444.0]}}
  torch_run = {'created': '2026-12-04T17:00:35', 'machine': machine,
               'pipeline': {'kind': 'torch'}, 'rates': rates, 'images': {'writer': 'Pillow'}}
  old = {'created': '2026-12-02T16:09:43', 'machine': {'cpu': 'AMD EPYC', 'cores': 2},
         'pipeline': {'augment': 'inception_crop'},  # before `kind`: jaxpar's stream
         'rates': {'1': {'median': 514.0, 'interval': [456.0, 553.0]}}}
  lines = input_rate.hosts_table([torch_run, old]).splitlines()
  assert lines[2] == ("| 2026-12-02 | AMD EPYC, 2 cores | jaxpar's tf.data stream | TensorFlow "
                      '| 514 [456–553] | 514 [456–553] | 1 | 514 |')
  assert lines[3] == ("| 2026-12-04 | Intel Xeon, 16 cores (H200 host) | PyTorch's ImageNet loader "
                      '| Pillow | 180 [176–182] | 1,320 [1,073–1,343] | 8 | 165 |')


def test_input_rate_refuses_bad_core_counts_in_one_line(capsys):
  import pytest
  for bad in ('1,x', f'1,{len(os.sched_getaffinity(0)) + 1}'):
    with pytest.raises(SystemExit):
      input_rate.main(['--core_counts', bad])
    assert '--core_counts' in capsys.readouterr().err
  # nvJPEG reads on one core: other counts contradict it, refused before anything runs.
  with pytest.raises(SystemExit):
    input_rate.main(['--pipeline', 'nvjpeg', '--core_counts', '1,2'])
  assert '--core_counts=1,2 with --pipeline=nvjpeg' in capsys.readouterr().err


def test_pytorchs_loader_times_the_same_files(tmp_path):
  import pytest
  pytest.importorskip('torchvision')
  input_rate.write_images(str(tmp_path / 'jpegs'), 70, classes=2)
  found = input_rate.child(str(tmp_path / 'jpegs'), 1, 1, 'torch')
  assert found['cores'] == 1 and found['images_per_s'] > 0
