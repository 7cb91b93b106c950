"""An emulated cluster link: processes on one machine that talk as if through a switch.

The thesis' regime — workers on 1 Gb/s Ethernet, where communication decides — cannot be
seen over loopback (here tens of GB/s). So each process i of a measurement runs in its own
Linux network namespace with address 10.213.k.(i+1)/24 on one end of a veth pair; the other
ends join one bridge (the switch). The namespace's end sends through a token-bucket filter
(`tc qdisc ... tbf rate R`): every process sends at most R bits/s, as a NIC of rate R into a
non-blocking switch; a ring all-reduce of n bytes over P processes then needs at least
2·n·(P−1)/P bytes per process on the wire, 2·n·(P−1)/(P·R/8) seconds (eq. 4.2's β = 8/R).
netem is not in every kernel (not in this one), so there is no added latency: α stays the
software's.

gloo binds to the address the host name resolves to, and `ip netns exec NS` reads
/etc/netns/NS/hosts over /etc/hosts: each namespace maps the host name to its own address.
Everything is created under a random tag and removed on exit (also after an error). Only
the namespaces' own addresses are used; nothing on the host's interfaces changes.
Needs root and iproute2 (`ip`, `tc`); `unavailable()` says why not in one line.
"""
import os
import random
import re
import shutil
import socket
import subprocess
import uuid

_RATE = re.compile(r'^(\d+(?:\.\d+)?)([kmg]?)bit$')
_UNITS = {'': 1.0, 'k': 1e3, 'm': 1e6, 'g': 1e9}


def bits_per_second(rate: str) -> float:
  """'1gbit' → 1e9: tc's rate syntax in bits (kbit, mbit, gbit)."""
  match = _RATE.match(rate)
  if not match:
    raise ValueError(f'{rate!r} is not a link rate: write it as tc does, e.g. 100mbit or 1gbit')
  return float(match.group(1)) * _UNITS[match.group(2)]


def burst_bytes(bits_per_second: float) -> int:
  """The token bucket's depth: sent at once before the rate holds. At least one 64 KiB
  segment (veth passes GSO packets, twice that for headroom) and 1 ms at the rate."""
  return max(int(bits_per_second / 8 / 1000), 128 * 1024)


def unavailable() -> str | None:
  """Why an emulated link cannot be made here, or None."""
  if os.geteuid() != 0:
    return 'it needs root (network namespaces, veth pairs, a bridge and tc)'
  missing = [tool for tool in ('ip', 'tc') if not shutil.which(tool)]
  if missing:
    return f'it needs {" and ".join(missing)} (iproute2), which is not installed'
  probe = f'jpprobe{uuid.uuid4().hex[:6]}'  # root in a container may still be refused
  made = subprocess.run(['ip', 'netns', 'add', probe], capture_output=True, text=True)
  subprocess.run(['ip', 'netns', 'del', probe], capture_output=True)
  if made.returncode:
    return f'this machine refuses network namespaces ({made.stderr.strip()})'
  return None


def describe(rate: str) -> str:
  """'1gbit' → '1 Gb/s', '100mbit' → '100 Mb/s': a rate as the reports name it."""
  bits = bits_per_second(rate)
  return f'{bits / 1e9:g} Gb/s' if bits >= 1e9 else f'{bits / 1e6:g} Mb/s'


def free_port() -> int:
  """A TCP port free on this host now: where a joined run's process 0 coordinates."""
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def refusal(rate: str) -> str | None:
  """Why a tool's `--link=rate` cannot be used here, in one line, or None: a rate tc does
  not read, or a machine that cannot make the link (`unavailable`)."""
  try:
    bits_per_second(rate)
  except ValueError as e:
    return f'--link: {e}.'
  why_not = unavailable()
  return f'--link={rate}: {why_not}' if why_not else None


def _run(*cmd):
  done = subprocess.run(cmd, capture_output=True, text=True)
  if done.returncode:
    raise RuntimeError(f'emulated link: `{" ".join(cmd)}` failed: {done.stderr.strip()}')


