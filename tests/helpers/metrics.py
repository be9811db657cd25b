"""Metrics read through prometheus' public API, from the registry a `Metrics` owns."""

from __future__ import annotations

from app.kit.observability import Metrics


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    """The value of the sample `name` (a counter's is `<name>_total`) with these labels.

    A labelled child that was never created has no sample: it reads as 0.0, as the child would
    before its first increment.
    """
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value
