"""Regenerates every results table from the JSON committed under analysis/report/.

  python -m analysis.report           # rewrite the tables that differ, list them
  python -m analysis.report --check   # exit 1 naming each table that differs (tests run it)

Two kinds of target:
- whole files under analysis/report/ (`FILES`): the reports and tables the analysis tools
  write (`analysis.steptime.compare`'s report.md, `analysis.benchmarks.bench_table`'s
  table.md), from the JSON beside them;
- tables inside README.md, docs/*.md and the reports written by hand under analysis/report/
  (e.g. performance/report.md), between marker comments (`TABLES`):

      <!-- generated: NAME (python -m analysis.report) -->
      | ... |
      <!-- end: NAME -->

A re-measured JSON, or a change to the code that formats it, is then one command away from
every table that shows it; a table typed by hand cannot drift unseen (tests/test_report.py).
"""
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REPORT = os.path.join(ROOT, 'analysis', 'report')


def _load(*patterns) -> list:
  """The JSON files matching `patterns` (under analysis/report/), in the order given (each
  pattern's matches sorted)."""
  found = []
  for pattern in patterns:
    paths = sorted(glob.glob(os.path.join(REPORT, pattern)))
    if not paths:
      raise FileNotFoundError(f'analysis/report/{pattern}: no file')
    for path in paths:
      with open(path) as f:
        found.append(json.load(f))
  return found


def _bench(*patterns, newest=False):
  from analysis.benchmarks import bench_table
  results = _load(*patterns)
  return bench_table.table(bench_table.newest(results) if newest else results)


def _bench_summary(*patterns):
  from analysis.benchmarks import bench_table
  return bench_table.torch_summary(_load(*patterns))


def _bench_sync_bn(*patterns):
  from analysis.benchmarks import bench_table
  return bench_table.sync_bn_table(_load(*patterns))


def _emulated_mesh():
  from analysis.benchmarks import emulated_mesh
  return emulated_mesh.table(_load('bench/emulated/*.json'))


def _fusion():
  from analysis.benchmarks import bench_table
  return bench_table.fusion_table(_load('bench/fusion/*.json'))


def _host_memory():
  from analysis.benchmarks import bench_table
  return bench_table.host_memory_table(_load('host_memory/bench/*.json'))


def _compile_host_memory():
  from analysis.benchmarks import compile_bench
  return compile_bench.table(_load('compile/*.json'))


def _compile_cache_restart():
  from analysis.benchmarks import restart_bench
  return restart_bench.table(_load('compile_cache/*.json'))


def _host_memory_auto():
  from analysis.benchmarks import malloc_bench
  return malloc_bench.table(_load('host_memory/auto.json')[0])


def _host_memory_processes():
  from analysis.benchmarks import malloc_bench
  return malloc_bench.processes_table(_load('host_memory/processes.json')[0])


def _host_memory_programs():
  from analysis.benchmarks import malloc_bench
  return malloc_bench.networks_table(*_load('host_memory/programs.json'))


def _host_memory_networks():
  from analysis.benchmarks import malloc_bench
  return malloc_bench.networks_table(*_load('host_memory/networks.json',
                                            'host_memory/networks_224.json'))


def _ray_worker_cpus():
  from analysis.benchmarks import ray_worker_bench
  return ray_worker_bench.table(_load('ray/*.json'))


def _methods():
  from analysis.benchmarks import bench_table
  return bench_table.methods_table(_load('bench/methods/*.json'))


def _measured(table, *patterns):
  """`table(results, points)` of `compare` (markdown, overview_table) on measure's files."""
  from analysis.steptime import compare
  results = _load(*patterns)
  return getattr(compare, table)(results, [p for r in results for p in compare.rows(r)])


def _measured_summary(*patterns):
  """`compare.overview_summary` of the points of measure's files."""
  from analysis.steptime import compare
  return compare.overview_summary([p for r in _load(*patterns) for p in compare.rows(r)])


def _held_out(pattern):
  from analysis.steptime import compare
  return compare.summary_table(compare.held_out_summary(compare.rows(_load(pattern)[0])))


def _settings(pattern):
  from analysis.steptime import compare
  result = _load(pattern)[0]
  return compare.settings_table(result, compare.rows(result))


