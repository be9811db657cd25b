"""Size control: whether a profile fits its space's token budget, counted as the consolidation
model counts, and fitting a change that does not (condensed by the model, else truncated)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from app.consolidation.model_calls import ModelCalls, Usage
from app.consolidation.prompts import MalformedModelOutput
from app.consolidation.snapshot import Snapshot
from app.kit.llm import ModelError
from app.kit.observability import Metrics
from app.kit.tokens import TokenCounters
from app.profiles.budget import truncate_to_budget
from app.profiles.document import Operation, Profile, diff_operations, render_body
from app.profiles.versions import WorkerReason

logger = logging.getLogger("app.consolidation")


@dataclass(frozen=True)
class Change:
    """A new profile, ready to write, with the operations that produced it."""

    profile: Profile
    operations: tuple[Operation, ...]
    reason: WorkerReason


def budget_counter(tokens: TokenCounters, model: str) -> Callable[[str], int]:
    """Tokens as `model` counts them, but never fewer than the stored count the load path
    compares with the budget (else a profile could fit here and still queue condensations at
    every load)."""
    model_counter, stored = tokens.for_model(model), tokens.stored
    if model_counter.encoding_name == stored.encoding_name:
        return stored.count
    return lambda text: max(model_counter.count(text), stored.count(text))


class SizeControl:
    """Fits changes to their snapshot's budget; `model_calls` None means truncation only."""

    def __init__(
        self, model_calls: ModelCalls | None, metrics: Metrics, tokens: TokenCounters
    ) -> None:
        self.model_calls = model_calls
        self.metrics = metrics
        self.tokens = tokens

    def fits(self, profile: Profile, snapshot: Snapshot) -> bool:
        """True when `profile`'s body is within the snapshot's budget."""
        count = budget_counter(self.tokens, snapshot.model)
        return count(render_body(profile)) <= snapshot.budget

    async def fit(self, snapshot: Snapshot, change: Change, usage: Usage) -> Change:
        """Within budget as is; else condensed by the model; else (or still over) truncated.

        A consolidation keeps reason `consolidation` (its turn count advances); a condensation
        job records `condensation` or `truncation`, whichever step made it fit.
        """
        if self.fits(change.profile, snapshot):
            return change
        profile, ops, reason = change.profile, list(change.operations), change.reason
        condensed = await self._condense(snapshot, profile, usage)
        if condensed is not None:
            self.metrics.condensations.inc()
            ops += diff_operations(profile, condensed)
            profile = replace(condensed, frontmatter=profile.frontmatter, truncated=False)
        if not self.fits(profile, snapshot):
            count = budget_counter(self.tokens, snapshot.model)
            cut = truncate_to_budget(profile, snapshot.budget, count)
            self.metrics.truncations.inc()
            ops += diff_operations(profile, cut)
            profile = cut
            if reason == "condensation":
                reason = "truncation"
        return Change(profile, tuple(ops), reason)

    async def _condense(self, snapshot: Snapshot, profile: Profile, usage: Usage) -> Profile | None:
        """The model's condensed profile, or None (no model, or the condensation failed)."""
        if self.model_calls is None:
            return None
        try:
            condensed = await self.model_calls.condensation(snapshot, profile, usage)
        except (ModelError, MalformedModelOutput) as error:
            usage.calls.append("condensation=failed")
            logger.warning("condensation failed (%s); truncating instead", type(error).__name__)
            return None
        usage.calls.append("condensation=NOOP" if condensed == "NOOP" else "condensation=done")
        return None if condensed == "NOOP" else condensed
