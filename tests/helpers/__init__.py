"""What the test modules share, one home per kind of helper: `apps` (settings, identities, apps
built with other settings), `db` (SQL below the app), `settings` (flags and spaces over HTTP),
`turns` (the orchestrator's two calls), `memory` and `profiles` (a user's memory.md), `jobs` and
`worker` (the queue and the consolidation worker), `metrics`, `llm_stub` (a real
OpenAI-compatible stub server), `bad_tokens` (the JWT rejection table), `tenants` (users of two
companies whose data carries canaries) and `snapshots` (database digests to compare). Fixtures
stay in `tests/conftest.py`."""
