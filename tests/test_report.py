"""`python -m analysis.report`: every results table committed in analysis/report/, README.md
and docs/ is what the committed JSON gives through the current code, so a re-measurement or a
change of format cannot leave a table behind."""
import os

import pytest

from analysis.report import __main__ as report


def test_every_committed_table_is_what_the_json_gives():
  stale = [os.path.relpath(path, report.ROOT)
           for path, (committed, text) in report.regenerate().items() if committed != text]
  assert not stale, f'run python -m analysis.report: {stale} differ from the committed JSON'


def test_every_committed_result_is_standard_json():
  """No NaN or Infinity (Python writes them by default; JSON has neither, and other
  readers refuse them): a value that is not a number is null."""
  import glob
  import json

  def refused(constant):
    raise ValueError(f'{constant} is not JSON')
  files = [path for folder in ('analysis', 'jaxpar')
           for path in glob.glob(os.path.join(report.ROOT, folder, '**', '*.json'),
                                 recursive=True)]
  assert len(files) > 100
  bad = []
  for name in files:
    with open(name) as f:
      try:
        json.load(f, parse_constant=refused)
      except ValueError as e:
        bad.append(f'{name}: {e}')
  assert not bad, bad


def test_the_readme_holds_the_headline_tables():
  with open(os.path.join(report.ROOT, 'README.md')) as f:
    text = f.read()
  for name in ('configs-digits', 'four-networks', 'bench-cpu', 'bench-gpus', 'tta-squeezenet16'):
    assert f'<!-- generated: {name} (python -m analysis.report) -->' in text, name


def test_no_measurement_is_typed_into_a_table_outside_a_generated_block():
  assert report.hand_tables_in_docs() == []


def test_a_typed_table_of_measurements_is_found_and_a_table_of_settings_is_not():
  text = '\n'.join([
      '| key | meaning |', '|---|---|', '| `plan.budget_s` | 180 s by default |',  # 1-3: prose
      '| network | step |', '|---|---:|', '| ResNet34 | 0.202 s |',            # 6: measured
      '```', '| a | 3.7 | 293.9× |', '```',                                    # 8: a code block
      '<!-- generated: t (python -m analysis.report) -->', '| b | 1.5 ms |',
      '<!-- end: t -->',                                                       # 11: generated
      '| row | 12 % (10–14) |', '| n | 4 |'])                                  # 13; 14 a count
  assert report.hand_tables(text) == [6, 8, 13]


def test_a_marked_table_is_replaced_and_an_unknown_name_is_refused(tmp_path, monkeypatch):
  doc = tmp_path / 'README.md'
  doc.write_text('before\n<!-- generated: t (python -m analysis.report) -->\n| old |\n'
                 '<!-- end: t -->\nafter\n')
  monkeypatch.setattr(report, 'documents', lambda: [str(doc)])
  monkeypatch.setattr(report, 'FILES', {})
  monkeypatch.setattr(report, 'TABLES', {'t': lambda: '| new |\n|---|'})
  assert report.main([]) == 0
  assert doc.read_text() == ('before\n<!-- generated: t (python -m analysis.report) -->\n'
                             '| new |\n|---|\n<!-- end: t -->\nafter\n')
  assert report.main(['--check']) == 0
  monkeypatch.setattr(report, 'TABLES', {})
  with pytest.raises(KeyError, match="no generator for table 't'"):
    report.main(['--check'])


