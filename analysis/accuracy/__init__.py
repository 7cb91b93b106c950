"""Time to accuracy: the gradient noise scale (`noise_scale`), delayed-gradient SGD
(`staleness`), models of the steps to a target (`steps_model`) and the CLI that measures,
fits and multiplies them by the step time (`tta`)."""
