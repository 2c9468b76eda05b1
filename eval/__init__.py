"""Evaluation: `python -m eval <benchmark> <step> ...`: the generation backends and judges, each benchmark's data,
prompts, metrics and reports (spy, general, geoprivacy, spatialtrust), the suite, compare, statistics over seeds and
the per-sample viewer (view). Imports data_prep, store, vlm and cli."""
