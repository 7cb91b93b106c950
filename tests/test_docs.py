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
