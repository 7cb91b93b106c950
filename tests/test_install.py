"""The install keeps an accelerator's JAX: pip's own resolution (`pip install --dry-run
--report`), read from this environment, whose JAX stands in for the one a GPU user installed
first (on the newest leg of CI, jax 0.12, the version whose install the old `<0.11` pin
downgraded). Asks the package registry: skipped, with pip's words, where none answers."""
import importlib.metadata
import importlib.util
import json
import subprocess
import sys

import pytest

from runs import ROOT

_OFFLINE = ('NewConnectionError', 'Max retries exceeded', 'Could not fetch URL',
            'Temporary failure in name resolution', 'Network is unreachable')


def _resolution(target: str, tmp_path) -> dict:
  """{name: version} that `pip install target` would install into this environment."""
  report = tmp_path / 'report.json'
  done = subprocess.run([sys.executable, '-m', 'pip', 'install', '--dry-run', '--quiet',
                         '--disable-pip-version-check', '--report', str(report), '-e', target],
                        capture_output=True, text=True, timeout=600)
  if done.returncode != 0 and any(s in done.stderr for s in _OFFLINE):
    pytest.skip(f'no package registry answered: {done.stderr.strip().splitlines()[-1]}')
  assert done.returncode == 0, done.stderr
  return {i['metadata']['name'].lower(): i['metadata']['version']
          for i in json.loads(report.read_text())['install']}


def test_installing_jaxpar_keeps_the_installed_jax(tmp_path):
  install = _resolution(ROOT, tmp_path)
  assert 'jax' not in install and 'jaxlib' not in install, install
  if importlib.util.find_spec('tensorflow') is None:
    pytest.skip('this environment lacks TensorFlow (a GPU image): pip would add it and its '
                'dependencies beside jaxpar')
  assert set(install) == {'jaxpar'}, install  # every dependency already satisfied here


def test_the_cuda12_extra_adds_the_plugin_of_the_installed_jax(tmp_path):
  """`.[cuda12]` beside an installed JAX of the supported range adds the CUDA plugin of that
  very version (jax[cuda12] pins it) and leaves jax and jaxlib as they are."""
  install = _resolution(f'{ROOT}[cuda12]', tmp_path)
  assert 'jax' not in install and 'jaxlib' not in install, install
  assert install['jax-cuda12-plugin'] == importlib.metadata.version('jax'), install
