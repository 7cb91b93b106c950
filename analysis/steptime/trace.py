"""What a compiled program's ops take, read from a JAX profiler trace: its compute, its
collectives, and how long they overlap.

XLA's CPU runtime records one trace event per instruction it executes, on the thread that
executes it, under the instruction's name in the compiled HLO; a `conditional`, `while` or
`call` event holds the events of the instructions it runs. Each event's *exclusive* time
is its duration less that of the events nested in it on its thread, so every microsecond
of the program counts once. Over the traced calls, per call:

  compute     Σ exclusive time of the instructions that are not collectives;
  collective  Σ exclusive time of the collectives (waiting for a peer included);
  overlap     wall time in which a collective runs on one thread while a compute
              instruction runs on another: what a step saves by overlapping them.

The step-time model (`analysis.steptime.compare`) takes a step's non-gradient work from its
compute less the gradient program's ([T]'s t_grad measured alone, traced the same way),
costs its collectives from the calibration, and subtracts the overlap the trace shows.
"""
import collections
import glob
import gzip
import json
import re
import tempfile

_INSTRUCTION = re.compile(r'^\s*(?:ROOT )?%?([\w.\-]+) = .*? ([a-z][a-z\-]*)\(')
_CALLS = re.compile(r'(?:calls|to_apply|body|condition|branch_computations)=\{?%?([\w.\-, %]+)\}?')
COLLECTIVES = ('all-reduce', 'all-gather', 'reduce-scatter', 'collective-permute', 'all-to-all')
_SKIPPED = ('ThunkExecutor', '$')  # the runtime's own spans; Python's (`$file:line fn`)


def instructions(hlo_text: str) -> dict:
  """{computation name: [(instruction name, opcode, called computations)]} of a compiled
  program's HLO text, ENTRY's under the key None."""
  comps, current = {}, None
  for line in hlo_text.splitlines():
    if not line.startswith(' ') and line.rstrip().endswith('{'):
      head = line.split('(')[0].split()
      current = None if head[0] == 'ENTRY' else head[-1].lstrip('%')
      comps[current] = []
    elif (m := _INSTRUCTION.match(line)) and current in comps:
      called = [c.strip().lstrip('%') for found in _CALLS.findall(line)
                for c in found.split(',')]
      comps[current].append((m.group(1), m.group(2), called))
  return comps


def collective_names(hlo_text: str) -> set:
  """The names of every collective instruction of a compiled program's HLO text, in any of
  its computations (a conditional's branches, loop bodies; `-start`/`-done` halves too)."""
  return {name for found in instructions(hlo_text).values() for name, opcode, _ in found
          if opcode.startswith(COLLECTIVES)}


def record(run, calls: int, threads: str = 'tf_XLA') -> list:
  """The complete events ('ph': 'X') of the threads whose names start with `threads` (XLA's
  CPU runtime's; '' for all) while `run()` (one blocking call) runs `calls` times under the
  profiler."""
  import jax
  with tempfile.TemporaryDirectory() as logdir:
    with jax.profiler.trace(logdir):
      for _ in range(calls):
        run()
    (path,) = glob.glob(f'{logdir}/**/*.trace.json.gz', recursive=True)
    with gzip.open(path) as f:
      events = json.load(f)['traceEvents']
  names = {(e['pid'], e['tid']): e['args']['name'] for e in events
           if e.get('ph') == 'M' and e.get('name') == 'thread_name'}
  return [e for e in events if e.get('ph') == 'X'
          and names.get((e['pid'], e['tid']), '').startswith(threads)
          and not e['name'].startswith(_SKIPPED)]


def exclusive(events) -> list:
  """(event, exclusive µs) of each event: its duration less its nested events' on its
  thread."""
  out = []
  by_thread = collections.defaultdict(list)
  for e in events:
    by_thread[(e['pid'], e['tid'])].append(e)
  for thread in by_thread.values():
    thread.sort(key=lambda e: (e['ts'], -e['dur']))
    stack = []  # [event, exclusive] of the open events enclosing the next one
    for e in thread:
      while stack and stack[-1][0]['ts'] + stack[-1][0]['dur'] <= e['ts']:
        out.append(tuple(stack.pop()))
      if stack:
        stack[-1][1] -= e['dur']
      stack.append([e, e['dur']])
    out += [tuple(x) for x in stack]
  return out


def _union(intervals) -> list:
  merged = []
  for start, end in sorted(intervals):
    if merged and start <= merged[-1][1]:
      merged[-1][1] = max(merged[-1][1], end)
    else:
      merged.append([start, end])
  return merged


def _intersection(a, b) -> float:
  """Total length shared by two sorted lists of disjoint intervals."""
  total, i, j = 0.0, 0, 0
  while i < len(a) and j < len(b):
    total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
    if a[i][1] < b[j][1]:
      i += 1
    else:
      j += 1
  return total


def summarize(events, collectives: set, calls: int) -> dict:
  """{'compute', 'collective', 'overlap'}: seconds per call (see the module docstring) of
  the events of `calls` calls; `collectives`: the instruction names that are collectives."""
  seconds = collections.Counter({'compute': 0.0, 'collective': 0.0})
  leaves = collections.defaultdict(list)  # (kind, thread): intervals of the innermost events
  for e, own in exclusive(events):
    kind = 'collective' if e['name'] in collectives else 'compute'
    seconds[kind] += own * 1e-6 / calls
    if own == e['dur']:  # nothing nested in it: an instruction, not a conditional or loop
      leaves[(kind, (e['pid'], e['tid']))].append((e['ts'], e['ts'] + e['dur']))
  overlap = 0.0
  for (kind, thread), intervals in leaves.items():
    if kind != 'collective':
      continue
    others = _union(x for (k, t), xs in leaves.items() if k == 'compute' and t != thread
                    for x in xs)
    overlap += _intersection(_union(intervals), others)
  return {**seconds, 'overlap': overlap * 1e-6 / calls}


def trace_calls(run, hlo_text: str = '', calls: int = 3) -> dict:
  """`summarize` of `calls` calls of `run()` (a compiled program, blocking; `hlo_text`: its
  compiled HLO, to tell its collectives; none without)."""
  return summarize(record(run, calls), collective_names(hlo_text), calls)
