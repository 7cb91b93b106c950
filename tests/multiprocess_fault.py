"""One of two processes that all-reduce in a loop until one of them fails, for the fault
tests in test_multiprocess.py.

  python tests/multiprocess_fault.py PROCESS_ID PORT raise|exit|hang

After 3 steps process 1 raises an exception (raise) or stops itself (hang: SIGSTOP, as a
process stuck in the kernel or a debugger), or process 0 kills itself (exit).
"""
import os
import signal
import sys

from jaxpar import mesh as mesh_lib
from jaxpar import multihost

process_id, port, fault = int(sys.argv[1]), sys.argv[2], sys.argv[3]
multihost.join(f'127.0.0.1:{port}', 2, process_id, 'none', 60, 5)
mesh_lib.emulate_cpu_devices(2)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

mesh = mesh_lib.make_mesh((4,), ('d',))
total = jax.jit(jax.shard_map(lambda x: jax.lax.psum(x, 'd'), mesh=mesh, in_specs=P('d'),
                              out_specs=P()))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('d')), jnp.ones((2, 1000)))
for step in range(100_000):
  assert float(total(x)[0, 0]) == 4
  if step == 3 and fault == 'raise' and process_id == 1:
    raise RuntimeError('a bad batch')
  if step == 3 and fault == 'hang' and process_id == 1:
    os.kill(os.getpid(), signal.SIGSTOP)
  if step == 3 and fault == 'exit' and process_id == 0:
    os.kill(os.getpid(), signal.SIGKILL)
print('never reached')
