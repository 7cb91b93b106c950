"""Joining a multi-process run, in one process: which cluster environment is read, what a
single process does, what it logs. (Real processes: test_multiprocess.py.)"""
import os
import re

import pytest

from jaxpar import config as config_lib
from jaxpar import multihost

SLURM_STEP = {'SLURM_JOB_ID': '7', 'SLURM_STEP_NODELIST': 'node[01-02]', 'SLURM_PROCID': '0',
              'SLURM_LOCALID': '0'}


@pytest.fixture
def no_cluster(monkeypatch):
  """An environment with no scheduler's variables (whatever the machine running the tests)."""
  for name in list(os.environ):
    if name.startswith(('SLURM_', 'OMPI_', 'PMI', 'TPU_', 'KUBERNETES_', 'JAX_COORDINATOR')):
      monkeypatch.delenv(name)
  return monkeypatch


def test_no_cluster_and_no_coordinator_is_one_process(no_cluster):
  assert multihost.join('', 1, 0, 'auto', 10, 10) == 1
  assert multihost.join('', 1, 0, 'none', 10, 10) == 1


def test_a_one_task_slurm_step_runs_alone_but_several_tasks_are_detected(no_cluster):
  """`salloc`/`srun -n1 python -m jaxpar.train` is a single process: nothing to join."""
  for name, value in SLURM_STEP.items():
    no_cluster.setenv(name, value)
  no_cluster.setenv('SLURM_NTASKS', '1')
  assert multihost.join('', 1, 0, 'auto', 10, 10) == 1
  no_cluster.setenv('SLURM_NTASKS', '8')
  env = multihost._cluster_env('auto')
  assert env.name == 'slurm' and env.get_process_count() == 8
  assert env.get_coordinator_address(None, None).startswith('node01:')
  assert multihost._cluster_env('none') is None


def test_a_named_cluster_that_is_absent_is_a_config_error(no_cluster):
  with pytest.raises(config_lib.ConfigError,
                     match=r"config.distributed.cluster='slurm' is invalid: no slurm"):
    multihost.join('', 1, 0, 'slurm', 10, 10)


def test_the_process_line_says_what_this_process_has():
  cores = sorted(os.sched_getaffinity(0))
  line = multihost.describe_process()
  assert re.fullmatch(r'Process 0 of 1: 8 cpu devices \(emulated\) on cores? [0-9,-]+ of \d+\.',
                      line), line
  assert multihost._ranges(cores) in line
  assert multihost._ranges([0, 1, 2, 5, 7, 8]) == '0-2,5,7-8'
  assert multihost._ranges([3]) == '3'


def test_gloos_loop_thread_is_told_by_its_system_call(tmp_path, monkeypatch):
  """/proc/<tid>/syscall: gloo's loop waits in epoll for 64 events with a 10 ms timeout;
  gRPC's pollers wait for 100 (timeout -1 or a day), other threads in futex, one runs."""
  monkeypatch.setattr('platform.machine', lambda: 'x86_64')
  lines = {'11': '232 0xe 0x7fa86d7f9b30 0x40 0xa 0x0 0x0 0x7ffd 0x7ffe',   # gloo's loop
           '12': '232 0x3 0x7fa891973784 0x64 0xffffffff 0x0 0x0 0x1 0x2',  # gRPC
           '13': '232 0x5 0x559c6524c44c 0x64 0x5265c00 0x0 0x0 0x1 0x2',   # gRPC event engine
           '14': '202 0x7fa8825e5ae0 0x189 0x0 0x0 0x0 0x0 0x1 0x2',        # futex
           '15': 'running',
           '16': '281 0x9 0x7f0000000000 0x40 0xa 0x0 0x8 0x1 0x2'}        # epoll_pwait, gloo's
  for tid, line in lines.items():
    (tmp_path / tid).mkdir()
    (tmp_path / tid / 'syscall').write_text(line + '\n')
  assert sorted(multihost.gloo_loop_threads(str(tmp_path))) == [11, 16]
