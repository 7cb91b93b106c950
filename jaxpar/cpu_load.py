"""CPU time other processes take from this one: the busy time /proc/stat counts on some cores
(or the whole machine) less this process's own, between two readings.

    other = (busy_after − busy_before) − (own_after − own_before)   (never below 0)

Busy: user, nice, system, irq and softirq time (idle and iowait are not; steal is the
hypervisor's, not this machine's work). /proc/stat counts in clock ticks (10 ms at
USER_HZ = 100) and this process's times at finer grain, so a short window can read a few
ticks either way. Used by `measure` (other work during a measurement: a warning) and by
`multihost.IdleGlooLoops` (another process on a gloo loop's core: back to normal priority).
"""
import os


def cpu_clock(stat: str = '/proc/stat', cores=None, children: bool = True) -> tuple | None:
  """(seconds the machine's CPUs have been busy, seconds this process has used), or None
  where the system has no /proc/stat. `cores`: only those CPUs' busy time (their `cpuN`
  lines), None for every CPU. `children`: this process's waited-for children's time too."""
  try:
    with open(stat) as f:
      lines = f.readlines()
  except OSError:
    return None
  busy = 0
  for line in lines:
    name, *ticks = line.split()
    if cores is None and name == 'cpu' or (
        cores is not None and name[3:].isdigit() and name.startswith('cpu')
        and int(name[3:]) in cores):
      user, nice, system, _idle, _iowait, irq, softirq = map(int, ticks[:7])
      busy += user + nice + system + irq + softirq
  own = os.times()
  mine = own.user + own.system + (own.children_user + own.children_system if children else 0)
  return busy / os.sysconf('SC_CLK_TCK'), mine


def other_cpu(before: tuple | None, after: tuple | None) -> float | None:
  """CPU seconds other work took between two `cpu_clock` readings (none below zero: the two
  clocks tick at different grains)."""
  if before is None or after is None:
    return None
  return max(0.0, (after[0] - before[0]) - (after[1] - before[1]))
