"""Where a compiled step spends its time, by HLO op: a JAX profiler trace of a few steps,
its events matched to the instructions of the compiled program.

XLA's CPU runtime records one trace event per instruction it executes (a fusion, a
convolution, an all-reduce, …) under the instruction's name in the compiled HLO.
`categories` names what each top-level instruction does, from the ops inside it (a
fusion holding a convolution is a convolution); `op_times` runs the step under the
profiler and sums the events' durations by category. Emulated devices run on threads of
one process: the sums add every device's thread, so they are CPU time, not wall time.

On a GPU the trace's device lines hold kernels, not instructions: `traced_steps` (`bench
--trace`) sums the kernels' time a step by what their names say they do (`gpu_kind`:
cuDNN's convolution passes, matrix products, copies, the rest), for JAX's steps and
PyTorch's alike (`gpu_kernels`).
"""
import collections
import re

from analysis.steptime import trace

# What a computation does, by the most telling op it holds, in this order.
_KINDS = (('convolution', 'convolution'), ('dot', 'dot'), ('reduce-window', 'pooling'),
          ('select-and-scatter', 'pooling'), ('reduce', 'reduction'), ('scatter', 'gather/scatter'),
          ('gather', 'gather/scatter'), ('dynamic-update-slice', 'slicing/concat/pad'),
          ('dynamic-slice', 'slicing/concat/pad'), ('concatenate', 'slicing/concat/pad'),
          ('slice', 'slicing/concat/pad'), ('pad', 'slicing/concat/pad'),
          ('transpose', 'copy/transpose'), ('copy', 'copy/transpose'))


# oneDNN's convolutions (jaxpar/models/onednn.py) are custom calls: named by their target.
_ONEDNN_CALL = re.compile(r'%?([\w.\-]+) = [^\n]*custom-call\([^\n]*'
                          r'custom_call_target="jaxpar_onednn_')


def categories(hlo_text: str) -> dict:
  """{name of a top-level (ENTRY) instruction of a compiled program: what it does}."""
  comps = trace.instructions(hlo_text)
  onednn = set(_ONEDNN_CALL.findall(hlo_text))

  def ops(name, seen):
    if name in seen or name not in comps:
      return set()
    seen.add(name)
    found = set()
    for _, opcode, called in comps[name]:
      found.add(opcode)
      for c in called:
        found |= ops(c, seen)
    return found

  out = {}
  for name, opcode, called in comps.get(None, []):
    if opcode in ('parameter', 'constant', 'get-tuple-element', 'tuple', 'bitcast'):
      continue
    inside = {opcode}
    for c in called:
      inside |= ops(c, set())
    if any(o.startswith(trace.COLLECTIVES) for o in inside):
      out[name] = 'collective'
    elif name in onednn:
      out[name] = 'convolution'
    else:
      out[name] = next((kind for op, kind in _KINDS if op in inside), 'elementwise')
  return out


def op_times(run, hlo_text: str, steps: int = 2) -> dict:
  """Runs `run()` (one step, blocking) `steps` times under the profiler; returns
  {'seconds_per_step': {category: s}, 'top': [(instruction, category, s per step)]},
  summed over the threads (devices) that executed them."""
  cats = categories(hlo_text)
  per_instruction = collections.Counter()
  for e in trace.record(run, steps, threads=''):
    if e['name'] in cats:
      per_instruction[e['name']] += e['dur'] * 1e-6 / steps
  by_category = collections.Counter()
  for name, s in per_instruction.items():
    by_category[cats[name]] += s
  return {'seconds_per_step': dict(by_category.most_common()),
          'top': [(n, cats[n], s) for n, s in per_instruction.most_common(10)]}


# What a GPU kernel does, from its name (cuDNN's, cuBLAS's, XLA's and Inductor's names), in
# this order: a cuDNN convolution kernel's name says its pass, and also 'gemm'.
_GPU_KINDS = (('convolution forward', ('fprop', 'conv2d_fprop', 'implicit_convolve')),
              ('convolution data gradient', ('dgrad',)),
              ('convolution weight gradient', ('wgrad',)),
              ('matrix product', ('gemm', 'nvjet', 'cublas', 'cutlass')),
              ('copy/set', ('memcpy', 'memset', 'nchwtonhwc', 'nhwctonchw', 'transpose')))