def _tta(*patterns):
  from analysis.accuracy import tta
  return tta.summary_table(_load(*patterns))


def _tta_report(result, steps=None):
  from analysis.accuracy import tta
  return tta.report(_load(result)[0], _load(steps)[0] if steps else None)


def _tta_time(result, steps):
  from analysis.accuracy import tta
  return tta.time_table(_load(result)[0], _load(steps)[0])


def _end_to_end(pattern):
  from analysis.accuracy import end_to_end
  return end_to_end.report(_load(pattern)[0])


def _end_to_end_table(pattern):
  from analysis.accuracy import end_to_end
  return end_to_end.table(_load(pattern)[0])


def _collapse(table):
  from analysis.accuracy import collapse
  return getattr(collapse, table)(_load('accuracy/collapse.json')[0])


# Plans made and judged by 2 processes (analysis.accuracy.plan_regret --processes 2).
PLANS_ACROSS_PROCESSES = ('squeezenet16_p2_loopback', 'squeezenet16_p2_1gbit',
                          'resnet34_16_p2_loopback', 'resnet34_16_p2_1gbit',
                          'squeezenet16_p2_100mbit')


# Plans made with the defaults (two serial seeds, the tie rule, bounded by steps).
PLANS_WITH_DEFAULTS = ('googlenet32_p2_loopback', 'squeezenet32_p2_loopback',
                       'resnet34_32_p2_loopback')
# Every method ranked (BN per device, Local SGD, Downpour: their own runs) and the batch model
# through two measured points; one plan made before the second point, kept to compare.
PLANS_WITH_METHODS = ('methods/squeezenet32_p2_loopback', 'methods/googlenet32_p2_loopback',
                      'methods/resnet34_32_p2_loopback', 'methods/vgg16e32_p2_loopback',
                      'methods/squeezenet32_p2_loopback_ray')
PLANS_BEFORE_THE_SECOND_POINT = ('methods/squeezenet32_p2_loopback_noise_scale',)
# A plan whose tie rule compared ranges with the seeds' spread in them, kept to compare.
PLANS_BEFORE_OWN_RANGES = ('methods/resnet34_32_p2_loopback_tie_with_seeds',)
# Made after phase 3b read each program inside its real step.
PLANS_WITH_REAL_PROGRAMS = ('methods/resnet34_32_p2_loopback_real_programs',)
# Made with the tie rule pairing rows timed in the same rounds of phase 5.
PLANS_WITH_PAIRED_ROUNDS = ('methods/resnet34_32_p2_loopback_paired',
                            'methods/googlenet32_p2_loopback_paired')
# Made with Local SGD run at its smallest period as well as its largest.
PLANS_WITH_TWO_PERIODS = ('methods/googlenet32_p2_loopback_two_periods',)
# Made with phase 5's windows after a step untimed.
PLANS_WITH_UNTIMED_STEP = ('methods/googlenet32_p2_loopback_untimed_step',)
# Made with a tie judged on fewer than plan.tie_windows rounds timed in more.
PLANS_WITH_TIE_ROUNDS = ('methods/googlenet32_p2_loopback_tie_rounds',
                         'methods/squeezenet32_p2_loopback_tie_rounds')
# A subset's reading at the target confirmed on more of the split; then further runs read
# often enough to place K.
PLANS_WITH_CONFIRMED_SUBSET = ('methods/squeezenet32_p2_loopback_confirmed',
                               'methods/squeezenet32_p2_loopback_spaced',
                               'methods/vgg16e32_p2_loopback_spaced')
# A Local SGD row up to the smallest period on that period's own run (`rank.period_run`).
PLANS_WITH_OWN_PERIOD = ('methods/vgg16e32_p2_loopback_own_period',)
# The serial run's metric within its share (step 0's batches timed, readings within half).
PLANS_WITH_METRIC_SHARE = ('methods/squeezenet32_p2_loopback_metric_share',)
# Each family's run at the serial run's seeds, its K their mean (`planner.seed_mean`).
PLANS_WITH_FAMILY_SEEDS = ('methods/squeezenet32_p2_loopback_family_seeds',
                           'methods/resnet34_32_p2_loopback_family_seeds',
                           'methods/googlenet32_p2_loopback_family_seeds')
