"""`host_memory='keep'` and `'mapped'`: a compiled step whose temporaries exceed glibc's
largest mmap threshold (32 MiB) stops faulting its pages in again on every call. Counted in
minor page faults (the kernel's count, not a time), each setting in a fresh process.

Counted call by call over 80 calls, and judged by the median of the last 20: with 'keep'
an occasional call still faults its 36 MB in once more (8,792 pages, on jaxlib 0.10 and
0.12 alike), when the previous call's temporaries are freed on another thread after its
result is ready and the next call's allocation finds them still in use: the kept heap
grows by one buffer, a few times in the first calls and rarely after. With 'mapped' each
thread that runs a call has an arena of its own, which faults the buffer in at that
thread's first calls (jaxlib 0.12 ran them on several of its 12 threads: the median of 15
calls still faulted in one of three processes; of the last 20 of 40, none in five — but
once in a whole suite's run on 2 busy cores, so 80 now). With
'system' every call faults them in."""
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
import json, sys
from jaxpar.host_memory import keep_freed_memory, minor_faults
kept = keep_freed_memory(sys.argv[1])
import jax, jax.numpy as jnp
f = jax.jit(lambda a, b: jnp.tanh(a @ b).sum(axis=0) + jnp.tanh(b.T @ a.T).sum(axis=1))
a, b = jnp.ones((3000, 8), jnp.float32) / 8, jnp.ones((8, 3000), jnp.float32)
f(a, b).block_until_ready()
calls = []
for _ in range(80):
  before = minor_faults()
  f(a, b).block_until_ready()
  calls.append(minor_faults() - before)
