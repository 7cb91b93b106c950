"""A step's time: measured in interleaved rounds on real processes, loopback or an emulated
link (`measure`, `timing`, `link`); per-call collective costs calibrated inside compiled
programs (`calibrate`, `collectives`, `hlo`, `volume`); each step's compute, collectives
and overlap from its profiler trace (`trace`); four predictions judged on held-out
points, with the recommendation's regret (`compare`)."""
