"""Timing things side by side, shared by the benchmarks: a call as a timer (a compiled JAX
function's, waiting for its result; or any other), and rounds in which every timer runs in
turn (`conv_bench`, `pool_bench`); the order of a round's settings (`in_turn`) and two
settings' ratio taken round by round (`paired_ratio`: `bench`, `compile_bench`,
`ray_worker_bench`) and whether its median is known closely enough (`known_within`); and
the host's speed every benchmark records when it starts (`host_speed`); a tool's arguments
passed on to the processes it times (`passed_on`)."""
import time

import jax
import numpy as np

from jaxpar.plan import call_timing


def call_timer(call):
  """Runs `call()` once (warming it), then returns a callable timing one call."""
  call()

  def run():
    start = time.perf_counter()
    call()
    return time.perf_counter() - start
  return run


def jax_timer(f, *args):
  """`call_timer` of the compiled `f` on `args`, up to its result being ready (the first
  call compiles it)."""
  return call_timer(lambda: jax.block_until_ready(f(*args)))


def medians(timers: dict, rounds: int, repeat: int) -> dict:
  """{name: {pass: median seconds}} of `timers` ({name: {pass: timer}}): in each round every
  pass of every name runs in turn, so all see the same machine state, each `repeat` times
  in a row with the last call timed (right after another runtime's work — XLA's threads,
  PyTorch's or oneDNN's OpenMP threads still spinning on the cores — a call measured up to
  2× its time in a row: oneDNN's forward 3×3 64→64 on 2×224×224, 33 against 14 ms;
  2026-11-27)."""
  samples = {name: {p: [] for p in passes} for name, passes in timers.items()}
  for _ in range(rounds):
    for name, passes in timers.items():
      for p, run in passes.items():
        samples[name][p].append([run() for _ in range(repeat)][-1])
  return {name: {p: float(np.median(t)) for p, t in by_pass.items()}
          for name, by_pass in samples.items()}


def in_turn(settings: list, round_index: int) -> list:
  """`settings` in round `round_index`'s order: each round starts with the next one, so that
  no setting always runs first (after the process started, or after another's work)."""
  k = round_index % len(settings)
  return settings[k:] + settings[:k]


def paired_ratio(times_a, times_b) -> dict:
  """a's time over b's, round by round: each ratio of two times measured in the same round (a
  few hundred ms apart), so that a host whose speed drifts during the run (20-90 % between
  rounds on a shared VM; docs/benchmark.md) moves both sides of each ratio alike. The median
  of the rounds' ratios, their quartiles (the rounds' spread), and the median's 95 %
  interval (`median_interval`: what the verdicts rest on)."""
  ratios = np.asarray(times_a, float) / np.asarray(times_b, float)
  q25, median, q75 = np.percentile(ratios, [25, 50, 75])
  low, high = median_interval(ratios)
  return {'median': float(median), 'q25': float(q25), 'q75': float(q75),
          'interval': [low, high]}


def known_within(times_a, times_b, within: float) -> bool:
  """Whether the median of a's time over b's, round by round (`paired_ratio`), is known within
  ± `within` of itself: its 95 % interval inside [(1 − within)·m, (1 + within)·m]. A
  benchmark runs rounds until it is (`bench --within`); fewer than 6 rounds never are."""
  ratios = np.asarray(times_a, float) / np.asarray(times_b, float)
  if len(ratios) < 6:
    return False
  low, high = median_interval(ratios)
  median = float(np.median(ratios))
  return (1 - within) * median <= low and high <= (1 + within) * median


def median_interval(samples, level: float = 0.95) -> tuple:
  """The distribution-free interval of a median: the order statistics (j, n + 1 − j) of n
  samples with P(j ≤ #below the median < n + 1 − j) ≥ `level` under the binomial(n, ½) law
  (any continuous distribution of independent rounds; no bootstrap, so the same samples give
  the same interval). Fewer than 6 samples cannot reach 95 %: their whole range."""
  from scipy.stats import binom
  x = np.sort(np.asarray(samples, float))
  n = len(x)
  j = int(binom.ppf((1 - level) / 2, n, 0.5))  # P(B ≤ j − 1) ≤ (1 − level) / 2
  while j > 0 and binom.cdf(n - j, n, 0.5) - binom.cdf(j - 1, n, 0.5) < level:
    j -= 1
  if j < 1:
    return float(x[0]), float(x[-1])
  return float(x[j - 1]), float(x[n - j])


def host_speed(calls: int = 5) -> dict:
  """This host's speed when a benchmark starts, so that tables from different hosts of one kind
  can be put side by side (the same "2 cores of an AMD EPYC" ran every step 1.1–3.9× slower
  one afternoon than that morning; docs/benchmark.md): a float32 2048 × 2048 matmul in numpy
  (its BLAS, every core) in GFLOP/s and a 64 MB copy (one core) in GB/s, each the best of
  `calls`."""
  rng = np.random.default_rng(0)
  a = rng.random((2048, 2048), dtype=np.float32)
  src = np.ones(16 * 2**20, np.float32)
  dst = np.empty_like(src)
  best = lambda call: min(call_timing.timed(call, calls, warmup=1))
  return {'matmul_gflop_s': 2 * 2048**3 / best(lambda: a @ a) / 1e9,
          'copy_gb_s': 2 * src.nbytes / best(lambda: np.copyto(dst, src)) / 1e9}


def passed_on(args: list[str], own=('--out', '--rounds')) -> list[str]:
  """A benchmark's command-line arguments less its `own` flags (and their values): the
  config and its overrides, passed on to the processes it times (`compile_bench`,
  `restart_bench`)."""
  kept, skip = [], False
  for a in args:
    if skip:
      skip = False
    elif a in own:
      skip = True
    elif not a.startswith(tuple(f'{flag}=' for flag in own)):
      kept.append(a)
  return kept
