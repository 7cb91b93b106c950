"""`python -m analysis.report`: every results table committed in analysis/report/, README.md
and docs/ is what the committed JSON gives through today's code, so a re-measurement or a
change of format cannot leave a table behind."""
import os

import pytest

from analysis.report import __main__ as report


def test_every_committed_table_is_what_the_json_gives():
  stale = [os.path.relpath(path, report.ROOT)
           for path, (committed, text) in report.regenerate().items() if committed != text]
  assert not stale, f'run python -m analysis.report: {stale} differ from the committed JSON'


def test_the_readme_holds_the_headline_tables():
  with open(os.path.join(report.ROOT, 'README.md')) as f:
    text = f.read()
  for name in ('configs-digits', 'four-networks', 'bench-cpu', 'bench-gpu', 'tta-squeezenet16'):
    assert f'<!-- generated: {name} (python -m analysis.report) -->' in text, name


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
