"""Ways to combine per-device gradients and weights; one module per method."""
