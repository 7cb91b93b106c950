"""Host memory kept for reuse: XLA's CPU temporaries are not faulted in again every step.

XLA's CPU runtime allocates each execution's temporaries (one buffer a program: 34 MB
for SqueezeNet's sync-join gossip step on 32 images at 32², 80 MB for ResNet34's step
on 16) with `malloc` and frees them when the step ends. glibc serves an allocation above
its mmap threshold (adjusted as it goes, but never above 32 MiB) from a fresh `mmap` and
unmaps it when freed, and an arena of a thread other than the main one cannot hold a
block above 64 MiB at all. So every step the kernel maps and zeroes each 4 KiB page of
the temporaries again, one minor page fault a page: 8,342 faults a step for that
SqueezeNet step (+10 ms of 43), 19,500 for ResNet34's (+25 ms of 92), measured on this
project's 2-core machines (docs/performance.md). Whether a method pays depended on
whether its temporaries crossed 32 MiB: gossip's and Local SGD's sync-join steps did,
all-reduce's (32.03 MB) did not — the "sync-join residual" of #19.

`keep_freed_memory()` tells glibc (mallopt) to serve every thread from the main heap
(M_ARENA_MAX = 1: it grows without a size limit), to map directly only above 2 GiB
(M_MMAP_THRESHOLD) and to keep what is freed (M_TRIM_THRESHOLD): the second step reuses
the first one's pages. The cost: a process keeps its peak heap, and threads share one
arena's lock. Off glibc (macOS, musl) it does nothing and says so.

That lock is why `auto` (the default) keeps freed memory only where the backend is the
CPU: `JAX_PLATFORMS` names only the CPU, or no accelerator's PJRT plugin (CUDA, ROCm, TPU)
is installed. An accelerator's temporaries are its own memory, so there is nothing to keep,
and XLA's GPU compiler runs LLVM and ptxas on a thread per core: with one arena for all of
them, one H200 machine (16 cores) compiled SqueezeNet's bfloat16 step at 224² in 139 s on
2026-11-28; on 2026-11-26 the same step took 28 s there, when the benchmark started JAX's
backend before asking for one arena: the arenas its threads had made by then stayed in use
(docs/benchmark.md).
"""
import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import tempfile

from absl import logging

HOST_MEMORY = ('auto', 'keep', 'system')
# jax_plugins' modules (and their entry points) that make an accelerator backend.
_ACCELERATOR_PLUGINS = ('cuda', 'rocm', 'tpu')
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_LARGEST = 2**31 - 1  # mallopt takes an int
_applied = None


def accelerator_plugins() -> list[str]:
  """The installed JAX plugins that make an accelerator backend (e.g. 'xla_cuda13'), and
  'libtpu' where that is installed; [] when `JAX_PLATFORMS` names only the CPU. Asks the
  installed packages, not JAX, whose backend must not start before `keep_freed_memory`."""
  platforms = os.environ.get('JAX_PLATFORMS', '').lower().replace(' ', '')
  if platforms and set(platforms.split(',')) <= {'cpu'}:
    return []
  found = {e.name for e in importlib.metadata.entry_points(group='jax_plugins')}
  spec = importlib.util.find_spec('jax_plugins')
  if spec is not None and spec.submodule_search_locations:
    found |= {m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)}
  if importlib.util.find_spec('libtpu') is not None:
    found.add('libtpu')
  return sorted(name for name in found
                if any(kind in name.lower() for kind in _ACCELERATOR_PLUGINS))


def resolve(choice: str) -> str:
  """`choice` itself, or for 'auto' 'keep' where JAX's backend will be the CPU and
  'system' where an accelerator's plugin is installed (logged)."""
  if choice != 'auto':
    return choice
  plugins = accelerator_plugins()
  if plugins:
    logging.info("host_memory=auto: system (%s installed: an accelerator's temporaries are "
                 "its own memory, and its compiler's threads would share one malloc arena; "
                 "JAX_PLATFORMS=cpu or host_memory='keep' to keep).", ', '.join(plugins))
    return 'system'
  return 'keep'


def keep_freed_memory(choice: str = 'auto') -> bool:
  """Applies `choice` ('auto' | 'keep' | 'system', see `resolve`) to this process's malloc;
  True if glibc took it. Call before JAX starts its backend: glibc caps only the arenas
  made after the call, and threads keep the arena they have.
  Once per process is enough, later calls return the first answer."""
  global _applied
  if resolve(choice) != 'keep':
    return False
  if _applied is not None:
    return _applied
  libc = ctypes.CDLL(ctypes.util.find_library('c') or None)
  if not hasattr(libc, 'mallopt') or not hasattr(libc, 'gnu_get_libc_version'):
    logging.info('host_memory=%s: not glibc, malloc left as it is.', choice)
    _applied = False
    return False
  libc.gnu_get_libc_version.restype = ctypes.c_char_p
  # Every setting tried, even after one is refused (all() of a generator would stop there).
  _applied = all([libc.mallopt(param, value) == 1 for param, value in
                  ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, _LARGEST),
                   (_M_TRIM_THRESHOLD, _LARGEST))])
  logging.info('host_memory=%s: glibc %s keeps freed memory for reuse (one arena, mmap '
               'above 2 GiB only, no trimming)%s.',
               'auto, keep on the CPU backend (no accelerator plugin, or JAX_PLATFORMS=cpu)'
               if choice == 'auto' else choice, libc.gnu_get_libc_version().decode(),
               '' if _applied else ': glibc refused a setting')
  return _applied


def arenas() -> int | None:
  """This process's malloc arenas (glibc's `malloc_info`: one <heap> each; `keep` leaves one);
  None off glibc."""
  libc = ctypes.CDLL(ctypes.util.find_library('c') or None)
  if not hasattr(libc, 'malloc_info'):
    return None
  libc.fopen.restype = ctypes.c_void_p
  with tempfile.NamedTemporaryFile(suffix='.xml') as out:
    stream = ctypes.c_void_p(libc.fopen(out.name.encode(), b'w'))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    with open(out.name) as written:
      return len(re.findall(r'<heap nr=', written.read()))
