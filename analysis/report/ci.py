"""What CI's legs ran, from the JSON each leg's pytest session wrote (tests/conftest.py,
`JAXPAR_TEST_REPORT`; `.ci/run` writes .ci/results/LEG.json, copied to analysis/report/ci/):
docs/install.md's versions and runs tables, docs/testing.md's table of where the time went
and the README's line on the suite.

A leg's file records the counts by outcome, the marker expression, the seconds from the
session's start to its end, the date, machine, versions and commit; every figure these
tables show is one of those fields.
"""
import math

# The legs `.ci/run` runs, in its order, and how the tables name them.
LEGS = {'floor': "CI's first leg", 'newest': "CI's second leg"}
# Runs of the suite besides CI's (`JAXPAR_TEST_LEG=NAME JAXPAR_TEST_REPORT=PATH python -m
# pytest` in a leg's environment), in analysis/report/ci/besides/: the whole suite where CI
# runs part of it.
BESIDES = {'newest-whole': "CI's second leg's environment"}
_ROWS = (('Python', lambda leg: leg['machine']['python']),
         ('jax / jaxlib', lambda leg: _pair(leg, 'jax', 'jaxlib')),
         ('flax', lambda leg: _version(leg, 'flax')),
         ('optax, orbax-checkpoint', lambda leg: _pair(leg, 'optax', 'orbax-checkpoint', ', ')),
         ('tensorflow-cpu, tensorflow-datasets',
          lambda leg: _pair(leg, 'tensorflow-cpu', 'tensorflow-datasets', ', ')),
         ('ray', lambda leg: _version(leg, 'ray')),
         ('torch (optional: the PyTorch peer)', lambda leg: _version(leg, 'torch')))
_ORDER = ('passed', 'failed', 'error', 'skipped', 'xfailed', 'xpassed')


def ordered(legs: list, names: dict = LEGS) -> list:
  """The legs in the order of `names` (`.ci/run`'s); a leg it does not name is an error (one
  line)."""
  unknown = [leg.get('leg') for leg in legs if leg.get('leg') not in names]
  if unknown:
    raise ValueError(f"CI result of leg {unknown[0]!r}: known legs are {', '.join(names)} "
                     "(.ci/run's JAXPAR_TEST_LEG)")
  return sorted(legs, key=lambda leg: list(names).index(leg['leg']))


def _version(leg, name):
  return leg['versions'].get(name) or '—'


def _pair(leg, a, b, sep=' / '):
  first, second = _version(leg, a), _version(leg, b)
  return first if first == second and sep == ' / ' else f'{first}{sep}{second}'


def tests(leg) -> int:
  """Tests the leg ran to an outcome (deselected ones not counted)."""
  return sum(leg['outcomes'].get(kind, 0) for kind in _ORDER)


def selection(leg) -> str:
  return ('whole suite' if not leg['markexpr']
          else 'without the slow marker' if leg['markexpr'] == 'not slow'
          else f"-m '{leg['markexpr']}'")


def result(leg) -> str:
  counts = ', '.join(f"{leg['outcomes'][k]} {k}" for k in _ORDER if leg['outcomes'].get(k))
  return f"{counts}, {leg['seconds'] / 60:.1f} min" + ('' if leg['exitstatus'] == 0 else
                                                       f" (pytest exit {leg['exitstatus']})")


def machine(leg) -> str:
  m = leg['machine']
  isa = f" ({m['cpu_isa']})" if m.get('cpu_isa') else ''  # recorded since 2026-11-28
  return (f"{m['cores']} cores of an {m['cpu'] or m['system']}{isa}, "
          f"{m['memory_bytes'] / 2**30:.0f} GiB")


def versions_table(legs: list) -> str:
  legs = ordered(legs)
  head = '| | ' + ' | '.join(f"{LEGS[leg['leg']]} ({leg['created'][:10]})" for leg in legs) + ' |'
  lines = [head, '|---|' + '---|' * len(legs)]
  lines += ['| ' + ' | '.join([name] + [get(leg) for leg in legs]) + ' |' for name, get in _ROWS]
  return '\n'.join(lines)


