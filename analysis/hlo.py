"""The collectives of a lowered program, read from its StableHLO text.

The lowered program (`jax.jit(f).lower(...).as_text()`) keeps every collective
as written, with its operand dtypes; the compiled CPU HLO merges all-reduces into
tuples and shows bfloat16 sums as float32, so it is the wrong place to check
what a step sends.
"""
import dataclasses
import math
import re

OPS = ('all_reduce', 'reduce_scatter', 'all_gather', 'collective_permute', 'all_to_all')
_OP = re.compile(r'stablehlo\.(' + '|'.join(OPS) + r')\b')
_SIGNATURE = re.compile(r':\s*\(([^()]*)\)\s*->[^()]*$')
_TENSOR = re.compile(r'tensor<((?:\d+x)*)([a-z]+\d*)>')
BYTES = {'f64': 8, 'f32': 4, 'bf16': 2, 'f16': 2, 'i64': 8, 'i32': 4, 'i8': 1, 'i1': 1,
         'ui32': 4, 'ui8': 1}


@dataclasses.dataclass(frozen=True)
class Collective:
  op: str
  shape: tuple
  dtype: str

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
  for i, line in enumerate(lines):
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
    for dims, dtype in _TENSOR.findall(signature.group(1)):
      found.append(Collective(op.group(1), tuple(int(d) for d in dims.split('x') if d), dtype))
  return found
