"""Settings: the only place configuration is read, from the environment and `.env`.

Environment names marked "contract" are relied on by scripts and deployments; keep them stable.
"""

from __future__ import annotations

import difflib
import ipaddress
import json
import logging
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Final, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEV_JWT_SECRET = "dev-only-insecure-secret-change-me"  # noqa: S105 - refused outside development
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# a rate limit: QUOTA/WINDOW_SECONDS (120/60: 120 requests a minute), or off (0 too)
RATE_LIMIT_PATTERN = r"^(off|0|[1-9][0-9]{0,7}/[1-9][0-9]{0,4})$"

Environment = Literal["development", "test", "production"]
ServiceRole = Literal["space_admin", "company_operator", "operator"]
IssuerAlgorithm = Literal["RS256", "RS384", "RS512", "ES256", "ES384", "ES512"]


class IssuerConfig(BaseModel):
    """One trusted OpenID issuer of `AUTH_ISSUERS` (docs/identity.md).

    Tokens whose `iss` is exactly `issuer` are verified with the keys of its JWKS and read with
    its claim paths. A dotted path reaches nested claims (`realm_access.roles`); a claim whose
    own name holds dots or colons is found as a whole key first.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    issuer: str = Field(min_length=1, max_length=2048)
    jwks_uri: str | None = Field(default=None, max_length=2048)
    audiences: list[str] = Field(min_length=1)
    algorithms: list[IssuerAlgorithm] = Field(default=["RS256"], min_length=1)
    company: str | None = Field(default=None, min_length=1, max_length=128)
    company_claim: str | None = Field(default=None, min_length=1, max_length=256)
    user_claim: str = Field(default="sub", min_length=1, max_length=256)
    roles_claim: str | None = Field(default=None, min_length=1, max_length=256)
    role_map: dict[str, ServiceRole] | None = None
    platform: bool = False

    @model_validator(mode="after")
    def _one_company_source(self) -> IssuerConfig:
        if (self.company is None) == (self.company_claim is None):
            raise ValueError(f"issuer {self.issuer!r}: set exactly one of company, company_claim")
        return self


class ModelPrice(BaseModel):
    """One model's price in `MODEL_PRICES`, per million tokens (the currency is the operator's)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_per_million: float = Field(ge=0, le=1_000_000)
    completion_per_million: float = Field(ge=0, le=1_000_000)


LlmProvider = Literal["auto", "openai", "rules"]
ConsolidationStrategy = Literal["operations", "rewrite"]
LogFormat = Literal["auto", "json", "text"]


