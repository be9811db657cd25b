"""Consolidation: the job kinds this domain registers, the pipeline the worker runs for them, its
prompts and model calls, size control, and the offline rule engine."""
