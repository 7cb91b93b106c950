"""JAX's persistent compilation cache for `python -m jaxpar.train`: a run started again — the
same command after SIGTERM (exit 75), a preemption, a lost process, or simply once more —
loads the programs it compiled before instead of compiling them again.

Compiling is much of a short run and of every restart: ResNet34's quickstart config (2×4
emulated CPU devices, 4 steps and the evaluation) took 58 s from the command to its exit
compiling, 32 s loading the same programs (2 cores of an AVX2-only AMD EPYC, 2026-11-29,
jax 0.10.2; docs/reliability.md); on a GPU a network's step can take minutes to compile.
JAX keeps a program in the cache (`jax_compilation_cache_dir`) when it took at least
`jax_persistent_cache_min_compile_time_secs` (JAX's 1 s) to compile, keyed by the program,
the devices, the compile options and the jaxlib version, so a changed config or another JAX
compiles afresh.

`config.compilation_cache`:
  auto  JAX's own setting where the environment makes one (`JAX_COMPILATION_CACHE_DIR`, or
        `JAX_ENABLE_COMPILATION_CACHE=false`); else `xla/` in jaxpar's cache folder
        (`~/.cache/jaxpar/xla`: `user_cache`) for a run of one process, and none for several:
        JAX writes the cache from process 0 only, so on hosts that do not share the folder
        the other processes would compile while process 0 loads and waits for them in the
        first collective (gloo gives up after 30 s), and every restart would compile there.
  off   none: every program compiled.
  PATH  that folder; across hosts, one every process sees (a shared file system or a
        `gs://` bucket, as JAX's cache supports).

Training only: the measuring tools compile in every process, as a first launch does
(`analysis.steptime.measure --compilation_cache` is theirs), since a process that loaded
its step can run it at another speed than one that compiled it (docs/performance.md).
"""
import os

from absl import logging

from jaxpar import user_cache
from jaxpar.config import ConfigError

_applied = None  # the folder this process's runs cache in ('' none), once applied


def _jax_setting():
  """(JAX's cache folder or None, whether JAX's cache is enabled), as its config (and so the
  environment's JAX_* variables) has them."""
  import jax
  return jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache


def resolve(choice, processes: int) -> tuple[str, str]:
  """(folder, why): the folder `choice` ('auto' | 'off' | a path) caches in for a run of
  `processes` processes ('' none), and why, for the log line. A choice that is neither is one
  ConfigError naming the field."""
  if not isinstance(choice, str) or not choice.strip():
    raise ConfigError(f"config.compilation_cache={choice!r} is invalid: 'auto', 'off' or a "
                      f'folder for compiled programs')
  if choice == 'off':
    return '', 'config.compilation_cache=off'
  if choice != 'auto':
    return (choice if '://' in choice else os.path.abspath(os.path.expanduser(choice)),
            'config.compilation_cache')
  folder, enabled = _jax_setting()
  if not enabled:
    return '', "JAX's cache is disabled (jax_enable_compilation_cache)"
  if folder:
    return folder, "JAX's setting (jax_compilation_cache_dir)"
  if processes > 1:
    return '', (f'{processes} processes: JAX writes its cache from process 0 only, and '
                f'processes that load while others compile wait in the first collective; '
                f'set config.compilation_cache to a folder every process sees')
  return user_cache.folder('xla'), 'one process'


def apply(choice, processes: int) -> str:
  """Caches this process's compiled programs as `resolve` says (logged), before its first
  compile; the folder ('' none). Once per process: later calls return the first folder."""
  global _applied
  if _applied is not None:
    return _applied
  import jax
  folder, why = resolve(choice, processes)
  if folder:
    if '://' not in folder and (problem := _unwritable(folder)):
      raise ConfigError(f'config.compilation_cache={folder!r} cannot be created ({problem}): '
                        f"choose a folder you can write to, or 'off'")
    jax.config.update('jax_compilation_cache_dir', folder)
    jax.config.update('jax_enable_compilation_cache', True)
    logging.info('Compiled programs are kept in %s and loaded from there by a run started '
                 'again (%s; programs that compiled in %g s or more).', folder, why,
                 jax.config.jax_persistent_cache_min_compile_time_secs)
  else:
    jax.config.update('jax_enable_compilation_cache', False)
    logging.info('Compiled programs are not kept for a run started again (%s).', why)
  _applied = folder
  return folder


def _unwritable(folder: str) -> str:
  """Why `folder` could not be made or written ('' where it can): checked on it or its
  nearest existing parent, making nothing (JAX makes it at its first program kept). A
  relative folder (JAX_COMPILATION_CACHE_DIR may name one) is under the working directory."""
  path = os.path.abspath(folder)
  while not os.path.exists(path) and os.path.dirname(path) != path:
    path = os.path.dirname(path)
  if not os.path.isdir(path):
    return f'{path} is not a folder'
  if not os.access(path, os.W_OK | os.X_OK):
    return f'{path} is not writable'
  return ''


def applied() -> str | None:
  """The folder `apply` chose for this process ('' none), or None before it ran."""
  return _applied
