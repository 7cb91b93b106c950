"""analysis.benchmarks.bench on one tiny case: both steps compile, run and report (no timing
asserted)."""
import json
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from analysis.benchmarks import alternate, bench, bench_table, torch_peer
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


def test_bench_runs_both_steps_and_reads_their_compiled_programs(data_dir, monkeypatch):
  calls = []
  run = bench.Runner.__call__

  def recorded(self, timed=True):
    calls.append((self.name, timed))
    return run(self, timed)
  monkeypatch.setattr(bench.Runner, '__call__', recorded)
  # `within`: after the 2 rounds asked for, a round for each runner at a time (each leads
  # once) until the jit/jaxpar ratio is known closely enough — here (a stand-in for the
  # interval) once 3 rounds are in: after the 4th.
  asked = []

  def known_within(a, b, within):
    asked.append((len(a), len(b), within))
    return len(a) >= 3
  monkeypatch.setattr(alternate, 'known_within', known_within)
  result = bench.bench(_config(data_dir), steps=2, warmup=1, repeat=2, within=0.03,
                       max_steps=5)
  assert asked == [(2, 2, 0.03), (4, 4, 0.03)] and result['rounds'] == 4
  assert result['within'] == 0.03
  # A warm-up round, then each round each runner's untimed step and its timed one in a row,
  # each round starting with the next runner.
  names = ('jaxpar shard_map', 'auto-sharded jit')
  assert calls == [(n, False) for n in names] + [
      c for n in (names + names[::-1]) * 2 for c in ((n, False), (n, True))]
  assert result['repeat'] == 2
  assert result['host_speed']['matmul_gflop_s'] > 0 and result['host_speed']['copy_gb_s'] > 0
  jaxpar, jit = result['steps']
  assert (jaxpar['step'], jit['step']) == ('jaxpar shard_map', 'auto-sharded jit')
  param_bytes = 731_146 * 4  # SqueezeNet at 10 classes, float32
  # Less fire 9's 3×3 kernel (64 → 256) on its 1×1 map: its 8 taps that read padding only.
  sent_bytes = {'jaxpar shard_map': param_bytes - 8 * 64 * 256 * 4,
                'auto-sharded jit': param_bytes}
  for s in (jaxpar, jit):
    assert len(s['samples']) == 4 and s['median_s'] > 0 and s['compile_s'] > 0
    assert s['flops_per_device'] > 0 and s['peak_memory_bytes_per_device'] > param_bytes
    assert 0 < s['temp_bytes_per_device'] < s['peak_memory_bytes_per_device']
    assert s['page_faults_per_step'] >= 0
    # Both compiled programs all-reduce the gradients over the 8 devices (+ a few metrics).
    assert s['collective_bytes_per_device'] == pytest.approx(2 * 7 / 8 * sent_bytes[s['step']],
                                                             rel=1e-4)
  # Round by round: each round's jit step over its jaxpar step, the median of the four.
  ratios = np.sort(np.array(jit['samples']) / np.array(jaxpar['samples']))
  assert result['shard_map_over_jit_throughput'] == pytest.approx((ratios[1] + ratios[2]) / 2)
  assert result['shard_map_over_jit_quartiles'] == pytest.approx(
      [0.25 * ratios[0] + 0.75 * ratios[1], 0.75 * ratios[2] + 0.25 * ratios[3]])
  # Four rounds: the median's interval is their range.
  assert result['shard_map_over_jit_interval'] == pytest.approx([ratios[0], ratios[3]])
  assert '| jaxpar shard_map |' in bench.markdown(result)
  row = bench_table.table([result]).splitlines()[-1]
  assert row.startswith('| squeezenet | 32² | float32 | 8 (emulated) | 16 | no BN |')
  low, high = result['shard_map_over_jit_interval']
  assert (f"| {result['shard_map_over_jit_throughput']:.3f}× [{low:.2f}–{high:.2f}] | – | – |"
          in row)
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


