"""analysis.measure and analysis.compare end to end with 2 real processes (jax.distributed
over loopback, each pinned to a core). Its own file, so the suite's two workers can run it
beside the emulated case of test_measure.py."""
import csv
import os

import pytest

from test_measure import check_setting, measure_and_compare


@pytest.mark.slow
def test_measure_and_compare_end_to_end_with_two_processes(tmp_path, data_dir):
  result, stderr, report = measure_and_compare(tmp_path, data_dir, '--workers=0',
                                               '--processes=2')
  assert '[processes] [1/1] t_iter sync-join allreduce N=2' in stderr  # progress
  assert set(result['settings']) == {'processes'}
  setting = check_setting(result, 'processes')
  assert setting['processes'] == 2
  assert setting['pinned_cores'] == [0, 1 % (os.cpu_count() or 1)]
  text = (report / 'report.md').read_text()
  assert '| processes | sync-join | allreduce | 2 |' in text
  assert '- **squeezenet** (processes):' in text
  with open(report / 'speedup.csv') as f:
    assert len(list(csv.DictReader(f))) == 2  # N = 1, 2
