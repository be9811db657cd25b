"""The operator's calls and the user's memory import, against the real app and PostgreSQL: the
async client over ASGI, and the company export and import with the blocking client over real
HTTP. Each group is read back after it is written, and hostile input comes back as the typed
problem error naming what was wrong, never as a value made up by the client."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
from context_memory_client import (
    FLAG_CONTEXT_MEMORY,
    UNLIMITED,
    AsyncMemoryClient,
    ClassOverrideIn,
    CompanyIn,
    Conflict,
    Forbidden,
    LimitBody,
    MemoryClient,
    MemoryImportIn,
    ModelBudgetIn,
    NotFound,
    PreconditionFailed,
    RateLimitsIn,
    Unprocessable,
)
from fastapi import FastAPI

from app.profiles.profile import Section
from tests.client.conftest import async_client_of
from tests.helpers.apps import OPERATOR, TokenFactory
from tests.helpers.portability import stream_of
from tests.helpers.profiles import memory_md


def fresh_company() -> str:
    return f"op-{uuid.uuid4().hex[:10]}"


def operator_of(app: FastAPI, make_token: TokenFactory) -> AsyncMemoryClient:
    return async_client_of(app, make_token("olga", "platform", OPERATOR))


async def test_rate_limits_are_read_replaced_and_put_back_to_the_defaults(
    app: FastAPI, make_token: TokenFactory
) -> None:
    company = fresh_company()
    async with operator_of(app, make_token) as operator:
        await operator.create_company(CompanyIn(company))  # operator writes need it
        before = await operator.get_rate_limits(company)
        assert before.default
        assert before.company_id == company
        assert before.processes >= 1

        limits = RateLimitsIn(
            turns=ClassOverrideIn(user=LimitBody(240, 60), company=UNLIMITED),
            exports=ClassOverrideIn(user=LimitBody(2, 3600)),
        )
        saved = await operator.set_rate_limits(company, limits)
        assert not saved.default
        assert saved.updated_by == "olga"
        assert saved.turns.user.overridden
        assert saved.turns.user.limit is not None
        assert (saved.turns.user.limit.quota, saved.turns.user.limit.window_seconds) == (240, 60)
        assert saved.turns.company.overridden
        assert saved.turns.company.limit is None  # unlimited
        assert saved.exports.company == before.exports.company  # left out: the default
        assert await operator.get_rate_limits(company) == saved

        back = await operator.set_rate_limits(company, RateLimitsIn())  # every default again
        assert back.turns == before.turns
        assert back.exports == before.exports


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        (RateLimitsIn(turns=ClassOverrideIn(user=LimitBody(0, 60))), "quota"),
        (RateLimitsIn(context=ClassOverrideIn(company=LimitBody(5, 86_401))), "window_seconds"),
    ],
)
async def test_a_rate_limit_out_of_range_is_unprocessable_naming_its_field(
    app: FastAPI, make_token: TokenFactory, limits: RateLimitsIn, field: str
) -> None:
    company = fresh_company()
    async with operator_of(app, make_token) as operator:
        await operator.create_company(CompanyIn(company))  # operator writes need it
        with pytest.raises(Unprocessable) as refused:
            await operator.set_rate_limits(company, limits)
        assert refused.value.request_id
        assert any(error.field.endswith(field) for error in refused.value.errors), refused.value
        assert (await operator.get_rate_limits(company)).default  # nothing written


async def test_the_usage_report_has_every_day_of_the_range(
    app: FastAPI, make_token: TokenFactory
) -> None:
    company = fresh_company()
    first = datetime.now(UTC).date() - timedelta(days=2)
    async with operator_of(app, make_token) as operator:
        report = await operator.get_usage(company, first, first + timedelta(days=2))
        assert report.company_id == company
        assert (report.from_, report.to) == (str(first), str(first + timedelta(days=2)))
        assert [day.day for day in report.days] == [
            str(first + timedelta(days=n)) for n in range(3)
        ]
        assert report.totals.turns_saved == 0
        assert report.totals.consolidations.updated == 0
        assert report.unpriced_models == []
        same = await operator.get_usage(company, str(first), str(first + timedelta(days=2)))
        assert same == report


@pytest.mark.parametrize(
    ("from_", "to"),
    [
        (date(2026, 12, 2), date(2026, 12, 1)),  # backwards
        (date(2025, 1, 1), date(2026, 12, 31)),  # more than 366 days
        ("2026-13-01", "2026-12-31"),  # no such month
        ("yesterday", "2026-12-31"),
    ],
)
async def test_a_usage_range_the_service_cannot_report_is_unprocessable(
    app: FastAPI, make_token: TokenFactory, from_: date | str, to: date | str
) -> None:
    async with operator_of(app, make_token) as operator:
        with pytest.raises(Unprocessable) as refused:
            await operator.get_usage(fresh_company(), from_, to)
        assert refused.value.status == 422
        assert refused.value.detail


async def test_the_model_budget_is_read_and_replaced(
    app: FastAPI, make_token: TokenFactory
) -> None:
    company = fresh_company()
    async with operator_of(app, make_token) as operator:
        await operator.create_company(CompanyIn(company))  # operator writes need it
        before = await operator.get_model_budget(company)
        assert before.default
        assert before.monthly_tokens is None
        assert before.used_share is None
        assert before.spent_tokens == 0

        saved = await operator.set_model_budget(company, ModelBudgetIn(5_000_000, "defer"))
        assert (saved.monthly_tokens, saved.when_spent, saved.default) == (
            5_000_000,
            "defer",
            False,
        )
        assert saved.used_share == 0
        assert date.fromisoformat(saved.period_start) < date.fromisoformat(saved.period_end)
        assert await operator.get_model_budget(company) == saved

        with pytest.raises(Unprocessable) as refused:
            await operator.set_model_budget(company, ModelBudgetIn(-1, "offline"))
        assert any(error.field.endswith("monthly_tokens") for error in refused.value.errors)
        assert await operator.get_model_budget(company) == saved


async def test_the_operator_calls_are_forbidden_to_a_user(
    app: FastAPI, make_token: TokenFactory
) -> None:
    company = fresh_company()
    async with async_client_of(app, make_token("alice", company)) as user:
        with pytest.raises(Forbidden):
            await user.get_rate_limits(company)
        with pytest.raises(Forbidden):
            await user.set_model_budget(company, ModelBudgetIn(1, "offline"))
        with pytest.raises(Forbidden):
            await user.get_usage(company, date(2026, 12, 1), date(2026, 12, 1))
        with pytest.raises(Forbidden):
            await user.export_company(company)


async def test_the_user_imports_an_export_of_their_memory_over_a_version(
    app: FastAPI, make_token: TokenFactory
) -> None:
    company = fresh_company()
    async with async_client_of(app, make_token("alice", company)) as memory:
        first = await memory.create_memory(memory_md({Section.IDENTITY: ["An analyst"]}))
        export = await memory.export_memory()
        second = await memory.replace_memory(
            memory_md({Section.IDENTITY: ["A bank analyst"]}), if_match=first.version
        )

        with pytest.raises(PreconditionFailed):  # the profile moved on since `first`
            await memory.import_memory(MemoryImportIn.of(export), if_match=first.version)
        with pytest.raises(PreconditionFailed):  # there is a profile already
            await memory.import_memory(MemoryImportIn.of(export), if_none_match=True)

        imported = await memory.import_memory(MemoryImportIn.of(export), if_match=second.version)
        assert imported.version == second.version + 1
        assert "- An analyst" in imported.content
        assert (await memory.get_memory()).version == imported.version


async def test_an_export_without_a_profile_has_nothing_to_import(
    app: FastAPI, make_token: TokenFactory
) -> None:
    async with async_client_of(app, make_token("bob", fresh_company())) as memory:
        export = await memory.export_memory()
    assert export.profile is None
    with pytest.raises(ValueError, match="no profile"):
        MemoryImportIn.of(export)


def test_a_company_is_exported_and_imported_over_http(
    served_url: str, make_token: TokenFactory
) -> None:
    source, target = fresh_company(), fresh_company()
    with MemoryClient(served_url, make_token("olga", "platform", OPERATOR)) as operator:
        operator.create_company(CompanyIn(source))  # operator writes need it
        operator.set_feature_flag(source, FLAG_CONTEXT_MEMORY, enabled=True)
        exported = operator.export_company(source)
        lines = [json.loads(line) for line in exported.splitlines()]
        assert lines[0]["type"] == "header"
        assert lines[0]["company_id"] == source
        assert lines[-1]["type"] == "end"
        flags = [line for line in lines if line["type"] == "feature_flag"]
        assert [(f["flag"], f["enabled"]) for f in flags] == [(FLAG_CONTEXT_MEMORY, True)]

        stream = stream_of(target, *flags)
        first = operator.import_company(target, stream)
        assert (first.company_id, first.replayed) == (target, False)
        assert {kind: n for kind, n in first.records.items() if n} == {"feature_flag": 1}
        again = operator.import_company(target, stream)  # a retry after a lost answer
        assert again == type(first)(target, first.sha256, first.records, replayed=True)
        flags_now = operator.list_feature_flags(target).flags
        assert [f.enabled for f in flags_now if f.flag == FLAG_CONTEXT_MEMORY] == [True]

        with pytest.raises(Conflict) as holds_data:  # another stream into a company with data
            operator.import_company(target, stream_of(target))
        assert not holds_data.value.retryable


def test_a_stream_that_is_not_an_export_is_unprocessable_naming_its_line(
    served_url: str, make_token: TokenFactory
) -> None:
    company = fresh_company()
    with MemoryClient(served_url, make_token("olga", "platform", OPERATOR)) as operator:
        with pytest.raises(Unprocessable) as refused:
            operator.import_company(company, b"not json\n")
        assert [error.field for error in refused.value.errors] == ["body.lines.1"]
        with pytest.raises(Unprocessable) as other_company:
            operator.import_company(company, stream_of(fresh_company()))
        assert other_company.value.errors[0].field.startswith("body.lines.1")
        assert not any(flag.enabled for flag in operator.list_feature_flags(company).flags)


def test_a_company_id_with_a_slash_stays_one_path_segment(
    served_url: str, make_token: TokenFactory
) -> None:
    """The client percent-encodes a path parameter: `a/../../me` reaches no other route (here
    none at all), it is never read as a path."""
    with MemoryClient(served_url, make_token("olga", "platform", OPERATOR)) as operator:
        with pytest.raises(NotFound) as refused:
            operator.get_model_budget("a/../../me")
        assert refused.value.request_id