PLANS_WITH_GATHERED_BN = ('methods/squeezenet32_p2_loopback_gathered_bn',
                          'methods/squeezenet32_p2_loopback_leader_again')
# Every method ranked, each check in the order it was made.
PLANS_CHECKED = (PLANS_WITH_METHODS + PLANS_BEFORE_THE_SECOND_POINT + PLANS_BEFORE_OWN_RANGES
                 + PLANS_WITH_REAL_PROGRAMS + PLANS_WITH_PAIRED_ROUNDS + PLANS_WITH_TWO_PERIODS
                 + PLANS_WITH_UNTIMED_STEP + PLANS_WITH_TIE_ROUNDS + PLANS_WITH_CONFIRMED_SUBSET
                 + PLANS_WITH_OWN_PERIOD + PLANS_WITH_METRIC_SHARE + PLANS_WITH_FAMILY_SEEDS
                 + PLANS_WITH_GATHERED_BN)


def _far_targets():
  from analysis.accuracy import far_targets
  return far_targets.table(_load('plan/far/*.json'))


def _metric_share():
  from analysis.accuracy import metric_share
  return metric_share.table(_load('plan/metric_share/*.json'))


def _plan(name):
  from analysis.accuracy import plan_regret
  return plan_regret.report(*_load(f'plan/{name}.json', f'plan/{name}_regret.json'))


def _plan_summary(*names):
  from analysis.accuracy import plan_regret
  return plan_regret.summary_table(
      [tuple(_load(f'plan/{n}.json', f'plan/{n}_regret.json')) for n in names])


def _plan_latest(*names):
  """`_plan_summary` of each network's newest check among `names` (by the day and hour its
  plan was made, per network, size and setting): where the plan stands, the older checks
  in the record."""
  from analysis.accuracy import plan_regret
  latest = {}
  for plan, regret in (tuple(_load(f'plan/{n}.json', f'plan/{n}_regret.json')) for n in names):
    key = (plan['network'], plan['image_size'], plan['setting'])
    if key not in latest or plan['created'] > latest[key][0]['created']:
      latest[key] = (plan, regret)
  return plan_regret.summary_table(list(latest.values()), dated=True)


def _plan_families(*names):
  from analysis.accuracy import plan_regret
  return plan_regret.family_table(
      [tuple(_load(f'plan/{n}.json', f'plan/{n}_regret.json')) for n in names])


def _config_runs(*names):
  from analysis.benchmarks import config_runs
  return config_runs.table(_load('configs/digits.json')[0], names)


def _conv():
  from analysis.benchmarks import conv_bench
  return conv_bench.table(_load('conv/conv_bench.json')[0]['summary'])


def _join_penalty(runs: dict, header: str | None = None):
  """`compare.join_penalty_table` of measure's files (`runs`: label → pattern), with a first
  column `header` naming each row's run where several stand side by side."""
  from analysis.steptime import compare
  rows_ = []
  for label, pattern in runs.items():
    rows_ += [r | {'run': label} for r in compare.join_penalty(compare.rows(_load(pattern)[0]))]
  return compare.join_penalty_table(rows_, header)


def _gossip(what):
  from analysis.accuracy import gossip_sim
  return (gossip_sim.table(_load('gossip/simulation.json')[0]['runs']) if what == 'simulation'
          else gossip_sim.modes_table())


def _thesis(what):
  from analysis.theory import thesis_report
  return getattr(thesis_report, what)()


def _conv_lowerings():
  """Every lowering per network and size, `auto`'s choice, the best it could pick, and
  PyTorch's, summarised afresh from the rows (`summarize` as it is now)."""
  from analysis.benchmarks import conv_bench
  rows = [r for result in _load('conv/lowerings_224.json', 'conv/lowerings_32.json')
          for r in result['rows']]
  return conv_bench.lowerings_table(conv_bench.summarize(rows))


