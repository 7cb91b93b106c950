"""The committed measurements (JSON) and the tables generated from them: `python -m
analysis.report` (see `__main__`)."""