def test_the_ratio_is_taken_round_by_round():
  # A host that runs the third round at half speed slows both of its steps: the rounds'
  # ratios stay 2.0, where the ratio of the medians would read 1.0.
  jaxpar, peer = [0.1, 0.1, 0.2, 0.2, 0.2], [0.2, 0.2, 0.4, 0.4, 0.4]
  assert alternate.paired_ratio(peer, [0.1, 0.2, 0.2, 0.1, 0.1]) != alternate.paired_ratio(peer, jaxpar)
  assert alternate.paired_ratio(peer, jaxpar) == {'median': 2.0, 'q25': 2.0, 'q75': 2.0,
                                                  'interval': [2.0, 2.0]}
  spread = alternate.paired_ratio([1.0, 1.1, 1.2, 1.3, 1.4], [1.0] * 5)
  assert spread['interval'] == pytest.approx([1.0, 1.4])  # 5 rounds: their range
  assert {k: spread[k] for k in ('median', 'q25', 'q75')} == pytest.approx(
      {'median': 1.2, 'q25': 1.1, 'q75': 1.3})
  assert [alternate.in_turn(['a', 'b', 'c'], i) for i in range(4)] == [
      ['a', 'b', 'c'], ['b', 'c', 'a'], ['c', 'a', 'b'], ['a', 'b', 'c']]  # each leads in turn
  old = {'shard_map_over_torch_throughput': 1.234}  # a file from before the quartiles
  assert bench_table.ratio(old, 'shard_map_over_torch') == '1.23×'
  assert bench_table.ratio(dict(old, shard_map_over_torch_quartiles=[1.1, 1.3]),
                           'shard_map_over_torch') == '1.23× (1.10–1.30)'
  new = dict(old, shard_map_over_torch_quartiles=[1.1, 1.3],
             shard_map_over_torch_interval=[1.2, 1.26])
  assert bench_table.ratio(new, 'shard_map_over_torch') == '1.23× [1.20–1.26]'
  assert bench_table.verdict(new, 'shard_map_over_torch') == 'ahead'


def test_a_ratio_is_known_within_a_fraction_once_its_interval_is():
  rng = np.random.default_rng(0)
  jaxpar = rng.uniform(0.09, 0.11, 400)
  steady = jaxpar * rng.uniform(0.99, 1.01, 400)   # the other step within ±1 % round by round
  noisy = jaxpar * rng.uniform(0.8, 1.2, 400)      # ±20 %
  assert not alternate.known_within(steady[:5], jaxpar[:5], 0.03)  # under 6 rounds: never
  assert alternate.known_within(steady[:12], jaxpar[:12], 0.03)
  assert not alternate.known_within(noisy[:12], jaxpar[:12], 0.03)
  # The interval narrows as 1/√n: ±20 % rounds reach ±3 % within a few hundred rounds.
  assert alternate.known_within(noisy, jaxpar, 0.03)
  low, high = alternate.median_interval(noisy / jaxpar)
  median = np.median(noisy / jaxpar)
  assert 0.97 * median <= low < median < high <= 1.03 * median


def test_the_median_s_interval_is_the_binomial_order_statistics():
  """The 95 % interval of a median from n samples, as the sign test's tables give it: n = 12
  → the 3rd and 10th, n = 30 → the 10th and 21st, n = 100 → the 40th and 61st; fewer than 6
  samples, the whole range; and it holds the true median in ~95 % of normal samples."""
  for n, (j, k) in {12: (3, 10), 30: (10, 21), 100: (40, 61), 5: (1, 5), 6: (1, 6)}.items():
    assert alternate.median_interval(np.arange(1, n + 1)[::-1]) == (j, k)
  rng = np.random.default_rng(0)
  held = [low <= 0 <= high for low, high in
          (alternate.median_interval(rng.normal(size=30)) for _ in range(2000))]
  assert 0.93 <= np.mean(held) <= 0.97


def test_a_timing_tool_passes_on_every_argument_but_its_own():
  args = ['--config', 'configs/resnet34_2d.py', '--rounds', '3', '--config.total_steps=4',
          '--out=x.json', '--outer=1', '--rounds=2']
  assert alternate.passed_on(args) == ['--config', 'configs/resnet34_2d.py',
                                       '--config.total_steps=4', '--outer=1']


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


