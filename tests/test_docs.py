"""Every `python -m TOOL …` command written in README.md and docs/ names flags its tool
defines (as the tool's own `--helpfull`, or argparse's `-h`, lists them), `--config.KEY`
overrides that name fields of the config, and configs/ files that exist: a flag renamed
or a field moved cannot leave a copied command behind."""
from concurrent import futures
import glob
import os
import re
import shlex
import subprocess
import sys

import pytest

from jaxpar import config as config_lib
from jaxpar import validation
from runs import ROOT, process_env

# A command in a ```bash block (continuation lines joined) or in one `code span`; it ends at
# a comment, `;`, `&&` or a pipe.
COMMAND = re.compile(r'python -m ([\w.]+)([^#;&|`\n]*)')
NOT_TOOLS = {'pytest', 'pip'}


def commands() -> list[tuple[str, str, str]]:
  """(file, module, arguments) of each command in README.md and docs/*.md."""
  found = []
  docs = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'docs', '*.md')))
  for name in ['README.md'] + docs:
    with open(os.path.join(ROOT, name)) as f:
      text = f.read()
    blocks = [re.sub(r'\\\n\s*', ' ', b)
              for b in re.findall(r'```(?:bash|sh)?\n(.*?)```', text, re.S)]
    spans = re.findall(r'`([^`\n]*python -m [^`\n]*)`', re.sub(r'```.*?```', '', text, flags=re.S))
    for piece in blocks + spans:
      found += [(name, m.group(1), m.group(2)) for m in COMMAND.finditer(piece)
                if m.group(1) not in NOT_TOOLS]
  return found


def defined_flags(module: str) -> set[str]:
  """The flags `module` defines, from its help: absl's `--helpfull`, else argparse's `-h`."""
  def run(flag):
    done = subprocess.run([sys.executable, '-m', module, flag], capture_output=True, text=True,
                          env=process_env(), cwd=ROOT, timeout=300)
    return done.stdout + done.stderr
  text = run('--helpfull')
  if 'usage:' in text:  # argparse: --helpfull is an unknown argument
    text = run('-h')
  return {m.group(2) for m in re.finditer(r'--(\[no\])?(\w[\w.-]*)', text)}


def has_field(config, path: str) -> bool:
  try:
    validation._get(config, path)  # as the config's checks read a dotted field
  except (KeyError, TypeError, AttributeError):
    return False
  return True


def problems(found, flags_of, config) -> list[str]:
  """One line per flag no tool defines, unknown config field, or missing config file."""
  out = []
  for where, module, arguments in found:
    try:
      tokens = shlex.split(arguments)
    except ValueError:  # an unclosed quote in a prose span
      tokens = arguments.split()
    for i, token in enumerate(tokens):
      if not token.startswith('--'):
        continue
      name, _, value = token[2:].partition('=')
      if name.startswith('config.'):
        if not has_field(config, name[len('config.'):]):
          out.append(f'{where}: python -m {module} {token}: the config has no field '
                     f'{name[len("config."):]}')
        continue
      flags = flags_of(module)
      if name not in flags and not (name.startswith('no') and name[2:] in flags):
        out.append(f'{where}: python -m {module} --{name}: the tool defines no such flag')
      if name == 'config':
        value = value or (tokens[i + 1] if i + 1 < len(tokens) else '')
        file = value.split(':')[0]
        if re.fullmatch(r'configs/\w+\.py', file) and not os.path.exists(os.path.join(ROOT, file)):
          out.append(f'{where}: python -m {module} --config {value}: no such file')
  return out


def test_the_checker_finds_an_unknown_flag_field_and_config_file():
  found = [('x.md', 'tool', " --steps 3 --nowarmup --config configs/squeezenet.py "
            "'--config.mesh.shape=(2,)' --stepz 3 --config.dtypo=bfloat16"),
           ('y.md', 'tool', ' --config=configs/gone.py:net=a --config configs/<file>.py')]
  found_lines = problems(found, lambda m: {'steps', 'warmup', 'config'}, config_lib.defaults())
  assert found_lines == [
      'x.md: python -m tool --stepz: the tool defines no such flag',
      'x.md: python -m tool --config.dtypo=bfloat16: the config has no field dtypo',
      'y.md: python -m tool --config configs/gone.py:net=a: no such file']


def test_every_documented_command_names_what_its_tool_defines():
  found = commands()
  modules = sorted({m for _, m, _ in found})
  # The README's quickstart, its table of tools and the docs' recipes are all read.
  assert {'jaxpar.train', 'jaxpar.plan', 'analysis.benchmarks.bench',
          'analysis.steptime.measure', 'analysis.accuracy.tta'} <= set(modules)
  with futures.ThreadPoolExecutor(4) as pool:  # each a process importing its tool
    flags = dict(zip(modules, pool.map(defined_flags, modules)))
  lines = problems(found, flags.get, config_lib.defaults())
  assert not lines, '\n'.join(lines)


def _page_commands(page: str, module: str) -> list[str]:
  """The `python -m MODULE ...` commands of a docs page's bash blocks, continuations joined."""
  with open(os.path.join(ROOT, 'docs', page)) as f:
    text = f.read()
  blocks = [re.sub(r'\\\n\s*', ' ', b) for b in re.findall(r'```bash\n(.*?)```', text, re.S)]
  return [line.split('#')[0].strip() for b in blocks for line in b.splitlines()
          if line.startswith(f'python -m {module} ')]


