"""oneDNN's convolution on JAX's CPU backend: `conv_onednn`, an exact lowering of

    y[n, a, b, :] = Σ_{i<kh, j<kw} x̃[n, a·sh + i, b·sw + j, :] @ w[i, j]

(x̃ the padded NHWC input, w the HWIO kernel; `jaxpar/models/conv.py`), with its two
gradients

    ∂L/∂x = the transposed convolution of ∂L/∂y with w,   ∂L/∂w[i, j] = Σ_{n,a,b} x̃ᵀ ∂L/∂y,

each computed by oneDNN's primitive for that pass (`convolution_forward`,
`convolution_backward_data`, `convolution_backward_weights`) — the library PyTorch's CPU
convolutions run on. XLA's CPU convolutions are slower than those on large maps (ResNet34
at 224²: 0.32 s of convolution a step against PyTorch's 0.14 s; docs/performance.md), and
XLA has no switch to use them (`--xla_cpu_use_onednn` was tried: slower).

How: `onednn_conv.cc` (beside this file) is three XLA FFI handlers that describe each
convolution to oneDNN, let it choose its weights' layout, reorder and run its primitive;
it holds no arithmetic of its own. It is compiled on first use against the running
jaxlib's FFI headers (`jax.ffi.include_dir()`) and the oneDNN wheel's library and headers
(`onednn-cpu-gomp`, `onednn-devel-cpu-gomp`: oneDNN 3.2 on GNU OpenMP, dependencies of
jaxpar on Linux x86-64), cached under `~/.cache/jaxpar/onednn/` keyed by what it was built
from, and registered as FFI targets for the CPU platform. `available()` says whether that
can be done here, and why not (no compiler, no wheel, another platform); `conv_impl`
falls back to the other lowerings then, saying so once.

Threads: each thread that calls oneDNN leads its own OpenMP team of T threads, and the
D CPU devices of a process (emulated devices) run their steps at once, under `shard_map` or
an auto-sharded `jit`: each call takes max(1, T / D) threads, so they share the cores
instead of oversubscribing them (`share_threads(False)`: every call takes T;
docs/performance.md). D is fixed for the process, never by how many calls happen to run at
the moment: oneDNN's sums depend on its team, and results must not depend on timing. XLA
also runs a program's independent instructions at once (an Inception module's branches, a
layer's two gradients), each call on its own thread, so two teams may share the cores;
`gate(True)` lets at most T / team calls run at once (off by default: docs/performance.md).

Meshes: inside `shard_map` (jaxpar's step) each device calls oneDNN on its own shard. Where
XLA partitions the program instead (an auto-sharded `jit` over a mesh), each pass carries a
partitioning rule (`custom_partitioning`): the batch stays split, every other dimension
whole, and the kernel's gradient is each device's part summed by a psum. Without it XLA
gathered the operands and ran every call on the whole batch on every device. Over Explicit
axes (`jax.make_mesh`'s default: sharding in types, where every result's type must say its
split and an FFI call's cannot) each pass is a `shard_map` over the batch's axes, as in
jaxpar's step, and each gradient is given its input's type (`models/explicit.py`).

float32 and bfloat16 (oneDNN's bf16 kernels accumulate in float32 and round once, as XLA's
convolution does; on a CPU without oneDNN's bfloat16 kernels, an AVX2-only one, in float32
rounded once: `computes_in`); other dtypes, dilations, groups and negative padding go to XLA's
convolution, as for every lowering (`conv._lowering`).
"""
import contextlib
import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import jax
import jax.experimental.custom_partitioning
import jaxlib
import numpy as np
from absl import logging

from jaxpar.models import explicit

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'onednn_conv.cc')
DTYPES = ('float32', 'bfloat16')
_TARGETS = {'forward': 'JaxparOnednnConvForward', 'input_grad': 'JaxparOnednnConvInputGrad',
            'kernel_grad': 'JaxparOnednnConvKernelGrad'}


def _prefixes():
  """Where a wheel's data files land: this environment's prefix (a venv), the base
  prefix, the user scheme."""
  seen = []
  for p in (sys.prefix, sys.base_prefix, sysconfig.get_config_var('userbase') or ''):
    if p and p not in seen:
      seen.append(p)
  return seen