def runs_table(legs: list, names: dict = LEGS) -> str:
  """A row per leg: CI's (`names=LEGS`, each a fresh install) or runs besides (`BESIDES`)."""
  lines = ['| leg | date | machine | commit | Python | jax | tests | result |',
           '|---|---|---|---|---|---|---|---|']
  for leg in ordered(legs, names):
    how = ', fresh install' if names is LEGS else ''
    lines.append(f"| {names[leg['leg']]}{how} | {leg['created'][:10]} | {machine(leg)} | "
                 f"{(leg['commit'] or '—')[:7]} | {leg['machine']['python']} | "
                 f"{_version(leg, 'jax')} | {selection(leg)} | {result(leg)} |")
  return '\n'.join(lines)


def suite_line(legs: list) -> str:
  """The README's sentence on how long the suite takes, from the legs."""
  first, *rest = ordered(legs)
  text = (f"The suite ({tests(first)} tests, {selection(first)}) took "
          f"{first['seconds'] / 60:.1f} minutes on {machine(first)} ({first['created'][:10]}, "
          f"Python {first['machine']['python']}, jax {_version(first, 'jax')}: "
          f"{result(first).rsplit(', ', 1)[0]})")
  for leg in rest:
    text += (f"; CI also runs the {tests(leg)} {selection(leg)} on Python "
             f"{leg['machine']['python']} with jax {_version(leg, 'jax')} "
             f"({leg['seconds'] / 60:.1f} minutes)")
  return text + '.'


def time_table(legs: list, files: int = 10) -> str:
  """Where the first leg's time went (its file's 'time': tests/conftest.py's `time_spent`):
  the `files` costliest test files with their share of the workers' seconds, then the
  slowest tests; one line where the leg's file predates the record."""
  leg = ordered(legs)[0]
  spent = leg.get('time')
  if not spent:
    return (f"(Not recorded: {LEGS[leg['leg']]}'s file of {leg['created'][:10]} predates the "
            'time record; the next CI run writes it.)')
  # fsum (exact): Python 3.11's sum and 3.12's compensated one round alike.
  total = math.fsum(f['seconds'] for f in spent['files'])
  workers = leg.get('workers') or 1
  lines = [f"{LEGS[leg['leg']]} ({selection(leg)}, {leg['created'][:10]}, {machine(leg)}, "
           f"commit {(leg['commit'] or '—')[:7]}): {leg['seconds'] / 60:.1f} minutes, "
           f"{total:,.0f} s of its {workers} workers' time"
           + (f' (each busy {_share(total / workers, leg["seconds"])} of the session, on average)'
              if workers > 1 else '') + '.', '',
           '| test file | tests | worker seconds | share |', '|---|---:|---:|---:|']
  for f in spent['files'][:files]:
    lines.append(f"| `{f['file']}` | {f['tests']} | {f['seconds']:,.0f} | "
                 f"{_share(f['seconds'], total)} |")
  rest = spent['files'][files:]
  if rest:
    seconds = math.fsum(f['seconds'] for f in rest)
    lines.append(f"| the other {len(rest)} files | {sum(f['tests'] for f in rest)} | "
                 f"{seconds:,.0f} | {_share(seconds, total)} |")
  lines += ['', f"The {len(spent['slowest'])} slowest tests (setup, call and teardown):", '',
            '| test | seconds |', '|---|---:|']
  lines += [f"| `{_cell(t['test'].removeprefix('tests/'))}` | {t['seconds']:.0f} |"
            for t in spent['slowest']]
  return '\n'.join(lines)


def _cell(text: str) -> str:
  """`text` inside a Markdown table's cell: a parametrized test's id may hold a '|'."""
  return text.replace('|', '\\|')


def _share(part: float, whole: float) -> str:
  return f'{part / whole:.0%}' if whole else '—'
