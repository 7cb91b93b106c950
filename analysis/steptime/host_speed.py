"""The host's speed at a moment, as the plan's step model reads it: t_grad at the serial batch
b on every device of the plan's processes at once — phase 2's program (`probe.
gradient_call`), the plan's t_grad(b, N) — timed again now, by the plan's processes over its
link.

  python -m analysis.steptime.host_speed --config configs/thesis.py:net=resnet34,batch=16 \
      --config.image_size=32 --devices 2 --out speed.json   (as the plan's processes)

A plan's parts (t_grad, the calls' costs, each program's own work) are measured within a few
minutes; a step trained minutes or hours later runs on the same cores at another speed:
these shared cores take the same program up to 1.8× as long from one hour to the next
(ResNet34 32², t_grad at b = 16 on both cores: 55.7 ms in a plan, 66-102 ms within one
ten-minute launch hours later). `plan_steps` times this beside each row's launch, so that a
row's error at the host's speed of its launch — the prediction × (t_grad now / the plan's
t_grad(b, N)) — separates the step model from the host's drift. Writes (process 0)
{'t_grad_s', 'samples_s', 'batch', 'devices'}.
"""
import json
import os

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file('config', None, "The plan's configs/*.py file[:arg] (with "
                                  'its --config.* overrides).', lock_config=False)
  flags.DEFINE_integer('devices', 1, "The plan's devices (every process's), N of t_grad(b, N).")
  flags.DEFINE_integer('calls', 12, 'Calls timed, after one.')
  flags.DEFINE_string('out', None, 'The JSON file process 0 writes.')


def measure(cfg, devices: int, calls: int) -> dict:
  """t_grad(b, `devices`) now: the median of `calls` calls on every process at once (this
  process's; process 0's is the plan's)."""
  import jax

  from jaxpar import multihost
  from jaxpar.config import with_overrides
  from jaxpar.data import sources
  from jaxpar.plan import call_timing, probe
  b = cfg.per_device_batch
  one = with_overrides(cfg, {**probe.one_device_overrides(cfg, b), 'total_steps': 1})
  source = sources.open_source(cfg.dataset)
  meta = source.meta
  call = probe.gradient_call(one, meta, b, devices // jax.process_count(),
                             probe.initial_variables(one, meta))
  multihost.barrier('host_speed')
  samples = call_timing.timed(call, calls, 1)
  multihost.barrier('host_speed/timed')  # none leaves while another times
  return {'t_grad_s': float(np.median(samples)), 'samples_s': samples, 'batch': b,
          'devices': devices}


def main(argv):
  import jax

  from jaxpar.plan import planner
  del argv
  cfg = planner.prepare(FLAGS.config)
  result = measure(cfg, FLAGS.devices, FLAGS.calls)
  if jax.process_index() == 0 and FLAGS.out:
    with open(FLAGS.out, 'w') as f:
      json.dump(result, f)


if __name__ == '__main__':
  define_flags()
  flags.mark_flags_as_required(['config'])
  app.run(main)