@pytest.mark.parametrize('size', range(1, 8))
def test_the_torch_peers_ceil_max_pool_is_jaxpars(size):
  """Every map size, maps smaller than the window included (torch's ceil-mode pool refuses
  them; SqueezeNet and GoogLeNet at 16² reach 1×1)."""
  torch = pytest.importorskip('torch')
  from jaxpar.models.layers import max_pool_ceil
  x = np.random.default_rng(size).normal(size=(2, size, size + 1, 3)).astype(np.float32)
  want = np.asarray(max_pool_ceil(jax.numpy.asarray(x), 3, 2))
  got = torch_peer.ceil_max_pool()(torch.from_numpy(x).permute(0, 3, 1, 2))
  np.testing.assert_array_equal(got.permute(0, 2, 3, 1).numpy(), want)


@pytest.mark.parametrize('name,size', [('resnet34', 16), ('vgg16e', 32), ('squeezenet', 16),
                                       ('squeezenet', 32), ('googlenet', 32), ('googlenet', 224)])
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
  result = bench.bench(_config(data_dir, image_size=16, global_batch=8),
                       steps=1, warmup=1, profile_steps=1, with_torch=True)
  assert len(result['steps']) == 3 and 'shard_map_over_torch_compile_throughput' not in result
  peer = result['steps'][2]
  assert peer['step'] == 'PyTorch eager' and len(peer['samples']) == 1 and peer['flops_per_device']
  assert result['shard_map_over_torch_throughput'] == pytest.approx(
      peer['median_s'] / result['steps'][0]['median_s'])  # one round: its ratio
  assert result['shard_map_over_torch_quartiles'] == pytest.approx(
      [result['shard_map_over_torch_throughput']] * 2)
  assert "PyTorch's" in bench.markdown(result) and 'Time by HLO op' in bench.markdown(result)


@pytest.mark.slow
def test_the_compiled_torch_peer_trains_as_the_eager_one():
  """torch.compile's step is the eager step's arithmetic: from the same seed and batch, two
  steps of each leave the same parameters (Inductor fuses and reorders float32 sums).
  SqueezeNet's dropout is switched off in both: Inductor draws its own random numbers."""
  pytest.importorskip('torchvision')
  import torch
  c = config_lib.defaults()
  c.model, c.image_size, c.batch_norm = 'squeezenet', 32, False
  rng = np.random.default_rng(0)
  batch = {'image': rng.normal(size=(4, 32, 32, 3)).astype(np.float32),
           'label': rng.integers(0, 10, 4).astype(np.int32)}
  runners = [torch_peer.TorchRunner(c, 10, batch, 0.05, 1, 0, compiled=compiled)
             for compiled in (False, True)]
  for r in runners:
    for m in r.model.modules():
      if isinstance(m, torch.nn.Dropout):
        m.p = 0.0
    r(timed=False)
    r()
  eager, compiled = runners
  assert (eager.name, compiled.name) == ('PyTorch eager', 'torch.compile')
  assert eager.compile_time == 0 and compiled.compile_time > 0 and len(compiled.times) == 1
  assert isinstance(compiled.model, torch._dynamo.eval_frame.OptimizedModule)
  assert compiled.flops == eager.flops > 0
  moved = 0.0
  for a, b, before in zip(eager.model.parameters(), compiled.model.parameters(),
                          torch_peer.network('squeezenet', 10, 3, 32).parameters()):
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    moved = max(moved, float((a - before).detach().abs().max()))
  assert moved > 1e-3  # the two steps changed the parameters the comparison covers


