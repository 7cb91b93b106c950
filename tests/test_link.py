"""The emulated cluster link (`analysis.steptime.link`): namespaces joined by a bridge, each sending
through a token bucket of the given rate; made and removed by the tool (needs root)."""
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
