"""Context Memory Service: memory as a service for AI chat orchestrators.

The packages depend one way, bottom to top; a module imports only from the layers below its own.
The order is written down once, as import-linter contracts in pyproject.toml
(`[tool.importlinter]`, top first), and checked by `lint-imports` (`make lint`) and
tests/test_package_order.py. What each layer holds, and why it sits where it does, bottom first:

1. `kit`: the shared plumbing (configuration, errors, the database, authentication and the
   issuers' keys, token counting, the model adapter, request limits, the HTTP protocol,
   pagination, logs, metrics, traces, the lean routes, the embedded PostgreSQL, the contract's
   additions, API tags, snapshots, the audited write of a company setting); `detectors`: the
   secret, contact, number and instruction detectors. Neither imports the other, nor any
   other package of `app`.
2. `companies` (on `kit` only): the registry of companies, the platform log that outlives them,
   the records of their offboardings, and the one check of an operator's write (the company is
   registered). Above it `jobs`: the durable job queue and its worker; knows no domain.
   Domains register their job kinds and hand the worker their handlers and maintenance steps.
3. `conversations`: chats, turns and messages, and the history modes.
4. `quotas`: the quota rules, the marks of the periodic check of stored amounts (a user's
   mark is written under the history lock of `conversations`), and that check as a
   maintenance step.
5. `folders`: the folder tree and the access check.
6. `enablement`: flags, space settings, the user's stored setting, the audit trail, and the
   decision whether memory is on.
7. `rate_limits`: the limits per route class, the per-process limiter, and the operators'
   per-company overrides (audited in the enablement trail).
8. `usage`: usage metering per company and day, and the monthly model budget per company
   (audited in the enablement trail); the worker and the hot path count through it. It and
   `rate_limits` know nothing of each other (a contract of their own).
9. `profiles`: the `memory.md` document, its versions, the user's memory API and the switch that
   deletes it (which reaches down into folders, enablement and jobs).
10. `consolidation`: the job kinds it handles, the pipeline, its prompts and the offline engine.
11. `turns`: the orchestrator's two calls (and explicit consolidation), composed from the above.
12. `erasure`: `DELETE /v1/me`, which deletes what the packages below keep about the caller.
    `portability`: a company's data exported and imported, and a user's import of their
    memory export (through the profile gate, like every write). Independent of each other.
13. `control_plane`: companies listed with their summaries, offboarded (every company table
    erased, the tables handed in by `main`), their users erased on request (through
    `erasure`) and their spaces set by their operators.
14. `mcp_server`: the caller's memory over the Model Context Protocol (`/mcp`), on the
    services below; `ui`: the user's memory page (`/ui/memory`) and the admin console
    (`/ui/admin`), static files that call the
    public API from the browser and import nothing of the domain; `health`: liveness,
    readiness and metrics; `docs_pages`: the offline `/docs` and `/redoc` pages; `identity`:
    `GET /v1/me`, who the token says the caller is. Independent of each other.
15. composition: `main`, `cli`, `models` (every table, for the migrations) and `__main__`,
    which may import each other.
"""