def _find(relative: str) -> str | None:
  for p in _prefixes():
    path = os.path.join(p, relative)
    if os.path.exists(path):
      return path
  return None


def _ingredients() -> tuple[dict | None, str]:
  """(what the library is built from, '') or (None, why it cannot be built here)."""
  if os.environ.get('JAXPAR_ONEDNN', '1') == '0':
    return None, 'JAXPAR_ONEDNN=0 turns them off'
  if sys.platform != 'linux':
    return None, f'oneDNN convolutions are built on Linux only (this is {sys.platform})'
  lib = _find(os.path.join('lib', 'libdnnl.so.3'))
  header = _find(os.path.join('include', 'oneapi', 'dnnl', 'dnnl.hpp'))
  if not lib or not header:
    return None, ("oneDNN's wheels are not installed (pip install onednn-cpu-gomp "
                  'onednn-devel-cpu-gomp; jaxpar depends on them on Linux x86-64)')
  compiler = os.environ.get('CXX') or shutil.which('g++') or shutil.which('c++')
  if not compiler:
    return None, 'no C++ compiler to build the oneDNN convolutions (set CXX, or install g++)'
  try:
    ffi_include = jax.ffi.include_dir()
  except AttributeError:
    return None, f'jax {jax.__version__} has no jax.ffi.include_dir()'
  return dict(lib=os.path.realpath(lib), include=os.path.dirname(os.path.dirname(
      os.path.dirname(header))), ffi_include=ffi_include, compiler=compiler), ''


def _cache_dir() -> str:
  from jaxpar import user_cache
  return user_cache.folder('onednn')


def _build(parts: dict) -> str:
  """The compiled library's path, built once per (source, jaxlib, oneDNN, compiler): the
  name is a hash of them. Raises RuntimeError where the compiler fails or is missing."""
  with open(SOURCE, 'rb') as f:
    source = f.read()
  key = hashlib.sha256(b'\0'.join([source, jaxlib.__version__.encode(), parts['lib'].encode(),
                                   parts['ffi_include'].encode(), parts['compiler'].encode()]))
  out = os.path.join(_cache_dir(), f'libjaxpar_onednn-{key.hexdigest()[:16]}.so')
  if os.path.exists(out):
    return out
  os.makedirs(os.path.dirname(out), exist_ok=True)
  # Built beside its name and renamed into place: two processes building at once (the
  # suite's workers) each rename a whole library.
  fd, tmp = tempfile.mkstemp(suffix='.so', dir=os.path.dirname(out))
  os.close(fd)
  command = [parts['compiler'], '-O2', '-fopenmp', '-std=c++17', '-shared', '-fPIC', '-w',
             '-I' + parts['ffi_include'], '-I' + parts['include'], SOURCE, parts['lib'],
             '-Wl,-rpath,' + os.path.dirname(parts['lib']), '-o', tmp]
  logging.info('Building the oneDNN convolutions: %s', ' '.join(command))
  try:
    subprocess.run(command, check=True, capture_output=True, text=True)
  except (subprocess.CalledProcessError, OSError) as e:
    os.unlink(tmp)
    raise RuntimeError(f'building {SOURCE} failed:\n'
                       + str(getattr(e, 'stderr', None) or e)[-4000:]) from e
  os.replace(tmp, out)
  return out


@contextlib.contextmanager
def _wait_policy():
  """While oneDNN's library loads, OMP_WAIT_POLICY=PASSIVE unless it is set: oneDNN's OpenMP
  threads then sleep when a convolution ends instead of spinning on the cores XLA's threads
  need for the ops between (2 cores: GoogLeNet's step at 224² 0.911 → 0.935× PyTorch's,
  SqueezeNet's 0.735 → 0.847×, ResNet34's level; docs/performance.md). GNU OpenMP reads it
  once, when it loads; the variable is restored after, so that another runtime loaded later
  (PyTorch's own OpenMP) and child processes keep their defaults."""
  if 'OMP_WAIT_POLICY' in os.environ:
    logging.info('oneDNN convolutions: OMP_WAIT_POLICY=%s (set before jaxpar)',
                 os.environ['OMP_WAIT_POLICY'])
    yield
    return
  with open('/proc/self/maps') as f:
    loaded = 'libgomp.so.1' in f.read()
  logging.info('oneDNN convolutions: OMP_WAIT_POLICY=PASSIVE for their OpenMP threads (set '
               'OMP_WAIT_POLICY to override)%s', ' — too late: GNU OpenMP was loaded before, '
               'and keeps its policy' if loaded else '')
  os.environ['OMP_WAIT_POLICY'] = 'PASSIVE'
  try:
    yield
  finally:
    del os.environ['OMP_WAIT_POLICY']


