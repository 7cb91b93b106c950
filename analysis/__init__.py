"""jaxpar's analysis package: the thesis' timing equations, collective cost models,
the `estimate` CLI and the reproduced predictions (see `thesis_report.md`)."""