def _conv_onednn(what):
  """oneDNN's convolutions beside every lowering and PyTorch's (`conv_bench`): per network
  and size summed, whole ('lowerings') or pass by pass ('passes')."""
  from analysis.benchmarks import conv_bench
  rows = [r for result in _load('conv/onednn/lowerings_224.json', 'conv/onednn/lowerings_32.json')
          for r in result['rows']]
  if what == 'passes':
    return conv_bench.passes_table(rows)
  return conv_bench.lowerings_table(conv_bench.summarize(rows))


def _conv_steps(folder):
  from analysis.benchmarks import conv_step_ab
  return conv_step_ab.table(_load(f'conv/{folder}/*.json'))


def _pools():
  from analysis.benchmarks import pool_bench
  return pool_bench.table(_load('pool/float32.json'))


def _gaps():
  from analysis.steptime import gaps
  return gaps.table(_load('measured/collective_gaps.json')[0])


def _small_collectives():
  from analysis.benchmarks import small_collectives
  return small_collectives.table(_load('collectives/small_collectives.json')[0])


def _sums_in_a_chain():
  from analysis.benchmarks import small_collectives
  return small_collectives.chain_table(_load('collectives/sums_in_a_chain.json')[0])


def _input_rate(what):
  from analysis.benchmarks import bench_table, input_rate
  result = _load('input/rate.json')[0]
  if what == 'table':
    return input_rate.table(result)
  gpus = bench_table.newest(_load('bench/gpu/*.json', 'bench/gpu_h100/*.json'))
  return input_rate.cores_needed(result, [r for r in gpus if r['image_size'] == 224])


def _input_hosts():
  from analysis.benchmarks import input_rate
  return input_rate.hosts_table(_load('input/*.json'))


def _gpu_check(folder, what):
  """One GPU check's runs (analysis/benchmarks/gpu_check.sh), each named by its file."""
  from analysis.benchmarks import bench_table
  paths = sorted(glob.glob(os.path.join(REPORT, 'bench/gpu', folder, '*.json')))
  results = [dict(r, run=os.path.basename(p)[:-len('.json')])
             for p, r in zip(paths, _load(f'bench/gpu/{folder}/*.json'))]
  return getattr(bench_table, what)(results)


def _ci(what):
  from analysis.report import ci
  return getattr(ci, what)(_load('ci/*.json'))


def _ci_besides():
  from analysis.report import ci
  return ci.runs_table(_load('ci/besides/*.json'), ci.BESIDES)


FOUR_NETWORKS = ('measured/squeezenet.json', 'measured/vgg16e.json', 'measured/resnet34.json',
                 'measured/googlenet.json')

# analysis/report/<file> ← what generates it.
FILES = {
    'measured/report.md': lambda: _measured('markdown', *FOUR_NETWORKS),
    'gossip/report.md': lambda: _measured('markdown', 'gossip/one_buffer.json'),
    'host_memory/keep/report.md': lambda: _measured('markdown', 'host_memory/keep.json'),
    'host_memory/system/report.md': lambda: _measured('markdown', 'host_memory/system.json'),
    'bench/table.md': lambda: _bench('bench/*.json'),
    'bench/gpu/table.md': lambda: _bench('bench/gpu/*.json'),
    'bench/gpu_h100/table.md': lambda: _bench('bench/gpu_h100/*.json'),
    'bench/methods/table.md': _methods,
    'accuracy/squeezenet16.md': lambda: _tta_report('accuracy/squeezenet16.json',
                                                    'accuracy/squeezenet16_steps.json'),
    'accuracy/squeezenet16_staleness.md': lambda: _tta_report(
        'accuracy/squeezenet16_staleness.json'),
    'accuracy/resnet34_16.md': lambda: _tta_report('accuracy/resnet34_16.json',
                                                   'accuracy/resnet34_16_steps.json'),
    'accuracy/squeezenet16_end_to_end.md': lambda: _end_to_end(
        'accuracy/squeezenet16_end_to_end.json'),
    'plan/squeezenet16.md': lambda: _plan('squeezenet16'),
    'plan/resnet34_16.md': lambda: _plan('resnet34_16'),
    'plan/googlenet16.md': lambda: _plan('googlenet16'),
    **{f'plan/{name}.md': (lambda n=name: _plan(n))
       for name in PLANS_ACROSS_PROCESSES + PLANS_WITH_DEFAULTS + PLANS_CHECKED},
    'thesis_report.md': lambda: _thesis('markdown'),
}

