"""Timing calls side by side, shared by the benchmarks of single operations
(`conv_bench`, `pool_bench`): a call as a timer (a compiled JAX function's, waiting for its
result; or any other), and rounds in which every timer runs in turn."""
import time

import jax
import numpy as np


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
