"""Several processes forming one mesh (jax.distributed over loopback, gloo collectives)."""
import os
import random
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

from test_step import TinyResNet, _batches, _reference_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, 'PYTHONPATH': ROOT, 'XLA_FLAGS': ''}


@pytest.mark.slow
def test_sync_split_across_two_processes_equals_one_device(tmp_path):
  port = str(random.randint(20000, 40000))
  out = tmp_path / 'result.npz'
  procs = [subprocess.Popen([sys.executable, os.path.join(ROOT, 'tests', 'multiprocess_step.py'),
                             str(i), '2', port, str(out)], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  logs = [p.communicate(timeout=600)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], logs[0][-3000:] + logs[1][-3000:]

  tx = optax.chain(optax.add_decayed_weights(1e-3), optax.sgd(0.1, momentum=0.9))
  ref_state, ref_losses = _reference_run(TinyResNet(), tx, _batches(3, batch=32))
  result = np.load(out)
  np.testing.assert_allclose(result['losses'], ref_losses, rtol=1e-5)
  ref_leaves = jax.tree.leaves((ref_state.params, ref_state.batch_stats))
  assert len(result.files) == len(ref_leaves) + 1
  for i, ref in enumerate(ref_leaves):
    np.testing.assert_allclose(result[f'arr_{i}'], ref, rtol=2e-4, atol=2e-6)


@pytest.mark.slow
def test_launch_local_trains_and_evaluates_every_example(tmp_path, data_dir):
  proc = subprocess.run(
      ['bash', os.path.join(ROOT, 'launch', 'local.sh'), '2', '--config',
       os.path.join(ROOT, 'configs', 'squeezenet.py'), '--workdir', str(tmp_path),
       f'--config.dataset.data_dir={data_dir}', '--config.total_steps=4',
       '--config.optimizer.warmup_steps=1', '--config.checkpoint_every=2'],
      env={**ENV, 'PYTHON': sys.executable, 'JAXPAR_PORT': str(random.randint(20000, 40000))},
      capture_output=True, text=True, timeout=600, cwd=ROOT)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert 'on 360 examples' in proc.stdout
  # Process 1 took part in the same run and evaluation.
  log1 = (tmp_path / 'process_1.log').read_text()
  assert 'test accuracy' in log1 and 'on 360 examples' in log1
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['2', '4']
