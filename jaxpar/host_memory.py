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
"""
import ctypes
import ctypes.util

from absl import logging

HOST_MEMORY = ('keep', 'system')
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
_LARGEST = 2**31 - 1  # mallopt takes an int
_applied = None


def keep_freed_memory(choice: str = 'keep') -> bool:
  """Applies `choice` ('keep' | 'system') to this process's malloc; True if glibc took
  it. Call before JAX starts its backend (threads created earlier keep their arenas);
  once per process is enough, later calls return the first answer."""
  global _applied
  if choice != 'keep':
    return False
  if _applied is not None:
    return _applied
  libc = ctypes.CDLL(ctypes.util.find_library('c') or None)
  if not hasattr(libc, 'mallopt') or not hasattr(libc, 'gnu_get_libc_version'):
    logging.info('host_memory=keep: not glibc, malloc left as it is.')
    _applied = False
    return False
  libc.gnu_get_libc_version.restype = ctypes.c_char_p
  # Every setting tried, even after one is refused (all() of a generator would stop there).
  _applied = all([libc.mallopt(param, value) == 1 for param, value in
                  ((_M_ARENA_MAX, 1), (_M_MMAP_THRESHOLD, _LARGEST),
                   (_M_TRIM_THRESHOLD, _LARGEST))])
  logging.info('host_memory=keep: glibc %s keeps freed memory for reuse (one arena, mmap '
               'above 2 GiB only, no trimming)%s.',
               libc.gnu_get_libc_version().decode(),
               '' if _applied else ': glibc refused a setting')
  return _applied
