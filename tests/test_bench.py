"""analysis.benchmarks.bench on one tiny case: both steps compile, run and report (no timing
asserted)."""
import json
import pathlib
import subprocess
import sys

import jax
import pytest

from analysis.benchmarks import bench, bench_table, torch_peer
from jaxpar import config as config_lib
from jaxpar import models
from jaxpar.step import init_variables

ROOT = pathlib.Path(__file__).parent.parent


def _config(data_dir, **overrides):
  c = config_lib.defaults()
  c.model, c.global_batch = 'squeezenet', 16
  # XLA's convolutions: with the per-tap lowering, the 3×3 kernels on SqueezeNet's 1×1 maps
  # use their centre tap only, and the jit program all-reduces no gradient for the other
  # eight (they are zero), so its bytes are below the whole gradient's.
  c.conv_impl = 'xla'
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
    assert 0 < s['temp_bytes_per_device'] < s['peak_memory_bytes_per_device']
    assert s['page_faults_per_step'] >= 0
    # Both compiled programs all-reduce the gradients over the 8 devices (+ a few metrics).
    assert s['collective_bytes_per_device'] == pytest.approx(2 * 7 / 8 * param_bytes, rel=1e-4)
  assert result['shard_map_over_jit_throughput'] == pytest.approx(
      jit['median_s'] / jaxpar['median_s'])
  assert '| jaxpar shard_map |' in bench.markdown(result)
  row = bench_table.table([result]).splitlines()[-1]
  assert row.startswith('| squeezenet | 32² | float32 | 8 (emulated) | 16 | no BN |')
  assert f"| {result['shard_map_over_jit_throughput']:.3f}× | – | – |" in row
  row = bench_table.methods_table([result]).splitlines()[-1]
  assert row.startswith('| squeezenet | 32² | 8 | 16 | allreduce | sgd |')
  assert row.endswith(f"| {jaxpar['peak_memory_bytes_per_device'] / 1e6:.0f} "
                      f"| {jit['peak_memory_bytes_per_device'] / 1e6:.0f} |")


def test_the_host_memory_table_pairs_the_two_settings_of_one_step():
  def run(setting, ms, faults):
    return {'network': 'resnet34', 'image_size': 32, 'mesh': [2], 'global_batch': 32,
            'config': {'distributed': {'num_processes': 2}, 'bn_group_size': 1,
                       'scheme': 'sync-split', 'server': 'allreduce', 'host_memory': setting},
            'steps': [{'step': 'jaxpar shard_map', 'median_s': ms / 1e3, 'temp_bytes_per_device':
                       170.4e6, 'page_faults_per_step': faults}]}
  old = run('keep', 1.0, 0)
  del old['steps'][0]['page_faults_per_step']  # a file from before the fault counts: left out
  table = bench_table.host_memory_table([run('system', 144.6, 41603), run('keep', 120.4, 0), old])
  assert table.splitlines()[2] == ('| resnet34 32², sync-split allreduce, 16 a device, 2 processes, '
                                   'per-device BN | 170.40 | 144.6 (41,603) | 120.4 (0) |')
  assert len(table.splitlines()) == 3


def test_minor_faults_count_the_pages_a_step_maps_afresh():
  import mmap
  pages = 2048
  region = mmap.mmap(-1, pages * mmap.PAGESIZE)
  if hasattr(mmap, 'MADV_NOHUGEPAGE'):  # one fault per 4 KiB page, not per huge page
    region.madvise(mmap.MADV_NOHUGEPAGE)
  before = bench._minor_faults()
  for i in range(pages):  # the first write to each fresh page faults it in
    region[i * mmap.PAGESIZE] = 1
  assert bench._minor_faults() - before >= pages
  region.close()


def test_bench_refuses_the_async_scheme(data_dir):
  with pytest.raises(config_lib.ConfigError, match="config.scheme='async'"):
    bench.bench(_config(data_dir, scheme='async', server='central'), steps=1, warmup=1)


