"""The input benchmark times input and train step for one config, on a generated JPEG folder."""
import os

from jaxpar import config as config_lib
from analysis.benchmarks import input_bench


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
