"""The models of a step's time and of a run's steps, shared by the planner (`jaxpar.plan`)
and `analysis/`: the collectives of a lowered or compiled program (`hlo`), what each costs
inside a compiled program (`calibrate`, `alpha_beta`), and the steps K to a target
(`steps_model`, `noise_scale`). A leaf library: it imports jax, numpy, scipy and itself,
nothing else of jaxpar (tests/test_layers.py)."""
