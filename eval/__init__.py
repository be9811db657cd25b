"""`make eval`: a scripted corpus replayed through the real service and its consolidation
pipeline, scored against the profiles it should produce, with the model calls and tokens it
cost. Run as `python -m eval`; docs/eval.md describes the corpus, the engines and the report."""
