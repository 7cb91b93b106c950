"""The package's import graph, read from the source (every import, those inside functions
too): no import circle; `jaxpar.perfmodel` a leaf library (jax, numpy, scipy and itself);
the step and the modules under it import no method (`jaxpar.parallel`), no planner and no
builder; the methods import no planner; and nothing of jaxpar imports `analysis/`."""
import ast
import glob
import os
import sys

import pytest

from runs import ROOT


def _name(path: str) -> str:
  name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
  return name.removesuffix('.__init__')


def imports(path: str) -> set:
  """The modules `path` imports, anywhere in it; `from a import b` gives a.b where a.b is a
  module of jaxpar, else a."""
  name = _name(path)
  package = name if path.endswith('__init__.py') else name.rpartition('.')[0]
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      found |= {alias.name for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ''
      if node.level:
        parts = package.split('.')
        base = '.'.join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
      found |= {f'{base}.{alias.name}' if f'{base}.{alias.name}' in MODULES else base
                for alias in node.names}
  return found


MODULES = {_name(p): p
           for p in glob.glob(os.path.join(ROOT, 'jaxpar', '**', '*.py'), recursive=True)}
GRAPH = {m: {i for i in imports(p) if i != m} for m, p in MODULES.items()}


def _within(module: str, packages) -> bool:
  return any(module == p or module.startswith(p + '.') for p in packages)


def violations(graph: dict, importers, forbidden) -> list:
  """'a imports b' for each module a of `importers` (names or packages) importing one of
  `forbidden`."""
  return sorted(f'{a} imports {b}' for a, found in graph.items() if _within(a, importers)
                for b in found if _within(b, forbidden))


def circles(graph: dict) -> list:
  """Pairs (a, b) of jaxpar's modules each of which reaches the other."""
  def reach(start):
    seen, todo = set(), [start]
    while todo:
      for nxt in graph.get(todo.pop(), ()):
        if nxt in graph and nxt not in seen:
          seen.add(nxt)
          todo.append(nxt)
    return seen
  reached = {m: reach(m) for m in graph}
  return sorted({tuple(sorted((a, b))) for a in graph for b in reached[a] if a in reached[b]
                 and a != b})


def test_the_rules_find_what_they_are_for():
  graph = {'jaxpar.step': {'jaxpar.parallel.servers'}, 'jaxpar.parallel.servers': {'jaxpar.step'},
           'jaxpar.perfmodel.hlo': {'re', 'jaxpar.mesh'}}
  assert circles(graph) == [('jaxpar.parallel.servers', 'jaxpar.step')]
  assert violations(graph, ['jaxpar.step'], ['jaxpar.parallel']) == [
      'jaxpar.step imports jaxpar.parallel.servers']
  assert violations(graph, ['jaxpar.perfmodel'], ['jaxpar.mesh']) == [
      'jaxpar.perfmodel.hlo imports jaxpar.mesh']


def test_the_graph_is_read_from_every_module():
  assert {'jaxpar.train', 'jaxpar.step', 'jaxpar.perfmodel.hlo',
          'jaxpar.plan.planner'} <= set(GRAPH)
  assert 'jaxpar.perfmodel.calibrate' in GRAPH['jaxpar.plan.planner']
  assert 'jaxpar.collectives' in GRAPH['jaxpar.step']


def test_no_module_of_jaxpar_imports_another_that_imports_it_back():
  assert circles(GRAPH) == []


def test_the_models_of_time_and_steps_are_a_leaf_library():
  allowed = set(sys.stdlib_module_names) | {'numpy', 'scipy', 'jax', 'jaxpar.perfmodel'}
  outside = sorted(f'{a} imports {b}' for a, found in GRAPH.items()
                   if _within(a, ['jaxpar.perfmodel'])
                   for b in found if not _within(b, allowed) and b.split('.')[0] not in allowed)
  assert outside == []


@pytest.mark.parametrize('importers, forbidden', [
    (['jaxpar.step', 'jaxpar.collectives', 'jaxpar.mesh', 'jaxpar.group_batchnorm',
      'jaxpar.config', 'jaxpar.models'],
     ['jaxpar.parallel', 'jaxpar.plan', 'jaxpar.build', 'jaxpar.train']),
    (['jaxpar.parallel'], ['jaxpar.plan', 'jaxpar.build', 'jaxpar.train']),
    (['jaxpar'], ['analysis']),
])
def test_no_module_imports_a_layer_above_it(importers, forbidden):
  assert violations(GRAPH, importers, forbidden) == []