@functools.cache
def _load() -> tuple[bool, str]:
  """(True, the library's path) once the handlers are registered, or (False, why not)."""
  parts, why = _ingredients()
  if parts is None:
    return False, why
  try:
    path = _build(parts)
    with _wait_policy():
      lib = ctypes.cdll.LoadLibrary(path)
  except (OSError, RuntimeError) as e:
    return False, str(e)
  for name, symbol in _TARGETS.items():
    jax.ffi.register_ffi_target(f'jaxpar_onednn_{name}', jax.ffi.pycapsule(getattr(lib, symbol)),
                                platform='cpu')
  logging.info('oneDNN convolutions: %s', path)
  return True, path


@functools.cache
def _library_functions():
  """The built library's own C functions (None where `available()` is False)."""
  ok, path = _load()
  if not ok:
    return None
  lib = ctypes.cdll.LoadLibrary(path)  # the handle `_load` opened, not a second copy
  lib.JaxparOnednnCalls.restype = ctypes.c_longlong
  lib.JaxparOnednnSupports.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
  return lib


def share_threads(on: bool) -> None:
  """Whether the calls of a process's devices take a share of the OpenMP threads each (the
  default) or all of them (module doc); for measuring the difference."""
  if lib := _library_functions():
    lib.JaxparOnednnShareThreads(int(on))


def gate(on: bool) -> None:
  """Whether at most T / team oneDNN calls run at once in this process, the others waiting,
  or as many as XLA's threads start (the default; module doc); for measuring the
  difference."""
  if lib := _library_functions():
    lib.JaxparOnednnGate(int(on))


def most_in_flight(reset: bool = False) -> int:
  """The most oneDNN calls seen running at once in this process (since the last reset)."""
  lib = _library_functions()
  return lib.JaxparOnednnMostInFlight(int(reset)) if lib else 0


def threads() -> int:
  """T: the OpenMP threads a call takes alone (0 where oneDNN cannot run here)."""
  lib = _library_functions()
  return lib.JaxparOnednnThreads() if lib else 0


def calls_by_team() -> dict:
  """{OpenMP threads: how many oneDNN passes ran with that many} in this process so far."""
  lib = _library_functions()
  if not lib:
    return {}
  return {t: n for t in range(1, 257) if (n := lib.JaxparOnednnCalls(t))}


def available() -> bool:
  """Whether oneDNN's convolutions can run here (built and registered on first call)."""
  return _load()[0]


def library() -> str:
  """The built library's path ('' where `available()` is False)."""
  ok, path = _load()
  return path if ok else ''


def unavailable_reason() -> str:
  """Why `available()` is False ('' where it is True)."""
  ok, why = _load()
  return '' if ok else why


# oneDNN's ISAs by their dnnl_cpu_isa_t value (oneDNN 3.2's dnnl_types.h).
_ISAS = {0x0: 'default', 0x1: 'sse41', 0x3: 'avx', 0x7: 'avx2', 0xf: 'avx2_vnni',
         0x1f: 'avx2_vnni_2', 0x27: 'avx512_core', 0x67: 'avx512_core_vnni',
         0xe7: 'avx512_core_bf16', 0x1ef: 'avx512_core_fp16', 0xfef: 'avx512_core_amx',
         0x1fef: 'avx512_core_amx_fp16'}


def isa() -> str:
  """The instruction set oneDNN's kernels use on this CPU ('' where `available()` is False)."""
  lib = _library_functions()
  if not lib:
    return ''
  value = lib.JaxparOnednnIsa()
  return _ISAS.get(value, hex(value))


