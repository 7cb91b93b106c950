"""Hybrid data/model parallelism ([H] §4; docs/communication.md): convolutions data
parallel, FC layers model parallel along a mesh axis.

Convolutions hold few parameters and most of the compute, FC layers the reverse. So
the FC layers named in `split` keep their kernel and bias split along the output
dimension over the mesh axis `model_axis` (`models.layers.ModelParallelDense` does the
forward: gather the inputs, multiply by the local slice, all-to-all the outputs back),
and only those slices' gradients need averaging — over the other (data) axes, as each
slice's gradient already covers every sample of its model group. The rest is
replicated and all-reduced over every axis. The optimizer state follows its
parameters' layout, so the split layers' parameter and optimizer memory per device is
1/R of the replicated case.

`choose_split` decides per layer ([H]'s rule): model-parallel moves fewer values when
M·R < (K+1)·N / (3K + 2N), for K inputs, N outputs, M samples per device and R devices
on the model axis.
"""
import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from jaxpar import optim
from jaxpar.parallel.allreduce import all_reduce_bytes
from jaxpar.collectives import nbytes, replicate, travelling
from jaxpar.step import ReplicatedParams

FC_PARALLEL = ('data', 'model', 'auto')
MODEL_AXIS = 'model'  # the mesh axis split FC layers are sharded over


def model_parallel_pays(k: int, n: int, m: int, r: int) -> bool:
  """[H]'s rule: model-parallel communication (3·M·K·R + 2·M·N·R values) below
  data-parallel (K·N + N) for an FC layer of K inputs and N outputs."""
  return m * r < (k + 1) * n / (3 * k + 2 * n)


def choose_split(params, fc_layers, mode: str, per_device_batch: int, r: int) -> tuple:
  """The FC layers to split: all (`model`), none (`data`), or those [H]'s rule picks
  (`auto`); only layers whose N the R devices divide evenly can be split."""
  if mode == 'data':
    return ()
  chosen = []
  for name in fc_layers:
    k, n = params[name]['kernel'].shape
    if mode == 'model' and n % r:
      raise ValueError(f'{name} has {n} outputs, which {r} devices do not split evenly')
    if mode == 'model' or (n % r == 0 and model_parallel_pays(k, n, per_device_batch, r)):
      chosen.append(name)
  return tuple(chosen)


class HybridFC(ReplicatedParams):
  """Strategy: the FC layers in `split` sharded over `model_axis`, the rest replicated."""

  def __init__(self, mesh, model_axis: str, split, dtype=None, per_device_batch: int = 0,
               compute_dtype=jnp.float32):
    self.axes = tuple(mesh.axis_names)
    self.model_axis, self.split, self.dtype = model_axis, tuple(split), dtype
    # For the accounting of the split layers' activations (M samples, in compute dtype).
    self.per_device_batch, self.compute_dtype = per_device_batch, jnp.dtype(compute_dtype)
    self.data_axes = tuple(a for a in self.axes if a != model_axis)
    self.tx = None

  def describe(self):
    return (f"FC layers {', '.join(self.split) or 'none'} split over '{self.model_axis}'; "
            f"all-reduces the other gradients over {self.data_axes} {travelling(self.dtype)}")

  def checkpoint_layout(self):
    return {'kind': 'replicated'}  # split layers are whole global arrays

  def _param_specs(self, params):
    def spec(path, _):
      layer, leaf = path[0].key, path[-1].key
      if layer not in self.split:
        return P()
      return P(None, self.model_axis) if leaf == 'kernel' else P(self.model_axis)
    return jax.tree_util.tree_map_with_path(spec, params)

  def make_optimizer(self, opt_config, schedule, params):
    del params  # the optimizer sees each device's slices; masks come from their shapes
    # LARS: a split layer's norms are summed over the model axis (the whole tensor's).
    self.tx = optim.make_optimizer(opt_config, schedule, norm_axes=(self.model_axis,))
    return self.tx

  def state_specs(self, state):
    specs = self._param_specs(state.params)
    opt_specs = optax.tree_map_params(self.tx, lambda _, s: s, state.opt_state, specs,
                                      transform_non_params=lambda _: P())
    return jax.tree.map(lambda _: P(), state).replace(params=specs, opt_state=opt_specs)

  def init(self, tx, params, batch_stats):
    return params, batch_stats, tx.init(params)

  def local_variables(self, state):
    def varying(x):  # the split slices already vary over the model axis
      missing = tuple(a for a in self.axes if a not in jax.typeof(x).mat.varying)
      return lax.pcast(x, missing, to='varying') if missing else x
    return jax.tree.map(varying, state.params), state.batch_stats

  def update(self, tx, grads, batch_stats, state):
    n = lax.axis_size(self.axes)
    specs = self._param_specs(grads)
    is_split = lambda s: s != P()

    def mean(g, spec):
      sent = g if self.dtype is None else g.astype(self.dtype)
      return (lax.psum(sent, self.data_axes if is_split(spec) else self.axes)
              .astype(g.dtype) / n)
    reduced = jax.tree.map(mean, grads, specs)
    updates, opt_state = tx.update(reduced, state.opt_state, state.params)
    split = [g for g, s in zip(jax.tree.leaves(grads), jax.tree.leaves(specs)) if is_split(s)]
    whole = [g for g, s in zip(jax.tree.leaves(grads), jax.tree.leaves(specs)) if not is_split(s)]
    sent = (all_reduce_bytes('psum', nbytes(whole, self.dtype), self.axes)
            + (all_reduce_bytes('psum', nbytes(split, self.dtype), self.data_axes)
               if self.data_axes else 0.0))
    # Each split layer (K inputs, N/R local outputs) moves activations too: forward, the
    # all-gather of the inputs ((R−1)·M·K values) and the all-to-all of the outputs
    # ((R−1)·M·N/R); backward, their transposes, the same again.
    r = lax.axis_size(self.model_axis)
    for name in self.split:
      k, local_n = grads[name]['kernel'].shape
      sent += (2 * (r - 1) * self.per_device_batch * (k + local_n)
               * self.compute_dtype.itemsize)
    return (optax.apply_updates(state.params, updates), replicate(batch_stats), opt_state,
            {'sent_bytes': jnp.float32(sent)})