temp = f.lower(a, b).compile().memory_analysis().temp_size_in_bytes
from jaxpar.host_memory import arenas
late = sorted(calls[-20:])  # after every thread XLA runs calls on has had its first
print(json.dumps({'kept': kept, 'faults': late[len(late) // 2], 'calls': calls,
                  'temp': temp, 'arenas': arenas()}))
"""


def _faults(choice: str) -> dict:
  out = subprocess.run([sys.executable, '-c', _CHILD, choice], env=process_env(),
                       capture_output=True, text=True, timeout=300, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_kept_memory_is_not_faulted_in_again():
  system, keep, mapped = _faults('system'), _faults('keep'), _faults('mapped')
  assert 32 * 2**20 < system['temp'] < host_memory.HEAP_MAX  # above glibc's mmap threshold,
  # however it adapted, and within what a thread's own arena holds
  if system['faults'] < system['temp'] / 4096 / 2:
    pytest.skip(f"this libc does not unmap large blocks ({system['faults']:.0f} faults a call)")
  assert keep['kept'] and mapped['kept'] and not system['kept']
  # One malloc arena for every thread (what slows compilers, docs/performance.md); `mapped`
  # leaves each thread its own.
  assert keep['arenas'] == 1 and system['arenas'] > 1 and mapped['arenas'] > 1, (
      keep['arenas'], system['arenas'], mapped['arenas'])
  # Every 4 KiB page of the temporaries faulted in each call, then none of them (median call).
  assert keep['faults'] < 0.05 * system['faults'], (keep, system)
  assert mapped['faults'] < 0.05 * system['faults'], (mapped, system)


def test_choices_and_one_decision_a_process():
  assert HOST_MEMORY == ('auto', 'keep', 'mapped', 'system')
  # conftest chose for this process before its backend started: later calls change nothing.
  assert host_memory.applied() == 'mapped'
  assert keep_freed_memory('keep') is keep_freed_memory('system') is True
  assert host_memory.applied() == 'mapped'


def test_auto_sizes_the_step_on_the_cpu_and_leaves_an_accelerator_alone(monkeypatch):
  asked = []

  def temporaries(size):
    return lambda: asked.append(size) or size
  monkeypatch.setattr(host_memory, 'accelerator_plugins', lambda: [])
  assert host_memory.resolve('auto') == 'keep'  # no step known: the one a large step needs
  assert host_memory.resolve('auto', temporaries(8 * 2**20)) == 'mapped'
  assert host_memory.resolve('auto', temporaries(host_memory.HEAP_MAX)) == 'mapped'
  assert host_memory.resolve('auto', temporaries(host_memory.HEAP_MAX + 1)) == 'keep'
  assert asked == [8 * 2**20, host_memory.HEAP_MAX, host_memory.HEAP_MAX + 1]
  # A network's own bound (GoogLeNet's many small allocations: `models.KEEP_ABOVE`).
  assert host_memory.resolve('auto', temporaries(208 * 2**20), above=400 * 2**20) == 'mapped'
  assert host_memory.resolve('auto', temporaries(589 * 2**20), above=400 * 2**20) == 'keep'
  del asked[3:]
  monkeypatch.setattr(host_memory, 'accelerator_plugins', lambda: ['xla_cuda13'])
  assert host_memory.resolve('auto', temporaries(1)) == 'system' and len(asked) == 3  # unsized
  assert [host_memory.resolve(c) for c in ('keep', 'mapped', 'system')] == [
      'keep', 'mapped', 'system']


def test_the_run_gives_auto_its_network_s_bound(monkeypatch):
  """`build.keep_freed_memory` hands `resolve` GoogLeNet's bound and no other network's."""
  from jaxpar import build, config, models
  given = []
  monkeypatch.setattr(host_memory, 'keep_freed_memory',
                      lambda choice, temporaries, above: given.append(above) or True)
  for name in ('googlenet', 'resnet34'):
    c = config.defaults()
    c.model = name
    build.keep_freed_memory(c)
  assert given == [models.KEEP_ABOVE['googlenet'], None]
  assert models.KEEP_ABOVE['googlenet'] > host_memory.HEAP_MAX


# The estimate in a process of its own: it must not start JAX's backend (the setting is
# applied after it, before the backend's threads make their arenas).
_ESTIMATE = """
import json, sys
from jax._src import xla_bridge
from jaxpar import build, config
c = config.defaults()
c.update_from_flattened_dict(json.loads(sys.argv[1]))
sizes = [build.step_temporaries(c, 10, 1), build.step_temporaries(c, 10, 1, batch=4 * c.per_device_batch)]
print(json.dumps({'sizes': sizes, 'backends': sorted(xla_bridge._backends)}))
"""


def _estimates(**fields) -> dict:
  out = subprocess.run([sys.executable, '-c', _ESTIMATE, json.dumps(fields)], env=process_env(),
                       capture_output=True, text=True, timeout=300, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_step_is_sized_without_starting_the_backend_near_what_xla_allocates():
  from analysis.benchmarks.malloc_bench import compiled_temporaries
  from jaxpar import config as config_lib
  fields = {'model': 'squeezenet', 'batch_norm': True, 'image_size': 16, 'scheme': 'sync-join',
            'mesh.shape': (1,), 'per_device_batch': 64}
  small = _estimates(**fields)
  assert small['backends'] == []
  # Activations scale with the batch, the gradients (2.9 MB) do not.
  assert 3.0 < small['sizes'][1] / small['sizes'][0] < 4.0, small
  c = config_lib.defaults()
  c.update_from_flattened_dict(fields)
  xla = compiled_temporaries(c, {'num_classes': 10, 'channels': 1})
  # 1.33 × on jax 0.10.2 (XLA's buffers reuse some activations' memory): the estimate errs
  # large, towards `keep`, which a step above 64 MiB needs. docs/performance.md.
  assert 0.8 < small['sizes'][0] / xla < 1.6, (small, xla)
  # ResNet34's gradients alone pass what a thread's arena holds: `keep`.
  large = _estimates(model='resnet34', image_size=16, scheme='sync-join', **{
      'mesh.shape': (1,), 'per_device_batch': 8})
  assert large['sizes'][0] > host_memory.HEAP_MAX and large['backends'] == []


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


def test_minor_faults_count_the_pages_a_step_maps_afresh():
  import mmap
  pages = 2048
  region = mmap.mmap(-1, pages * mmap.PAGESIZE)
  if hasattr(mmap, 'MADV_NOHUGEPAGE'):  # one fault per 4 KiB page, not per huge page
    region.madvise(mmap.MADV_NOHUGEPAGE)
  before = host_memory.minor_faults()
  for i in range(pages):  # the first write to each fresh page faults it in
    region[i * mmap.PAGESIZE] = 1
  assert host_memory.minor_faults() - before >= pages
  region.close()
