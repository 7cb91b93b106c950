"""jaxpar.compile_cache: where `python -m jaxpar.train` keeps its compiled programs
(config.compilation_cache), and that a run started again loads them (end to end in
test_faults.py's SIGTERM test: the resumed run's step and initialisation are cache hits)."""
import os
import subprocess
import sys

import pytest

from jaxpar import compile_cache
from jaxpar.config import ConfigError
from runs import ROOT, process_env


@pytest.fixture
def jax_unset(monkeypatch):
  """JAX configured by nothing: no folder, the cache enabled (its defaults)."""
  monkeypatch.setattr(compile_cache, '_jax_setting', lambda: (None, True))


def test_auto_keeps_one_process_s_programs_under_the_user_s_cache_folder(jax_unset, monkeypatch):
  monkeypatch.delenv('JAXPAR_CACHE_DIR', raising=False)
  monkeypatch.setenv('XDG_CACHE_HOME', '/somewhere')
  assert compile_cache.resolve('auto', 1) == ('/somewhere/jaxpar/xla', 'one process')
  monkeypatch.delenv('XDG_CACHE_HOME')
  folder, _ = compile_cache.resolve('auto', 1)
  assert folder == os.path.join(os.path.expanduser('~'), '.cache', 'jaxpar', 'xla')
  monkeypatch.setenv('JAXPAR_CACHE_DIR', '/jaxpar/files')  # jaxpar's, as oneDNN's library
  assert compile_cache.resolve('auto', 1)[0] == '/jaxpar/files/xla'


def test_auto_keeps_nothing_across_processes_and_says_how_to_share_a_folder(jax_unset):
  folder, why = compile_cache.resolve('auto', 2)
  assert folder == '' and 'process 0 only' in why
  assert 'config.compilation_cache to a folder every process sees' in why


def test_auto_follows_jax_s_own_setting_where_the_environment_makes_one(monkeypatch):
  monkeypatch.setattr(compile_cache, '_jax_setting', lambda: ('/jax/cache', True))
  assert compile_cache.resolve('auto', 1)[0] == '/jax/cache'
  assert compile_cache.resolve('auto', 4)[0] == '/jax/cache'  # the user chose it: shared
  monkeypatch.setattr(compile_cache, '_jax_setting', lambda: ('/jax/cache', False))
  folder, why = compile_cache.resolve('auto', 1)
  assert folder == '' and 'disabled' in why


def test_off_and_a_named_folder_are_taken_as_given(jax_unset, monkeypatch, tmp_path):
  assert compile_cache.resolve('off', 1)[0] == ''
  monkeypatch.chdir(tmp_path)
  assert compile_cache.resolve('xla', 2)[0] == str(tmp_path / 'xla')  # named: across processes too
  assert compile_cache.resolve('gs://bucket/xla', 2)[0] == 'gs://bucket/xla'
  # JAX's own setting may name a relative folder: checked under the working directory
  assert compile_cache._unwritable('not/yet/xla') == ''
  (tmp_path / 'not').write_text('')
  assert compile_cache._unwritable('not/yet/xla') == f"{tmp_path / 'not'} is not a folder"


@pytest.mark.parametrize('value', ['', '  ', None, 3])
def test_a_value_that_names_no_folder_is_one_line_naming_the_field(value):
  with pytest.raises(ConfigError, match=r'config\.compilation_cache=.* is invalid: '
                                        r"'auto', 'off' or a folder"):
    compile_cache.resolve(value, 1)


def test_the_cli_applies_the_setting_before_anything_compiles(tmp_path):
  """In a fresh process, as `jaxpar.train`'s main does it: JAX's config then points at the
  folder (the line saying so: test_faults.py), made only when JAX keeps a program there; a
  folder that cannot be made is one line, exit 2."""
  code = ('import sys, jax; from jaxpar import compile_cache; '
          'folder = compile_cache.apply(sys.argv[1], 1); '
          'print(folder, jax.config.jax_compilation_cache_dir, '
          'jax.config.jax_enable_compilation_cache, compile_cache.apply("off", 1))')
  env = {k: v for k, v in process_env().items()
         if k not in ('JAX_COMPILATION_CACHE_DIR', 'JAX_ENABLE_COMPILATION_CACHE')}
  done = subprocess.run([sys.executable, '-c', code, str(tmp_path / 'xla')], capture_output=True,
                        text=True, env=env, cwd=ROOT, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  folder = str(tmp_path / 'xla')
  assert done.stdout.split() == [folder, folder, 'True', folder]  # once per process
  assert not os.path.exists(folder)  # nothing compiled: nothing made

  blocked = tmp_path / 'file'
  blocked.write_text('')
  # Both CLIs that compile apply it first: training, and the plan.
  for module, flags in (('jaxpar.train', ['--workdir', str(tmp_path / 'run')]),
                        ('jaxpar.plan', ['--target_loss=1', f'--out={tmp_path}/plan.json'])):
    done = subprocess.run(
        [sys.executable, '-m', module, '--config', 'configs/squeezenet.py', *flags,
         f'--config.compilation_cache={blocked}/xla'],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"{module.replace('.train', '')}: config.compilation_cache='{blocked}/xla' cannot be "
        f"created ({blocked} is not a folder): choose a folder you can write to, or 'off'")
