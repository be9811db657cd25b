"""Runnable examples of an orchestrator using the Context Memory Service (`make demo`)."""