def test_cli_on_one_device_no_collectives_and_time_by_op(data_dir, tmp_path):
  # The README's command, on one device (its own process: this one has 8). Axes of one
  # device are no data axes: jaxpar's program, like jit's, holds no all-reduce over a
  # group of one device (BN statistics, gradients, metrics).
  out = tmp_path / 'bench.json'
  done = subprocess.run(
      [sys.executable, '-m', 'analysis.benchmarks.bench', '--config',
       'configs/thesis.py:net=squeezenet,scheme=sync-split,server=allreduce,workers=1,batch=4',
       f'--config.dataset.data_dir={data_dir}', '--steps=1', '--warmup=1', '--profile=1',
       f'--out={out}'], capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert done.returncode == 0, done.stderr[-2000:]
  assert 'Time by HLO op' in done.stdout
  for s in json.loads(out.read_text())['steps']:
    assert s['collectives'] == 0 and s['collective_bytes_per_device'] == 0
    by_op = s['profile']['seconds_per_step']
    assert by_op['convolution'] > 0 and 'collective' not in by_op
    _, category, seconds = s['profile']['top'][0]  # the costliest instruction
    assert 0 < seconds <= by_op[category]


@pytest.mark.parametrize('name,size', [('resnet34', 16), ('vgg16e', 32), ('squeezenet', 32),
                                       ('googlenet', 32), ('googlenet', 224)])
def test_torch_peer_is_jaxpars_network(name, size):
  pytest.importorskip('torchvision')
  variables = jax.eval_shape(lambda: init_variables(models.MODELS[name](num_classes=10),
                                                    (1, size, size, 1), jax.random.key(0)))
  kernels = sorted(tuple(k.shape) for k in jax.tree.leaves(variables['params']) if k.ndim > 1)
  peer = torch_peer.materialise(torch_peer.network(name, 10, 1, size), 1, size)
  # torch kernels are (out, in, h, w); flax's (h, w, in, out) and Dense (in, out).
  peer_kernels = sorted((*p.shape[2:], p.shape[1], p.shape[0]) if p.ndim == 4
                        else tuple(p.shape[::-1]) for p in peer.parameters() if p.ndim > 1)
  assert peer_kernels == kernels
  assert (sum(p.numel() for p in peer.parameters())
          == sum(v.size for v in jax.tree.leaves(variables['params'])))


def test_bench_alternates_the_torch_peer(data_dir):
  pytest.importorskip('torch')
  result = bench.bench(_config(data_dir, model='resnet34', image_size=16, global_batch=8),
                       steps=1, warmup=1, profile_steps=1, with_torch=True)
  peer = result['steps'][2]
  assert peer['step'] == 'PyTorch eager' and len(peer['samples']) == 1 and peer['flops_per_device']
  assert result['shard_map_over_torch_throughput'] == pytest.approx(
      peer['median_s'] / result['steps'][0]['median_s'])
  assert "PyTorch's" in bench.markdown(result) and 'Time by HLO op' in bench.markdown(result)


def test_torch_peer_is_refused_for_a_variant_it_does_not_have(data_dir):
  with pytest.raises(config_lib.ConfigError, match='config.batch_norm=True is invalid with'):
    bench.bench(_config(data_dir, batch_norm=True), steps=1, warmup=1, with_torch=True)


def test_bench_table_bad_arguments_are_one_line(tmp_path, capsys):
  with pytest.raises(SystemExit) as e:
    bench_table.main(['--help'])
  assert e.value.code == 2 and 'bench_table runs/*.json' in capsys.readouterr().err
  bad = tmp_path / 'bad.json'
  bad.write_text('{not json')
  with pytest.raises(SystemExit, match='bad.json: not a JSON written by analysis.benchmarks'):
    bench_table.main([str(bad)])


def test_on_a_gpu_the_table_takes_the_steps_flops_from_the_peer():
  # XLA's GPU cost analysis leaves out the cuDNN convolutions: the committed H200 run of
  # VGG16E counted 44 GFLOP where PyTorch counts 7,528 for the same step.
  result = json.loads((ROOT / 'analysis/report/bench/gpu/vgg16e_224_bfloat16_gpu.json').read_text())
  assert result['backend'] == 'gpu'
  jaxpar, _, peer = result['steps']
  assert jaxpar['flops_per_device'] < peer['flops_per_device'] / 100
  text = bench_table.table([result])
  expected = peer['flops_per_device'] / jaxpar['median_s'] / 1e9
  assert text.splitlines()[2].endswith(f'| {expected:,.0f}* |')
  assert text.splitlines()[-1] == bench_table.PEER_FLOPS
  on_cpu = dict(result, backend='cpu')  # there XLA's count is the step's
  counted = jaxpar['flop_per_s_per_device'] / 1e9
  assert counted >= 1000 and bench_table.table([on_cpu]).splitlines()[-1].endswith(
      f'| {counted:,.0f} |')


def test_the_torch_peer_on_jaxs_gpu_needs_a_cuda_torch(data_dir, monkeypatch):
  torch = pytest.importorskip('torch')
  monkeypatch.setattr(bench.jax, 'default_backend', lambda: 'gpu')
  monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
  with pytest.raises(config_lib.ConfigError, match=r"^--torch on JAX's GPU backend needs"):
    bench._torch_device()


def test_the_checks_leave_jaxs_backend_for_the_processes_to_join(data_dir):
  """`check` runs before `build.mesh` joins the processes, and jax.distributed.initialize
  refuses once anything has touched the backend: asking JAX's backend where the PyTorch peer
  runs (as `check` once did) broke every `--torch` bench across processes."""
  code = ('import sys; from jax._src import xla_bridge; '
          'from analysis.benchmarks import bench, torch_peer; '
          'from tests.test_bench import _config; torch_peer.available = lambda: True; '
          f'bench.check(_config({str(data_dir)!r}, batch_norm=False), with_torch=True); '
          'sys.exit(3 if xla_bridge.backends_are_initialized() else 0)')
  done = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]
