"""jaxpar.plan: which scheme, server, N and BatchNorm grouping reach a target soonest on the
hardware at hand. It measures (`probe`, `call_timing`), predicts with the models of
`jaxpar.perfmodel`, ranks (`candidates`, `rank`) and chooses (`planner`); `scheme=auto`
trains with its answer. It imports nothing of `analysis/`."""