def test_the_gpu_table_adds_torch_compile_and_the_fraction_of_peak():
  result = json.loads((ROOT / 'analysis/report/bench/gpu/vgg16e_224_bfloat16_gpu.json').read_text())
  jaxpar, _, peer = result['steps']
  compiled = dict(peer, step='torch.compile (CUDA)', median_s=peer['median_s'] / 2)
  with_compiled = dict(result, steps=[*result['steps'], compiled],
                       shard_map_over_torch_compile_throughput=compiled['median_s']
                       / jaxpar['median_s'])
  cells = _cells(bench_table.table([with_compiled]))
  assert cells['torch.compile step (s)'] == f"{compiled['median_s']:.4f}"
  assert cells['jaxpar / torch.compile'] == f"{compiled['median_s'] / jaxpar['median_s']:.2f}×"
  # An H200 in bfloat16: 989.4 dense TFLOP/s; the step's FLOPs are PyTorch's count.
  rate = peer['flops_per_device'] / jaxpar['median_s']
  assert cells["jaxpar / GPU's peak"] == f'{100 * rate / 989.4e12:.0f} %'
  assert bench_table.peak_flops(dict(result, dtype='float32')) == 494.7e12
  for other in (dict(result, device_kind='TPU v5 lite'), dict(result, backend='cpu',
                                                              device_kind='cpu')):
    assert bench_table.peak_flops(other) is None
    assert "GPU's peak" not in bench_table.table([other]).splitlines()[0]
  assert 'torch.compile' not in bench_table.table([result]).splitlines()[0]
  # Runs on two kinds of GPU (the README's table): a first column names each one's.
  h100 = json.loads((ROOT / 'analysis/report/bench/gpu_h100/resnet34_224_bfloat16_gpu.json')
                    .read_text())
  both = bench_table.table([result, h100])
  assert [_cells(both, i)['device'] for i in range(2)] == ['H100 80GB HBM3', 'H200']
  assert _cells(both, 0)["jaxpar / GPU's peak"] == '13 %' and _cells(both, 1)[
      'torch.compile step (s)'] == '–'
  # Measured on two days: a column says which day each row ran; one day, no column.
  assert [_cells(both, i)['measured'] for i in range(2)] == ['2026-11-27', '2026-11-26']
  assert 'measured' not in bench_table.table([result, dict(h100, created=result['created'])])


def test_the_cpu_table_names_the_cpu_of_each_row_where_its_rows_ran_on_several():
  run = json.loads((ROOT / 'analysis/report/bench/resnet34_32_float32_1.json').read_text())
  on = lambda cpu, **changed: dict(run, machine=dict(run['machine'], cpu=cpu), **changed)
  amd, intel = on('AMD EPYC'), on('Intel(R) Xeon(R) Processor', global_batch=64)
  both = bench_table.table([amd, intel])
  day = run['created'][:10]
  assert [_cells(both, i)['measured'] for i in range(2)] == [f'{day}, AMD EPYC',
                                                             f'{day}, Intel Xeon']
  # One CPU on one day: no column; one CPU on two days: the days alone.
  assert 'measured' not in bench_table.table([amd, on('AMD EPYC', global_batch=64)])
  later = bench_table.table([amd, on('AMD EPYC', global_batch=64, created='2027-01-01T00:00')])
  assert _cells(later, 1)['measured'] == '2027-01-01'


def test_the_front_page_keeps_each_cells_newest_run():
  gpu = ROOT / 'analysis/report/bench/gpu'
  old, new = (json.loads((gpu / f'squeezenet_224_bfloat16_gpu{day}.json').read_text())
              for day in ('', '_2026-11-28'))
  h100 = json.loads((ROOT / 'analysis/report/bench/gpu_h100/resnet34_224_bfloat16_gpu.json')
                    .read_text())
  f32 = json.loads((gpu / 'squeezenet_224_float32_gpu.json').read_text())
  for runs in ([old, new, h100, f32], [new, f32, h100, old]):
    kept = bench_table.newest(runs)
    assert sorted(r['created'] for r in kept) == sorted(
        [new['created'], h100['created'], f32['created']])
  # Another batch, BatchNorm grouping or mesh is another cell, kept beside it.
  for other in (dict(old, global_batch=128), dict(old, mesh=[2]),
                dict(old, config=dict(old['config'], bn_group_size=1))):
    assert len(bench_table.newest([old, new, other])) == 2


