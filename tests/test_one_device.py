"""On one device every method is plain SGD, and pays for no machinery it does not use:
the same losses and weights as the all-reduce step, a program with no collective and no
conditional, the state in the all-reduce step's shapes, and no more memory."""
import jax
import numpy as np
import pytest

from jaxpar.perfmodel.hlo import collectives
from jaxpar.mesh import make_mesh
from jaxpar.parallel.allreduce import AllReduce
from jaxpar.parallel.averaging import LocalSGD
from jaxpar.parallel.gossip import Gossip
from jaxpar.parallel.servers import CentralServer, DistributedServer
from jaxpar.step import init_state, make_train_step, to_global
from test_servers import IMAGE, _optimizer
from runs import TinyResNet, assert_trees_close, random_batches, sharded_run

METHODS = {
    'central': CentralServer,
    'distributed even': lambda mesh: DistributedServer(mesh, placement='even'),
    'distributed greedy': lambda mesh: DistributedServer(mesh, placement='greedy'),
    'gossip': Gossip,
    'local SGD': lambda mesh: LocalSGD(mesh, every=2),
}


def _program(strategy, mesh, name='sgd'):
  """(lowered StableHLO, compiled peak bytes, initial state) of one step."""
  tx = _optimizer(name, strategy)
  model = TinyResNet(bn_axis_name=None)
  state = init_state(model, tx, strategy, mesh, IMAGE, jax.random.key(0))
  lowered = make_train_step(model, tx, mesh, strategy).lower(
      state, to_global(mesh, random_batches(1, batch=8)[0]), jax.random.key(0))
  memory = lowered.compile().memory_analysis()
  peak = (memory.argument_size_in_bytes + memory.output_size_in_bytes
          - memory.alias_size_in_bytes + memory.temp_size_in_bytes)
  return lowered.as_text(), peak, state


@pytest.mark.parametrize('method,name', [(m, 'sgd') for m in METHODS]
                         + [('distributed even', 'lars')])  # its own trust ratio's code
def test_one_device_trains_like_all_reduce(method, name):
  mesh = make_mesh((1,), ('data',))
  reference = AllReduce(mesh.axis_names)
  ref, ref_losses = sharded_run(TinyResNet(), _optimizer(name, reference), mesh,
                                random_batches(3, batch=8), reference)
  strategy = METHODS[method](mesh)
  state, losses = sharded_run(TinyResNet(), _optimizer(name, strategy), mesh,
                              random_batches(3, batch=8), strategy)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
  assert_trees_close(state.params, ref.params, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize('method', list(METHODS))
def test_one_device_program_has_no_machinery(method):
  mesh = make_mesh((1,), ('data',))
  text, peak, state = _program(METHODS[method](mesh), mesh)
  ref_text, ref_peak, ref_state = _program(AllReduce(mesh.axis_names), mesh)
  assert collectives(text) == [] and collectives(ref_text) == []
  assert 'stablehlo.case' not in text and 'stablehlo.if' not in text
  # The weights in their own shapes (no per-device leading dimension), and no more memory
  # (compiled memory analysis: the same program up to the optimizer state's tree).
  assert ([x.shape for x in jax.tree.leaves(state.params)]
          == [x.shape for x in jax.tree.leaves(ref_state.params)])
  assert peak <= ref_peak * 1.01, (peak, ref_peak)
