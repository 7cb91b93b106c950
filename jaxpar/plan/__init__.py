"""jaxpar.plan: which scheme, server, N and BatchNorm grouping reach a target soonest on the
hardware at hand (`planner`), and the models it and `analysis/` share — the collectives of
a lowered program (`hlo`) and their calibrated costs (`calibrate`, `alpha_beta`), the steps
to a target (`steps_model`, `noise_scale`). A leaf of the package: training imports it,
it imports nothing of `analysis/`."""
