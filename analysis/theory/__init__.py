"""The equations: [T] ch. 4 and 7, [S] §5, [H] §4 (`equations`); the thesis' estimate CLI
(`estimate`); its predictions beside its published results (`thesis_report`)."""