# A table named in README.md or docs/*.md ← what generates it.
TABLES = {
    'conv-small-maps': _conv,
    'conv-lowerings': _conv_lowerings,
    'conv-step-ab': lambda: _conv_steps('step_ab'),
    'conv-step-auto': lambda: _conv_steps('step_auto'),
    'conv-onednn-lowerings': lambda: _conv_onednn('lowerings'),
    'conv-onednn-passes': lambda: _conv_onednn('passes'),
    'conv-step-onednn': lambda: _conv_steps('step_onednn'),
    'conv-step-share': lambda: _conv_steps('step_share'),
    'conv-step-gate': lambda: _conv_steps('step_gate'),
    'conv-step-onednn-bf16': lambda: _conv_steps('step_onednn_bf16'),
    'conv-step-bf16-above16': lambda: _conv_steps('step_bf16_above16'),
    'conv-step-pool': lambda: _conv_steps('step_pool'),
    'conv-step-xla': lambda: _conv_steps('step_xla'),
    'pool-float32': _pools,
    'small-collectives': _small_collectives,
    'sums-in-a-chain': _sums_in_a_chain,
    'collectives-resnet34': lambda: _bench('collectives/bench_resnet34_32_2p_*.json'),
    'calls-after-compute': _gaps,
    'configs-digits': lambda: _config_runs('resnet34_2d', 'vgg16e', 'googlenet', 'squeezenet'),
    'configs-thesis-grid': lambda: _config_runs(
        'thesis:squeezenet,async,central,4', 'thesis:squeezenet,sync-split,distributed,4',
        'thesis:resnet34,sync-join,distributed,4', 'thesis:googlenet,sync-join,distributed,4',
        'thesis:vgg16e,sync-join,distributed,2'),
    'tta-squeezenet16': lambda: _tta('accuracy/squeezenet16.json',
                                     'accuracy/squeezenet16_staleness.json'),
    'tta-time-squeezenet16': lambda: _tta_time('accuracy/squeezenet16.json',
                                               'accuracy/squeezenet16_steps.json'),
    'tta-time-resnet34_16': lambda: _tta_time('accuracy/resnet34_16.json',
                                              'accuracy/resnet34_16_steps.json'),
    'end-to-end-squeezenet16': lambda: _end_to_end_table(
        'accuracy/squeezenet16_end_to_end.json'),
    'end-to-end-squeezenet16-seed1': lambda: _end_to_end_table(
        'accuracy/squeezenet16_end_to_end_seed1.json'),
    'four-networks': lambda: _measured('overview_table', *FOUR_NETWORKS),
    'four-networks-summary': lambda: _measured_summary(*FOUR_NETWORKS),
    'held-out-squeezenet': lambda: _held_out('measured/squeezenet.json'),
    'settings-squeezenet': lambda: _settings('measured/squeezenet.json'),
    'collapse-similarity': lambda: _collapse('similarity_table'),
    'collapse-dead-classes': lambda: _collapse('dead_table'),
    'collapse-training': lambda: _collapse('training_table'),
    'bench-cpu': lambda: _bench('bench/*.json'),
    'bench-cpu-summary': lambda: _bench_summary('bench/*.json'),
    'bench-gpu': lambda: _bench('bench/gpu/*_gpu.json'),
    'bench-gpu-h100': lambda: _bench('bench/gpu_h100/*.json'),
    'bench-gpu-2026-11-28': lambda: _bench('bench/gpu/*_2026-11-28.json'),
    'bench-gpu-2026-11-29': lambda: _bench('bench/gpu/*_2026-11-29.json'),
    'grad-fusion': _fusion,
    'input-rate': lambda: _input_rate('table'),
    'input-cores-per-gpu': lambda: _input_rate('cores'),
    'input-rate-hosts': _input_hosts,
    'gpu-check-2026-12-04': lambda: _gpu_check('check_2026-12-04', 'check_table'),
    'gpu-kernels-2026-12-04': lambda: _gpu_check('check_2026-12-04', 'kernel_table'),
    'bench-sync-bn': lambda: _bench_sync_bn('bench/sync_bn/*.json'),
    'emulated-mesh': _emulated_mesh,
    'bench-gpus': lambda: _bench('bench/gpu/*.json', 'bench/gpu_h100/*.json', newest=True),
    'bench-methods': _methods,
    'host-memory-faults': _host_memory,
    'host-memory-compile': _compile_host_memory,
    'host-memory-auto': _host_memory_auto,
    'host-memory-processes': _host_memory_processes,
    'host-memory-networks': _host_memory_networks,
    'host-memory-programs': _host_memory_programs,
    'compile-cache-restart': _compile_cache_restart,
    'ray-worker-cpus': _ray_worker_cpus,
    'join-penalty-squeezenet': lambda: _join_penalty({'': 'measured/squeezenet.json'}),
    'join-penalty-host-memory': lambda: _join_penalty(
        {'system': 'host_memory/system.json', 'keep': 'host_memory/keep.json'}, 'host_memory'),
    'thesis-best': lambda: _thesis('summary_table'),
    'gossip-modes': lambda: _gossip('modes'),
    'gossip-simulation': lambda: _gossip('simulation'),
    'ci-versions': lambda: _ci('versions_table'),
    'ci-runs': lambda: _ci('runs_table'),
    'ci-suite': lambda: _ci('suite_line'),
    'ci-time': lambda: _ci('time_table'),
    'ci-besides': _ci_besides,
    'plan-regret': lambda: _plan_summary('squeezenet16', 'resnet34_16', 'googlenet16'),
    'plan-regret-processes': lambda: _plan_summary(*PLANS_ACROSS_PROCESSES),
    'plan-regret-defaults': lambda: _plan_summary(*PLANS_WITH_DEFAULTS),
    'plan-regret-methods': lambda: _plan_summary(*PLANS_CHECKED),
    'plan-regret-latest': lambda: _plan_latest(*PLANS_CHECKED),
    'plan-methods-rows': lambda: _plan_families(*PLANS_CHECKED),
    'plan-far-targets': _far_targets,
    'plan-metric-share': _metric_share,
}

