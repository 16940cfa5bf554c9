"""qrun's benchmark suite: four workloads timed against the model's own speed (the ideal
replay) and a re-encoding baseline (the naive runner). Run with `python -m bench`."""
