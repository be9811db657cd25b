"""The claim's statement that takes an owner's jobs, shared by the one-node claim
(`queue.TAKE_JOBS`) and the cluster's (`cluster_claim.TAKE_JOBS`). They differ only in the clock
(PostgreSQL's, or the instant read once and bound), in how the live-lease probe names the
company (the job's column, or the parameter Citus routes by) and in where the company is
recorded as served (a CTE of the statement, or a statement of its own on a cluster)."""

from __future__ import annotations

from typing import Final

PENDING: Final = "status IN ('queued', 'retrying', 'running')"
"""As `ix_jobs_pending_company`'s predicate has it, literally (so a generic plan can use it)."""

RECORD_SERVED_CTE: Final = """,
served AS (
    INSERT INTO job_company_claims (company_id, last_claimed_at)
    SELECT :company_id, clock_timestamp() WHERE EXISTS (SELECT FROM claimed)
        ON CONFLICT (company_id) DO UPDATE
       SET last_claimed_at = greatest(job_company_claims.last_claimed_at,
                                      excluded.last_claimed_at)
)"""


def claimable(alias: str, clock: str) -> str:
    return (
        f"({alias}.status IN ('queued', 'retrying') AND {alias}.run_after <= {clock}"
        f" OR {alias}.status = 'running' AND {alias}.lease_expires_at < {clock})"
    )


def no_live_lease(alias: str, clock: str, company: str) -> str:
    """A probe of `ix_jobs_running_owner`, which holds running jobs only (about one per busy
    slot), however many jobs the owner or the company has finished."""
    return (
        "NOT EXISTS (SELECT FROM jobs live"
        f" WHERE live.company_id = {company} AND live.user_id = {alias}.user_id"
        f" AND live.status = 'running' AND live.lease_expires_at >= {clock})"
    )


def take_jobs_sql(clock: str, live_company: str, served: str) -> str:
    """The statement, with `clock` for the time, `live_company` for the company of the
    live-lease probe and `served` (`RECORD_SERVED_CTE` or nothing) after the `claimed` CTE."""
    return f"""
WITH exhausted AS (
    UPDATE jobs
       SET status = 'dead', error_class = :lease_expired_class,
           error_message = :lease_expired_message, lease_token = NULL,
           lease_expires_at = NULL, finished_at = {clock}, updated_at = {clock}
     WHERE company_id = :company_id AND user_id = :user_id
       AND id IN (SELECT id FROM jobs
                   WHERE company_id = :company_id AND user_id = :user_id
                     AND status = 'running' AND lease_expires_at < {clock}
                     AND attempts >= max_attempts
                     FOR UPDATE SKIP LOCKED)
),
head AS (
    SELECT j.id, j.kind, j.payload, j.max_attempts, j.created_at FROM jobs j
     WHERE j.company_id = :company_id AND j.user_id = :user_id
       AND {claimable("j", clock)} AND NOT (j.status = 'running' AND j.attempts >= j.max_attempts)
       AND {no_live_lease("j", clock, live_company)}
     ORDER BY j.created_at, j.id
     LIMIT 1
       FOR UPDATE SKIP LOCKED
),
batch AS (
    SELECT j.id, j.kind, j.payload, j.max_attempts, j.created_at FROM jobs j
      JOIN head ON j.kind = head.kind AND j.id <> head.id
     WHERE j.company_id = :company_id AND j.user_id = :user_id
       AND head.kind = ANY(:coalesce::text[])
       AND {claimable("j", clock)} AND NOT (j.status = 'running' AND j.attempts >= j.max_attempts)
     ORDER BY j.created_at, j.id
     LIMIT :more
       FOR UPDATE OF j SKIP LOCKED
),
picked AS (SELECT * FROM head UNION ALL SELECT * FROM batch),
claimed AS (
    UPDATE jobs
       SET status = 'running', attempts = jobs.attempts + 1, lease_token = :lease_token,
           lease_expires_at = {clock} + make_interval(secs => :lease_seconds::float8),
           locked_by = :worker_id, updated_at = {clock}
      FROM picked
     WHERE jobs.company_id = :company_id AND jobs.id = picked.id
 RETURNING jobs.id, jobs.attempts, picked.kind, picked.payload, picked.max_attempts,
           picked.created_at, jobs.trace_context
){served}
SELECT id, attempts, kind, payload, max_attempts, created_at, trace_context FROM claimed
 ORDER BY created_at, id
"""  # noqa: S608 - composed of this module's constants only
