"""The jobs this domain handles, and their payloads: what producers queue and the pipeline reads.

`consolidation`: fold newly saved turns into the profile; the worker coalesces a user's waiting
consolidation jobs into one claim. `condensation`: bring a profile over its budget back within
it; claimed alone. Payloads hold ids only (see `app.jobs.enqueue.NewJob`).
"""

from __future__ import annotations

from typing import Final

from app.jobs.enqueue import register_kind
from app.jobs.queue import JobPayload

CONSOLIDATION: Final = register_kind("consolidation")
CONDENSATION: Final = register_kind("condensation")
KINDS: Final = (CONSOLIDATION, CONDENSATION)
COALESCING: Final = frozenset({CONSOLIDATION})


def consolidation_payload(turn_id: str, space_id: str, model: str | None) -> JobPayload:
    """A saved turn to consolidate, with the space and the language model it was answered in."""
    return {"turn_id": turn_id, "space_id": space_id, "model": model}


def condensation_payload(space_id: str, version: int, model: str | None = None) -> JobPayload:
    """The profile `version` that was over the budget of `space_id` when it was loaded; `model`
    when the space names one (else the worker's default model condenses)."""
    payload: JobPayload = {"space_id": space_id, "version": str(version)}
    if model is not None:
        payload["model"] = model
    return payload
