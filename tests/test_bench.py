"""analysis.bench on one tiny case: both steps compile, run and report (no timing asserted)."""
import pytest

from analysis import bench
from jaxpar import config as config_lib


def _config(data_dir, **overrides):
  c = config_lib.defaults()
  c.model, c.global_batch = 'squeezenet', 16
  c.dataset.data_dir = data_dir
  c.update_from_flattened_dict(overrides)
  return c


def test_bench_runs_both_steps_and_reads_their_compiled_programs(data_dir):
  result = bench.bench(_config(data_dir), steps=2, warmup=1)
  jaxpar, jit = result['steps']
  assert (jaxpar['step'], jit['step']) == ('jaxpar shard_map', 'auto-sharded jit')
  param_bytes = 731_146 * 4  # SqueezeNet at 10 classes, float32
  for s in (jaxpar, jit):
    assert len(s['samples']) == 2 and s['median_s'] > 0 and s['compile_s'] > 0
    assert s['flops_per_device'] > 0 and s['peak_memory_bytes_per_device'] > param_bytes
    # Both compiled programs all-reduce the gradients over the 8 devices (+ a few metrics).
    assert s['collective_bytes_per_device'] == pytest.approx(2 * 7 / 8 * param_bytes, rel=1e-4)
  assert result['shard_map_over_jit_throughput'] == pytest.approx(
      jit['median_s'] / jaxpar['median_s'])
  assert '| jaxpar shard_map |' in bench.markdown(result)


def test_bench_refuses_the_async_scheme(data_dir):
  with pytest.raises(config_lib.ConfigError, match="config.scheme='async'"):
    bench.bench(_config(data_dir, scheme='async', server='central'), steps=1, warmup=1)