class Link:
  """`processes` namespaces on one bridge, each sending at most `rate` (tc syntax).

  with Link(2, '1gbit') as link:
    subprocess.Popen(link.command(i, [...]))   # process i, in its namespace
    link.addresses[0]                          # where process 0 listens
  """

  def __init__(self, processes: int, rate: str):
    self.rate, self.bits_per_second = rate, bits_per_second(rate)
    tag = uuid.uuid4().hex[:6]
    subnet = random.randrange(256)
    self.bridge = f'jp{tag}br'
    self.namespaces = [f'jp{tag}n{i}' for i in range(processes)]
    self.veths = [(f'jp{tag}h{i}', f'jp{tag}v{i}') for i in range(processes)]  # host, ns side
    self.addresses = [f'10.213.{subnet}.{i + 1}' for i in range(processes)]

  def command(self, i: int, cmd: list) -> list:
    return ['ip', 'netns', 'exec', self.namespaces[i], *cmd]

  def __enter__(self):
    try:
      self._create()
    except BaseException:
      self.remove()
      raise
    return self

  def __exit__(self, *exc):
    self.remove()

  def _create(self):
    burst = burst_bytes(self.bits_per_second)
    hostname = socket.gethostname()
    _run('ip', 'link', 'add', self.bridge, 'type', 'bridge')
    _run('ip', 'link', 'set', self.bridge, 'up')
    for ns, (host_end, ns_end), address in zip(self.namespaces, self.veths, self.addresses):
      _run('ip', 'netns', 'add', ns)
      _run('ip', 'link', 'add', host_end, 'type', 'veth', 'peer', 'name', ns_end)
      _run('ip', 'link', 'set', ns_end, 'netns', ns)
      _run('ip', 'link', 'set', host_end, 'master', self.bridge)
      _run('ip', 'link', 'set', host_end, 'up')
      _run('ip', '-n', ns, 'addr', 'add', f'{address}/24', 'dev', ns_end)
      _run('ip', '-n', ns, 'link', 'set', ns_end, 'up')
      _run('ip', '-n', ns, 'link', 'set', 'lo', 'up')
      _run('tc', '-n', ns, 'qdisc', 'add', 'dev', ns_end, 'root', 'tbf', 'rate', self.rate,
           'burst', str(burst), 'latency', '100ms')
      os.makedirs(f'/etc/netns/{ns}', exist_ok=True)
      with open(f'/etc/netns/{ns}/hosts', 'w') as f:
        f.write(f'127.0.0.1 localhost\n{address} {hostname}\n')

  def remove(self):
    """Removes whatever of it exists (deleting a namespace deletes its veth pair)."""
    for ns, (host_end, _) in zip(self.namespaces, self.veths):
      subprocess.run(['ip', 'netns', 'del', ns], capture_output=True)
      subprocess.run(['ip', 'link', 'del', host_end], capture_output=True)
      shutil.rmtree(f'/etc/netns/{ns}', ignore_errors=True)
    subprocess.run(['ip', 'link', 'del', self.bridge], capture_output=True)
    if os.path.isdir('/etc/netns') and not os.listdir('/etc/netns'):
      os.rmdir('/etc/netns')

  def exists(self) -> bool:
    listed = subprocess.run(['ip', 'netns', 'list'], capture_output=True, text=True).stdout
    links = subprocess.run(['ip', 'link', 'show'], capture_output=True, text=True).stdout
    return (any(ns in listed for ns in self.namespaces) or self.bridge in links
            or any(os.path.exists(f'/etc/netns/{ns}') for ns in self.namespaces))


def launch(module: str, args: list, processes: int, rate: str, folder: str,
           timeout_s: float | None = 3600) -> list:
  """`python -m module ARGS` as `processes` processes joined by `config.distributed` flags
  (process 0 coordinates), process i pinned to core i mod cores, each in its namespace of
  an emulated link of `rate` ('' or 'loopback': over loopback); one process: pinned to core
  0, nothing joined. Each one's output goes to FOLDER/process_i.log. Returns those logs'
  paths; a process that fails, or all still running after `timeout_s` (None: no limit),
  stops the others and raises with the tails of the logs."""
  import contextlib
  import sys
  import time
  emulated = rate and rate != 'loopback' and processes > 1
  cores = os.cpu_count() or 1
  os.makedirs(folder, exist_ok=True)
  with (Link(processes, rate) if emulated else contextlib.nullcontext()) as made:
    host = made.addresses[0] if made else '127.0.0.1'
    port = free_port()
    procs, logs = [], []
    for i in range(processes):
      cmd = [sys.executable, '-m', module, *args]
      if processes > 1:
        cmd += [f'--config.distributed.coordinator={host}:{port}',
                f'--config.distributed.num_processes={processes}',
                f'--config.distributed.process_id={i}']
      if made:
        cmd = made.command(i, cmd)
      logs.append(os.path.join(folder, f'process_{i}.log'))
      with open(logs[-1], 'w') as log:
        procs.append(subprocess.Popen(['taskset', '-c', str(i % cores), *cmd], stdout=log,
                                      stderr=subprocess.STDOUT))
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    timed_out = False
    while any(p.poll() is None for p in procs):
      timed_out = deadline is not None and time.monotonic() > deadline
      if any(p.poll() not in (None, 0) for p in procs) or timed_out:
        for p in procs:
          if p.poll() is None:
            p.kill()
        break
      time.sleep(0.2)
    codes = [p.wait() for p in procs]
  if any(codes):
    tails = []
    for i, path in enumerate(logs):
      with open(path) as f:
        tails.append(f'--- process {i} (exit {codes[i]}) ---\n' + f.read()[-2500:])
    why = (f'stopped at its time limit of {timeout_s:g} s (launch\'s timeout_s)' if timed_out
           else 'failed')
    raise RuntimeError(f"python -m {module} on {processes} process(es)"
                       f"{' over ' + rate if emulated else ''} {why}:\n" + '\n'.join(tails))
  return logs
