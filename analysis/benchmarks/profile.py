"""Where a compiled step spends its time, by HLO op: a JAX profiler trace of a few steps,
its events matched to the instructions of the compiled program.

XLA's CPU runtime records one trace event per instruction it executes (a fusion, a
convolution, an all-reduce, …) under the instruction's name in the compiled HLO.
`categories` names what each top-level instruction does, from the ops inside it (a
fusion holding a convolution is a convolution); `op_times` runs the step under the
profiler and sums the events' durations by category. Emulated devices run on threads of
one process: the sums add every device's thread, so they are CPU time, not wall time.
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