def _test_files() -> str:
  """Each test file and what it checks: the first paragraph of its module docstring."""
  import ast
  lines = ['| file | what it checks |', '|---|---|']
  for path in sorted(glob.glob(os.path.join(ROOT, 'tests', 'test_*.py'))):
    with open(path) as f:
      doc = ast.get_docstring(ast.parse(f.read())) or ''
    first = ' '.join(doc.split('\n\n')[0].split()).replace('|', '\\|')
    lines.append(f'| `{os.path.basename(path)}` | {first} |')
  return '\n'.join(lines)


TABLES['test-files'] = _test_files


def _digits_recipes() -> str:
  """`DIGITS_RECIPES` as the trainer reads them: rate per 256 examples, epochs of the
  digits' training split, and the steps these make at global batch 64."""
  from jaxpar import config as config_lib
  train_images = 1437  # the digits' training split (test_percent 20)
  lines = ['| network | learning rate (per 256) | epochs | steps (batch 64) | BatchNorm |',
           '|---|---:|---:|---:|---|']
  for model, recipe in config_lib.DIGITS_RECIPES.items():
    run = config_lib.with_overrides(config_lib.defaults(), {
        'scheme': 'sync-split', 'global_batch': 64, 'num_epochs': recipe['num_epochs']})
    steps = config_lib.run_steps(run, train_images)
    norm = 'after every convolution (a variant)' if recipe.get('batch_norm') else 'as published'
    lines.append(f"| {model} | {recipe['base_lr']:g} | {recipe['num_epochs']} | {steps} | {norm} |")
  return '\n'.join(lines)


TABLES['digits-recipes'] = _digits_recipes


def _plan_steps():
  from analysis.steptime import plan_steps
  return plan_steps.table(*_load('plan/steps/*.json'))


TABLES['plan-steps'] = _plan_steps

_MARKED = re.compile(r'(<!-- generated: (?P<name>[\w-]+) \(python -m analysis\.report\) -->\n)'
                     r'(?P<body>.*?)(<!-- end: (?P=name) -->)', re.S)
_START = re.compile(r'<!-- generated: ([\w-]+) ')


