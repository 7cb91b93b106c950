"""jaxpar: parallel training of CNNs on JAX device meshes, checked against single-device maths."""
