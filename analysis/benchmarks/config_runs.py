"""The README's config table: each config trained on the bundled digits, its top-1 and time.

  python -m analysis.benchmarks.config_runs --out analysis/report/configs/digits.json \\
      squeezenet=configs/squeezenet.py 'sq_async=configs/thesis.py:net=squeezenet,scheme=async'

Each NAME=CONFIG runs `python -m jaxpar.train --config CONFIG --workdir TMP [extra flags]` as a
user would, one after the other; the final line's top-1/top-5 and wall time (compilation
included), the process time and the `[train]` log lines go into the JSON under NAME, beside
the runs already there (a name run again is replaced). A run that fails is reported and
recorded with its return code and last lines; the others still run.
"""
import argparse
import datetime
import json
import os
import re
import resource
import subprocess
import sys
import tempfile

from analysis.steptime.measure import machine

FINAL = re.compile(r'test accuracy: top-1 ([\d.]+)%, top-5 ([\d.]+)% on (\d+) examples; '
                   r'wall time ([\d.]+) s')
STEPS = re.compile(r'\[train\] step (\d+)/(\d+)')


def run_one(config: str, extra: list[str]) -> dict:
  """Trains one config in a fresh process; returns what its output says."""
  with tempfile.TemporaryDirectory(prefix='config_run_') as workdir:
    # A first launch, compiling everything (not loading what an earlier run kept).
    command = [sys.executable, '-m', 'jaxpar.train', '--config', config,
               '--workdir', workdir, '--config.compilation_cache=off', *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(command, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
  lines = (proc.stdout + proc.stderr).splitlines()
  record = {'config': config, 'flags': extra, 'returncode': proc.returncode,
            'date': datetime.date.today().isoformat(),
            'process_time_s': round(after.ru_utime + after.ru_stime
                                    - before.ru_utime - before.ru_stime, 2),
            'train_log': [line[line.index('[train]'):] for line in lines if '[train]' in line]}
  final = [m for m in map(FINAL.search, lines) if m]
  if proc.returncode or not final:
    record['last_lines'] = lines[-15:]
    return record
  top1, top5, count, wall = final[-1].groups()
  steps = [m for m in map(STEPS.search, record['train_log']) if m]
  record.update(top1=round(float(top1) / 100, 4), top5=round(float(top5) / 100, 4),
                test_examples=int(count), wall_time_s=float(wall),
                steps=int(steps[-1].group(2)) if steps else None)
  return record


def table(data: dict, names) -> str:
  """The README's table of the shipped configs' runs (`names`, in that order) in `data` (the
  JSON `main` writes): test top-1 and top-5, wall time with compilation, steps, date."""
  lines = ['| config | test top-1 | top-5 | wall time (compilation included) | steps | date |',
           '|---|---:|---:|---:|---:|---|']
  for name in names:
    r = data['runs'][name]
    lines.append(f"| `{r.get('config', f'configs/{name}.py')}` | {r['top1']:.1%} | {r['top5']:.1%} "
                 f"| {r['wall_time_s'] / 60:.1f} min | {r['steps']} | {r['date']} |")
  return '\n'.join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('runs', nargs='+', metavar='NAME=CONFIG')
  parser.add_argument('--out', required=True, help='JSON to add the runs to (created if absent)')
  args, extra = parser.parse_known_args(argv)
  runs = []
  for spec in args.runs:
    name, sep, config = spec.partition('=')
    if not sep or not name or not config:
      parser.error(f'run {spec!r}: write NAME=CONFIG, e.g. squeezenet=configs/squeezenet.py')
    runs.append((name, config))
  data = {'runs': {}}
  if os.path.exists(args.out):
    with open(args.out) as f:
      data = json.load(f)
  data.update(machine=machine(), command='python -m jaxpar.train --config CONFIG --workdir DIR')
  for name, config in runs:
    print(f'[config_runs] {name}: {config} {" ".join(extra)}', flush=True)
    record = run_one(config, extra)
    data['runs'][name] = record
    summary = (f'top-1 {record["top1"]:.2%}, {record["wall_time_s"]:.0f} s, {record["steps"]} steps'
               if 'top1' in record else f'FAILED (return code {record["returncode"]})')
    print(f'[config_runs] {name}: {summary}', flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
      json.dump(data, f, indent=1)
  return 0 if all('top1' in data['runs'][n] for n, _ in runs) else 1


if __name__ == '__main__':
  sys.exit(main())