@functools.cache
def _dtype_support() -> dict:
  """{dtype name: '' where oneDNN makes all three passes of its convolutions on this CPU,
  else why not}, asked of oneDNN itself (`JaxparOnednnSupports`: a small convolution's
  primitive descriptors). oneDNN 3.2's bfloat16 convolutions need bfloat16 instructions or
  AVX-512 to emulate them: on an AVX2-only CPU (an AMD EPYC of the Zen 3 generation) it
  makes none, and every bfloat16 call failed at run time before this was asked."""
  lib = _library_functions()
  if not lib:
    return {name: unavailable_reason() for name in DTYPES}
  support = {}
  for code, name in enumerate(DTYPES):  # the C function's codes: 0 float32, 1 bfloat16
    why = ctypes.create_string_buffer(512)
    ok = lib.JaxparOnednnSupports(code, why, len(why))
    support[name] = '' if ok else (
        f'oneDNN has no {name} convolution for this CPU (its ISA here: {isa()}; '
        f'oneDNN: {why.value.decode(errors="replace")})')
  return support


def dtypes() -> tuple:
  """The dtypes oneDNN has convolution kernels of on this CPU: of `DTYPES`, those it makes
  every pass for (float32 always; bfloat16 where the CPU has it); () where not available."""
  return tuple(name for name, why in _dtype_support().items() if not why)


def native_reason(dtype) -> str:
  """Why oneDNN has no kernels of `dtype` here ('' where it has)."""
  name = np.dtype(dtype).name
  if name not in DTYPES:
    return f'oneDNN convolutions compute {" and ".join(DTYPES)} only, not {name}'
  return _dtype_support()[name]


def computes_in(dtype) -> np.dtype | None:
  """The dtype `conv_onednn` computes a convolution of `dtype` in: `dtype` itself where oneDNN
  has kernels of it on this CPU; for bfloat16 where it has none, float32, each pass's result
  rounded to bfloat16 once — the sums oneDNN's bfloat16 kernels make (they multiply and
  accumulate in float32, and a product of two bfloat16 numbers is exact in float32), in
  twice the bytes; None for any other dtype (XLA's convolution computes it)."""
  name = np.dtype(dtype).name
  if name not in DTYPES or not available():
    return None
  if name in dtypes():
    return np.dtype(name)
  return np.dtype('float32') if name == 'bfloat16' and 'float32' in dtypes() else None


def _varying(x):
  return jax.typeof(x).manual_axis_type.varying


def _same_varying(a, b):
  """Inside `shard_map` an FFI call's operands must vary over the same mesh axes: the one
  replicated over an axis the other varies over (a kernel beside a batch shard) is cast to
  varying there (its gradient is then summed over that axis by the cast's transpose)."""
  axes = _varying(a) | _varying(b)
  return tuple(jax.lax.pcast(t, tuple(sorted(axes - _varying(t))), to='varying')
               if axes - _varying(t) else t for t in (a, b))


def _callers() -> int:
  """How many devices of this process may make this call at once: its CPU devices (a mesh
  of emulated devices runs them all at once, under `shard_map` or an auto-sharded `jit`)."""
  return max(1, jax.local_device_count('cpu'))


def _ffi(name, a, b, shape, strides, pads, typed: bool = True):
  """One handler's call; its result is typed as varying over the operands' mesh axes
  (`manual_axis_type`; `_same_varying` made them the same), or untyped (`typed=False`:
  on a device's shard of a partitioned call)."""
  (pt, pb), (pl, pr) = pads
  aval = jax.typeof(a)
  result = (jax.ShapeDtypeStruct(shape, a.dtype, sharding=aval.sharding,
                                 manual_axis_type=aval.manual_axis_type) if typed
            else jax.ShapeDtypeStruct(shape, a.dtype))
  return jax.ffi.ffi_call(f'jaxpar_onednn_{name}', result, vmap_method='sequential')(
      a, b, strides=np.asarray(strides, np.int64), padding=np.asarray([pt, pb, pl, pr], np.int64),
      callers=np.int64(_callers()))


