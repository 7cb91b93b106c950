"""The collectives of a lowered program, read from its StableHLO text.

The lowered program (`jax.jit(f).lower(...).as_text()`) keeps every collective
as written, with its operand dtypes; the compiled CPU HLO merges all-reduces into
tuples and shows bfloat16 sums as float32, so it is the wrong place to check
what a step sends.

`lax.cond` and `lax.switch` lower to `stablehlo.case` with every branch in the text;
each collective records the branch it sits in, and `step_bytes` counts one branch of
each conditional: the most expensive, i.e. the step that communicates (Local SGD's
averaging step; a gossip ring distance with two partners, not one whose partners coincide).
"""
import dataclasses
import math
import re

OPS = ('all_reduce', 'reduce_scatter', 'all_gather', 'collective_permute', 'all_to_all')
_OP = re.compile(r'stablehlo\.(' + '|'.join(OPS) + r')\b')
_SIGNATURE = re.compile(r':\s*\(([^()]*)\)\s*->[^()]*$')
_TENSOR = re.compile(r'tensor<((?:\d+x)*)([a-z]+\d*)>')
_GROUPS = re.compile(r'replica_groups = dense<[^>]*> : tensor<(\d+)x(\d+)xi64>')
_PAIRS = re.compile(r'source_target_pairs = dense<[^>]*> : tensor<(\d+)x2xi64>')
# jax >= 0.11 lowers shard_map's collectives with mesh-axis replica groups (`jax_use_rgv3`):
# `replica_groups = #stablehlo.replica_group_mesh_axes<mesh = @mesh_0, axes = [#stablehlo.axis_ref
# <name = "x">, ...]>`, the axes' sizes declared once at the top, `sdy.mesh @mesh_0 = <["x"=2, ...]>`.
_MESH_GROUPS = re.compile(r'replica_group_mesh_axes<mesh = @([\w.]+), axes = \[(.*?)\]>')
_MESH = re.compile(r'sdy\.mesh @([\w.]+) = <\[(.*?)\]')
_CASE = re.compile(r'"stablehlo\.case"\(.*\(\{\s*$')
BYTES = {'f64': 8, 'f32': 4, 'bf16': 2, 'f16': 2, 'i64': 8, 'i32': 4, 'i8': 1, 'i1': 1,
         'ui32': 4, 'ui8': 1, 's64': 8, 's32': 4, 's8': 1, 'u32': 4, 'u8': 1, 'pred': 1}


@dataclasses.dataclass(frozen=True)
class Collective:
  op: str
  shape: tuple
  dtype: str
  group: int = 0   # devices in each replica group (reductions, gathers, all-to-all)
  pairs: int = 0   # source → target pairs (collective permute)
  branch: tuple = ()  # ((case, branch index), ...) of the conditionals it sits in, outermost first

  @property
  def size(self) -> int:
    return math.prod(self.shape)

  @property
  def nbytes(self) -> int:
    return self.size * BYTES[self.dtype]


def collectives(stablehlo: str) -> list:
  """Every collective operand in program order (an all-reduce of a tuple gives one each).

  An op's signature `: (tensor<...>, ...) -> ...` ends its line, or, for the
  reductions, the line that closes their region (`}) : (...) -> ...`).
  """
  found = []
  lines = stablehlo.splitlines()
  meshes = {name: {a: int(n) for a, n in re.findall(r'"(\w+)"=(\d+)', axes)}
            for name, axes in _MESH.findall(stablehlo)}
  open_cases = []  # (indent, case number, branch index) of the conditionals around this line
  cases = 0
  for i, line in enumerate(lines):
    indent = len(line) - len(line.lstrip())
    if open_cases and indent == open_cases[-1][0]:  # a branch of the innermost case ends
      if line.strip() == '}, {':
        open_cases[-1] = (indent, open_cases[-1][1], open_cases[-1][2] + 1)
      elif line.lstrip().startswith('})'):
        open_cases.pop()
      continue
    if _CASE.search(line):
      open_cases.append((indent, cases, 0))
      cases += 1
      continue
    op = _OP.search(line)
    if not op:
      continue
    signature = _SIGNATURE.search(line)
    j = i
    while signature is None and j + 1 < len(lines):
      j += 1
      if lines[j].lstrip().startswith('})'):
        signature = _SIGNATURE.search(lines[j])
        break
    pairs = _PAIRS.search(line)
    group = _stablehlo_group_size(line, meshes)
    for dims, dtype in _TENSOR.findall(signature.group(1)):
      found.append(Collective(op.group(1), tuple(int(d) for d in dims.split('x') if d), dtype,
                              group=group,
                              pairs=int(pairs.group(1)) if pairs else 0,
                              branch=tuple((c, b) for _, c, b in open_cases)))
  return found


def _stablehlo_group_size(line: str, meshes: dict) -> int:
  """Devices in each replica group of a StableHLO collective's line: the groups' second
  dimension (`dense<...> : tensor<GxNxi64>`), or the product of the named mesh axes' sizes."""
  groups = _GROUPS.search(line)
  if groups:
    return int(groups.group(2))
  axes = _MESH_GROUPS.search(line)
  if axes:
    sizes = meshes[axes.group(1)]
    return math.prod(sizes[a] for a in re.findall(r'axis_ref<name = "(\w+)"', axes.group(2)))
  return 0


