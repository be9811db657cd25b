"""Context Memory Service: memory as a service for AI chat orchestrators.

The packages depend one way, bottom to top; a module imports only from its own layer or below:

1. `kit`: the shared plumbing (configuration, errors, the database, authentication and the
   issuers' keys, token counting, the model adapter, request limits, the HTTP protocol,
   pagination, logs, metrics, traces, the lean routes, the embedded PostgreSQL, the contract's
   additions, API tags, snapshots); `detectors`: the secret, contact, number and instruction
   detectors. Neither imports any other package of `app`.
2. `jobs`: the durable job queue and its worker; knows no domain. Domains register their job
   kinds and hand the worker their handlers and maintenance steps.
3. `conversations`: chats, turns and messages, and the history modes.
   `quotas`: the quota rules, the marks of the periodic check of stored amounts, and that
   check as a maintenance step.
4. `folders`: the folder tree and the access check.
5. `enablement`: flags, space settings, the user's stored setting, the audit trail, and the
   decision whether memory is on.
   `rate_limits`: the limits per route class, the per-process limiter, and the operators'
   per-company overrides (audited in the enablement trail).
   `usage`: usage metering per company and day, and the monthly model budget per company
   (audited in the enablement trail); the worker and the hot path count through it.
6. `profiles`: the `memory.md` document, its versions, the user's memory API and the switch that
   deletes it (which reaches down into folders, enablement and jobs).
7. `consolidation`: the job kinds it handles, the pipeline, its prompts and the offline engine.
8. `turns`: the orchestrator's two calls (and explicit consolidation), composed from the above.
9. `erasure`: `DELETE /v1/me`, which deletes what the packages below keep about the caller.
   `portability`: a company's data exported and imported, and a user's import of their
   memory export (through the profile gate, like every write).
10. `mcp_server`: the caller's memory over the Model Context Protocol (`/mcp`), on the
    services below; `ui`: the user's memory page (`/ui/memory`), static files that call the
    public API from the browser and import nothing of the domain; `health`: liveness,
    readiness and metrics; `docs_pages`: the offline `/docs` and `/redoc` pages.
11. composition: `main`, `cli`, `models` (every table, for the migrations) and `__main__`.

`tests/test_package_order.py` fails when a module imports upward; `python -m
tests.test_package_order` prints the package graph it checks.
"""

LAYERS: tuple[tuple[str, ...], ...] = (
    ("kit", "detectors"),
    ("jobs",),
    ("conversations",),
    ("quotas",),
    ("folders",),
    ("enablement",),
    ("rate_limits",),
    ("usage",),
    ("profiles",),
    ("consolidation",),
    ("turns",),
    ("erasure", "portability"),
    ("mcp_server", "ui", "health", "docs_pages"),
    ("main", "cli", "models", "__main__"),
)
"""The order above, bottom first: each entry names the modules or packages of one layer."""
