"""Tests run on 8 emulated CPU devices, requested before JAX starts its backend."""
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update('jax_num_cpu_devices', 8)
assert jax.device_count() == 8, jax.devices()


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A TFDS data_dir holding the bundled digits, built once per session."""
  import tensorflow_datasets as tfds

  import jaxpar.data.sklearn_digits  # noqa: F401
  path = str(tmp_path_factory.mktemp('tfds'))
  tfds.builder('sklearn_digits', data_dir=path).download_and_prepare()
  return path
