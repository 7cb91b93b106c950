"""oneDNN's convolutions (`conv_impl='onednn'`, and `auto`'s on CPU; bfloat16 in float32 on a
CPU without oneDNN's bfloat16 kernels, as oneDNN itself answers which dtypes it has): they run
as the compiled program's FFI calls (the equality tests in test_conv.py are not XLA's
fallback), on a mesh of devices at once, equal to XLA's convolution there; the library
builds once per source and jaxlib; where oneDNN cannot run, `auto` says why and takes the
other lowerings, and `onednn` computes by XLA's convolution; `hlo_flops` counts the calls'
FLOPs as PyTorch counts a convolution's."""
import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxpar.models import conv as conv_lib
from jaxpar.models import onednn

DN = ('NHWC', 'HWIO', 'NHWC')
pytestmark = pytest.mark.skipif(not onednn.available(), reason=onednn.unavailable_reason())


def _loss(conv, x, w, strides=(2, 2), padding=((1, 1), (1, 1))):
  return jnp.sum(jnp.sin(conv(x, w, strides, padding, dimension_numbers=DN)))


def _inputs(n=2, hw=9, c=3, d=4, k=3, dtype=jnp.float32):
  rng = np.random.default_rng(0)
  return (jnp.asarray(rng.normal(size=(n, hw, hw, c)), dtype),
          jnp.asarray(rng.normal(size=(k, k, c, d)), dtype))


def test_the_program_calls_onednn_for_each_pass():
  x, w = _inputs()
  text = jax.jit(jax.grad(functools.partial(_loss, conv_lib.conv_onednn), argnums=(0, 1))).lower(
      x, w).compile().as_text()
  for name in ('forward', 'input_grad', 'kernel_grad'):
    assert f'custom_call_target="jaxpar_onednn_{name}"' in text
  assert 'convolution(' not in text  # none of XLA's own


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_auto_picks_onednn_above_its_dtypes_threshold_on_cpu_only(dtype):
  # The threshold of the dtype oneDNN computes in (bfloat16 in float32 on an AVX2-only CPU).
  above = conv_lib.ONEDNN_AUTO_ABOVE[onednn.computes_in(dtype).name]
  args = ((2, 32, 32, 3), (3, 3, 3, 8), (1, 1), 'SAME')
  assert conv_lib.choose('auto', *args, 'cpu', dtype) == 'onednn'
  assert conv_lib.choose('auto', *args, 'gpu', dtype) == 'xla'
  # The smallest map oneDNN computes, and the largest it leaves to the per-tap rule.
  side = next(s for s in range(1, 9) if s * s > above)
  assert conv_lib.choose('auto', (2, side, side, 8), (3, 3, 8, 8), (1, 1), 'SAME', 'cpu',
                         dtype) == 'onednn'
  if above:
    small = ((2, 4, 4, 8), (3, 3, 8, 8), (1, 1), 'SAME')
    assert conv_lib.output_positions(*small) <= above
    assert conv_lib.choose('auto', *small, 'cpu', dtype) == 'taps'


@pytest.mark.parametrize('name', onednn.DTYPES)
def test_the_dtypes_onednn_reports_are_those_its_calls_run_in(name):
  """`onednn.dtypes()` asks oneDNN for a small convolution's primitives; a call of the FFI
  handlers themselves in each dtype runs where it says so and fails where it does not (an
  AVX2-only CPU has no bfloat16 kernels: every such call failed at run time before)."""
  x, w = _inputs(dtype=jnp.dtype(name))
  call = jax.jit(lambda x, w: onednn._conv(x, w, (1, 1), ((1, 1), (1, 1))))
  if name in onednn.dtypes():
    assert onednn.native_reason(name) == '' and onednn.computes_in(name) == jnp.dtype(name)
    assert call(x, w).dtype == jnp.dtype(name)
  else:
    assert name == 'bfloat16' and onednn.isa() in onednn.native_reason(name)
    with pytest.raises(jax.errors.JaxRuntimeError, match='primitive descriptor'):
      call(x, w).block_until_ready()


