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
all-reduce's (32.03 MB) did not — the "sync-join residual".

`keep_freed_memory('keep')` tells glibc (mallopt) to serve every thread from the main heap
(M_ARENA_MAX = 1: it grows without a size limit), to map directly only above 2 GiB
(M_MMAP_THRESHOLD) and to keep what is freed (M_TRIM_THRESHOLD): the second step reuses
the first one's pages. The cost: a process keeps its peak heap, and threads share one
arena's lock. Off glibc (macOS, musl) it does nothing and says so.

That lock is what `mapped` leaves out: the last two settings alone, each thread keeping its
own arena. A thread's arena other than the main one cannot hold a block above 64 MiB
(`HEAP_MAX`: glibc's largest heap of an arena, twice its largest mmap threshold), so a step
whose temporaries pass it is kept only by `keep`. Measured with the training loop
(docs/performance.md): SqueezeNet-BN at 16², batch 64 (temporaries 8 MiB), 1.6-1.8 x slower
a step under `keep` than under `system` or `mapped`; ResNet34 at 16², batch 32 (104 MiB), 13 %
faster under `keep` than `mapped`, 14-19 % faster than `system`.

So `auto` (the default) decides from the step: where an accelerator's PJRT plugin (CUDA,
ROCm, TPU) is installed and `JAX_PLATFORMS` does not name only the CPU, `system` (an
accelerator's temporaries are its own memory; XLA's GPU compiler runs LLVM and ptxas on a
thread per core, and with one arena for all of them one H200 machine compiled SqueezeNet's
bfloat16 step at 224² in 139 s on 2026-11-28, 28 s when the threads kept their arenas:
docs/benchmark.md); on the CPU, `keep` where the step's temporaries (estimated before
JAX starts its backend: `build.step_temporaries`) pass `HEAP_MAX`, `mapped` below — but
for a network whose step makes many small allocations side by side, which one heap serves
slowly, a larger bound measured for it (`models.KEEP_ABOVE`: GoogLeNet's training step
1.80× as long under `keep` at 36 MiB of temporaries, 1.29× at 70, 1.05–1.18× at 112–371,
0.91× at 571). Every choice is logged with its reason.

Why one heap is slow for such a step: compiling a program in the process leaves the
compiler's freed memory in the heap, in holes of many sizes between what it keeps; glibc
keeps each large bin's free blocks in a list sorted by size and walks it to place a block
or to find one, so under `keep` every allocation of the step's threads walks those lists
(GoogLeNet 32², batch 16: 32 % of the step's time in `_int_malloc`). A process that loads
its programs from JAX's compilation cache has compiled nothing, and there `keep` is the
faster setting for GoogLeNet too — but a first run compiles, and the rule is for it.
"""
import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import pkgutil
import re
import resource
import tempfile

from absl import logging

HOST_MEMORY = ('auto', 'keep', 'mapped', 'system')
# jax_plugins' modules (and their entry points) that make an accelerator backend.
_ACCELERATOR_PLUGINS = ('cuda', 'rocm', 'tpu')
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_LARGEST = 2**31 - 1  # mallopt takes an int
# glibc's HEAP_MAX_SIZE on 64-bit systems (2 × DEFAULT_MMAP_THRESHOLD_MAX): the largest heap
# of an arena other than the main one, and so the largest block such an arena can hold.
HEAP_MAX = 64 * 2**20
_applied = None  # (setting, glibc took it) of this process, once applied


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


def resolve(choice: str, temporaries=None, above: int | None = None) -> str:
  """`choice` itself, or for 'auto' (logged, with why): 'system' where an accelerator's
  plugin is installed; on the CPU 'keep' where the step's temporaries pass `above` (a
  network's own bound, `models.KEEP_ABOVE`: its many small allocations slower from one
  heap below it) or else `HEAP_MAX`, and 'mapped' below. `temporaries`: a function giving
  their bytes on one device (called only here, for 'auto' on the CPU;
  `build.step_temporaries`; it may return None), or None where no step is known (then
  'keep', as a step that passes it loses most)."""
  if choice != 'auto':
    return choice
  plugins = accelerator_plugins()
  if plugins:
    logging.info("host_memory=auto: system (%s installed: an accelerator's temporaries are "
                 "its own memory, and its compiler's threads would share one malloc arena; "
                 "JAX_PLATFORMS=cpu or host_memory='keep' to keep).", ', '.join(plugins))
    return 'system'
  if temporaries is None:
    return 'keep'
  size = temporaries()
  if size is None:
    logging.info("host_memory=auto: keep (the step's temporaries not known).")
    return 'keep'
  bound = above or HEAP_MAX
  chosen = 'keep' if size > bound else 'mapped'
  logging.info("host_memory=auto: %s (a step's temporaries about %.0f MiB a device, %s the "
               "%d MiB %s%s).", chosen, size / 2**20,
               'above' if chosen == 'keep' else 'within', bound // 2**20,
               "a thread's own malloc arena can hold" if bound == HEAP_MAX else
               "below which this network's many small allocations are faster from each "
               "thread's own malloc arena than from one heap",
               ': the main heap keeps them, every thread sharing its lock' if chosen == 'keep'
               else ': each thread keeps its own arena')
  return chosen


def keep_freed_memory(choice: str = 'auto', temporaries=None, above: int | None = None) -> bool:
  """Applies `choice` ('auto' | 'keep' | 'mapped' | 'system', see `resolve`; `temporaries`
  and `above` as there) to this process's malloc; True if glibc took it. Call before JAX starts its
  backend: glibc caps only the arenas made after the call, and threads keep the arena they
  have. Once per process: later calls return the first answer (`applied` says which) and
  estimate nothing."""
  global _applied
  if _applied is not None:
    return _applied[1]
  setting = resolve(choice, temporaries, above)
  if setting == 'system':
    _applied = (setting, False)
    return False
  libc = ctypes.CDLL(ctypes.util.find_library('c') or None)
  if not hasattr(libc, 'mallopt') or not hasattr(libc, 'gnu_get_libc_version'):
    logging.info('host_memory=%s: not glibc, malloc left as it is.', choice)
    _applied = (setting, False)
    return False
  libc.gnu_get_libc_version.restype = ctypes.c_char_p
  settings = ((_M_MMAP_THRESHOLD, _LARGEST), (_M_TRIM_THRESHOLD, _LARGEST))
  if setting == 'keep':
    settings = ((_M_ARENA_MAX, 1),) + settings
  # Every setting tried, even after one is refused (all() of a generator would stop there).
  ok = all([libc.mallopt(param, value) == 1 for param, value in settings])
  _applied = (setting, ok)
  logging.info('host_memory=%s: glibc %s keeps freed memory for reuse (%s, mmap above 2 GiB '
               'only, no trimming)%s.', setting if choice == setting else f'{choice}, {setting}',
               libc.gnu_get_libc_version().decode(),
               'one arena' if setting == 'keep' else "each thread's own arena",
               '' if ok else ': glibc refused a setting')
  return ok


def applied() -> str | None:
  """The setting `keep_freed_memory` chose for this process ('keep', 'mapped', 'system'),
  None before it is called: what a process it starts (a Ray actor) is given, so that both
  follow one decision."""
  return _applied[0] if _applied is not None else None


def minor_faults() -> int:
  """This process's minor page faults so far (the kernel's count): a step that has the
  kernel map and zero its temporaries again each time shows about one a 4 KiB page."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


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
