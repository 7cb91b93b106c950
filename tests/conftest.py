"""Tests run on 8 emulated CPU devices, requested before JAX starts its backend.

Compiled programs are kept in a persistent compilation cache for the session (one
directory shared by the xdist workers, removed at the end): many tests compile the same
steps (the same small networks under the same strategies, a run and its resumed twin),
and compilation is most of the suite's time. Every program is kept, however quickly it
compiled (JAX's default keeps only those over 1 s). Processes the tests launch use it
when they run alone (`runs.process_env(share_compiled=True)`), not in a multi-process
run: only some processes would find their programs there, and a process that compiles
while its peer waits in the first collective can exceed gloo's 30 s rendezvous.

Everything the tests compile, in this process and in those it launches, is compiled without
LLVM's optimisation passes (`--xla_backend_optimization_level=0`): the same arithmetic, and
compiling is most of the suite's time (43 tests of test_servers, test_gossip and
test_one_device: 176 s optimised, 110 s without). Where the jaxlib still has them (jax
0.10; jax 0.12's has not, and an unknown flag in XLA_FLAGS aborts the process, so the
session's first process asks a child first), with XLA's older CPU fusion emitters
(`--xla_cpu_use_fusion_emitters=false`, LLVM IR instead of MLIR): a SqueezeNet step compiles
in 2.7-3.5 s instead of 4.5-5.1 s, GoogLeNet's in 8.8 s instead of 16.7 s, and the whole
suite took 22.5 minutes instead of 33.0 (2 cores of an AVX2-only AMD EPYC, 2026-11-29).
They fuse differently, and so round differently: two programs of the same maths that round
alike with the default emitters can differ in the last bits (tests/test_servers.py's AdamW,
tests/test_accuracy.py's staleness simulator). Runs and measurements outside the tests keep
XLA's defaults.

With `JAXPAR_TEST_REPORT=PATH` the session writes what it ran to PATH as JSON (counts by
outcome, seconds, the marker expression, date, machine, versions, commit, and where the
time went: each test file's seconds and the slowest tests; `JAXPAR_TEST_LEG` names the run):
`.ci/run` sets both for each leg, and docs/install.md's CI tables, docs/testing.md's time
table and the README's suite line are generated from the files it wrote
(analysis/report/ci/).
"""
import atexit
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')
_FAST_COMPILE = '--xla_backend_optimization_level=0'
OLDER_EMITTERS = '--xla_cpu_use_fusion_emitters=false'


def _xla_accepts(flag: str) -> bool:
  """Whether this jaxlib starts with `flag` in XLA_FLAGS (an unknown one aborts it)."""
  done = subprocess.run([sys.executable, '-c', 'import jax; jax.devices()'],
                        env={**os.environ, 'XLA_FLAGS': flag, 'JAX_PLATFORMS': 'cpu'},
                        capture_output=True, timeout=300)
  return done.returncode == 0


if 'JAXPAR_TEST_XLA_CACHE' not in os.environ:  # the session's first process
  # Its workers and the processes the tests launch inherit XLA_FLAGS.
  _flags = [_FAST_COMPILE] + ([OLDER_EMITTERS] if _xla_accepts(OLDER_EMITTERS) else [])
  os.environ['XLA_FLAGS'] = ' '.join(
      [os.environ.get('XLA_FLAGS', '')] + [f for f in _flags
                                           if f not in os.environ.get('XLA_FLAGS', '')]).strip()
  os.environ['JAXPAR_TEST_XLA_CACHE'] = tempfile.mkdtemp(prefix='jaxpar-tests-xla-cache-')
  atexit.register(shutil.rmtree, os.environ['JAXPAR_TEST_XLA_CACHE'], ignore_errors=True)
  # jaxpar's cache folder (`user_cache`) for the session too, removed with it: the tests'
  # image folders leave their decode checks there, and oneDNN's library is built there
  # once (about 3 s), not in the user's ~/.cache.
  os.environ['JAXPAR_CACHE_DIR'] = tempfile.mkdtemp(prefix='jaxpar-tests-cache-')
  atexit.register(shutil.rmtree, os.environ['JAXPAR_CACHE_DIR'], ignore_errors=True)

import jax  # noqa: E402
import pytest  # noqa: E402

from jaxpar.data import sources  # noqa: E402
from jaxpar.host_memory import keep_freed_memory  # noqa: E402

# Before the backend, as every run does: what config.host_memory='auto' chooses for the tests'
# steps (SqueezeNet and the like at 16², batches up to 64: temporaries far below the 64 MiB a
# thread's arena holds, jaxpar/host_memory.py). With `keep`'s one arena the suite compiled
# about 8 % slower (docs/performance.md).
keep_freed_memory('mapped')

jax.config.update('jax_num_cpu_devices', 8)
jax.config.update('jax_compilation_cache_dir', os.environ['JAXPAR_TEST_XLA_CACHE'])
jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)  # unoptimised: most < 1 s
assert jax.device_count() == 8, jax.devices()


_STARTED = time.time()


