"""Evaluation: `python -m eval <benchmark> <step> ...`."""