def gpu_kind(name: str) -> str:
  """The kind of GPU kernel `name` is (`_GPU_KINDS`, first match), else a fusion."""
  low = name.lower()
  return next((kind for kind, parts in _GPU_KINDS if any(p in low for p in parts)),
              'fusion/elementwise/reduction')


def gpu_kernels(events, steps: int, top: int = 25) -> dict:
  """GPU time per step of a trace's device events (complete events, µs): the busy time (the
  sum of the kernels' durations), the span from the first kernel's start to the last one's
  end, the time by kind (`gpu_kind`) and the `top` kernels by time, each with its calls a
  step."""
  per_name, calls = collections.Counter(), collections.Counter()
  for e in events:
    per_name[e['name']] += e['dur'] * 1e-6 / steps
    calls[e['name']] += 1 / steps
  by_kind = collections.Counter()
  for name, s in per_name.items():
    by_kind[gpu_kind(name)] += s
  span = ((max(e['ts'] + e['dur'] for e in events) - min(e['ts'] for e in events)) * 1e-6
          / steps if events else 0.0)
  return {'busy_s_per_step': sum(per_name.values()), 'span_s_per_step': span,
          'kernels_per_step': sum(calls.values()),
          'by_kind_s_per_step': dict(by_kind.most_common()),
          'top': [(name[:160], gpu_kind(name), s, calls[name])
                  for name, s in per_name.most_common(top)]}


def _device_events(events) -> list:
  """The complete events that ran on a GPU: in a JAX trace, those on the streams
  ('Stream #…' threads) of its GPU planes ('/device:GPU:…'), not the derived lines beside
  them ('XLA Ops', 'XLA Modules', which span the same kernels); in a PyTorch trace, the
  kernel, copy and set events."""
  meta = [e for e in events if e.get('ph') == 'M']
  gpu = {e['pid'] for e in meta if e.get('name') == 'process_name'
         and '/device:GPU' in str(e.get('args', {}).get('name', ''))}
  streams = {(e['pid'], e['tid']) for e in meta if e.get('name') == 'thread_name'
             and e['pid'] in gpu and str(e.get('args', {}).get('name', '')).startswith('Stream')}
  return [e for e in events if e.get('ph') == 'X' and 'dur' in e
          and ((e.get('pid'), e.get('tid')) in streams
               or e.get('cat') in ('kernel', 'gpu_memcpy', 'gpu_memset'))]


def traced_steps(run, steps: int, out: str, torch_module=None) -> dict:
  """Runs `run()` (one blocking step) `steps` times under JAX's profiler, or PyTorch's when
  `torch_module` is given, keeps the trace at `out` (gzipped Chrome trace JSON) and returns
  `gpu_kernels` of its device events."""
  import glob
  import gzip
  import json
  import shutil
  import tempfile
  with tempfile.TemporaryDirectory() as logdir:
    if torch_module is None:
      import jax
      with jax.profiler.trace(logdir):
        for _ in range(steps):
          run()
      (path,) = glob.glob(f'{logdir}/**/*.trace.json.gz', recursive=True)
      shutil.copy(path, out)
    else:
      activities = [torch_module.profiler.ProfilerActivity.CPU,
                    torch_module.profiler.ProfilerActivity.CUDA]
      with torch_module.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
          run()
      path = f'{logdir}/trace.json'
      prof.export_chrome_trace(path)
      with open(path, 'rb') as f, gzip.open(out, 'wb') as g:
        shutil.copyfileobj(f, g)
  with gzip.open(out) as f:
    events = json.load(f)['traceEvents']
  found = gpu_kernels(_device_events(events), steps)
  # What the trace holds, to read it again where the filter above found nothing.
  found['threads'] = sorted({f"{e.get('pid')}: {e['args'].get('name')}" for e in events
                             if e.get('ph') == 'M' and 'args' in e
                             and e.get('name') in ('process_name', 'thread_name')})[:60]
  return found
