"""The collectives of a lowered program, read from its StableHLO text.

The lowered program (`jax.jit(f).lower(...).as_text()`) keeps every collective
as written, with its operand dtypes; the compiled CPU HLO merges all-reduces into
tuples and shows bfloat16 sums as float32, so it is the wrong place to check
what a step sends.

`lax.cond` and `lax.switch` lower to `stablehlo.case` with every branch in the text;
each collective records the branch it sits in, and `step_bytes` counts one branch of
each conditional: the most expensive, i.e. the step that communicates (Local SGD's
averaging step; one of gossip's equally expensive ring distances).
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
_CASE = re.compile(r'"stablehlo\.case"\(.*\(\{\s*$')
BYTES = {'f64': 8, 'f32': 4, 'bf16': 2, 'f16': 2, 'i64': 8, 'i32': 4, 'i8': 1, 'i1': 1,
         'ui32': 4, 'ui8': 1}


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
    groups, pairs = _GROUPS.search(line), _PAIRS.search(line)
    for dims, dtype in _TENSOR.findall(signature.group(1)):
      found.append(Collective(op.group(1), tuple(int(d) for d in dims.split('x') if d), dtype,
                              group=int(groups.group(2)) if groups else 0,
                              pairs=int(pairs.group(1)) if pairs else 0,
                              branch=tuple((c, b) for _, c, b in open_cases)))
  return found


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


def step_total(found: list, cost, depth: int = 0) -> float:
  """Σ cost(c) over a step's collectives: every unconditional one, and of each
  conditional the branch whose total is largest (see the module docstring)."""
  total, branches = 0.0, {}
  for c in found:
    if len(c.branch) == depth:
      total += cost(c)
    else:
      case, index = c.branch[depth]
      branches.setdefault(case, {}).setdefault(index, []).append(c)
  for case in branches.values():
    total += max(step_total(inside, cost, depth + 1) for inside in case.values())
  return total


def step_bytes(found: list, devices: int) -> float:
  """Bytes one device sends in a step (`step_total` of `bytes_per_device`)."""
  return step_total(found, lambda c: bytes_per_device(c, devices))