def _versions() -> dict:
  """{package: installed version, or None}: what the header prints and the report records."""
  import importlib.metadata
  found = {}
  for name in ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'tensorflow-cpu',
               'tensorflow-datasets', 'ray', 'torch'):
    try:
      found[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      found[name] = None
  return found


def pytest_report_header(config):
  """The versions this run tests (CI runs the suite on the oldest and the newest supported)."""
  import platform
  found = ', '.join(f"{name} {version or 'absent'}" for name, version in _versions().items())
  return (f'jaxpar on Python {platform.python_version()}: {found}; '
          f"compiled with XLA_FLAGS={os.environ['XLA_FLAGS']}")


SLOWEST = 15  # tests listed by name in the report (as `--durations=15` prints them)


def time_spent(stats: dict) -> dict:
  """Where a session's time went, from the terminal reporter's reports (every worker's, on
  xdist's controller): {'files': [{'file', 'tests', 'seconds'}], slowest first; 'slowest':
  [{'test', 'seconds'}], the `SLOWEST` slowest tests}. A test's seconds are its setup, call
  and teardown together (a fixture's setup counts where it ran); summed over the workers,
  so with two workers a file's seconds are worker time, not the session's."""
  tests = {}
  for reports in stats.values():
    for r in reports:
      if getattr(r, 'when', None) in ('setup', 'call', 'teardown'):
        tests[r.nodeid] = tests.get(r.nodeid, 0.0) + float(r.duration)
  files = {}
  for nodeid, seconds in tests.items():
    entry = files.setdefault(nodeid.split('::')[0], {'tests': 0, 'seconds': 0.0})
    entry['tests'] += 1
    entry['seconds'] += seconds
  return {'files': [{'file': f, 'tests': e['tests'], 'seconds': round(e['seconds'], 2)}
                    for f, e in sorted(files.items(), key=lambda fe: -fe[1]['seconds'])],
          'slowest': [{'test': t, 'seconds': round(s, 2)} for t, s in
                      sorted(tests.items(), key=lambda ts: -ts[1])[:SLOWEST]]}


def pytest_sessionfinish(session, exitstatus):
  """The session's JSON report where `JAXPAR_TEST_REPORT` asks for one (the controller only,
  not xdist's workers: its terminal reporter holds every worker's results)."""
  path = os.environ.get('JAXPAR_TEST_REPORT')
  if not path or hasattr(session.config, 'workerinput'):
    return
  import datetime

  from jaxpar.plan import probe
  reporter = session.config.pluginmanager.get_plugin('terminalreporter')
  stats = reporter.stats if reporter is not None else {}
  try:
    commit = subprocess.run(['git', 'rev-parse', 'HEAD'], capture_output=True, text=True,
                            cwd=os.path.dirname(__file__), check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    commit = None
  report = {
      'tool': 'pytest', 'leg': os.environ.get('JAXPAR_TEST_LEG', ''),
      'created': datetime.datetime.now().isoformat(timespec='seconds'), 'commit': commit,
      'machine': probe.machine(), 'versions': _versions(),
      'markexpr': session.config.option.markexpr or '', 'collected': session.testscollected,
      'outcomes': {kind: len(reports) for kind, reports in stats.items()
                   if kind and kind != 'warnings'},
      'seconds': round(time.time() - _STARTED, 1), 'exitstatus': int(exitstatus),
      # xdist's workers as started ('auto' and --maxprocesses resolved; 0 without xdist).
      'workers': len(getattr(session.config.option, 'tx', None) or ()),
      'time': time_spent(stats)}
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, 'w') as f:
    json.dump(report, f, indent=1)


def _tensorflow_absent() -> str | None:
  """The TensorFlow package this environment lacks, or None: jaxpar's install has both,
  a GPU image with JAX and PyTorch only (docs/benchmark.md) has neither."""
  import importlib.util
  return next((name for name in ('tensorflow', 'tensorflow_datasets')
               if importlib.util.find_spec(name) is None), None)


_ABSENT = _tensorflow_absent()
# What a test's failure says when it failed for want of TensorFlow: an import, or the
# config check's one line (`sources.NEEDS_TFDS`), in this process or in one it launched
# (whose stderr shows inside a repr, its quotes escaped).
_WANTS_TENSORFLOW = re.compile(r"No module named \\*'tensorflow|" + re.escape(sources.NEEDS_TFDS))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
  """Where TensorFlow is not installed, a test that failed for want of it (and of nothing
  else: its error names the missing import or the config check's line) is reported
  skipped, saying so; every other failure stays a failure. With TensorFlow installed
  (jaxpar's install, CI) nothing changes."""
  outcome = yield
  report = outcome.get_result()
  if (_ABSENT and report.failed and call.excinfo is not None
      and _WANTS_TENSORFLOW.search(str(call.excinfo.value))):
    report.outcome = 'skipped'
    report.longrepr = (item.location[0], (item.location[1] or 0) + 1,
                       f'Skipped: needs {_ABSENT}, not installed here')


@pytest.fixture(scope='session')
def data_dir(tmp_path_factory):
  """A TFDS data_dir holding the bundled digits, built once per session. Where TensorFlow
  Datasets is not installed (a GPU machine with JAX and PyTorch only), the tests that read
  data are skipped; the project's install has it, so they run wherever it is installed."""
  tfds = pytest.importorskip('tensorflow_datasets')

  import jaxpar.data.sklearn_digits  # noqa: F401
  path = str(tmp_path_factory.mktemp('tfds'))
  tfds.builder('sklearn_digits', data_dir=path).download_and_prepare()
  return path
