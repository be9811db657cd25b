"""`AsyncMemoryClient`: every route of the service as an `async` method, with retries."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from datetime import date
from types import TracebackType
from typing import TypeVar

import httpx

from context_memory_client import calls
from context_memory_client.calls import Call
from context_memory_client.core import (
    RETRYABLE_TRANSPORT_ERRORS,
    TERMINAL_JOB_STATUSES,
    ClientCore,
    TokenSource,
)
from context_memory_client.models import (
    AuditEventOut,
    CompanyImportOut,
    CompanyIn,
    CompanyOut,
    ConsolidationRequest,
    ContextRequest,
    ContextResponse,
    DecisionOut,
    ErasureOut,
    FeatureFlag,
    FeatureFlagOut,
    FeatureFlagsOut,
    FolderOut,
    Health,
    JobStatus,
    JobSummary,
    JobView,
    Me,
    MemoryExportOut,
    MemoryImportIn,
    MemoryOut,
    MemoryPolicyIn,
    MemoryPolicyOut,
    ModelBudgetIn,
    ModelBudgetOut,
    OffboardingOut,
    Page,
    PolicyActionOut,
    RateLimitsIn,
    RateLimitsOut,
    Readiness,
    SpacePatch,
    SpaceSettingsOut,
    StoredMessageOut,
    TurnRequest,
    TurnSaved,
    UsageReportOut,
    UserErasureOut,
    UserSettingsOut,
    UserSettingsUpdateOut,
    VersionDiffOut,
    VersionOut,
    VersionSummaryOut,
)
from context_memory_client.retry import RetryPolicy

T = TypeVar("T")


class AsyncMemoryClient:
    """An async client of the Context Memory Service.

    `token` is the caller's bearer JWT (or a callable returning one, asked before every
    attempt). Give `http_client` to share an `httpx.AsyncClient` (it is not closed here) or
    `transport` for one this client builds. Use it as `async with AsyncMemoryClient(...) as
    memory:` or call `aclose()`.
    """

    def __init__(  # noqa: PLR0913 - the settings are keyword-only past the token
        self,
        base_url: str,
        token: TokenSource = None,
        *,
        timeout: float | httpx.Timeout = 10.0,
        retry: RetryPolicy | None = None,
        http_client: httpx.AsyncClient | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._core = ClientCore(base_url, token, retry or RetryPolicy())
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=timeout, transport=transport)
        self._timeout = timeout

    async def __aenter__(self) -> AsyncMemoryClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def send(self, call: Call[T]) -> T:
        """Send `call`, retrying it by the retry policy when it is safe to repeat."""
        attempt = 0
        while True:
            attempt += 1
            request = self._core.request(call)
            try:
                response = await self._http.request(
                    request.method,
                    request.url,
                    params=request.params,
                    headers=request.headers,
                    json=request.json,
                    content=request.content,
                    timeout=self._timeout,
                )
            except RETRYABLE_TRANSPORT_ERRORS as exc:
                await asyncio.sleep(self._core.transport_retry_delay(call, exc, attempt))
                continue
            delay = self._core.retry_delay(call, response, attempt)
            if delay is None:
                return self._core.result(call, response)
            await asyncio.sleep(delay)

    async def _paginate(self, page: Callable[[str | None], Call[Page[T]]]) -> AsyncIterator[T]:
        cursor: str | None = None
        while True:
            current = await self.send(page(cursor))
            for item in current.items:
                yield item
            if current.next_cursor is None:
                return
            cursor = current.next_cursor

    # --- the orchestrator's two calls ------------------------------------------------------------

    async def load_context(self, chat_id: str, request: ContextRequest) -> ContextResponse:
        """Before the model call: the final messages and the composed system prompt."""
        return await self.send(calls.load_context(chat_id, request))

    async def save_turn(
        self, chat_id: str, request: TurnRequest, *, idempotency_key: str | None = None
    ) -> TurnSaved:
        """After the answer: save the exchange. Without `idempotency_key` one is generated; the
        same key goes with every retry, so the turn is saved once."""
        return await self.send(calls.save_turn(chat_id, request, idempotency_key))

    # --- the user --------------------------------------------------------------------------------

    async def get_me(self) -> Me:
        return await self.send(calls.get_me())

    async def erase_me(self) -> ErasureOut:
        """Delete everything the service holds about the caller."""
        return await self.send(calls.erase_me())

    async def get_memory(self) -> MemoryOut:
        """The current profile (`NotFound` when there is none)."""
        memory = await self.send(calls.get_memory())
        assert memory is not None  # only a conditional read answers 304
        return memory

    async def get_memory_if_changed(self, version: int) -> MemoryOut | None:
        """The current profile, or None when it still is `version`."""
        return await self.send(calls.get_memory(if_none_match=version))

    async def create_memory(self, content: str) -> MemoryOut:
        """Create the profile (`If-None-Match: *`; `PreconditionFailed` if one exists)."""
        return await self.send(calls.put_memory(content, if_match=None))

    async def replace_memory(self, content: str, *, if_match: int) -> MemoryOut:
        """Replace the profile at version `if_match` (`PreconditionFailed` if it moved on)."""
        return await self.send(calls.put_memory(content, if_match=if_match))

    async def delete_memory(self, *, if_match: int | None = None) -> None:
        """Clear the profile and its history."""
        await self.send(calls.delete_memory(if_match))

    async def list_versions(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[VersionSummaryOut]:
        return await self.send(calls.list_versions(limit, cursor))

    def iter_versions(self, *, page_size: int | None = None) -> AsyncIterator[VersionSummaryOut]:
        """Every retained version, newest first, fetched a page at a time."""
        return self._paginate(lambda cursor: calls.list_versions(page_size, cursor))

    async def get_version(self, n: int) -> VersionOut:
        return await self.send(calls.get_version(n))

    async def diff_version(self, n: int, *, against: int | None = None) -> VersionDiffOut:
        """Unified diff of version `n` against `against` (default: the previous version)."""
        return await self.send(calls.diff_version(n, against))

    async def restore_version(self, n: int, *, if_match: int | None = None) -> MemoryOut:
        return await self.send(calls.restore_version(n, if_match))

    async def list_policy_actions(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[PolicyActionOut]:
        """What the company's memory policy kept out of the memory, newest first."""
        return await self.send(calls.list_policy_actions(limit, cursor))

    def iter_policy_actions(
        self, *, page_size: int | None = None
    ) -> AsyncIterator[PolicyActionOut]:
        return self._paginate(lambda cursor: calls.list_policy_actions(page_size, cursor))

    async def export_memory(self) -> MemoryExportOut:
        return await self.send(calls.export_memory())

    async def import_memory(
        self, document: MemoryImportIn, *, if_match: int | None = None, if_none_match: bool = False
    ) -> MemoryOut:
        """Make an export's profile the current one (`MemoryImportIn.of(export)`). With
        `if_match` only over that version, with `if_none_match` only when there is no profile
        yet (`PreconditionFailed` otherwise); conditional, it is retried, else sent once."""
        return await self.send(
            calls.import_memory(document, if_match=if_match, if_none_match=if_none_match)
        )

    async def get_settings(self) -> UserSettingsOut:
        return await self.send(calls.get_settings())

    async def update_settings(self, *, context_memory: bool) -> UserSettingsUpdateOut:
        """Switch context memory on or off for the caller; off deletes the memory for good."""
        return await self.send(calls.update_settings(context_memory))

    async def get_enablement(self, space_id: str) -> DecisionOut:
        return await self.send(calls.get_enablement(space_id))

    async def consolidate(
        self,
        request: ConsolidationRequest,
        *,
        wait: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - the server's wait
    ) -> JobView:
        """Consolidate one exchange now; with `wait` the answer is the finished job (or the
        pending one when the server's `timeout` ran out)."""
        return await self.send(calls.consolidate(request, wait, timeout))

    async def get_job(self, job_id: str) -> JobView:
        return await self.send(calls.get_job(job_id))

    async def wait_for_job(
        self,
        job_id: str,
        *,
        timeout: float = 30.0,  # noqa: ASYNC109 - the same signature as the sync client's
        poll_interval: float = 0.2,
    ) -> JobView:
        """Poll the job until it succeeded or is dead; `TimeoutError` after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            job = await self.get_job(job_id)
            if job.status in TERMINAL_JOB_STATUSES:
                return job
            if time.monotonic() >= deadline:
                raise TimeoutError(f"job {job_id} still {job.status} after {timeout}s")
            await asyncio.sleep(poll_interval)

    async def list_messages(
        self, chat_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[StoredMessageOut]:
        return await self.send(calls.list_messages(chat_id, limit, cursor))

    def iter_messages(
        self, chat_id: str, *, page_size: int | None = None
    ) -> AsyncIterator[StoredMessageOut]:
        """Every stored message of the chat, a page at a time."""
        return self._paginate(lambda cursor: calls.list_messages(chat_id, page_size, cursor))

    async def delete_chat(self, chat_id: str) -> None:
        await self.send(calls.delete_chat(chat_id))

    # --- space admins and operators --------------------------------------------------------------

    async def get_space(self, space_id: str) -> SpaceSettingsOut:
        return await self.send(calls.get_space(space_id))

    async def update_space(self, space_id: str, patch: SpacePatch) -> SpaceSettingsOut:
        return await self.send(calls.update_space(space_id, patch))

    async def list_feature_flags(self, company_id: str) -> FeatureFlagsOut:
        return await self.send(calls.list_feature_flags(company_id))

    async def set_feature_flag(
        self, company_id: str, flag: FeatureFlag, *, enabled: bool
    ) -> FeatureFlagOut:
        return await self.send(calls.set_feature_flag(company_id, flag, enabled))

    async def get_memory_policy(self, company_id: str) -> MemoryPolicyOut:
        return await self.send(calls.get_memory_policy(company_id))

    async def set_memory_policy(self, company_id: str, policy: MemoryPolicyIn) -> MemoryPolicyOut:
        """Replace the company's memory policy (every member; audited)."""
        return await self.send(calls.set_memory_policy(company_id, policy))

    async def list_audit_events(
        self, company_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[AuditEventOut]:
        return await self.send(calls.list_audit_events(company_id, limit, cursor))

    def iter_audit_events(
        self, company_id: str, *, page_size: int | None = None
    ) -> AsyncIterator[AuditEventOut]:
        return self._paginate(lambda cursor: calls.list_audit_events(company_id, page_size, cursor))

    async def list_company_jobs(
        self,
        company_id: str,
        *,
        status: JobStatus | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[JobSummary]:
        return await self.send(calls.list_company_jobs(company_id, status, limit, cursor))

    def iter_company_jobs(
        self, company_id: str, *, status: JobStatus | None = None, page_size: int | None = None
    ) -> AsyncIterator[JobSummary]:
        return self._paginate(
            lambda cursor: calls.list_company_jobs(company_id, status, page_size, cursor)
        )

    async def retry_job(self, company_id: str, job_id: str) -> JobSummary:
        """Send a dead job back to the queue."""
        return await self.send(calls.retry_job(company_id, job_id))

    async def get_user_memory_folder(self, company_id: str) -> FolderOut:
        return await self.send(calls.get_user_memory_folder(company_id))

    async def get_rate_limits(self, company_id: str) -> RateLimitsOut:
        """The company's rate limits by class, and which of them its overrides set."""
        return await self.send(calls.get_rate_limits(company_id))

    async def set_rate_limits(self, company_id: str, limits: RateLimitsIn) -> RateLimitsOut:
        """Replace the company's overrides (a class left None: the defaults; audited)."""
        return await self.send(calls.set_rate_limits(company_id, limits))

    async def get_usage(self, company_id: str, from_: date | str, to: date | str) -> UsageReportOut:
        """The company's usage for every UTC day from `from_` to `to`, both included."""
        return await self.send(calls.get_usage(company_id, from_, to))

    async def get_model_budget(self, company_id: str) -> ModelBudgetOut:
        """The company's monthly model budget and what it spent this month."""
        return await self.send(calls.get_model_budget(company_id))

    async def set_model_budget(self, company_id: str, budget: ModelBudgetIn) -> ModelBudgetOut:
        """Replace the company's monthly model budget (audited)."""
        return await self.send(calls.set_model_budget(company_id, budget))

    async def export_company(self, company_id: str) -> bytes:
        """The whole company as the NDJSON stream `import_company` reads (docs/portability.md)."""
        return await self.send(calls.export_company(company_id))

    async def import_company(self, company_id: str, stream: bytes) -> CompanyImportOut:
        """Load an export of this very company into a deployment that holds nothing of it;
        the same stream sent again answers the first import's outcome (`replayed`)."""
        return await self.send(calls.import_company(company_id, stream))

    # --- the control plane: companies, offboarding, erasure requests ----------------------------

    async def list_companies(
        self, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[CompanyOut]:
        return await self.send(calls.list_companies(limit, cursor))

    def iter_companies(self, *, page_size: int | None = None) -> AsyncIterator[CompanyOut]:
        """Every company (platform operators), a page at a time."""
        return self._paginate(lambda cursor: calls.list_companies(page_size, cursor))

    async def create_company(self, company: CompanyIn) -> CompanyOut:
        """Register a company (platform operators); registered already: its record."""
        return await self.send(calls.create_company(company))

    async def get_company(self, company_id: str) -> CompanyOut:
        return await self.send(calls.get_company(company_id))

    async def offboard_company(self, company_id: str) -> OffboardingOut:
        """Erase everything the company holds (platform operators): the receipt."""
        return await self.send(calls.offboard_company(company_id))

    async def get_offboarding(self, company_id: str) -> OffboardingOut:
        return await self.send(calls.get_offboarding(company_id))

    async def erase_company_user(self, company_id: str, user_id: str) -> UserErasureOut:
        """Erase a user of the company on request (its operators): the receipt."""
        return await self.send(calls.erase_company_user(company_id, user_id))

    async def list_company_spaces(
        self, company_id: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Page[SpaceSettingsOut]:
        return await self.send(calls.list_company_spaces(company_id, limit, cursor))

    def iter_company_spaces(
        self, company_id: str, *, page_size: int | None = None
    ) -> AsyncIterator[SpaceSettingsOut]:
        return self._paginate(
            lambda cursor: calls.list_company_spaces(company_id, page_size, cursor)
        )

    async def get_company_space(self, company_id: str, space_id: str) -> SpaceSettingsOut:
        return await self.send(calls.get_company_space(company_id, space_id))

    async def set_company_space(
        self, company_id: str, space_id: str, patch: SpacePatch
    ) -> SpaceSettingsOut:
        return await self.send(calls.set_company_space(company_id, space_id, patch))

    # --- operations ------------------------------------------------------------------------------

    async def health(self) -> Health:
        return await self.send(calls.health())

    async def ready(self) -> Readiness:
        return await self.send(calls.ready())