class Settings(BaseSettings):
    """Every knob of the service. Field name == environment variable name (case-insensitive)."""

    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore", case_sensitive=False
    )

    # --- runtime -----------------------------------------------------------------------------
    environment: Environment = "development"
    log_level: str = "INFO"  # contract: LOG_LEVEL
    log_format: LogFormat = Field(
        default="auto",
        description=(
            "`json`: one JSON object per line; `text`: short lines for a person at a terminal; "
            "`auto`: text when stderr is a terminal, JSON otherwise."
        ),
    )
    api_workers: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "API processes of `serve` sharing its port (`serve --workers` overrides it). Each "
            "has its own database connections and, with WORKER_ENABLED, its own in-process "
            "consolidation worker."
        ),
    )

    # --- database ----------------------------------------------------------------------------
    database_url: str | None = None  # contract: DATABASE_URL (unset -> embedded PostgreSQL)
    embedded_pg_dir: Path = PROJECT_ROOT / "var" / "pg"  # contract: EMBEDDED_PG_DIR
    db_pool_size: int = Field(default=20, ge=1, le=200)
    # asyncpg connections of the two calls of every chat turn, opened on demand
    # (app/kit/db/driver_pool.py)
    db_hot_pool_size: int = Field(default=20, ge=1, le=200)
    db_max_overflow: int = Field(default=10, ge=0, le=200)
    # On a Citus cluster: /context's read sent to the worker node holding the company's shards,
    # over a pool of its own per node (DB_HOT_POOL_SIZE connections), not through the
    # coordinator; the workers must take the service's connections as the coordinator does
    # (app/kit/citus_reads.py, docs/scaling.md). Ignored on plain PostgreSQL.
    citus_worker_reads: bool = False
    # Group commit of the common turn-save (app/turns/batching.py): turn-saves handed in while a
    # turn-save statement of the process runs are written together, up to TURN_BATCH_MAX to a
    # statement (1: each turn alone, as with an Idempotency-Key); up to TURN_BATCH_IN_FLIGHT
    # statements at once, a second one once a quarter of TURN_BATCH_MAX turns wait.
    turn_batch_max: int = Field(default=32, ge=1, le=1000)
    turn_batch_in_flight: int = Field(default=2, ge=1, le=200)
    # Off: a pre-ping costs round trips on every checkout of the hot path; after a database
    # restart the first request on a stale connection answers 503 and the pool is recycled.
    db_pool_pre_ping: bool = False
    db_connect_timeout_seconds: float = Field(default=5.0, gt=0)
    db_statement_timeout_ms: int = Field(default=15_000, ge=0)
    db_pgbouncer_transaction_mode: bool = Field(
        default=False,
        description=(
            "The database is reached through PgBouncer with pool_mode=transaction: no prepared "
            "statement outlives its statement, and DB_STATEMENT_TIMEOUT_MS is not sent (set "
            "statement_timeout on the database role instead)."
        ),
    )
    db_unavailable_retry_after_seconds: int = Field(default=5, ge=1)
    # A session left idle inside a transaction this long is ended by the server (a stuck
    # request or job cannot hold its connection and row locks for ever); 0: never. Sent at
    # connect, except in PgBouncer mode (set it on the role there).
    db_idle_in_transaction_timeout_seconds: int = Field(default=60, ge=0, le=86_400)
    # The worker's own pool (claims, heartbeats, its reads and writes), apart from the one
    # requests use: a flood of requests cannot make the worker wait for a connection. 0: two
    # per worker slot (its job and its lease's heartbeat) and two for the housekeeping.
    db_worker_pool_size: int = Field(default=0, ge=0, le=200)

    # --- exports (app/kit/spool.py) ----------------------------------------------------------
    # Exports are read from their snapshot into a temporary file as fast as the database
    # serves them, then sent from the file at the client's pace: a connection is held only
    # while a snapshot is read. At most EXPORT_READ_CONCURRENCY snapshots are read at once per
    # process, EXPORT_READ_COMPANY_CONCURRENCY of them for one company; past either the export
    # is refused with Retry-After (503 for the process, 429 for the company).
    export_read_concurrency: int = Field(default=4, ge=1, le=64)
    export_read_company_concurrency: int = Field(default=2, ge=1, le=64)
    # Each piece of an export sent (256 KiB) must be taken by the client within this long, else
    # the client is cut off and the file deleted: 60 s asks at least ~4 KiB/s of a reader.
    export_send_timeout_seconds: float = Field(default=60.0, gt=0, le=3600)

    # --- auth (contract names) ---------------------------------------------------------------
    jwt_secret: SecretStr = SecretStr(DEV_JWT_SECRET)
    jwt_algorithms: Annotated[list[str], NoDecode] = ["HS256"]
    jwt_issuer: str = "context-memory-dev"
    jwt_audience: str = "context-memory"
    jwt_public_key: SecretStr | None = None
    jwt_private_key: SecretStr | None = None  # only for `token` with RS256/ES256 in development
    jwt_max_token_bytes: int = Field(default=8192, ge=256)
    jwt_leeway_seconds: int = Field(default=0, ge=0, le=300)
    # verified tokens remembered until their exp (~300 bytes each); 0 verifies every request
    jwt_cache_size: int = Field(default=100_000, ge=0)
    # the static key's confinement, in the shape of an AUTH_ISSUERS entry (docs/identity.md)
    jwt_company: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description=(
            "A fixed company id: every static token acts in it, whatever its claims say. "
            "Unset: the company comes from JWT_COMPANY_CLAIM."
        ),
    )
    jwt_company_claim: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description=(
            "The claim path of a static token's company id (unset: `company_id`); set at most "
            "one of JWT_COMPANY, JWT_COMPANY_CLAIM."
        ),
    )
    jwt_platform: bool | None = Field(
        default=None,
        description=(
            "Static tokens may carry `operator` (act on any company). Unset: yes in "
            "ENVIRONMENT=development only; elsewhere their `operator` is dropped and counted."
        ),
    )
    jwt_role_map: Annotated[dict[str, ServiceRole] | None, NoDecode] = Field(
        default=None,
        description=(
            "Role names of static tokens to service roles, a JSON object such as "
            '`{"memory-admin": "space_admin"}`; only mapped roles pass. Unset: roles named '
            "`space_admin`, `company_operator` or `operator` pass as they are."
        ),
    )

    # --- trusted OpenID issuers (docs/identity.md) ---------------------------------------------
    auth_issuers: Annotated[list[IssuerConfig], NoDecode] = Field(
        default=[],
        description=(
            "Trusted OpenID issuers: a JSON list, or `@path` to a file holding one. Tokens are "
            "routed to their issuer by `iss` and verified with the keys of its JWKS."
        ),
    )
    auth_resource_url: str | None = Field(
        default=None,
        max_length=300,
        pattern=r"^https?://(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?/?$",
        description=(
            "The service's public URL as its clients reach it, scheme, host and port only "
            "(`https://memory.example`): the resource that `/.well-known/oauth-protected-"
            "resource` describes (`<url>/mcp` for MCP) and the origin of the metadata URL a 401 "
            "from `/mcp` names. Unset: each request's own scheme and Host header, which behind a "
            "proxy that terminates TLS says `http://`; set it in production (docs/mcp.md)."
        ),
    )
    auth_allow_http_issuers: bool = Field(
        default=False,
        description=(
            "Accept `http://` issuer and JWKS URLs on hosts other than loopback (a provider "
            "inside a private network); `https://` is required otherwise."
        ),
    )
    auth_jwks_timeout_seconds: float = Field(default=5.0, gt=0, le=60)
    auth_jwks_refresh_interval_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description=(
            "At most one JWKS fetch per issuer in this interval for tokens whose `kid` is "
            "unknown, however many such tokens arrive."
        ),
    )
    auth_jwks_cache_min_seconds: int = Field(default=60, ge=0)
    auth_jwks_cache_max_seconds: int = Field(default=86_400, ge=1)
    auth_jwks_cache_default_seconds: int = Field(
        default=600, ge=0, description="Keys' lifetime when the JWKS sends no max-age."
    )
    auth_jwks_max_stale_seconds: int = Field(
        default=86_400,
        ge=60,
        description=(
            "Keys fetched longer ago than this (the provider unreachable since) make /readyz "
            "answer 503; they are still used meanwhile."
        ),
    )

    # --- the memory page's sign-in (authorization code flow with PKCE) ---------------------------
    ui_oidc_issuer: str | None = None
    ui_oidc_client_id: str | None = None
    ui_oidc_scope: str = "openid"
    ui_oidc_extra_params: Annotated[dict[str, str], NoDecode] = Field(
        default={},
        description=(
            "Extra parameters of the authorization request as a JSON object, such as "
            '`{"resource": "https://memory.example"}` or `{"audience": "context-memory"}`, '
            "so that the provider issues an access token for this service."
        ),
    )

    # --- HTTP limits -------------------------------------------------------------------------
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    import_max_bytes: int = Field(
        default=8 * 1024**3,
        ge=1024,
        description=(
            "The largest body of a company import (`POST /v1/companies/{company_id}/import`), "
            "which is read as it arrives, never buffered; every other request has MAX_BODY_BYTES."
        ),
    )
    max_request_headers: int = Field(
        default=100,
        ge=16,
        le=1000,
        description="The most header fields a request may have; more is a 431.",
    )
    max_request_header_bytes: int = Field(
        default=16_384,
        ge=4096,
        le=1_048_576,
        description=(
            "The most bytes of a request's head (request line and header fields, as sent); "
            "more is a 431. Keep it above JWT_MAX_TOKEN_BYTES plus a few hundred bytes."
        ),
    )
    request_header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description=(
            "`serve` closes a connection whose request head (request line and headers) is not "
            "complete this long after the connection opened or its previous response ended."
        ),
    )
    request_body_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description=(
            "A request body must have arrived this long after its headers (a 408 otherwise, "
            "and the connection is closed); a company import, read as it arrives, must not "
            "pause longer than this between two pieces."
        ),
    )
    max_messages_per_request: int = Field(default=200, ge=1)
    max_message_chars: int = Field(default=100_000, ge=1)
    idempotency_key_max_length: int = Field(default=255, ge=8)
    idempotency_ttl_hours: int = Field(default=24, ge=24)

    # --- rate limits (QUOTA/WINDOW_SECONDS, or off; per user and per company) ----------------
    rate_limit_context_user: str = Field(default="600/60", pattern=RATE_LIMIT_PATTERN)
    rate_limit_context_company: str = Field(default="12000/60", pattern=RATE_LIMIT_PATTERN)
    rate_limit_turns_user: str = Field(default="120/60", pattern=RATE_LIMIT_PATTERN)
    rate_limit_turns_company: str = Field(default="3000/60", pattern=RATE_LIMIT_PATTERN)
    rate_limit_consolidations_user: str = Field(default="10/60", pattern=RATE_LIMIT_PATTERN)
    rate_limit_consolidations_company: str = Field(default="300/60", pattern=RATE_LIMIT_PATTERN)
    rate_limit_exports_user: str = Field(default="10/3600", pattern=RATE_LIMIT_PATTERN)
    rate_limit_exports_company: str = Field(default="100/3600", pattern=RATE_LIMIT_PATTERN)
    rate_limit_memory_writes_user: str = Field(default="60/60", pattern=RATE_LIMIT_PATTERN)
    rate_limit_memory_writes_company: str = Field(default="1200/60", pattern=RATE_LIMIT_PATTERN)
    rate_limit_replicas: int = Field(
        default=1,
        ge=1,
        le=1024,
        description=(
            "Replicas of the service behind the load balancer. Each API process enforces "
            "1/(RATE_LIMIT_REPLICAS x API_WORKERS) of every limit, so that together they never "
            "allow more than the limit."
        ),
    )
    rate_limit_refusal_delay_seconds: float = Field(
        default=0.5,
        ge=0,
        le=10,
        description=(
            "A request over a rate limit is answered after this pause (at most its "
            "Retry-After), so that a client retrying in a tight loop is slowed down; 0: at once."
        ),
    )
    rate_limit_refresh_seconds: float = Field(
        default=30.0,
        ge=1,
        le=3600,
        description="How often a process reads the companies' rate-limit overrides again.",
    )

    # --- conversation history ----------------------------------------------------------------
    history_max_messages: int = Field(default=50, ge=0)
    history_max_tokens: int = Field(default=8000, ge=0)
    # stored messages older than this many days are deleted by the worker; 0 keeps them
    chat_retention_days: int = Field(default=0, ge=0, le=36_500)

    # --- memory profile ----------------------------------------------------------------------
    memory_max_versions: int = Field(default=50, ge=1)
    memory_change_guard_share: float = Field(default=0.5, gt=0, le=1)

    # --- language model (contract names) -----------------------------------------------------
    llm_provider: LlmProvider = "auto"
    openai_api_key: SecretStr | None = None
    openai_base_url: str | None = None
    llm_model: str = Field(
        default="gpt-4o-mini",
        description=(
            "The worker's model for a job that names none: a condensation queued at load time "
            "for a space that uses the orchestrator's model (unknown then). Turns always name "
            "theirs (the orchestrator's or the space's `language_model`). With Azure, a "
            "deployment name."
        ),
    )
    llm_gate_model: str = Field(
        default="gpt-4o-mini",
        description=(
            "The model of the UPDATE/NOOP gate: one word out, so a small model of the same "
            "provider; the operations, rewrite and condensation calls use the space's model. "
            "With Azure, a deployment name of its own."
        ),
    )
    llm_timeout_seconds: float = Field(default=30.0, gt=0)
    llm_encodings_dir: Path | None = Field(
        default=None,
        description=(
            "A directory of token encoding files as OpenAI publishes them (`o200k_base.tiktoken`):"
            " a model whose encoding is there is counted with it; any other with the bundled "
            "cl100k encoding. Nothing is ever downloaded."
        ),
    )
    azure_openai_endpoint: str | None = None
    azure_openai_api_version: str | None = None
    consolidation_strategy: ConsolidationStrategy = "operations"
    consolidation_gate: bool = True
    consolidation_prefilter: bool = Field(
        default=True,
        description=(
            "Decide locally which model calls a consolidation needs: none for clearly "
            "non-durable turns (greetings, thanks, questions about the world), no gate when "
            "the offline engine already reads a fact or a forget request."
        ),
    )

    # --- quotas (0 = unlimited) ----------------------------------------------------------------
    quota_user_queued_jobs: int = Field(
        default=20,
        ge=0,
        le=10_000,
        description=(
            "Waiting (queued or retrying) consolidation jobs per user; a further turn is "
            "coalesced into the user's newest queued job instead of queuing one."
        ),
    )
    quota_job_max_turns: int = Field(
        default=25,
        ge=1,
        le=1_000,
        description=(
            "Most turns one consolidation job carries once turns are coalesced into it; when "
            "every waiting job of the user is full, a turn-save answers 409."
        ),
    )
    quota_user_history_messages: int = Field(
        default=1_000_000,
        ge=0,
        description="Stored chat messages per user (every chat); over it a turn-save is a 409.",
    )
    quota_company_users_with_memory: int = Field(
        default=0,
        ge=0,
        description="Users of one company with a memory folder; 0 = unlimited.",
    )
    quota_company_storage_bytes: int = Field(
        default=0,
        ge=0,
        description=(
            "Bytes of stored chat messages and memory versions per company; over it a "
            "turn-save is a 409. 0 = unlimited."
        ),
    )
    quota_check_interval_seconds: int = Field(
        default=300,
        ge=300,
        le=86_400,
        description=(
            "How often the worker recounts stored history and storage against their quotas "
            "(at its housekeeping rounds, every 300 s)."
        ),
    )

    # --- worker ------------------------------------------------------------------------------
    worker_enabled: bool = True  # run the worker inside `serve`
    worker_concurrency: int = Field(default=2, ge=1, le=64)
    worker_poll_seconds: float = Field(default=1.0, gt=0)
    job_lease_seconds: int = Field(default=60, ge=5)
    job_max_attempts: int = Field(default=5, ge=1)
    job_batch_size: int = Field(default=10, ge=1)
    # touched by every idle worker poll; `worker --check` reads its age
    worker_heartbeat_file: Path = Path("/tmp/context-memory-worker.heartbeat")  # noqa: S108
    worker_metrics_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description=(
            "`python -m app worker` serves its Prometheus metrics (queue, jobs, model calls) "
            "at http://WORKER_METRICS_HOST:<port>/metrics; 0 serves none."
        ),
    )
    worker_metrics_host: str = "127.0.0.1"
    # Idle workers are woken when a request queues a job (app/jobs/wakeup.py): each API process
    # sends one NOTIFY at most every JOB_NOTIFY_INTERVAL_MS; 0: none (workers find jobs by
    # polling every WORKER_POLL_SECONDS, which they do anyway).
    job_notify_interval_ms: int = Field(default=20, ge=0, le=10_000)
    # The worker LISTENs on a session of its own: on DATABASE_URL, or on this one (the database
    # itself, not a transaction pooler). Behind PgBouncer in transaction mode it is needed: there,
    # without it, workers only poll.
    database_listen_url: str | None = None

    # --- usage metering (docs/usage.md) --------------------------------------------------------
    usage_flush_seconds: float = Field(
        default=10.0,
        ge=0.1,
        le=86_400,
        description=(
            "How often each process writes its in-memory counts of turns saved and contexts "
            "served (and at shutdown): a crash loses at most this interval of those two counts."
        ),
    )
    model_prices: Annotated[dict[str, ModelPrice], NoDecode] = Field(
        default={},
        description=(
            'Prices per model for the usage report\'s estimated cost, as JSON: `{"gpt-4o-mini": '
            '{"prompt_per_million": 0.15, "completion_per_million": 0.6}}`, keyed by the model '
            "name the provider reports. A model without a price has no cost estimate."
        ),
    )

    @field_validator("auth_issuers", mode="before")
    @classmethod
    def _read_issuers(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("@"):
                try:
                    text = Path(text[1:]).read_text(encoding="utf-8")
                except OSError as exc:
                    raise ValueError(f"AUTH_ISSUERS: cannot read {text[1:]!r}: {exc}") from exc
            return json.loads(text) if text else []
        return value

    @field_validator("jwt_role_map", mode="before")
    @classmethod
    def _read_role_map(cls, value: object) -> object:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else None
        return value

    @field_validator("model_prices", mode="before")
    @classmethod
    def _read_model_prices(cls, value: object) -> object:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("ui_oidc_extra_params", mode="before")
    @classmethod
    def _read_extra_params(cls, value: object) -> object:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("auth_issuers")
    @classmethod
    def _consistent_issuers(cls, value: list[IssuerConfig]) -> list[IssuerConfig]:
        seen: set[str] = set()
        for entry in value:
            if entry.issuer in seen:
                raise ValueError(f"AUTH_ISSUERS lists {entry.issuer!r} twice")
            seen.add(entry.issuer)
        return value

    @field_validator("jwt_algorithms", mode="before")
    @classmethod
    def _split_algorithms(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("jwt_algorithms")
    @classmethod
    def _known_algorithms(cls, value: list[str]) -> list[str]:
        allowed = {"HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384"}
        unknown = [alg for alg in value if alg not in allowed]
        if unknown or not value:
            raise ValueError(f"JWT_ALGORITHMS must be a non-empty subset of {sorted(allowed)}")
        return value

    @model_validator(mode="after")
    def _refuse_dev_secret_outside_development(self) -> Settings:
        if self.jwt_issuer in {entry.issuer for entry in self.auth_issuers}:
            raise ValueError("JWT_ISSUER must not be the issuer of an AUTH_ISSUERS entry")
        if self.jwt_company is not None and self.jwt_company_claim is not None:
            raise ValueError("set at most one of JWT_COMPANY, JWT_COMPANY_CLAIM")
        if self.auth_jwks_cache_min_seconds > self.auth_jwks_cache_max_seconds:
            raise ValueError("AUTH_JWKS_CACHE_MIN_SECONDS exceeds AUTH_JWKS_CACHE_MAX_SECONDS")
        if (self.ui_oidc_issuer is None) != (self.ui_oidc_client_id is None):
            raise ValueError("set both UI_OIDC_ISSUER and UI_OIDC_CLIENT_ID, or neither")
        if self.ui_oidc_issuer is not None and not is_allowed_url(
            self.ui_oidc_issuer, allow_http=self.auth_allow_http_issuers
        ):
            raise ValueError(
                "UI_OIDC_ISSUER must be an https:// URL (http:// only on loopback, or with "
                "AUTH_ALLOW_HTTP_ISSUERS)"
            )
        allow_http = self.auth_allow_http_issuers
        for entry in self.auth_issuers:
            for url in (entry.issuer, entry.jwks_uri):
                if url is not None and not is_allowed_url(url, allow_http=allow_http):
                    raise ValueError(
                        f"AUTH_ISSUERS: {url!r} must be https:// (http:// only on loopback, "
                        "or with AUTH_ALLOW_HTTP_ISSUERS)"
                    )
        hmac = [a for a in self.jwt_algorithms if a.startswith("HS")]
        needed = max((_MIN_HMAC_SECRET_BYTES[a] for a in hmac), default=0)
        secret_bytes = len(self.jwt_secret.get_secret_value().encode())
        if self.static_hmac_enabled and secret_bytes < needed:
            raise ValueError(
                f"JWT_SECRET must be at least {needed} bytes for {', '.join(hmac)} "
                "(RFC 7518 3.2: a key as long as the hash output)"
            )
        if self.auth_issuers and self.environment != "development":
            return self._require_static_keys()
        if self.environment != "development" and self.uses_development_jwt_secret:
            raise ValueError(
                "JWT_SECRET is the built-in development secret; "
                "set a real secret outside ENVIRONMENT=development"
            )
        if any(not alg.startswith("HS") for alg in self.jwt_algorithms) and not (
            self.jwt_public_key
        ):
            raise ValueError("JWT_PUBLIC_KEY is required for RS*/ES* algorithms")
        return self

    def _require_static_keys(self) -> Settings:
        # With trusted issuers outside development, the built-in secret is never honoured:
        # static HMAC tokens are simply off (static_hmac_enabled), not a start-up error.
        if any(not alg.startswith("HS") for alg in self.jwt_algorithms) and not (
            self.jwt_public_key
        ):
            raise ValueError("JWT_PUBLIC_KEY is required for RS*/ES* algorithms")
        return self

    @property
    def static_hmac_enabled(self) -> bool:
        """Static `HS*` tokens are verified: never with the built-in secret outside
        development (with AUTH_ISSUERS set, that is how the static mode is switched off)."""
        return not (self.environment != "development" and self.uses_development_jwt_secret)

    @property
    def static_platform(self) -> bool:
        """Static tokens may carry `operator`: JWT_PLATFORM, unset meaning development only."""
        if self.jwt_platform is None:
            return self.environment == "development"
        return self.jwt_platform

    @property
    def static_issuer(self) -> IssuerConfig:
        """The static key's confinement in the shape of an AUTH_ISSUERS entry: its `iss` and
        `aud`, its company rule, `sub` and `roles` as its claims, its role map and platform
        flag. Its keys and algorithms are JWT_SECRET, JWT_PUBLIC_KEY and JWT_ALGORITHMS, not
        this entry's `jwks_uri` and `algorithms` (unused)."""
        return IssuerConfig(
            issuer=self.jwt_issuer,
            audiences=[self.jwt_audience],
            company=self.jwt_company,
            company_claim=None if self.jwt_company else self.jwt_company_claim or "company_id",
            user_claim="sub",
            roles_claim="roles",
            role_map=self.jwt_role_map,
            platform=self.static_platform,
        )

    @property
    def owned_companies(self) -> frozenset[str]:
        """Companies that an issuer of AUTH_ISSUERS (or the static key) owns by a fixed
        company: no token of another issuer, and no static token, may act in them."""
        owned = {entry.company for entry in self.auth_issuers if entry.company}
        if self.jwt_company is not None:
            owned.add(self.jwt_company)
        return frozenset(owned)

    @property
    def uses_embedded_database(self) -> bool:
        return not self.database_url

    @property
    def uses_development_jwt_secret(self) -> bool:
        """HMAC tokens signed with the built-in secret, which anybody can read in this file:
        only then may `serve` print a token (a token in a log is a credential otherwise)."""
        uses_hmac = any(alg.startswith("HS") for alg in self.jwt_algorithms)
        return uses_hmac and self.jwt_secret.get_secret_value() == DEV_JWT_SECRET

    @property
    def worker_pool_size(self) -> int:
        """Connections of the worker's own pool (`DB_WORKER_POOL_SIZE`, or its default)."""
        return self.db_worker_pool_size or 2 * self.worker_concurrency + 2

    @property
    def async_database_url(self) -> str | None:
        """DATABASE_URL normalised for SQLAlchemy's asyncpg dialect."""
        return to_asyncpg_url(self.database_url) if self.database_url else None


# RFC 7518 3.2: an HMAC key at least as long as the hash output
_MIN_HMAC_SECRET_BYTES: Final = {"HS256": 32, "HS384": 48, "HS512": 64}


def is_allowed_url(url: str, *, allow_http: bool) -> bool:
    """`https://`, or `http://` on a loopback host (or anywhere with AUTH_ALLOW_HTTP_ISSUERS):
    the URLs an issuer's discovery document and keys may be fetched from."""
    parts = urlsplit(url)
    if not parts.hostname:
        return False
    if parts.scheme == "https":
        return True
    if parts.scheme != "http":
        return False
    return allow_http or is_loopback_host(parts.hostname)


def is_loopback_host(host: str) -> bool:
    """`serve --host` binds only this machine's loopback interface."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def to_asyncpg_url(url: str) -> str:
    """`url` for SQLAlchemy's asyncpg dialect: its scheme, and several hosts (libpq's
    `postgresql://u@h1:5433,h2:5434/db` or `postgresql://u@/db?host=h1,h2&port=5433,5434`)
    respelled as the one form the dialect reads whole, a `host=h:port` parameter per host; the
    other parameters (`target_session_attrs`) are kept. A single-host URL keeps its spelling."""
    for prefix in ("postgresql+asyncpg://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return _one_host_parameter_each("postgresql+asyncpg://" + url[len(prefix) :])
    raise ValueError("DATABASE_URL must start with postgresql:// or postgresql+asyncpg://")


def _one_host_parameter_each(url: str) -> str:
    parts = urlsplit(url)
    userinfo, at, netloc_hosts = parts.netloc.rpartition("@")
    query = parse_qsl(parts.query, keep_blank_values=True)
    query_hosts = [h for name, value in query if name == "host" for h in value.split(",")]
    hosts = query_hosts or [h for h in netloc_hosts.split(",") if h]
    if len(hosts) < 2:
        return url
    ports = [p for name, value in query if name == "port" for p in value.split(",")]
    if len(ports) not in {0, 1, len(hosts)}:
        raise ValueError(f"DATABASE_URL names {len(hosts)} hosts and {len(ports)} ports")
    listed: list[tuple[str, str]] = []
    for number, entry in enumerate(hosts):
        host, colon, port = entry.rpartition(":")
        if not colon or "]" in port or "/" in port:  # no port of its own
            host, port = entry, ports[number % len(ports)] if ports else "5432"
        listed.append(("host", f"{host}:{port}"))
    kept = [(name, value) for name, value in query if name not in {"host", "port"}]
    respelled = urlencode([*kept, *listed], safe="/:,[]")
    return urlunsplit((parts.scheme, f"{userinfo}{at}", parts.path, respelled, parts.fragment))


@lru_cache
def get_settings() -> Settings:
    return Settings()


# --- names in the environment that no setting reads ---------------------------------------------

logger = logging.getLogger("app.kit.config")

READ_ELSEWHERE: Final = frozenset(
    {
        # the OpenAI SDK's own, read while the service builds its client (app/kit/llm.py passes
        # the key, the base URL and the Azure endpoint itself, so those are settings)
        "OPENAI_ADMIN_KEY",
        "OPENAI_API_TYPE",
        "OPENAI_API_VERSION",
        "OPENAI_CUSTOM_HEADERS",
        "OPENAI_LOG",
        "OPENAI_ORG_ID",
        "OPENAI_PROJECT_ID",
        "OPENAI_WEBHOOK_SECRET",
    }
)
"""Variables under a settings prefix that something else reads on purpose. What the service's
own code reads from the environment (`OTEL_*`) is under no settings prefix;
tests/test_settings_typos.py holds that and fails when a new read would be flagged."""

# what Kubernetes sets in every pod for each service of its namespace (`WORKER_SERVICE_HOST`,
# `WORKER_PORT=tcp://10.0.0.7:9100`, `WORKER_PORT_9100_TCP_ADDR`, ...): a service named like a
# settings prefix is no typo
_SERVICE_LINK: Final = re.compile(
    r"^[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT_[0-9]+_(TCP|UDP|SCTP)(_[A-Z]+)?)$"
)
_SERVICE_LINK_PORT: Final = re.compile(r"^(tcp|udp|sctp)://[^\s]+$")


def setting_names() -> frozenset[str]:
    """The environment name of every setting, upper case (its alias where it has one)."""
    names = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        names.add((alias if isinstance(alias, str) else name).upper())
    return frozenset(names)


def setting_prefixes() -> frozenset[str]:
    """`DB_`, `JWT_`, `WORKER_`, ...: every prefix up to the first underscore that a setting
    uses, so that a setting added under a new prefix brings its prefix along."""
    return frozenset(name.split("_", 1)[0] + "_" for name in setting_names() if "_" in name)


def unknown_settings(environ: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """Each variable of `environ` under a settings prefix that names no setting (a typo, or a
    setting since renamed), with the setting whose name is closest, if one is close; sorted.

    Names compare case-insensitively, as the settings read them. A value is looked at only to
    recognise a Kubernetes service link (`X_PORT=tcp://...`), and never returned."""
    names, prefixes = setting_names(), tuple(sorted(setting_prefixes()))
    unknown: list[tuple[str, str | None]] = []
    for variable in sorted(environ):
        upper = variable.upper()
        if not upper.startswith(prefixes) or upper in names or upper in READ_ELSEWHERE:
            continue
        if _SERVICE_LINK.match(upper) or (
            upper.endswith("_PORT") and _SERVICE_LINK_PORT.match(environ[variable])
        ):
            continue
        close = difflib.get_close_matches(upper, names, n=1, cutoff=0.75)
        unknown.append((variable, close[0] if close else None))
    return unknown


def warn_unknown_settings(environ: Mapping[str, str]) -> list[str]:
    """At start-up: one warning per variable `unknown_settings` finds, naming it and the closest
    setting (never its value, which may be a secret); the names warned about."""
    for variable, closest in (found := unknown_settings(environ)):
        hint = f"; did you mean {closest}?" if closest else ""
        logger.warning(
            "%s is set in the environment but names no setting%s",
            variable,
            hint,
            extra={"variable": variable, "suggestion": closest},
        )
    return [variable for variable, _ in found]
