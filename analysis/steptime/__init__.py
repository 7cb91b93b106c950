"""A step's time: measured in interleaved rounds on real processes, loopback or an emulated
link (`measure`, `timing`, `link`); per-call collective costs calibrated inside compiled
programs (`calibrate`, `collectives`, `hlo`, `volume`); four predictions judged on held-out
points, with the recommendation's regret (`compare`)."""
