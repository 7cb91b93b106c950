"""analysis.benchmarks.config_runs: what a training run prints becomes the README config
table's record (top-1, wall time, steps, the train log), runs merge by name into the JSON,
and a failed run is recorded with its last lines while the others still run."""
import json
import subprocess

import pytest

from analysis.benchmarks import config_runs

OUTPUT = """I1124 metrics.py:71] [train] step 180/360  accuracy 0.81  loss 0.81
I1124 metrics.py:71] [train] step 360/360  accuracy 0.89  loss 0.57
test accuracy: top-1 94.44%, top-5 99.44% on 360 examples; wall time 51.8 s
"""


def _fake_run(outputs):
  real = subprocess.run

  def run(command, **kwargs):
    if '--config' not in command:  # e.g. platform's `uname -p`
      return real(command, **kwargs)
    config = command[command.index('--config') + 1]
    code, text = outputs[config]
    return subprocess.CompletedProcess(command, code, stdout='', stderr=text)
  return run


def test_runs_are_parsed_merged_by_name_and_failures_recorded(tmp_path, monkeypatch):
  monkeypatch.setattr(config_runs.subprocess, 'run', _fake_run({
      'good.py': (0, OUTPUT), 'bad.py': (1, 'Traceback\nConfigError: config.x is invalid\n')}))
  out = tmp_path / 'digits.json'
  out.write_text(json.dumps({'runs': {'kept': {'top1': 0.5}, 'good': {'top1': 0.1}}}))
  assert config_runs.main(['good=good.py', 'bad=bad.py', f'--out={out}', '--flag=1']) == 1
  runs = json.loads(out.read_text())['runs']
  assert runs['kept'] == {'top1': 0.5}  # another run's record stays
  good = runs['good']
  assert (good['top1'], good['top5'], good['test_examples'], good['wall_time_s'],
          good['steps']) == (0.9444, 0.9944, 360, 51.8, 360)
  assert good['flags'] == ['--flag=1'] and good['train_log'][-1].startswith(
      '[train] step 360/360')
  assert runs['bad']['returncode'] == 1 and 'top1' not in runs['bad']
  assert runs['bad']['last_lines'][-1] == 'ConfigError: config.x is invalid'


def test_a_run_without_a_name_is_a_usage_error(tmp_path):
  with pytest.raises(SystemExit):
    config_runs.main(['configs/squeezenet.py', f'--out={tmp_path / "x.json"}'])