def test_the_fusion_table_sets_each_grad_fusion_side_by_side():
  base = json.loads((ROOT / 'analysis/report/bench/resnet34_32_float32_2p.json').read_text())

  def run(fusion, seconds, calls):
    steps = [dict(s, median_s=seconds, collectives=calls) if s['step'] == 'jaxpar shard_map'
             else s for s in base['steps']]
    return dict(base, config=dict(base['config'], grad_fusion=fusion), steps=steps)
  runs = [run('per_tensor', 0.110, 181), run('per_tensor', 0.130, 181),
          run('per_tensor', 0.120, 181), run('one_buffer', 0.130, 75),
          run('by_size', 0.100, 90), run('by_size', 0.104, 90)]
  cells = _cells(bench_table.fusion_table(runs))
  assert cells['devices'] == '2 (2 processes)' and cells['server'] == 'allreduce'
  assert cells['per_tensor step (s)'] == '0.1200 (0.1100–0.1300)'  # median of 3 runs
  assert cells['one_buffer step (s)'] == '0.1300'
  assert cells['by_size step (s)'] == '0.1020 (0.1000–0.1040)'  # of 2: their mean
  assert cells['collectives (per_tensor, one_buffer, by_size)'] == '181, 75, 90'
  assert cells['by_size / faster other'] == f'{0.120 / 0.102:.2f}×'
  alone = _cells(bench_table.fusion_table([run('one_buffer', 0.13, 75)]))
  assert alone['by_size step (s)'] == '—' and alone['by_size / faster other'] == '—'


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
  assert _cells(text)['jaxpar GFLOP/s/device'] == f'{expected:,.0f}*'
  assert text.splitlines()[-1] == bench_table.PEER_FLOPS
  on_cpu = dict(result, backend='cpu')  # there XLA's count is the step's
  counted = jaxpar['flop_per_s_per_device'] / 1e9
  assert counted >= 1000 and bench_table.table([on_cpu]).splitlines()[-1].endswith(
      f'| {counted:,.0f} |')


def _cells(text: str, row: int = 0) -> dict:
  """{column: cell} of a markdown table's row (0: the first after the header)."""
  head, _, *rows = text.splitlines()
  return dict(zip(head.strip('| ').split(' | '), rows[row].strip('| ').split(' | ')))


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


def test_bench_times_batchnorm_per_device_beside_over_the_group(data_dir):
  """`--device_bn`: the same step with BatchNorm per device, alternated with the others; its
  program has BatchNorm's collectives no more, and the ratio is the group's step over it,
  round by round."""
  result = bench.bench(_config(data_dir, batch_norm=True, image_size=16), steps=3, warmup=1,
                       repeat=1, with_device_bn=True)
  group, jit, device = result['steps']
  assert (group['step'], device['step']) == ('jaxpar shard_map', bench_table.DEVICE_BN)
  assert len(device['samples']) == 3
  # SqueezeNet's 26 BatchNorm layers: 18 calls each way (a fire module's expand layers share
  # one), and the per-device step's running statistics averaged once a step.
  assert group['collectives'] - device['collectives'] == 2 * 18 - 1
  ratios = np.array(group['samples']) / np.array(device['samples'])
  assert result['sync_bn_over_device_bn'] == pytest.approx(np.median(ratios))
  assert result['sync_bn_over_device_bn_interval'] == pytest.approx([ratios.min(), ratios.max()])
  assert "BatchNorm over the group / with BatchNorm per device" in bench.markdown(result)
  row = bench_table.sync_bn_table([result]).splitlines()[-1]
  low, high = result['sync_bn_over_device_bn_interval']
  assert row.startswith(f"| squeezenet | 16² | 16 | 1 | 8 devices | {group['collectives']} / "
                        f"{device['collectives']} | {group['median_s']:.4f} ")
  assert f"| {result['sync_bn_over_device_bn']:.2f}× [{low:.2f}–{high:.2f}] |" in row


@pytest.mark.parametrize('overrides, error', [
    ({}, 'config.batch_norm=False is invalid with --device_bn'),
    ({'batch_norm': True, 'bn_group_size': 1}, 'config.bn_group_size=1 is invalid with')])
def test_device_bn_is_refused_where_there_is_nothing_to_compare(data_dir, overrides, error):
  with pytest.raises(config_lib.ConfigError, match=error):
    bench.bench(_config(data_dir, **overrides), steps=1, warmup=1, with_device_bn=True)


