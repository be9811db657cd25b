"""The durable job queue: PostgreSQL rows claimed under leases (SKIP LOCKED, fencing tokens,
backoff, dead letters), the worker that runs them, and the job routes. It knows no domain:
producers name a job kind and a payload of ids, and the worker runs the handler registered for
that kind."""