def test_without_bfloat16_kernels_bfloat16_is_computed_in_float32_and_rounded_once(monkeypatch):
  """Where oneDNN has no bfloat16 kernels (here pretended: the CPU's answer replaced), a
  bfloat16 convolution runs oneDNN's float32 passes on the bfloat16 values — exact products,
  float32 sums — and rounds each pass's result to bfloat16 once; `auto` takes float32's
  threshold for it and says why."""
  monkeypatch.setattr(onednn, '_dtype_support', lambda: {'float32': '', 'bfloat16': 'none (a test)'})
  said = []
  monkeypatch.setattr(conv_lib, '_say_once', said.append)
  assert onednn.dtypes() == ('float32',) and onednn.computes_in(jnp.bfloat16) == jnp.float32
  big, small = ((2, 32, 32, 3), (3, 3, 3, 8)), ((2, 4, 4, 8), (3, 3, 8, 8))
  assert conv_lib.choose('auto', *big, (1, 1), 'SAME', 'cpu', jnp.bfloat16) == 'onednn'
  assert conv_lib.choose('auto', *small, (1, 1), 'SAME', 'cpu', jnp.bfloat16) == 'taps'
  assert any('none (a test)' in line and 'in float32' in line for line in said)

  x, w = _inputs(dtype=jnp.bfloat16)
  value_and_grads = lambda conv: jax.value_and_grad(
      lambda x, w: _loss(conv, x, w).astype(jnp.float32), argnums=(0, 1))
  text = jax.jit(value_and_grads(conv_lib.conv_onednn)).lower(x, w).compile().as_text()
  calls = [line for line in text.splitlines() if 'custom_call_target="jaxpar_onednn' in line]
  assert len(calls) == 3 and all(' f32[' in line and 'bf16[' not in line.split('custom-call')[0]
                                 for line in calls)
  (got, got_grads) = jax.jit(value_and_grads(conv_lib.conv_onednn))(x, w)
  y = conv_lib.conv_onednn(x, w, (2, 2), ((1, 1), (1, 1)), dimension_numbers=DN)
  assert y.dtype == jnp.bfloat16
  # XLA's convolution of the same bfloat16 values in float32, rounded once: equal but where
  # the two float32 sums, in other orders, round to neighbouring bfloat16 numbers.
  want_y = lax.conv_general_dilated(x.astype(jnp.float32), w.astype(jnp.float32), (2, 2),
                                    ((1, 1), (1, 1)), dimension_numbers=DN).astype(jnp.bfloat16)
  ulp = 2.0 ** -7 * np.abs(np.asarray(want_y, np.float32)).max()
  assert np.abs(np.asarray(y, np.float32) - np.asarray(want_y, np.float32)).max() <= ulp
  want, want_grads = jax.jit(value_and_grads(lax.conv_general_dilated))(x, w)
  np.testing.assert_allclose(float(got), float(want), rtol=2e-2)
  for g, h in zip(got_grads, want_grads):
    assert g.dtype == jnp.bfloat16
    g, h = np.asarray(g, np.float32), np.asarray(h, np.float32)
    assert np.abs(g - h).max() <= 2e-2 * np.abs(h).max()


def test_auto_without_a_dtype_is_a_float32_steps_choice():
  for shape in ((2, 32, 32, 3), (2, 4, 4, 3)):
    args = (shape, (3, 3, 3, 8), (1, 1), 'SAME', 'cpu')
    assert conv_lib.choose('auto', *args) == conv_lib.choose('auto', *args, jnp.float32)
  # A dtype oneDNN does not compute keeps the lowerings before it.
  assert conv_lib.choose('auto', (2, 32, 32, 3), (3, 3, 3, 8), (1, 1), 'SAME', 'cpu',
                         jnp.float16) == 'xla'


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16])
def test_a_kernel_gradient_ignores_what_an_earlier_call_left_in_the_scratchpad(dtype):
  """ResNet34's stage 4 at 16²: a 3×3 stride-2 convolution of a 1×1 map. oneDNN 3.2's
  backward-weights kernel reads scratchpad it did not write there, so after another call
  had left large values in the thread's scratchpad the kernel's gradient was 2000 times
  its own size off (bfloat16); each call now gets its scratchpad zeroed. (On a CPU without
  oneDNN's bfloat16 kernels the bfloat16 case runs float32's.)"""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(8, 1, 1, 256)), dtype)
  w = jnp.asarray(rng.normal(size=(3, 3, 256, 512)), dtype)
  big_x = jnp.asarray(1000 * rng.normal(size=(8, 2, 2, 512)), dtype)
  big_w = jnp.asarray(rng.normal(size=(3, 3, 512, 512)), dtype)

  def grad_of_sum(conv, x, w, strides):  # ∂Σy/∂w: the same ones as ∂L/∂y for both
    return jax.grad(lambda w: jnp.sum(conv(x, w, strides, ((1, 1), (1, 1)),
                                           dimension_numbers=DN).astype(jnp.float32)))(w)

  kernel_grad = jax.jit(functools.partial(grad_of_sum, conv_lib.conv_onednn), static_argnums=2)
  want = np.asarray(grad_of_sum(lax.conv_general_dilated, x.astype(jnp.float32),
                                w.astype(jnp.float32), (2, 2)))
  tolerance = 1e-4 if dtype == jnp.float32 else 1e-2
  for _ in range(3):
    kernel_grad(big_x, big_w, (1, 1)).block_until_ready()  # leaves its scratchpad behind
    got = np.asarray(kernel_grad(x, w, (2, 2))).astype(np.float32)
    assert np.abs(got - want).max() <= tolerance * np.abs(want).max()