def test_gpu_kernels_are_read_off_the_streams_and_summed_by_kind_a_step():
  from analysis.benchmarks import profile
  meta = [{'ph': 'M', 'name': 'process_name', 'pid': 1, 'args': {'name': '/device:GPU:0'}},
          {'ph': 'M', 'name': 'thread_name', 'pid': 1, 'tid': 14,
           'args': {'name': 'Stream #14(Compute)'}},
          {'ph': 'M', 'name': 'thread_name', 'pid': 1, 'tid': 2, 'args': {'name': 'XLA Ops'}},
          {'ph': 'M', 'name': 'process_name', 'pid': 7, 'args': {'name': '/host:CPU'}}]
  def kernel(name, ts, dur, tid=14):
    return {'ph': 'X', 'pid': 1, 'tid': tid, 'name': name, 'ts': ts, 'dur': dur}
  events = meta + [
      kernel('sm90_xmma_fprop_implicit_gemm_bf16', 0, 100), kernel('loop_add_fusion', 110, 20),
      kernel('MemcpyD2D', 140, 10), kernel('sm90_xmma_wgrad_indexed_implicit_gemm', 1000, 60),
      kernel('sm90_xmma_dgrad_implicit_gemm', 1070, 30), kernel('nvjet_hsh_64x8', 1110, 40),
      kernel('cudnn-conv.1', 0, 150, tid=2),  # a derived line: the same time again
      {'ph': 'X', 'pid': 7, 'tid': 1, 'name': 'host work', 'ts': 0, 'dur': 500}]
  device = profile._device_events(events)
  assert len(device) == 6
  found = profile.gpu_kernels(device, steps=2)
  assert abs(found['busy_s_per_step'] - 260e-6 / 2) < 1e-12
  assert abs(found['span_s_per_step'] - 1150e-6 / 2) < 1e-12
  assert found['kernels_per_step'] == 3
  assert {k: round(v * 1e6, 6) for k, v in found['by_kind_s_per_step'].items()} == {
      'convolution forward': 50, 'convolution weight gradient': 30,
      'convolution data gradient': 15, 'matrix product': 20,
      'fusion/elementwise/reduction': 10, 'copy/set': 5}
  assert found['top'][0][:2] == ('sm90_xmma_fprop_implicit_gemm_bf16', 'convolution forward')
  # PyTorch's traces mark their device events by category instead.
  torch_events = [{'ph': 'X', 'cat': 'kernel', 'name': 'triton_poi_fused_relu_0', 'ts': 0,
                   'dur': 8, 'pid': 0, 'tid': 7},
                  {'ph': 'X', 'cat': 'cpu_op', 'name': 'aten::relu', 'ts': 0, 'dur': 30,
                   'pid': 0, 'tid': 1}]
  assert [e['name'] for e in profile._device_events(torch_events)] == ['triton_poi_fused_relu_0']


def test_traced_steps_keep_the_trace_and_find_no_gpu_kernels_on_a_cpu(tmp_path):
  from analysis.benchmarks import profile
  step = jax.jit(lambda x: (x @ x).sum())
  x = jax.numpy.ones((64, 64))
  found = profile.traced_steps(lambda: step(x).block_until_ready(), 2,
                               str(tmp_path / 'step.trace.json.gz'))
  assert (tmp_path / 'step.trace.json.gz').stat().st_size > 0
  assert found['kernels_per_step'] == 0 and found['busy_s_per_step'] == 0
  assert any('/host:CPU' in t for t in found['threads'])