@pytest.mark.slow
def test_the_datasets_page_trains_on_an_image_folder_and_refuses_an_unprepared_copy(
    data_dir, tmp_path):
  """docs/datasets.md's commands as a user runs them: the image-folder command on a folder of
  generated JPEGs (a few steps, small images: the page's flags unchanged), and the offline
  TFDS command where the copy holds the digits but not CIFAR-10 — one line naming the fields
  and how to prepare it, before anything compiles."""
  import numpy as np
  from jaxpar.data import tf_import
  tf = tf_import.tensorflow()
  commands = _page_commands('datasets.md', 'jaxpar.train')
  (folder,) = [c for c in commands if 'image_folder' in c]
  (offline,) = [c for c in commands if 'download=False' in c]
  rng = np.random.default_rng(0)
  for label in ('daisy', 'tulip'):
    (tmp_path / 'flowers' / label).mkdir(parents=True)
    for i in range(12):
      tf.io.write_file(str(tmp_path / 'flowers' / label / f'{i}.jpg'),
                       tf.io.encode_jpeg(rng.integers(0, 255, (40, 48, 3), np.uint8)))
  small = ['--config.total_steps=2', '--config.optimizer.warmup_steps=1',
           "--config.mesh.shape=(2,)", '--config.per_device_batch=4',
           '--config.image_size=16', '--config.eval_batch=8', '--config.log_every=1']
  args = shlex.split(folder.replace('/data/flowers', str(tmp_path / 'flowers'))
                     .replace('/tmp/flowers', str(tmp_path / 'run')))
  run = subprocess.run([sys.executable, *args[1:], *small], capture_output=True, text=True,
                       env=process_env(share_compiled=True), cwd=ROOT, timeout=600)
  assert run.returncode == 0, run.stderr[-3000:]
  assert 'test accuracy' in run.stdout + run.stderr
  args = shlex.split(offline.replace('/data/tfds', data_dir).replace('/tmp/cifar10',
                                                                     str(tmp_path / 'c')))
  run = subprocess.run([sys.executable, *args[1:]], capture_output=True, text=True,
                       env=process_env(), cwd=ROOT, timeout=600)
  assert run.returncode == 2, run.stderr[-3000:]
  assert (f"config.dataset.name='cifar10' is not prepared in config.dataset.data_dir="
          f"'{data_dir}' and config.dataset.download=False: prepare it on a machine with "
          f"internet (`tfds build cifar10 --data_dir DIR`)") in run.stderr
  assert 'Traceback' not in run.stderr


def test_the_troubleshooting_pages_bad_config_is_the_line_it_shows(tmp_path):
  """docs/troubleshooting.md's first command prints the line the page shows, exit status 2,
  before anything compiles (no traceback)."""
  (command,) = _page_commands('troubleshooting.md', 'jaxpar.train')
  with open(os.path.join(ROOT, 'docs', 'troubleshooting.md')) as f:
    shown = re.search(r'```\n(jaxpar: config\.[^\n]*)\n```', f.read()).group(1)
  args = shlex.split(command.replace('/tmp/t', str(tmp_path / 't')))
  run = subprocess.run([sys.executable, *args[1:]], capture_output=True, text=True,
                       env=process_env(), cwd=ROOT, timeout=300)
  assert run.returncode == 2, run.stderr[-3000:]
  assert shown in run.stderr.splitlines() and 'Traceback' not in run.stderr


def _anchors(path: str) -> set:
  """The anchors GitHub gives the headings of a markdown file (lower case, punctuation
  dropped, spaces as hyphens; a repeated heading gets -1, -2, …)."""
  found, seen = set(), {}
  with open(path) as f:
    for line in f:
      m = re.match(r'^#{1,6}\s+(.*)$', line.rstrip('\n'))
      if m:
        slug = re.sub(r'[^\w\- ]', '', m.group(1).strip().lower()).replace(' ', '-')
        found.add(slug if slug not in seen else f'{slug}-{seen[slug]}')
        seen[slug] = seen.get(slug, 0) + 1
  return found


def broken_links(paths) -> list[str]:
  """'file: target' of each relative markdown link (outside code blocks) whose file does not
  exist or whose #anchor no heading of that file makes."""
  bad = []
  for path in paths:
    with open(path) as f:
      text = re.sub(r'```.*?```', '', f.read(), flags=re.S)
    for m in re.finditer(r'\]\(([^)\s]+)\)', text):
      link = m.group(1)
      if re.match(r'[a-z]+:', link):
        continue
      file, _, anchor = link.partition('#')
      target = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
      if not os.path.exists(target):
        bad.append(f'{os.path.relpath(path, ROOT)}: {link} (no such file)')
      elif anchor and target.endswith('.md') and anchor not in _anchors(target):
        bad.append(f'{os.path.relpath(path, ROOT)}: {link} (no such heading)')
  return bad


def test_every_link_of_the_docs_and_reports_reaches_its_file_and_heading(tmp_path):
  pages = ([os.path.join(ROOT, 'README.md')] + glob.glob(os.path.join(ROOT, 'docs', '*.md'))
           + glob.glob(os.path.join(ROOT, 'analysis', 'report', '**', '*.md'), recursive=True))
  assert broken_links(pages) == []
  page = tmp_path / 'page.md'
  page.write_text('# A heading, with `code`\n## A heading, with `code`\n'
                  '[ok](#a-heading-with-code) [ok](#a-heading-with-code-1) [bad](#a-heading)\n'
                  '[missing](nowhere.md) [web](https://example.org)\n```\n[not](#in-code)\n```\n')
  name = os.path.relpath(page, ROOT)
  assert broken_links([str(page)]) == [f'{name}: #a-heading (no such heading)',
                                       f'{name}: nowhere.md (no such file)']
