"""One of two processes, each pinned to a core, that all-reduce 16 floats in a loop while
another process competes for process 0's core, for test_multiprocess.py:

  python tests/multiprocess_starved_loop.py PROCESS_ID PORT

Process 0's `multihost.IdleGlooLoops` (retrying idle priority after 2 s) must find its gloo
loop thread and set it idle, put it back at normal priority once a busy process pinned to
the same core starves it, and try idle again 2 s after that busy process has ended. Each
phase ends when process 0 says so through the all-reduce itself (its flag in element 0), so
both processes run the same number of collectives. Prints `history` (process 0's priority
changes) and `calls` (all-reduces per phase) as JSON; exits 1 if a phase outlasts 120 s.
"""
import json
import os
import subprocess
import sys
import time

from jaxpar import multihost

process_id, port = int(sys.argv[1]), sys.argv[2]
core = sorted(os.sched_getaffinity(0))[process_id % len(os.sched_getaffinity(0))]
os.sched_setaffinity(0, {core})  # as launch/local.sh pins its processes
multihost.join(f'127.0.0.1:{port}', 2, process_id, 'none', 60, 20, collective_threads='normal')
loops = multihost.IdleGlooLoops(retry_s=2.0, period_s=0.1)
loops.start()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from jaxpar.mesh import make_mesh  # noqa: E402

mesh = make_mesh((2,), ('d',), jax.devices())
total = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, 'd'), mesh=mesh, in_specs=P('d'),
                              out_specs=P()))


def until(done, pause=0.0) -> int:
  """All-reduces until process 0's `done()` holds; the number of calls."""
  deadline, calls = time.monotonic() + 120, 0
  while True:
    local = np.full((1, 16), process_id + 1, np.float32)
    local[0, 0] = process_id == 0 and done()
    out = np.asarray(total(jax.make_array_from_process_local_data(
        NamedSharding(mesh, P('d')), local)))
    calls += 1
    assert (out[0, 1:] == 3).all(), out  # 1 + 2 in every element but the flag
    if out[0, 0] >= 1:
      return calls
    if time.monotonic() > deadline:
      print('history', json.dumps(loops.history), flush=True)
      sys.exit(f'process {process_id}: a phase took more than 120 s ({calls} calls)')
    time.sleep(pause)


def changed(to, why):
  return lambda: any(h[1] == to and h[2].startswith(why) for h in loops.history)


calls = {'found': until(changed('idle', 'found'), pause=0.02)}  # the loop waits in epoll
busy = None
if process_id == 0:
  busy = subprocess.Popen(['taskset', '-c', str(core), sys.executable, '-c', 'while True: pass'])
calls['starved'] = until(changed('normal', 'starved'))
if busy is not None:
  busy.kill()
  busy.wait()
calls['retried'] = until(changed('idle', 'retry'))
multihost.barrier('end')
print('history', json.dumps(loops.history), flush=True)
print('calls', json.dumps(calls), flush=True)
