"""The emulated cluster link (`analysis.steptime.link`): namespaces joined by a bridge, each sending
through a token bucket of the given rate; made and removed by the tool (needs root)."""
import os
import subprocess
import sys

import pytest

from analysis.steptime import link

_WHY_NOT = link.unavailable()  # probes by making a namespace: once
needs_root = pytest.mark.skipif(_WHY_NOT is not None, reason=f'emulated link: {_WHY_NOT}')

_RECEIVE = ("import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 5001)); s.listen(); "
            "c, _ = s.accept(); n = 0; t = time.perf_counter()\n"
            "while d := c.recv(1 << 20): n += len(d)\n"
            "print(n, time.perf_counter() - t)")  # bytes, and seconds from accept to the end


def test_rates_read_as_tc_writes_them():
  assert link.bits_per_second('1gbit') == 1e9
  assert link.bits_per_second('100mbit') == 1e8
  assert link.bits_per_second('2.5gbit') == 2.5e9
  assert link.bits_per_second('800kbit') == 8e5
  for bad in ('1gbps', '1 gbit', 'fast', '100MBit'):
    with pytest.raises(ValueError, match='is not a link rate'):
      link.bits_per_second(bad)


@needs_root
def test_a_link_carries_bytes_at_its_rate_and_is_removed():
  """8 MiB from process 0's namespace to process 1's over 100 Mbit/s take about the 0.67 s
  the rate allows (loopback takes milliseconds); the host name resolves to each
  namespace's own address; after the block no namespace, veth, bridge or hosts file is left."""
  size = 8 << 20
  with link.Link(2, '100mbit') as made:
    assert made.exists()
    for i, address in enumerate(made.addresses):
      hosts = subprocess.run(made.command(i, ['getent', 'hosts', link.socket.gethostname()]),
                             capture_output=True, text=True, check=True).stdout
      assert hosts.split()[0] == address
    receiver = subprocess.Popen(made.command(1, [sys.executable, '-c', _RECEIVE]),
                                stdout=subprocess.PIPE, text=True)
    send = (f"import socket, time\n"
            f"for _ in range(100):\n"
            f"  try: c = socket.create_connection(('{made.addresses[1]}', 5001)); break\n"
            f"  except OSError: time.sleep(0.05)\n"
            f"c.sendall(b'x' * {size}); c.close()")
    subprocess.run(made.command(0, [sys.executable, '-c', send]), check=True, timeout=60)
    received, took = receiver.communicate(timeout=60)[0].split()
  assert int(received) == size
  # Less the token bucket's burst sent at once; a little over for TCP's headers.
  assert (size - link.burst_bytes(1e8)) * 8 / 1e8 <= float(took) < 2 * size * 8 / 1e8, took
  assert not made.exists()


@needs_root
def test_a_failed_link_leaves_nothing_behind(monkeypatch):
  made = link.Link(2, '1gbit')
  made.veths[1] = (made.veths[1][0], 'x' * 20)  # an interface name ip refuses
  with pytest.raises(RuntimeError, match='emulated link: `ip link add'):
    with made:
      pass
  assert not made.exists()


_ECHO = ("import json, os, socket, sys\n"
         "print(json.dumps({'argv': sys.argv[1:], 'cores': sorted(os.sched_getaffinity(0)),\n"
         "                  'address': socket.gethostbyname(socket.gethostname())}))\n"
         "sys.exit(3 if '--fail' in sys.argv and sys.argv[-1].endswith('=1') else 0)\n")


def _echoes(logs):
  import json
  return [json.loads(open(path).read().strip().splitlines()[-1]) for path in logs]


@pytest.mark.parametrize('rate', ['loopback', pytest.param('100mbit', marks=needs_root)])
def test_processes_are_launched_joined_pinned_and_in_their_namespaces(tmp_path, monkeypatch,
                                                                      rate):
  """`link.launch`: each process gets the coordinator (process 0's address), the count and
  its id, a core of its own, and (over an emulated link) its namespace's address; one
  process gets none of the flags; a failed process is one error naming it, with its log."""
  (tmp_path / 'jp_echo.py').write_text(_ECHO)
  monkeypatch.setenv('PYTHONPATH', str(tmp_path))
  (alone,) = _echoes(link.launch('jp_echo', ['--x=1'], 1, rate, str(tmp_path / 'one')))
  assert alone['argv'] == ['--x=1'] and alone['cores'] == [0]
  echoes = _echoes(link.launch('jp_echo', ['--x=1'], 2, rate, str(tmp_path / 'two')))
  coordinator = {e['argv'][1].split('=')[1] for e in echoes}
  assert len(coordinator) == 1
  host = coordinator.pop().split(':')[0]
  for i, e in enumerate(echoes):
    assert e['argv'][0] == '--x=1' and e['argv'][2:] == [
        '--config.distributed.num_processes=2', f'--config.distributed.process_id={i}']
    assert e['cores'] == [i % (os.cpu_count() or 1)]
  if rate == 'loopback':
    assert host == '127.0.0.1'
  else:  # each process in its namespace, process 0's address the coordinator's
    assert echoes[0]['address'] == host and echoes[1]['address'] != host
    assert host.startswith('10.213.')
  with pytest.raises(RuntimeError, match=r'(?s)jp_echo on 2 process\(es\).*process 1 \(exit 3\)'):
    link.launch('jp_echo', ['--fail'], 2, rate, str(tmp_path / 'fail'))


def test_a_launch_past_its_time_limit_is_stopped_and_says_so(tmp_path, monkeypatch):
  """Processes still running at `timeout_s` are killed, and the error names the limit (not
  a bare 'failed' with exit -9); `timeout_s=None` waits as long as they run."""
  (tmp_path / 'jp_sleep.py').write_text('import sys, time\ntime.sleep(float(sys.argv[1]))\n')
  monkeypatch.setenv('PYTHONPATH', str(tmp_path))
  with pytest.raises(RuntimeError, match=r'(?s)jp_sleep on 2 process\(es\) stopped at its time '
                     r'limit of 1 s.*process 0 \(exit -9\)'):
    link.launch('jp_sleep', ['60'], 2, 'loopback', str(tmp_path / 'slow'), timeout_s=1)
  assert len(link.launch('jp_sleep', ['0.5'], 2, 'loopback', str(tmp_path / 'free'),
                         timeout_s=None)) == 2