def bytes_per_device(c: Collective, devices: int) -> float:
  """What one device sends for collective `c`, on average over the `devices`, counted as
  the bandwidth-optimal algorithms do: all-reduce 2(n−1)/n of its operand (a ring),
  reduce-scatter (n−1)/n of its input, all-gather n−1 times its piece, all-to-all
  (n−1)/n, a collective permute its operand from each source (pairs of `devices`)."""
  n = c.group
  if c.op == 'collective_permute':
    return c.nbytes * c.pairs / devices
  if c.op == 'all_reduce':
    return 2 * (n - 1) / n * c.nbytes
  if c.op == 'all_gather':
    return (n - 1) * c.nbytes
  return (n - 1) / n * c.nbytes  # reduce_scatter, all_to_all


_HLO_OP = re.compile(r'=\s*(\(.*?\)|\S+)\s+(all-reduce|all-gather|reduce-scatter|'
                     r'collective-permute|all-to-all)\(')
_HLO_ARRAY = re.compile(r'([a-z]+\d*)\[([\d,]*)\]')
_HLO_GROUPS = re.compile(r'replica_groups=(\{\{[\d,]*\}|\[\d+,(\d+)\]<=|mesh\[([^\]]*)\]\s*'
                         r'\{([^}]*)\})')
_HLO_PAIRS = re.compile(r'source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}')


def _group_size(line: str) -> int:
  m = _HLO_GROUPS.search(line)
  if not m:
    return 0
  if m.group(1).startswith('{{'):
    return len(m.group(1)[2:].split(','))
  if m.group(2):
    return int(m.group(2))
  sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(3)))
  return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m.group(4)))


_HLO_HEADER = re.compile(r'^(ENTRY\s+)?%([\w.\-]+)\s.*\{\s*$')
_HLO_BRANCHES = re.compile(r'branch_computations=\{([^}]*)\}|true_computation=(%[\w.\-]+), '
                           r'false_computation=(%[\w.\-]+)')
_HLO_CALL = re.compile(r'\s(?:call|while)\(.*?(?:to_apply|body)=%([\w.\-]+)')


def _computations(hlo_text: str):
  """{name: its instruction lines} of an HLO module's text, and the entry's name."""
  found, entry, current = {}, None, None
  for line in hlo_text.splitlines():
    header = _HLO_HEADER.match(line)
    if header and not line.startswith(' '):
      current = header.group(2)
      found[current] = []
      entry = current if header.group(1) else entry
    elif line.startswith('}'):
      current = None
    elif current is not None:
      found[current].append(line)
  return found, entry


def compiled_collectives(hlo_text: str) -> list:
  """The collectives of a *compiled* program's HLO text (`compiled.as_text()`), where an
  auto-sharded `jit` first has them, in the order the entry computation runs them: each
  part of a tuple all-reduce separately (the CPU runtimes, gloo's included, reduce a tuple
  one buffer at a time), in the dtype the compiled program uses (on CPU, bfloat16 sums
  appear as float32). Shapes are those `bytes_per_device` expects: an all-gather's piece, a
  reduce-scatter's input. A `conditional`'s branches are computations of their own: each
  collective there records its branch, as `collectives` does, so `step_total` counts the
  costliest; `call`s and `while` bodies are followed (a loop's body once)."""
  computations, entry = _computations(hlo_text)
  if entry is None:  # a bare list of instructions (tests): read it as the entry
    computations, entry = {'entry': hlo_text.splitlines()}, 'entry'
  found, cases = [], [0]

  def visit(name, branch, seen):
    for line in computations.get(name, ()):
      m = _HLO_OP.search(line)
      if m:
        op = m.group(2).replace('-', '_')
        group = _group_size(line)
        pairs = _HLO_PAIRS.search(line)
        for dtype, dims in _HLO_ARRAY.findall(m.group(1)):
          shape = tuple(int(d) for d in dims.split(',') if d)
          size = math.prod(shape)
          if op == 'all_gather':
            shape = (size // max(group, 1),)
          elif op == 'reduce_scatter':
            shape = (size * group,)
          found.append(Collective(op, shape, dtype, group=group,
                                  pairs=pairs.group(1).count('{') if pairs else 0,
                                  branch=branch))
        continue
      branches = _HLO_BRANCHES.search(line)
      if branches and ' conditional(' in line:
        names = (re.findall(r'%([\w.\-]+)', branches.group(1)) if branches.group(1)
                 else [branches.group(2)[1:], branches.group(3)[1:]])
        case, cases[0] = cases[0], cases[0] + 1
        for index, target in enumerate(names):
          if target not in seen:
            visit(target, branch + ((case, index),), seen | {target})
        continue
      call = _HLO_CALL.search(line)
      if call and call.group(1) not in seen:
        visit(call.group(1), branch, seen | {call.group(1)})

  visit(entry, (), frozenset({entry}))
  return found


def step_total(found: list, cost, depth: int = 0, taken: float = 1.0) -> float:
  """Σ cost(c) over a step's collectives: every unconditional one, and of each
  conditional the branch whose total is largest (see the module docstring), × `taken`, the
  share of steps that take it (Local SGD's average: 1/τ)."""
  total, branches = 0.0, {}
  for c in found:
    if len(c.branch) == depth:
      total += cost(c)
    else:
      case, index = c.branch[depth]
      branches.setdefault(case, {}).setdefault(index, []).append(c)
  for case in branches.values():
    total += taken * max(step_total(inside, cost, depth + 1) for inside in case.values())
  return total


def step_bytes(found: list, devices: int) -> float:
  """Bytes one device sends in a step (`step_total` of `bytes_per_device`)."""
  return step_total(found, lambda c: bytes_per_device(c, devices))
