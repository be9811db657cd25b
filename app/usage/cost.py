"""The estimated cost of model calls (pure): tokens times the configured price per million
tokens of the model that answered. A model without a price has no cost (None), never 0."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Final

from app.kit.config import ModelPrice

COST_DECIMALS: Final = 6
_MILLION: Final = Decimal(1_000_000)


def call_cost(
    prices: Mapping[str, ModelPrice], model: str, prompt_tokens: int, completion_tokens: int
) -> Decimal | None:
    """The cost of `model`'s tokens at its configured prices; None when it has none."""
    price = prices.get(model)
    if price is None:
        return None
    cost = (
        Decimal(prompt_tokens) * Decimal(str(price.prompt_per_million))
        + Decimal(completion_tokens) * Decimal(str(price.completion_per_million))
    ) / _MILLION
    return round(cost, COST_DECIMALS)


def total_cost(costs: list[Decimal | None]) -> Decimal | None:
    """The sum, or None when any part has no price: a total that silently left out a model
    would read as the whole bill."""
    if any(cost is None for cost in costs):
        return None
    return sum((cost for cost in costs if cost is not None), Decimal(0))