def test_on_a_mesh_every_device_runs_its_own_calls_at_once():
  # Eight emulated devices call the handlers from eight threads at the same time, with one
  # cached primitive per pass: each must get its own shard's convolution and gradients.
  mesh = jax.make_mesh((8,), ('data',))
  x, w = _inputs(n=16, hw=12, c=8, d=16)
  x = jax.device_put(x, NamedSharding(mesh, P('data')))

  def grads(conv, cast):
    def per_device(x, w):
      # As jaxpar's step differentiates a varying copy of replicated parameters; without
      # the cast the call casts the kernel itself (`onednn._call`).
      w = jax.lax.pcast(w, 'data', to='varying') if cast else w
      y = conv(x, w, (2, 2), ((1, 1), (1, 1)), dimension_numbers=DN)
      g = jax.grad(functools.partial(_loss, conv), argnums=(0, 1))(x, w)
      return y, g[0], jax.lax.psum(g[1], 'data')
    return jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P('data'), P()),
                                 out_specs=(P('data'), P('data'), P())))(x, w)
  # Uncast, the kernel's gradient is summed over the devices by JAX itself (then 8× by
  # the psum above), as for XLA's convolution.
  want = {cast: grads(lax.conv_general_dilated, cast) for cast in (True, False)}
  for cast in (True, False, True):
    for g, v in zip(grads(conv_lib.conv_onednn, cast), want[cast]):
      np.testing.assert_allclose(g, v, rtol=0, atol=1e-5 * float(np.abs(v).max()))


def test_an_auto_sharded_jit_splits_each_call_over_the_batch():
  # Where XLA partitions the program (a flax user's jit over a mesh), each device calls
  # oneDNN on its shard of the batch — no operand gathered, the kernel's gradient the sum
  # of the devices' parts — and the results are XLA's convolution's.
  from jaxpar.mesh import make_mesh
  mesh = make_mesh((8,), ('data',))
  x, w = _inputs(n=16, hw=12, c=8, d=16)
  x = jax.device_put(x, NamedSharding(mesh, P('data')))
  w = jax.device_put(w, NamedSharding(mesh, P()))

  def step(conv):
    return jax.jit(jax.value_and_grad(functools.partial(_loss, conv), argnums=(0, 1)))
  text = step(conv_lib.conv_onednn).lower(x, w).compile().as_text()
  calls = [line for line in text.splitlines() if 'custom_call_target="jaxpar_onednn' in line]
  assert len(calls) == 3 and 'all-gather' not in text
  forward, input_grad, kernel_grad = (
      next(c for c in calls if f'jaxpar_onednn_{name}"' in c)
      for name in ('forward', 'input_grad', 'kernel_grad'))
  assert 'f32[2,6,6,16]' in forward and 'f32[2,12,12,8]' in input_grad  # 16 images / 8
  assert 'f32[3,3,8,16]' in kernel_grad
  got, want = step(conv_lib.conv_onednn)(x, w), step(lax.conv_general_dilated)(x, w)
  for g, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, v, rtol=0, atol=1e-5 * float(np.abs(v).max()))
  assert got[1][0].sharding.spec == P('data') and got[1][1].sharding.spec == P()


