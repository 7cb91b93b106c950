"""How many 224² training images a second jaxpar's input pipeline makes on k cores, and how
many cores a GPU's step would need from it.

  python -m analysis.benchmarks.input_rate --out analysis/report/input/rate.json

The pipeline is the training stream a run reads from an image folder with ImageNet's
augmentation (`jaxpar.data.pipeline.train_batches`, `augment.kind='inception_crop'`, flip):
per image, read the file, decode only the randomly drawn window of 8–100 % of its area
(`decode_and_crop_jpeg`), resize it to 224² (bilinear, antialiased), scale to [−1, 1] and
flip; then batches of 64. The images: `--images` JPEGs written first (quality 90) at
ImageNet's common shapes (500×375, 375×500, 500×333, 500×400, 333×500), smooth random
fields with pixel noise: ImageNet's mean size (the JSON records their mean pixels and
bytes; ImageNet's training set averages 108 KB a file, 138 GB for 1.28 M images). The files
sit in the page cache: this is the decode-and-augment rate, not a disk's.

For each core count k (1 up to the machine's cores), a fresh process pinned to k cores
(`os.sched_setaffinity` before TensorFlow starts, so tf.data's thread pools have k threads)
takes 2 batches to warm up, then times `--batches` batches; the rounds alternate the core
counts' order, and each count's rate is the median over rounds with its 95 % interval
(`alternate.median_interval`). Per core = rate / k. `analysis.report`'s `input-rate` table
sets the rates beside the committed GPU steps' images/s (`cores_needed`).

`--pipeline` chooses what is timed on the same files:
  tf      jaxpar's stream (above; needs TensorFlow);
  dali    jaxpar's stream with `dataset.decoder='dali'`: tf.data reads the files and draws
          the windows and flips, NVIDIA DALI decodes and augments — on the GPU where JAX
          runs on one, else with its CPU decoder, a thread a core (needs TensorFlow and
          DALI);
  torch   PyTorch's ImageNet example's loader for the same augmentation: torchvision's
          `ImageFolder` (Pillow decodes the whole JPEG), `RandomResizedCrop(224)` (bilinear,
          antialiased), a flip, `ToTensor` and `Normalize`, batches of 64 from a
          `DataLoader` with one worker process per core (where TensorFlow is not installed,
          such as a GPU image, this is the host's CPU rate to compare);
  nvjpeg  the JPEGs read on one core and decoded on the GPU (torchvision's `decode_jpeg` on
          CUDA: nvJPEG, a batch at a time), then each image's random window cropped, resized
          to 224² (bilinear, antialiased), flipped and scaled there: a GPU decode path's rate,
          the GPU doing nothing else.
`--core_counts` times chosen counts (e.g. 1,2,4,8,16) instead of every count.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

SHAPES = ((375, 500), (500, 375), (333, 500), (400, 500), (500, 333))  # (height, width)
BATCH = 64
IMAGE_SIZE = 224
PIPELINES = ('tf', 'dali', 'torch', 'nvjpeg')
# Each pipeline's name in the tables, and what it does to an image (the JSON's `augment`).
PIPELINE_NAMES = {'tf': "jaxpar's tf.data stream",
                  'dali': "jaxpar's stream decoded by DALI",
                  'torch': "PyTorch's ImageNet loader",
                  'nvjpeg': 'nvJPEG on the GPU (1 core reads)'}
_AUGMENT = {'tf': 'inception_crop (decode_and_crop_jpeg)',
            'dali': "inception_crop (tf.data's windows, DALI's decoders.image_slice)",
            'torch': 'RandomResizedCrop (Pillow decode, torchvision transforms)',
            'nvjpeg': 'RandomResizedCrop window, nvJPEG decode on the GPU'}


def write_images(root: str, count: int, classes: int = 8, noise: float = 25.0) -> dict:
  """`count` JPEGs in `classes` folders, cycling through `SHAPES`; their mean bytes and
  pixels. Written with Pillow (a smooth field: a 12×16 random image resized bicubically,
  plus pixel noise), so every pipeline and host reads the same kind of file."""
  import numpy as np
  from PIL import Image
  rng = np.random.default_rng(0)
  sizes, pixels = [], []
  for i in range(count):
    height, width = SHAPES[i % len(SHAPES)]
    folder = os.path.join(root, f'class_{i % classes}')
    os.makedirs(folder, exist_ok=True)
    low = rng.uniform(0, 255, (12, 16, 3)).astype(np.float32)
    image = np.stack([np.asarray(Image.fromarray(low[..., c]).resize(
        (width, height), Image.BICUBIC)) for c in range(3)], axis=-1)
    image += rng.normal(0, noise, image.shape)
    path = os.path.join(folder, f'{i}.jpg')
    Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(path, quality=90)
    sizes.append(os.path.getsize(path))
    pixels.append(height * width)
  return {'count': count, 'mean_bytes': float(np.mean(sizes)),
          'mean_pixels': float(np.mean(pixels)), 'shapes': [list(s) for s in SHAPES],
          'jpeg_quality': 90, 'writer': 'Pillow'}


def child(folder: str, cores: int, batches: int, which: str = 'tf') -> dict:
  """Images/s of the pipeline `which` (see the module docstring) on the first `cores` cores
  (run in a fresh process)."""
  os.sched_setaffinity(0, set(sorted(os.sched_getaffinity(0))[:cores]))
  if which not in ('tf', 'dali'):
    return _torch_child(folder, cores, batches, which)
  from jaxpar import config as config_lib
  from jaxpar.data import pipeline, sources
  c = config_lib.defaults()
  # Half the files a test split (never read here): neither split empty, however few files.
  c.dataset.name, c.dataset.path, c.dataset.test_percent = sources.IMAGE_FOLDER, folder, 50
  source = sources.open_source(c.dataset)
  stream = pipeline.train_batches(
      source, batch=BATCH, start=0, seed=0, image_size=IMAGE_SIZE, augment='inception_crop',
      crop_padding=0, flip=True, shuffle_buffer=source.num_train, cache=True, decoder=which)
  for _ in range(2):
    batch = next(stream)
  assert batch['image'].shape == (BATCH, IMAGE_SIZE, IMAGE_SIZE, 3), batch['image'].shape
  start = time.perf_counter()
  for _ in range(batches):
    next(stream)
  return {'cores': cores, 'images_per_s': batches * BATCH / (time.perf_counter() - start)}


def _torch_child(folder: str, cores: int, batches: int, which: str) -> dict:
  """`child` for the 'torch' and 'nvjpeg' pipelines (PyTorch and torchvision needed)."""
  import torch
  import torchvision
  from torchvision import transforms
  torch.manual_seed(0)
  if which == 'torch':
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    data = torchvision.datasets.ImageFolder(folder, transforms.Compose([
        transforms.RandomResizedCrop(IMAGE_SIZE), transforms.RandomHorizontalFlip(),
        transforms.ToTensor(), transforms.Normalize(mean, std)]))
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True,
                                         num_workers=cores, persistent_workers=True,
                                         drop_last=True)

    def epochs():
      while True:
        for images, _ in loader:
          yield images
    stream = epochs()
    take = lambda: next(stream)  # noqa: E731
  elif which == 'nvjpeg':
    if not torch.cuda.is_available():
      raise SystemExit("--pipeline=nvjpeg decodes on a CUDA GPU; torch sees none here")
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(folder) for f in names
                   if f.endswith('.jpg'))
    generator = torch.Generator().manual_seed(0)

    def take():
      chosen = torch.randint(len(files), (BATCH,), generator=generator).tolist()
      decoded = torchvision.io.decode_jpeg([torchvision.io.read_file(files[i]) for i in chosen],
                                           device='cuda')
      out = []
      for image in decoded:
        top, left, height, width = transforms.RandomResizedCrop.get_params(
            image, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        window = image[None, :, top:top + height, left:left + width].float()
        out.append(torch.nn.functional.interpolate(window, size=(IMAGE_SIZE, IMAGE_SIZE),
                                                   mode='bilinear', antialias=True)[0])
      images = torch.stack(out)
      flip = torch.rand(BATCH, device='cuda') < 0.5
      images = torch.where(flip[:, None, None, None], images.flip(-1), images) / 127.5 - 1
      torch.cuda.synchronize()
      return images
  else:
    raise SystemExit(f'--pipeline={which}: one of {", ".join(PIPELINES)}')
  for _ in range(2):
    images = take()
  assert tuple(images.shape) == (BATCH, 3, IMAGE_SIZE, IMAGE_SIZE), images.shape
  start = time.perf_counter()
  for _ in range(batches):
    take()
  return {'cores': cores, 'images_per_s': batches * BATCH / (time.perf_counter() - start)}


def measure(folder: str, rounds: int, batches: int, max_cores: int, which: str = 'tf',
            core_counts=None) -> dict:
  from analysis.benchmarks import alternate
  counts = list(core_counts or range(1, max_cores + 1))
  samples = {k: [] for k in counts}
  for r in range(rounds):
    for k in counts[r % len(counts):] + counts[:r % len(counts)]:
      run = subprocess.run(
          [sys.executable, '-m', 'analysis.benchmarks.input_rate', '--child', folder,
           '--cores', str(k), '--batches', str(batches), '--pipeline', which],
          capture_output=True, text=True, env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'})
      if run.returncode:
        raise RuntimeError(f'input_rate: the timing process on {k} cores failed:\n'
                           + run.stderr[-2000:])
      samples[k].append(json.loads(run.stdout.strip().splitlines()[-1])['images_per_s'])
      print(f'\rround {r + 1}/{rounds}, {k} cores: {samples[k][-1]:.0f} images/s', end='',
            file=sys.stderr, flush=True)
  print(file=sys.stderr)
  import numpy as np
  return {k: {'median': float(np.median(s)), 'interval': list(alternate.median_interval(s)),
              'samples': s} for k, s in samples.items()}


def table(result) -> str:
  """The rate on each core count: images/s (median, 95 % interval), per core, and the
  scaling from one core."""
  rates = {int(k): v for k, v in result['rates'].items()}
  one = rates[min(rates)]['median']
  lines = ['| cores | images/s: median [95 % interval] | images/s a core | speedup over 1 core |',
           '|---:|---:|---:|---:|']
  for k, v in sorted(rates.items()):
    low, high = v['interval']
    lines.append(f"| {k} | {v['median']:.0f} [{low:.0f}–{high:.0f}] | {v['median'] / k:.0f} "
                 f"| {v['median'] / one:.2f}× |")
  return '\n'.join(lines)


def hosts_table(results) -> str:
  """Each measured host and pipeline on one line: its date, host (CPU, cores, GPU), the
  pipeline, what wrote its JPEGs, the rate on one core, and the highest median rate over the
  core counts timed, with its count and its rate a core."""
  from analysis.benchmarks import bench_table
  lines = ['| measured | host | pipeline | JPEGs written by | images/s on 1 core [95 % interval] '
           '| most images/s [95 % interval] | on cores | images/s a core there |',
           '|---|---|---|---|---:|---:|---:|---:|']

  def shown(v):
    low, high = v['interval']
    return f"{v['median']:,.0f} [{low:,.0f}–{high:,.0f}]"
  for r in sorted(results, key=lambda r: r['created']):
    m = r['machine']
    gpu = ', '.join(a.removeprefix('NVIDIA ') for a in m.get('accelerators', []))
    where = f"{bench_table.cpu_name(r)}, {m['cores']} cores" + (f' ({gpu} host)' if gpu else '')
    kind = r['pipeline'].get('kind', 'tf')
    rates = {int(k): v for k, v in r['rates'].items()}
    most = max(rates, key=lambda k: rates[k]['median'])
    one = shown(rates[1]) if 1 in rates else '–'
    writer = r.get('images', {}).get('writer', 'TensorFlow')  # before Pillow wrote them
    name = PIPELINE_NAMES[kind] + (f" on the {r['pipeline']['decoded_on'].upper()}"
                                   if 'decoded_on' in r['pipeline'] else '')
    lines.append(f"| {r['created'][:10]} | {where} | {name} | {writer} | {one} "
                 f"| {shown(rates[most])} | {most} | {rates[most]['median'] / most:,.0f} |")
  return '\n'.join(lines)


def cores_needed(result, gpu_results) -> str:
  """Each GPU step's images/s (jaxpar's step, from `analysis.benchmarks.bench` runs) beside
  the cores this pipeline needs to keep up with it, at the per-core rate of the most cores
  measured (linear in cores from there: the scaling measured is the evidence)."""
  rates = {int(k): v for k, v in result['rates'].items()}
  most = max(rates)
  per_core = rates[most]['median'] / most
  lines = ['| GPU | network | compute | batch | GPU step images/s | cores to feed it '
           f'(at {per_core:.0f} images/s a core) | GPU measured |',
           '|---|---|---|---:|---:|---:|---|']
  for r in sorted(gpu_results, key=lambda r: (r['device_kind'], r['network'], r['dtype'])):
    step = next(s for s in r['steps'] if s['step'] == 'jaxpar shard_map')
    lines.append(f"| {r['device_kind'].removeprefix('NVIDIA ')} | {r['network']} "
                 f"| {r['dtype']} | {r['global_batch']} | {step['images_per_s']:,.0f} "
                 f"| {step['images_per_s'] / per_core:.0f} | {r['created'][:10]} |")
  return '\n'.join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  p.add_argument('--images', type=int, default=512, help='JPEGs to write and read')
  p.add_argument('--rounds', type=int, default=10, help='timings of each core count')
  p.add_argument('--batches', type=int, default=8, help=f'batches of {BATCH} timed a round')
  p.add_argument('--max_cores', type=int, default=len(os.sched_getaffinity(0)))
  p.add_argument('--core_counts', default='',
                 help='comma-separated core counts to time (default: 1 to --max_cores)')
  p.add_argument('--pipeline', default='tf', choices=PIPELINES,
                 help="what to time (module docstring): jaxpar's tf.data stream, the same "
                 "decoded by DALI, PyTorch's ImageNet loader, or nvJPEG's decode on the GPU")
  p.add_argument('--out', default='', help='write the JSON here')
  p.add_argument('--child', default='', help=argparse.SUPPRESS)
  p.add_argument('--cores', type=int, default=1, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.child:
    print(json.dumps(child(args.child, args.cores, args.batches, args.pipeline)))
    return
  available = len(os.sched_getaffinity(0))
  try:
    counts = sorted({int(k) for k in args.core_counts.split(',') if k.strip()})
  except ValueError:
    p.error(f'--core_counts={args.core_counts!r}: comma-separated whole numbers, e.g. 1,2,4')
  if not 1 <= args.max_cores <= available or any(not 1 <= k <= available for k in counts) or min(
      args.images, args.rounds, args.batches) < 1:
    p.error(f'--max_cores and --core_counts must be 1-{available} (this machine\'s cores); '
            '--images, --rounds and --batches at least 1')
  if args.pipeline == 'nvjpeg':
    if counts not in ([], [1]):
      p.error(f'--core_counts={args.core_counts} with --pipeline=nvjpeg: one core reads the '
              'files and the GPU decodes; leave --core_counts out')
    counts = [1]  # one core reads the files; the GPU decodes
  from jaxpar.plan.probe import machine, versions
  found = versions()
  if args.pipeline in ('tf', 'dali'):
    from jaxpar.data import tf_import
    found['tensorflow'] = tf_import.tensorflow().__version__
  if args.pipeline == 'dali':
    import jax
    import nvidia.dali
    found['nvidia-dali'] = nvidia.dali.__version__
    decoded_on = 'gpu' if jax.default_backend() == 'gpu' else 'cpu'
  elif args.pipeline != 'tf':
    import torch
    import torchvision
    found |= {'torch': torch.__version__, 'torchvision': torchvision.__version__}
  with tempfile.TemporaryDirectory() as folder:
    images = write_images(folder, args.images)
    rates = measure(folder, args.rounds, args.batches, args.max_cores, args.pipeline, counts)
  result = {'tool': 'analysis.benchmarks.input_rate',
            'created': datetime.datetime.now().isoformat(timespec='seconds'),
            'machine': machine(),
            'versions': found,
            'command': ' '.join(['python -m analysis.benchmarks.input_rate'] + sys.argv[1:]),
            'pipeline': {'kind': args.pipeline, 'augment': _AUGMENT[args.pipeline],
                         **({'decoded_on': decoded_on} if args.pipeline == 'dali' else {}),
                         'flip': True, 'image_size': IMAGE_SIZE,
                         'batch': BATCH, 'batches_timed': args.batches},
            'images': images, 'rounds': args.rounds,
            'rates': {str(k): v for k, v in rates.items()}}
  for k, v in rates.items():
    low, high = v['interval']
    print(f"{k} cores: {v['median']:.0f} images/s [{low:.0f}–{high:.0f}], "
          f"{v['median'] / k:.0f} a core")
  if args.out:
    with open(args.out, 'w') as f:
      json.dump(result, f, indent=1)


if __name__ == '__main__':
  main()