def _call(name, a, b, shape, strides, pads):
  """A pass's call: as it is inside `shard_map` (each device's shard is its own), over the
  batch's mesh axes where the operands' types carry their sharding (`_sharded_in_types`),
  and partitioned over the batch where XLA partitions the program (`_partitioned`)."""
  if jax.sharding.get_abstract_mesh().manual_axes:
    return _ffi(name, a, b, shape, strides, pads)
  if explicit.sharded(a) or explicit.sharded(b):
    return _sharded_in_types(name, a, b, shape, strides, pads)
  return _partitioned(a, b, name, tuple(shape), strides, pads)


def _sharded_in_types(name, a, b, shape, strides, pads):
  """Over Explicit mesh axes, where every operation's result type must say its sharding
  (an FFI call's cannot): each device calls oneDNN on its shard of the batch in a
  `shard_map` over the mesh of the operands' types, as in jaxpar's step (`_per_shard`).
  The batch stays split over the axes `a`'s batch is split over; any other dimension
  split is gathered first (by `reshard`)."""
  mesh = jax.typeof(a if explicit.sharded(a) else b).sharding.mesh
  in_specs, out_spec, call = _per_shard(name, _batch_axes(jax.typeof(a).sharding), shape,
                                        strides, pads, typed=True)
  a, b = (jax.sharding.reshard(t, jax.sharding.NamedSharding(mesh, spec))
          for t, spec in zip((a, b), in_specs))
  return jax.shard_map(lambda a, b: call(*_same_varying(a, b)), mesh=mesh,
                       in_specs=in_specs, out_specs=out_spec)(a, b)


def _typed_like(t, reference):
  """`t` resharded to `reference`'s type where types carry sharding (a gradient must have
  its primal input's type)."""
  if not (explicit.sharded(t) or explicit.sharded(reference)):
    return t
  return jax.sharding.reshard(t, jax.typeof(reference).sharding)


# Where XLA partitions a program (an auto-sharded `jit` over a mesh), a custom call without
# a rule runs whole on every device: the partitioner gathers its operands (an 8-device
# ResNet34 step computed the whole batch's convolutions on each device). Each pass is
# batch-parallel, so its rule lets the batch dimension n stay split and nothing else:
#   forward      x[n h w c], w[p q c o] -> y[n i j o]
#   input_grad  dy[n i j o], w[p q c o] -> dx[n h w c]
#   kernel_grad  x[n h w c], dy[n i j o] -> dw[p q c o], n summed: each device's part of
#                the sum, then a psum over the batch's mesh axes.
_RULES = {'forward': 'n h w c, p q c o -> n i j o', 'input_grad': 'n i j o, p q c o -> n h w c',
          'kernel_grad': 'n h w c, n i j o -> p q c o'}


def _batch_axes(sharding):
  """The mesh axes an operand's first (batch) dimension is split over, or None."""
  spec = getattr(sharding, 'spec', None)
  return spec[0] if spec else None


def _per_shard(name, batch, shape, strides, pads, typed: bool):
  """A pass on each device's shard of the batch (split over the mesh axes `batch`, or
  None): its operands' and result's specs and the call on a shard. The kernel gradient is
  each device's part of the sum over the batch, then a psum over `batch`."""
  P = jax.sharding.PartitionSpec
  if name == 'kernel_grad':
    def call(a, b):
      part = _ffi(name, a, b, shape, strides, pads, typed)
      return jax.lax.psum(part, batch) if batch else part
    return (P(batch), P(batch)), P(), call

  def call(a, b):
    return _ffi(name, a, b, (a.shape[0],) + tuple(shape[1:]), strides, pads, typed)
  return (P(batch), P()), P(batch), call


def _partition(name, shape, strides, pads, mesh, arg_shapes, result_shape):
  in_specs, out_spec, call = _per_shard(name, _batch_axes(arg_shapes[0].sharding), shape,
                                        strides, pads, typed=False)
  def named(spec):
    return jax.sharding.NamedSharding(mesh, spec)
  return mesh, call, named(out_spec), tuple(named(spec) for spec in in_specs)


def _infer(*args):
  """The result's sharding, as `_partition` decides it."""
  return _partition(*args)[2]


@functools.partial(jax.experimental.custom_partitioning.custom_partitioning,
                   static_argnums=(2, 3, 4, 5))
