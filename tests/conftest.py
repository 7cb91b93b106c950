"""Tests run on 8 emulated CPU devices, requested before JAX starts its backend.

Compiled programs are kept in a persistent compilation cache for the session (one
directory shared by the xdist workers and every process a test launches, removed at the
end): many tests compile the same steps (the same small networks under the same
strategies, a run and its resumed twin), and compilation is most of the suite's time.
"""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:  # the session's first process
  _cache = tempfile.mkdtemp(prefix='jaxpar-tests-xla-cache-')
  os.environ['JAX_COMPILATION_CACHE_DIR'] = _cache
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)

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