@pytest.mark.parametrize('shape,axes,x_spec,w_spec', [
    ((8,), ('data',), P('data'), P()),
    # The batch over one axis, the kernel's outputs over the other: the call gathers the
    # kernel, and its gradient comes back split as the kernel is.
    ((2, 4), ('x', 'y'), P('x'), P(None, None, None, 'y')),
])
@pytest.mark.parametrize('context', [True, False], ids=['set_mesh', 'no_context'])
def test_over_explicit_mesh_axes_each_call_takes_its_devices_shard(shape, axes, x_spec, w_spec,
                                                                   context):
  # `jax.make_mesh`'s axes are Explicit (sharding in types): every result's type must say
  # its sharding and a gradient must have its input's type, which an FFI call cannot say by
  # itself. Each call runs on its device's shard of the batch; the values are XLA's. With
  # the mesh set (`jax.set_mesh`, as flax's examples do) the custom VJP's gradient was
  # untyped and JAX refused it.
  mesh = jax.make_mesh(shape, axes, axis_types=(jax.sharding.AxisType.Explicit,) * len(axes))
  x, w = _inputs(n=16, hw=12, c=8, d=16)
  x = jax.device_put(x, NamedSharding(mesh, x_spec))
  w = jax.device_put(w, NamedSharding(mesh, w_spec))

  def step(conv):
    return jax.jit(jax.value_and_grad(functools.partial(_loss, conv), argnums=(0, 1)))
  with jax.set_mesh(mesh) if context else contextlib.nullcontext():
    text = step(conv_lib.conv_onednn).lower(x, w).compile().as_text()
    got = step(conv_lib.conv_onednn)(x, w)
  calls = [line for line in text.splitlines() if 'custom_call_target="jaxpar_onednn' in line]
  assert len(calls) == 3
  images = 16 // mesh.shape[x_spec[0]]
  assert f'f32[{images},6,6,16]' in next(c for c in calls if 'jaxpar_onednn_forward"' in c)
  # XLA's convolution on one device (over these axes it asks for the result's sharding).
  want = step(lax.conv_general_dilated)(np.asarray(x), np.asarray(w))
  for g, v in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, v, rtol=0, atol=1e-5 * float(np.abs(v).max()))
  assert jax.typeof(got[1][0]).sharding.spec == jax.typeof(x).sharding.spec
  assert jax.typeof(got[1][1]).sharding.spec == jax.typeof(w).sharding.spec


def _team_calls_since(before):
  now = onednn.calls_by_team()
  return {t: n - before.get(t, 0) for t, n in now.items() if n - before.get(t, 0)}


def _eight_devices_step():
  """Both gradients of a oneDNN convolution under `shard_map` over the tests' 8 devices (each
  calls oneDNN on its share of the batch), and its inputs."""
  mesh = jax.make_mesh((8,), ('data',))
  x, w = _inputs(n=16, hw=12, c=8, d=16)
  x = jax.device_put(x, NamedSharding(mesh, P('data')))
  step = jax.jit(jax.shard_map(
      lambda x, w: jax.grad(functools.partial(_loss, conv_lib.conv_onednn), argnums=(0, 1))(
          x, jax.lax.pcast(w, 'data', to='varying')),
      mesh=mesh, in_specs=(P('data'), P()), out_specs=(P('data'), P('data'))))
  return step, x, w


