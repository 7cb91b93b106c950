"""One process of the cross-process sync-split check in test_multiprocess.py.

  python tests/multiprocess_step.py PROCESS_ID NUM_PROCESSES PORT OUT.npz

Joins a jax.distributed run on loopback, emulates 8 / NUM_PROCESSES CPU devices,
trains TinyResNet for 3 steps on a 2×4 mesh spanning all processes (this process
feeding its rows of each global batch) and, in process 0, saves the losses and
parameters for the test to compare with one device.
"""
import os
import sys

process_id, num_processes, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jaxpar import mesh as mesh_lib  # noqa: E402

mesh_lib.initialize_distributed(f'127.0.0.1:{port}', num_processes, process_id)
mesh_lib.emulate_cpu_devices(8 // num_processes)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from test_step import TinyResNet, _batches, _init  # noqa: E402

from jaxpar.parallel.allreduce import AllReduce  # noqa: E402
from jaxpar.step import make_train_step, to_global  # noqa: E402

assert jax.process_count() == num_processes and jax.device_count() == 8
mesh = mesh_lib.make_mesh((2, 4), ('x', 'y'))
tx = optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.1, momentum=0.9))
model = TinyResNet(bn_axis_name=mesh.axis_names)
state = jax.jit(lambda: _init(model, tx, (1, 16, 16, 3)),
                out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))()
# Across processes build.strategy sends the gradients in one buffer (grad_fusion auto).
step = make_train_step(model, tx, mesh, AllReduce(mesh.axis_names, one_buffer=True))
losses = []
rows = 32 // num_processes
for batch in _batches(3, batch=32):
  local = {k: v[process_id * rows:(process_id + 1) * rows] for k, v in batch.items()}
  state, metrics = step(state, to_global(mesh, local), jax.random.key(7))
  losses.append(float(metrics['loss']))
if process_id == 0:
  leaves = jax.tree.leaves(jax.device_get((state.params, state.batch_stats)))
  np.savez(out, losses=np.array(losses), *leaves)
jax.distributed.shutdown()
