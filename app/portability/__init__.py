"""A company's data in and out: everything the service holds for one company as an NDJSON
stream (`docs/portability.md`), that stream loaded into an empty company of another
deployment, and a user's import of their own memory export."""
