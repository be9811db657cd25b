"""The five groups of the published API, by who calls an operation, in the order the
documentation shows them. Every operation carries exactly one (`tests/test_docs_pages.py`)."""

from __future__ import annotations

from typing import Any, Final

ORCHESTRATOR: Final = "orchestrator"
USER: Final = "user"
SPACE_ADMIN: Final = "space admin"
OPERATOR: Final = "operator"
OPERATIONS: Final = "operations"

OPENAPI_TAGS: Final[list[dict[str, Any]]] = [
    {
        "name": ORCHESTRATOR,
        "description": (
            "The chat back end, on behalf of the signed-in person and with that person's token. "
            "Every chat turn makes two calls: `/context` before the model call (the final "
            "messages, with the memory profile injected and the history the mode loads), "
            "`/turns` after the answer (the exchange is saved and consolidation queued). "
            "Listing and deleting a chat's stored history are here too, not under `user`: chat "
            "ids are the orchestrator's own, and it is the orchestrator that shows a "
            "conversation again or deletes it when the person deletes it in the chat."
        ),
    },
    {
        "name": USER,
        "description": (
            "The person, with their own token (a settings page, an assistant, a script): who "
            "the token says they are; their memory profile, its versions, diffs, restore, "
            "export and import; the context memory switch and whether memory is active in a "
            "space; an explicit consolidation and the job it queues; and erasing everything "
            "held about them. No path names a user: the token says whose data it is."
        ),
    },
    {
        "name": SPACE_ADMIN,
        "description": (
            "An administrator of the spaces of their own company (the `space_admin` role): "
            "whether context memory is on in a space, web search, the memory token budget; and "
            "the read-only view of the company's user-memory root folder and its ACL, which "
            "operators may also read for any company."
        ),
    },
    {
        "name": OPERATOR,
        "description": (
            "The people who run the service, across companies (the `operator` role): the "
            "companies it serves (registered, listed with a summary each, offboarded with a "
            "receipt), the company feature flags that switch context memory on, the audit trail "
            "of every settings change, the company's job queue with its dead letters and "
            "retries, and the company's data exported (NDJSON) and imported into another "
            "deployment. A company's own operators (the `company_operator` role) do all of that "
            "for their own company (its record, flags, memory policy, rate limits, model "
            "budget, usage, jobs, audit trail, spaces and users' erasure requests) except "
            "what concerns every company or moves its data: listing, registering, "
            "offboarding, export and import."
        ),
    },
    {
        "name": OPERATIONS,
        "description": (
            "Liveness, readiness and metrics, for load balancers, container orchestrators and "
            "Prometheus. No token."
        ),
    },
]