def _partitioned(a, b, name, shape, strides, pads):
  return _ffi(name, a, b, shape, strides, pads, typed=False)


def _rule(name, *_):
  """The pass's rule: every factor but n replicated (listed in the rule's order)."""
  factors = dict.fromkeys(f for f in _RULES[name].replace(',', ' ').split()
                          if f not in ('n', '->'))
  return _RULES[name], {'need_replication_factors': tuple(factors),
                        'reduction_factors': ('n',) if name == 'kernel_grad' else ()}


_partitioned.def_partition(partition=_partition, infer_sharding_from_operands=_infer,
                           sharding_rule=_rule)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv(x, w, strides, pads):
  return _call('forward', x, w, _out_shape(x.shape, w.shape, strides, pads), strides, pads)


def _out_shape(x_shape, w_shape, strides, pads):
  n, h, w, _ = x_shape
  kh, kw, _, d = w_shape
  return (n, (h + sum(pads[0]) - kh) // strides[0] + 1, (w + sum(pads[1]) - kw) // strides[1] + 1,
          d)


def _conv_fwd(x, w, strides, pads):
  return _conv(x, w, strides, pads), (x, w)


def _conv_bwd(strides, pads, residuals, dy):
  x, w = residuals
  return (_typed_like(_call('input_grad', dy, w, x.shape, strides, pads), x),
          _typed_like(_call('kernel_grad', x, dy, w.shape, strides, pads), w))


_conv.defvjp(_conv_fwd, _conv_bwd)


def conv_onednn(lhs, rhs, window_strides, pads, precision, preferred_element_type):
  """`lax.conv_general_dilated`, NHWC × HWIO, by oneDNN (module doc); `conv._lowering`
  sends it plain convolutions. It computes in the inputs' dtype, or in
  `preferred_element_type` where one is asked for (bfloat16 inputs, float32 result: in
  float32, whose products of bfloat16 numbers are exact, as XLA's) — bfloat16 in float32
  where this CPU has no bfloat16 kernels (`computes_in`); a result type oneDNN does not
  compute goes to XLA's convolution."""
  dtype = np.dtype(preferred_element_type or jax.numpy.result_type(lhs, rhs))
  compute = computes_in(dtype)
  if compute is None:
    return jax.lax.conv_general_dilated(lhs, rhs, window_strides, pads, precision=precision,
                                        preferred_element_type=preferred_element_type,
                                        dimension_numbers=('NHWC', 'HWIO', 'NHWC'))
  lhs, rhs = _same_varying(lhs.astype(compute), rhs.astype(compute))
  # Computed in another dtype (bfloat16 in float32: `computes_in`), each pass's result is
  # rounded once: the forward pass's here, the gradients' by the casts' transposes.
  return _conv(lhs, rhs, tuple(window_strides), tuple(tuple(p) for p in pads)).astype(dtype)


# A oneDNN convolution in compiled HLO: its result's dims, its pass, its operands' dims.
_HLO_CALL = re.compile(r'= \w+\[([\d,]*)\]\S* custom-call\([^\n]*?custom_call_target='
                       r'"jaxpar_onednn_(\w+)", operand_layout_constraints=\{\w+\[([\d,]*)\]'
                       r'\S*, \w+\[([\d,]*)\]')


def hlo_flops(hlo_text: str) -> float:
  """The FLOPs of the oneDNN convolutions in a compiled program's text, which XLA's cost
  analysis does not see into (custom calls): each pass of a convolution with output y
  (N, oh, ow, D) and kernel (kh, kw, C, D) takes 2·|y|·kh·kw·C, as PyTorch's FLOP counter
  counts a convolution (XLA's leaves out the products with padding)."""
  total = 0.0
  for result, kind, a, b in _HLO_CALL.findall(hlo_text):
    dims = lambda s: [int(d) for d in s.split(',') if d]
    result, a, b = dims(result), dims(a), dims(b)
    y, w = {'forward': (result, b), 'input_grad': (a, b), 'kernel_grad': (b, result)}[kind]
    total += 2.0 * float(np.prod(y)) * w[0] * w[1] * w[2]
  return total