def test_the_gpu_check_tables_read_the_committed_runs():
  folder = ROOT / 'analysis/report/bench/gpu/check_2026-12-04'
  results = []
  for path in sorted(folder.glob('*.json')):
    results.append(dict(json.loads(path.read_text()), run=path.stem))
  by_run = {r['run']: r for r in results}
  lines = bench_table.check_table(results).splitlines()
  rows = {line.split(' | ')[0].lstrip('| '): line.split(' | ') for line in lines[2:] if
          line.startswith('| ')}
  vgg = by_run['vgg16e_224_bfloat16_compile']
  steps = {s['step']: s for s in vgg['steps']}
  peer = steps['torch.compile (CUDA)']
  rate = peer['flops_per_device'] / steps['jaxpar shard_map']['median_s']
  assert rows['vgg16e_224_bfloat16_compile'][9] == f'{rate / 1e12:.0f}'
  assert rows['vgg16e_224_bfloat16_compile'][10] == f'{100 * rate / 989.4e12:.0f} % |'
  # A run without a peer takes the same network's count, scaled to its batch.
  big = by_run['resnet34_224_bfloat16_b256']
  count = next(s for s in by_run['resnet34_224_bfloat16_compile']['steps']
               if s['step'].startswith('torch.compile'))['flops_per_device']
  expected = count * 4 / big['steps'][0]['median_s']
  assert rows['resnet34_224_bfloat16_b256'][9] == f'{expected / 1e12:.0f}'
  assert rows['resnet34_224_bfloat16_b256'][7] == '–'
  assert '`--xla_gpu_enable_command_buffer=`' in rows['resnet34_224_bfloat16_no_graphs'][4]
  kernels = bench_table.kernel_table(results).splitlines()
  assert len(kernels) == 2 + 3 * 3  # three traced runs, three steps each
  first = kernels[2].split(' | ')
  k = next(s for s in by_run['resnet34_224_bfloat16_compile']['steps']
           if s['step'] == first[3])
  assert first[-1] == f"{1e3 * (k['median_s'] - k['kernels']['busy_s_per_step']):.2f} |"


def test_bench_traces_each_runner_beside_its_program_and_records_xla_flags(data_dir, tmp_path,
                                                                          monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_cpu_enable_fast_math=false')  # read, not reapplied
  result = bench.bench(_config(data_dir), steps=1, warmup=1, trace_dir=str(tmp_path / 'tr'),
                       trace_steps=1)
  assert result['xla_flags'] == '--xla_cpu_enable_fast_math=false'
  for slug, step in zip(('jaxpar_shard_map', 'auto_sharded_jit'), result['steps']):
    assert (tmp_path / 'tr' / f'{slug}.trace.json.gz').stat().st_size > 0
    assert (tmp_path / 'tr' / f'{slug}.hlo.txt').read_text().startswith('HloModule')
    assert step['kernels']['kernels_per_step'] == 0  # a CPU: no device streams
  # A trace that cannot be read costs its summary, not the timings.
  from analysis.benchmarks import profile

  def broken(*args):
    raise RuntimeError('no trace')
  monkeypatch.setattr(profile, 'traced_steps', broken)
  result = bench.bench(_config(data_dir), steps=1, warmup=1, trace_dir=str(tmp_path / 'tr2'))
  assert [s['kernels'] for s in result['steps']] == [{'error': 'RuntimeError: no trace'}] * 2
  assert all(s['median_s'] > 0 for s in result['steps'])


def test_emulated_mesh_times_the_mesh_and_one_device_on_the_same_batch(data_dir):
  """analysis.benchmarks.emulated_mesh on SqueezeNet 16² over 2 emulated devices: every call
  timed each round, the ratios taken round by round, the rest what the parts leave, and the
  one-device side the same maths at the whole batch (no timing asserted)."""
  from analysis.benchmarks import emulated_mesh
  cfg = _config(data_dir, image_size=16, global_batch=8, **{'mesh.shape': (2,)})
  one = emulated_mesh.one_device(cfg)
  assert (tuple(one.mesh.shape), config_lib.global_batch(one)) == ((1,), 8)
  assert (one.model, one.dtype, one.optimizer.name) == (cfg.model, cfg.dtype, cfg.optimizer.name)
  result = emulated_mesh.measure(cfg, rounds=2, repeat=1)
  samples = result['samples_s']
  assert set(samples) == set(emulated_mesh.CALLS) and all(len(t) == 2 for t in samples.values())
  per_round = np.asarray(samples['mesh step']) / np.asarray(samples['one-device step'])
  assert result['step_ratio']['median'] == pytest.approx(np.median(per_round))
  m = result['median_s']
  assert result['rest_s'] == pytest.approx(m['mesh step'] - m['mesh gradients']
                                           - m['mesh update'])
  assert result['devices'] == 2 and result['config']['global_batch'] == 8
  row = emulated_mesh.table([result]).splitlines()[-1]
  assert row.startswith('| squeezenet | 16² | float32 | 2 (2) | 8 |')
  with pytest.raises(config_lib.ConfigError, match=r"^config.scheme='async'"):
    emulated_mesh.check(_config(data_dir, scheme='async', server='central',
                                **{'mesh.shape': (2,)}))