def test_a_session_writes_what_it_ran_and_the_ci_tables_read_it(tmp_path):
  """The conftest hook `.ci/run` relies on, in a real pytest session (one quick test passing,
  one deselected): the counts, marker expression, versions and machine it writes, and the
  CI tables and README line generated from two legs' files."""
  import json
  import subprocess
  import sys

  import jax

  from analysis.report import ci
  path = tmp_path / 'floor.json'
  env = dict(os.environ, JAXPAR_TEST_REPORT=str(path), JAXPAR_TEST_LEG='floor')
  env.pop('PYTEST_XDIST_WORKER', None)
  node = 'tests/test_report.py::test_a_marked_table_is_replaced_and_an_unknown_name_is_refused'
  run = subprocess.run([sys.executable, '-m', 'pytest', '-q', '-n', '0', '-p', 'no:cacheprovider',
                        node, 'tests/test_report.py::test_the_readme_holds_the_headline_tables',
                        '-k', 'marked_table'],
                       cwd=report.ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
  leg = json.loads(path.read_text())
  assert leg['leg'] == 'floor' and leg['markexpr'] == '' and leg['exitstatus'] == 0
  assert leg['outcomes'].get('passed') == 1 and ci.tests(leg) == 1, leg['outcomes']
  assert leg['versions']['jax'] == jax.__version__
  assert leg['machine']['cores'] == os.cpu_count() and leg['seconds'] >= 0
  # The CPU's vector instructions beside its name (two hosts both "AMD EPYC" differ).
  with open('/proc/cpuinfo') as f:
    flags = next(line for line in f if line.startswith('flags')).split()
  isa = leg['machine']['cpu_isa']
  assert isa == ('AVX2' if 'avx512f' not in flags else 'AVX-512' + (
      ' with bfloat16' if 'avx512_bf16' in flags else '')) and f'({isa}), ' in ci.machine(leg)
  newest = leg | {'leg': 'newest', 'markexpr': 'not slow',
                  'outcomes': {'passed': 5, 'skipped': 2, 'deselected': 9},
                  'versions': leg['versions'] | {'jax': '0.12.0.1', 'jaxlib': '0.12.0.1'}}
  runs = ci.runs_table([newest, leg])  # rows in .ci/run's order, whatever the files' order
  assert runs.index('first leg') < runs.index('second leg')
  assert '| without the slow marker | 5 passed, 2 skipped, ' in runs
  versions = ci.versions_table([leg, newest])
  assert f"| jax / jaxlib | {ci._pair(leg, 'jax', 'jaxlib')} | 0.12.0.1 |" in versions, versions
  line = ci.suite_line([leg, newest])
  assert line.startswith('The suite (1 tests, whole suite) took ') and 'the 7 without' in line
  with pytest.raises(ValueError, match="leg 'other'.*JAXPAR_TEST_LEG"):
    ci.ordered([leg | {'leg': 'other'}])
  besides = ci.runs_table([newest | {'leg': 'newest-whole', 'markexpr': ''}], ci.BESIDES)
  assert besides.splitlines()[-1].startswith(
      f"| CI's second leg's environment | {leg['created'][:10]} |")
  assert '| whole suite | 5 passed, 2 skipped, ' in besides and 'fresh install' not in besides
  with pytest.raises(ValueError, match="leg 'newest'"):
    ci.runs_table([newest], ci.BESIDES)
  # Where the time went: the one test that ran, in its file, with its setup and teardown.
  spent = leg['time']
  assert [f['file'] for f in spent['files']] == ['tests/test_report.py']
  assert spent['files'][0]['tests'] == 1 and [t['test'] for t in spent['slowest']] == [node]
  assert spent['files'][0]['seconds'] == pytest.approx(spent['slowest'][0]['seconds'], abs=0.02)
  assert 0 <= spent['slowest'][0]['seconds'] <= leg['seconds'] and leg['workers'] == 0
  table = ci.time_table([newest, leg])  # the first leg's, whatever the files' order
  assert "| `tests/test_report.py` | 1 |" in table and f"| `{node.removeprefix('tests/')}` |" in table
  # Shares of the workers' seconds, the files beyond the first `files` in one row; a
  # parametrized id holding '|' stays in its cell.
  timed = leg | {'workers': 2, 'seconds': 25.0, 'time': {
      'files': [{'file': f'tests/{n}.py', 'tests': t, 'seconds': s}
                for n, t, s in (('a', 3, 30.0), ('b', 1, 10.0), ('c', 2, 6.0), ('d', 1, 4.0))],
      'slowest': [{'test': 'tests/t.py::f[a|b]', 'seconds': 9.0}]}}
  table = ci.time_table([timed], files=2)
  assert '50 s of its 2 workers\' time (each busy 100% of the session' in table
  assert '| `tests/a.py` | 3 | 30 | 60% |' in table and '| `tests/b.py` | 1 | 10 | 20% |' in table
  assert '| the other 2 files | 3 | 10 | 20% |' in table
  assert '| `t.py::f[a\\|b]` | 9 |' in table
  before = {k: v for k, v in leg.items() if k != 'time'}
  assert ci.time_table([before]).startswith("(Not recorded: CI's first leg's file of ")


def test_the_summary_against_pytorch_counts_each_cell_by_where_its_interval_lies():
  """bench-cpu-summary's sentence: a cell is ahead or behind where its median's interval (an
  older file's quartiles) lies above or below 1×, else level; cells grouped by mesh; bfloat16
  and peerless cells left out."""
  from analysis.benchmarks import bench_table

  def run(net, size, ratio, quartiles, mesh=(1,), processes=1, dtype='float32', peer=True):
    steps = [{'step': 'jaxpar shard_map'}] + ([{'step': 'PyTorch eager'}] if peer else [])
    return {'network': net, 'image_size': size, 'dtype': dtype, 'mesh': list(mesh),
            'config': {'distributed': {'num_processes': processes}}, 'steps': steps,
            'shard_map_over_torch_throughput': ratio, 'shard_map_over_torch_quartiles': quartiles}
  results = [run('resnet34', 32, 1.5, (1.4, 1.6)), run('squeezenet', 224, 1.01, (0.9, 1.1)),
             dict(run('vgg16e', 224, 1.05, (1.02, 1.08)),
                  shard_map_over_torch_interval=(0.99, 1.1)),  # the interval decides
             run('vgg16e', 32, 1.2, (1.1, 1.3), dtype='bfloat16'),
             run('googlenet', 32, 1.3, (1.2, 1.4), peer=False),
             run('resnet34', 32, 1.1, (1.05, 1.2), mesh=(2,), processes=2),
             run('resnet34', 32, 0.49, (0.48, 0.5), mesh=(8,))]
  assert bench_table.torch_summary(results).endswith(
      ': on one device ahead in 1 and level in 2 (squeezenet 224², vgg16e 224²) of 3, '
      '1.01–1.50×; '
      'across 2 processes ahead in 1 of 1, 1.10×; '
      'on 8 emulated devices behind in 1 (resnet34 32²) of 1, 0.49×.')