def pages() -> list:
  """README.md and docs/*.md: the pages a user reads."""
  return [os.path.join(ROOT, 'README.md')] + sorted(glob.glob(os.path.join(ROOT, 'docs', '*.md')))


def documents() -> list:
  """`pages` and the reports written by hand under analysis/report/ (those not in `FILES`)
  that hold a marked table."""
  generated = {os.path.join(REPORT, name) for name in FILES}
  reports = []
  for path in sorted(glob.glob(os.path.join(REPORT, '**', '*.md'), recursive=True)):
    if path not in generated:
      with open(path) as f:
        if _START.search(f.read()):
          reports.append(path)
  return pages() + reports


# A table cell that is a measurement: a number with a decimal point or a unit, alone in
# its cell (a range, ± or a parenthesis may follow). Prose cells that quote a default
# among words are not cells of measurements.
_MEASURED_CELL = re.compile(
    r'[~≈<>≤≥±]?\s*-?\d[\d,]*(\.\d+)?\s*'
    r'(ms|µs|s|%|×|x|images/s|steps/s|GB/s|MB/s|MiB|GiB|MB|GB)?(\s*(\(|[–-]|±).*)?')


def hand_tables(text: str) -> list[int]:
  """The lines (1-based) of table rows, in prose or in a code block, that hold a
  measurement outside a generated block: each results table is generated from JSON."""
  found, generated = [], False
  for i, line in enumerate(text.split('\n'), 1):
    if line.startswith('<!-- generated:'):
      generated = True
    elif line.startswith('<!-- end:'):
      generated = False
    elif not generated and line.lstrip().startswith('|') and set(line.strip()) - set('|-: '):
      for cell in line.strip().strip('|').split('|'):
        m = _MEASURED_CELL.fullmatch(cell.strip().strip('*'))
        if m and (m.group(1) or m.group(2)):
          found.append(i)
          break
  return found


def hand_tables_in_docs() -> list[str]:
  """'file:line' of each measurement typed by hand into a table of README.md or docs/."""
  out = []
  for path in pages():
    with open(path) as f:
      out += [f'{os.path.relpath(path, ROOT)}:{i}' for i in hand_tables(f.read())]
  return out


def regenerate() -> dict:
  """{path: (committed text, regenerated text)} of every target."""
  out = {}
  for name, make in FILES.items():
    path = os.path.join(REPORT, name)
    with open(path) as f:
      committed = f.read()
    # Ending in a newline as the committed file does (the tools print without one).
    out[path] = (committed, make().rstrip('\n') + ('\n' if committed.endswith('\n') else ''))
  made = {}  # a table shown in several documents is generated once
  for path in documents():
    with open(path) as f:
      committed = f.read()

    def fill(m):
      name = m.group('name')
      if name not in TABLES:
        raise KeyError(f"{os.path.relpath(path, ROOT)}: no generator for table "
                       f"{name!r}; known: {', '.join(TABLES)}")
      if name not in made:
        made[name] = TABLES[name]()
      return m.group(1) + made[name] + '\n' + m.group(4)
    if len(_START.findall(committed)) != len(_MARKED.findall(committed)):
      raise ValueError(f'{os.path.relpath(path, ROOT)}: a "<!-- generated: NAME" marker without '
                       f'its "<!-- end: NAME -->"')
    out[path] = (committed, _MARKED.sub(fill, committed))
  return out


def main(argv) -> int:
  check = argv == ['--check']
  if argv and not check:
    print(__doc__, file=sys.stderr)
    return 2
  stale = []
  for path, (committed, text) in regenerate().items():
    if committed != text:
      stale.append(os.path.relpath(path, ROOT))
      if not check:
        with open(path, 'w') as f:
          f.write(text)
  if check and stale:
    print('tables that differ from what the committed JSON gives (run python -m '
          f"analysis.report): {', '.join(stale)}", file=sys.stderr)
    return 1
  typed = hand_tables_in_docs()
  if typed:
    print('measurements typed into a table outside a generated block (commit their JSON '
          f"and name a generator in TABLES): {', '.join(typed)}", file=sys.stderr)
    return 1
  print(('rewrote: ' + ', '.join(stale)) if stale and not check else 'every table is current')
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