@pytest.mark.parametrize('share', [True, False])
def test_the_devices_of_a_mesh_share_the_openmp_threads(share):
  # Eight devices call at once (the tests' process has 8): with sharing each call takes
  # max(1, T / 8) of the T threads, without all T; every call says 8 (an attribute). The
  # results equal XLA's either way, and the same step gives the same bits again (the team
  # is fixed by the program, not by the timing of the calls).
  step, x, w = _eight_devices_step()
  assert step.lower(x, w).as_text().count('callers = 8 : i64') == 3
  want = jax.jit(jax.grad(functools.partial(_loss, lax.conv_general_dilated), argnums=(0, 1)))
  jax.block_until_ready(step(x, w))  # compiled, and each plan made, outside the count
  try:
    onednn.share_threads(share)
    before = onednn.calls_by_team()
    got = [jax.block_until_ready(step(x, w)) for _ in range(3)]
    teams = _team_calls_since(before)
  finally:
    onednn.share_threads(True)
  all_threads = onednn.threads()
  assert teams == {(max(1, all_threads // 8) if share else all_threads): 3 * 8 * 3}
  for again in got[1:]:
    for a, b in zip(got[0], again):
      np.testing.assert_array_equal(a, b)
  dx, dw = want(jnp.asarray(np.asarray(x)), w)
  np.testing.assert_allclose(got[0][0], dx, rtol=0, atol=1e-5 * float(np.abs(dx).max()))
  np.testing.assert_allclose(np.asarray(got[0][1]).reshape(8, *w.shape).sum(0), dw, rtol=0,
                             atol=1e-4 * float(np.abs(dw).max()))


def test_no_more_calls_run_at_once_than_the_cores_hold_teams():
  # Eight devices call at once, each call here a team of all T threads (sharing off): the
  # gate lets T / T = 1 run at a time, the others wait; ungated (the default), the eight ran
  # together (8 teams of T on T cores). The same bits either way: a call's team never changes.
  step, x, w = _eight_devices_step()
  jax.block_until_ready(step(x, w))  # compiled outside the count
  most, got = {}, {}
  try:
    onednn.share_threads(False)
    for gated in (True, False):
      onednn.gate(gated)
      onednn.most_in_flight(reset=True)
      got[gated] = [jax.block_until_ready(step(x, w)) for _ in range(5)]
      most[gated] = onednn.most_in_flight()
  finally:
    onednn.share_threads(True)
    onednn.gate(False)
  assert most[True] == 1 and most[False] > 1, most
  for again in got[True][1:] + got[False]:
    for a, b in zip(got[True][0], again):
      np.testing.assert_array_equal(a, b)


def test_a_program_on_one_device_shares_as_the_process_devices_do():
  # A one-device program in a process of D CPU devices takes T / D too: its calls cannot
  # tell whether other devices run at the same time.
  x, w = _inputs()
  before = onednn.calls_by_team()
  jax.block_until_ready(jax.jit(jax.grad(functools.partial(_loss, conv_lib.conv_onednn),
                                         argnums=(0, 1)))(x, w))
  want = max(1, onednn.threads() // jax.local_device_count())
  assert _team_calls_since(before) == {want: 3}


def test_hlo_flops_counts_each_pass_as_pytorch_counts_a_convolution():
  x, w = _inputs()
  text = jax.jit(jax.grad(functools.partial(_loss, conv_lib.conv_onednn), argnums=(0, 1))).lower(
      x, w).compile().as_text()
  # Output 2×5×5×4, kernel 3×3×3: 2·200·27 per pass, three passes.
  assert onednn.hlo_flops(text) == 3 * 2 * (2 * 5 * 5 * 4) * (3 * 3 * 3)
  assert onednn.hlo_flops(jax.jit(functools.partial(_loss, lax.conv_general_dilated)).lower(
      x, w).compile().as_text()) == 0


def test_the_library_is_built_once_per_source_and_jaxlib(tmp_path, monkeypatch):
  monkeypatch.setenv('JAXPAR_CACHE_DIR', str(tmp_path))
  parts, why = onednn._ingredients()
  assert parts, why
  first = onednn._build(parts)
  assert first.startswith(str(tmp_path)) and first.endswith('.so')
  stamp = (tmp_path / 'onednn').stat().st_mtime_ns, len(list((tmp_path / 'onednn').iterdir()))
  assert onednn._build(parts) == first  # cached: nothing built again
  assert ((tmp_path / 'onednn').stat().st_mtime_ns,
          len(list((tmp_path / 'onednn').iterdir()))) == stamp
  monkeypatch.setattr(onednn, 'SOURCE', str(tmp_path / 'broken.cc'))
  (tmp_path / 'broken.cc').write_text('this is not C++\n')
  with pytest.raises(RuntimeError, match='broken.cc failed'):
    onednn._build(parts)
  assert sorted(p.name for p in (tmp_path / 'onednn').iterdir()) == [first.split('/')[-1]]


def test_where_onednn_cannot_run_auto_says_why_and_takes_the_rule(monkeypatch):
  monkeypatch.setenv('JAXPAR_ONEDNN', '0')
  assert onednn._ingredients() == (None, 'JAXPAR_ONEDNN=0 turns them off')
  monkeypatch.setattr(onednn, '_load', lambda: (False, 'no compiler (a test)'))
  said = []
  monkeypatch.setattr(conv_lib, '_say_once', said.append)
  assert not onednn.available() and onednn.unavailable_reason() == 'no compiler (a test)'
  args = ((2, 32, 32, 3), (3, 3, 3, 8), (1, 1), 'SAME')
  assert conv_lib.choose('auto', *args, 'cpu', jnp.float32) == 'xla'
  assert said and 'no compiler (a test)' in said[0]
  # `onednn` named explicitly computes by XLA's convolution then.
  x, w = _inputs()
  text = jax.jit(functools.partial(_loss, conv_lib.conv_onednn)).lower(x, w).as_text()
  assert 'jaxpar_onednn' not in text and 'convolution' in text


def test_other_dtypes_and_mixed_inputs():
  x, w = _inputs(dtype=jnp.float16)
  text = jax.jit(functools.partial(_loss, conv_lib.conv_onednn)).lower(x, w).as_text()
  assert 'jaxpar_onednn' not in text  # float16: XLA's
  x, w = _inputs(dtype=jnp.bfloat16)
  y = conv_lib.conv_onednn(x, w, (1, 1), 'SAME', dimension_numbers=DN,
                           preferred_element_type=jnp.float32)
  want = lax.conv_general_dilated(x, w, (1, 1), 'SAME', dimension_numbers=DN,
                                  preferred_element_type=jnp.float32)
  assert y.dtype == jnp.float32  # computed in float32: as exact as XLA's
  np.testing.assert_allclose(y, want, rtol=0, atol=1e-6 * float(np.abs(want).max()))


def test_the_per_op_profile_counts_the_calls_as_convolutions():
  from analysis.benchmarks.profile import categories
  x, w = _inputs()
  text = jax.jit(jax.grad(functools.partial(_loss, conv_lib.conv_onednn), argnums=(0, 1))).lower(
      x, w).compile().as_text()
  found = categories(text)
  assert sorted(v for v in found.values() if v == 'convolution') == ['convolution'] * 3


def test_openmp_threads_sleep_between_calls_unless_told_otherwise(monkeypatch):
  import os
  monkeypatch.delenv('OMP_WAIT_POLICY', raising=False)
  with onednn._wait_policy():  # while the library loads
    assert os.environ['OMP_WAIT_POLICY'] == 'PASSIVE'
  assert 'OMP_WAIT_POLICY' not in os.environ  # PyTorch's OpenMP, loaded later, keeps its own
  monkeypatch.setenv('OMP_WAIT_POLICY', 'ACTIVE')
  with onednn._wait_policy():
    assert os.environ['OMP_WAIT_POLICY'] == 'ACTIVE'
  assert os.environ['OMP_WAIT_POLICY'] == 'ACTIVE'


def test_asking_for_onednn_where_it_cannot_run_is_a_config_error(monkeypatch):
  from jaxpar import config as config_lib
  from jaxpar import validation
  c = config_lib.defaults()
  c.conv_impl = 'onednn'
  validation.validate(c)  # it runs here
  monkeypatch.setattr(onednn, '_load', lambda: (False, 'no compiler (a test)'))
  c = config_lib.defaults()
  c.conv_impl = 'onednn'
  with pytest.raises(config_lib.ConfigError, match=r"config.conv_impl='onednn' is invalid: .*"
                     r"no compiler \(a test\).*'auto'"):
    validation.validate(c)
  c.conv_impl = 'auto'
  validation.validate(c)  # auto takes the other lowerings


def test_a_missing_compiler_is_a_reason_not_a_crash(tmp_path, monkeypatch):
  monkeypatch.setenv('JAXPAR_CACHE_DIR', str(tmp_path))
  parts, _ = onednn._ingredients()
  with pytest.raises(RuntimeError, match='failed'):
    onednn._build({**parts, 'compiler': str(tmp_path / 'no-such-g++')})
  assert list((tmp_path / 'onednn').iterdir()) == []
