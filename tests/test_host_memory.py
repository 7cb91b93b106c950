"""`host_memory='keep'`: a compiled step whose temporaries exceed glibc's largest mmap
threshold (32 MiB) stops faulting its pages in again on every call. Counted in minor page
faults (the kernel's count, not a time), each setting in a fresh process.

Counted call by call, and judged by the median call: with 'keep' an occasional call still
faults its 36 MB in once more (8,792 pages, on jaxlib 0.10 and 0.12 alike), when the
previous call's temporaries are freed on another thread after its result is ready and the
next call's allocation finds them still in use: the kept heap grows by one buffer, a few
times in the first calls and rarely after (measured over 40 calls). With 'system' every
call faults them in."""
import importlib
import json
import subprocess
import sys

import pytest

from jaxpar import host_memory
from jaxpar.host_memory import HOST_MEMORY, keep_freed_memory
from tests.runs import process_env

# Two products of a 3000 × 8 and an 8 × 3000 float32 matrix: their 3000 × 3000 (36 MB)
# outputs are the program's temporaries, above glibc's largest mmap threshold; the inner
# dimension of 8 keeps a call to milliseconds (3000 × 3000 × 3000 products: 2 s a call).
_CHILD = """
import json, resource, sys
from jaxpar.host_memory import keep_freed_memory
kept = keep_freed_memory(sys.argv[1])
import jax, jax.numpy as jnp
f = jax.jit(lambda a, b: jnp.tanh(a @ b).sum(axis=0) + jnp.tanh(b.T @ a.T).sum(axis=1))
a, b = jnp.ones((3000, 8), jnp.float32) / 8, jnp.ones((8, 3000), jnp.float32)
f(a, b).block_until_ready()
calls = []
for _ in range(15):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  f(a, b).block_until_ready()
  calls.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
temp = f.lower(a, b).compile().memory_analysis().temp_size_in_bytes
from jaxpar.host_memory import arenas
print(json.dumps({'kept': kept, 'faults': sorted(calls)[len(calls) // 2], 'calls': calls,
                  'temp': temp, 'arenas': arenas()}))
"""


def _faults(choice: str) -> dict:
  out = subprocess.run([sys.executable, '-c', _CHILD, choice], env=process_env(),
                       capture_output=True, text=True, timeout=300, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_kept_memory_is_not_faulted_in_again():
  system, keep = _faults('system'), _faults('keep')
  assert system['temp'] > 32 * 2**20  # above glibc's mmap threshold, however it adapted
  if system['faults'] < system['temp'] / 4096 / 2:
    pytest.skip(f"this libc does not unmap large blocks ({system['faults']:.0f} faults a call)")
  assert keep['kept'] and not system['kept']
  # One malloc arena for every thread (what slows compilers, docs/performance.md).
  assert keep['arenas'] == 1 and system['arenas'] > 1, (keep['arenas'], system['arenas'])
  # Every 4 KiB page of the temporaries faulted in each call, then none of them (median call).
  assert keep['faults'] < 0.05 * system['faults'], (keep, system)


def test_choices():
  assert HOST_MEMORY == ('auto', 'keep', 'system')
  assert keep_freed_memory('system') is False  # nothing asked, nothing changed


def test_auto_keeps_freed_memory_only_where_the_backend_is_the_cpu(monkeypatch):
  monkeypatch.setattr(host_memory, 'accelerator_plugins', lambda: [])
  assert host_memory.resolve('auto') == 'keep'
  monkeypatch.setattr(host_memory, 'accelerator_plugins', lambda: ['xla_cuda13'])
  assert host_memory.resolve('auto') == 'system'
  assert keep_freed_memory('auto') is False  # nothing asked of glibc
  assert [host_memory.resolve(c) for c in ('keep', 'system')] == ['keep', 'system']


def test_an_installed_accelerator_plugin_is_found_unless_jax_platforms_says_cpu(
    monkeypatch, tmp_path):
  # A CUDA plugin as jax[cuda13] installs it: a module of the jax_plugins namespace package.
  (tmp_path / 'jax_plugins' / 'xla_cuda13').mkdir(parents=True)
  (tmp_path / 'jax_plugins' / 'xla_cuda13' / '__init__.py').write_text('')
  (tmp_path / 'jax_plugins' / 'not_a_device').mkdir()
  (tmp_path / 'jax_plugins' / 'not_a_device' / '__init__.py').write_text('')
  monkeypatch.delitem(sys.modules, 'jax_plugins', raising=False)
  monkeypatch.syspath_prepend(str(tmp_path))
  importlib.invalidate_caches()
  monkeypatch.setenv('JAX_PLATFORMS', 'cuda,cpu')
  assert 'xla_cuda13' in host_memory.accelerator_plugins()
  assert 'not_a_device' not in host_memory.accelerator_plugins()
  monkeypatch.delenv('JAX_PLATFORMS')
  assert 'xla_cuda13' in host_memory.accelerator_plugins()
  monkeypatch.setenv('JAX_PLATFORMS', 'cpu')
  assert host_memory.accelerator_plugins() == []
