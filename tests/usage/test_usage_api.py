"""The operators' usage report and model budget over HTTP: operators only, strict input (dates,
ranges, budgets, unknown fields) refused with the offending field and nothing written, the
budget audited old -> new, and each company's figures its own."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from app.usage.budget import period_of
from tests.helpers.apps import OPERATOR, SPACE_ADMIN, AuthFactory
from tests.helpers.db import rows, sessions
from tests.helpers.settings import register_company

OLGA = ("olga", "platform", OPERATOR)
TODAY = datetime.now(UTC).date()


@pytest.fixture(autouse=True)
async def _registered_companies(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    """The companies these tests' operators write to are registered (`POST /v1/companies`)."""
    for company in ("acme", "globex", "initech"):
        await register_company(client, auth, company)


def usage_url(company: str = "acme") -> str:
    return f"/v1/companies/{company}/usage"


def budget_url(company: str = "acme") -> str:
    return f"/v1/companies/{company}/model-budget"


async def get_usage(
    client: httpx.AsyncClient, auth: AuthFactory, first: date, last: date, company: str = "acme"
) -> dict[str, Any]:
    params = {"from": first.isoformat(), "to": last.isoformat()}
    response = await client.get(usage_url(company), params=params, headers=auth(*OLGA))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def put_budget(
    client: httpx.AsyncClient, auth: AuthFactory, body: object, company: str = "acme"
) -> httpx.Response:
    return await client.put(budget_url(company), json=body, headers=auth(*OLGA))


async def budget_events(app: FastAPI) -> list[Any]:
    return await rows(
        app,
        "SELECT company_id, actor_company_id, actor_id, target_kind, target_id, old, new"
        " FROM audit_events WHERE action = 'model_budget.set' ORDER BY id",
    )


async def seed_usage(app: FastAPI, company: str, day: date) -> None:
    """Rows as the meter and the worker write them."""
    async with sessions(app)() as session, session.begin():
        await session.execute(
            text(
                "INSERT INTO usage_daily_counts (company_id, day, counter, count)"
                " VALUES (:c, :d, 'turns_saved', 4), (:c, :d, 'consolidations_noop', 2)"
            ),
            {"c": company, "d": day},
        )
        await session.execute(
            text(
                "INSERT INTO usage_daily_model_calls"
                " VALUES (:c, :d, 'gate', 'gpt-4o-mini', 2, 300, 2)"
            ),
            {"c": company, "d": day},
        )


async def test_a_report_shows_each_day_of_the_range_for_the_company_it_names(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await seed_usage(app, "acme", TODAY)
    await seed_usage(app, "globex", TODAY)

    report = await get_usage(client, auth, TODAY - timedelta(days=1), TODAY)

    assert report["company_id"] == "acme"
    assert (report["from"], report["to"]) == (
        (TODAY - timedelta(days=1)).isoformat(),
        TODAY.isoformat(),
    )
    yesterday, today = report["days"]
    assert (yesterday["turns_saved"], yesterday["model_calls"]) == (0, [])
    assert today["turns_saved"] == 4
    assert today["consolidations"]["noop"] == 2
    assert today["model_calls"] == [
        {
            "kind": "gate",
            "model": "gpt-4o-mini",
            "calls": 2,
            "prompt_tokens": 300,
            "completion_tokens": 2,
            "estimated_cost": None,
        }
    ]
    assert report["totals"]["prompt_tokens"] == 300  # globex's rows are globex's only
    assert report["unpriced_models"] == ["gpt-4o-mini"]
    empty = await get_usage(client, auth, TODAY, TODAY, company="initech")
    assert empty["totals"]["turns_saved"] == 0


BAD_RANGES: dict[str, tuple[dict[str, str], str]] = {
    "a month 13": ({"from": "2026-13-01", "to": "2026-12-31"}, "query.from"),
    "February 30": ({"from": "2026-02-01", "to": "2026-02-30"}, "query.to"),
    "a word": ({"from": "yesterday", "to": "2026-12-31"}, "query.from"),
    "no dashes": ({"from": "20261201", "to": "2026-12-31"}, "query.from"),
    "a timestamp": ({"from": "2026-12-01T00:00:00Z", "to": "2026-12-31"}, "query.from"),
    "to before from": ({"from": "2026-12-02", "to": "2026-12-01"}, "query.to"),
    "367 days": ({"from": "2026-01-01", "to": "2027-01-02"}, "query.to"),
    "a century": ({"from": "1900-01-01", "to": "2026-12-31"}, "query.to"),
    "no to": ({"from": "2026-12-01"}, "query.to"),
    "no from": ({"to": "2026-12-01"}, "query.from"),
    "NUL": ({"from": "2026-12-01\x00", "to": "2026-12-02"}, "query.from"),
}


@pytest.mark.parametrize("case", BAD_RANGES, ids=list(BAD_RANGES))
async def test_a_bad_range_is_a_422_naming_the_field(
    client: httpx.AsyncClient, auth: AuthFactory, case: str
) -> None:
    params, field = BAD_RANGES[case]

    response = await client.get(usage_url(), params=params, headers=auth(*OLGA))

    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert field in {error["field"] for error in response.json()["errors"]}


async def test_a_whole_leap_year_is_not_too_long(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    report = await get_usage(client, auth, date(2028, 1, 1), date(2028, 12, 31))

    assert len(report["days"]) == 366


async def test_a_company_without_a_budget_has_none_and_what_it_spent(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_usage(app, "acme", TODAY)

    response = await client.get(budget_url(), headers=auth(*OLGA))

    assert response.status_code == 200, response.text
    period = period_of(TODAY)
    assert response.json() == {
        "company_id": "acme",
        "monthly_tokens": None,
        "when_spent": "offline",
        "default": True,
        "updated_at": None,
        "period_start": period.start.isoformat(),
        "period_end": period.end.isoformat(),
        "spent_tokens": 302,
        "used_share": None,
    }


async def test_an_operator_sets_a_budget_and_the_change_is_audited_once(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_usage(app, "acme", TODAY)

    response = await put_budget(client, auth, {"monthly_tokens": 1000, "when_spent": "defer"})

    assert response.status_code == 200, response.text
    saved = response.json()
    assert (saved["monthly_tokens"], saved["when_spent"], saved["default"]) == (
        1000,
        "defer",
        False,
    )
    assert (saved["spent_tokens"], saved["used_share"]) == (302, 0.302)
    assert (await client.get(budget_url(), headers=auth(*OLGA))).json() == saved
    again = await put_budget(client, auth, {"monthly_tokens": 1000, "when_spent": "defer"})
    assert again.json() == saved
    await put_budget(client, auth, {"monthly_tokens": None, "when_spent": "defer"})
    first, second = await budget_events(app)
    assert (first.actor_company_id, first.actor_id, first.target_id) == ("platform", "olga", "acme")
    assert (first.old, first.new) == (
        {"monthly_tokens": None, "when_spent": "offline"},
        {"monthly_tokens": 1000, "when_spent": "defer"},
    )
    assert (second.old, second.new) == ({"monthly_tokens": 1000}, {"monthly_tokens": None})
    globex = (await client.get(budget_url("globex"), headers=auth(*OLGA))).json()
    assert (globex["default"], globex["monthly_tokens"]) == (True, None)


HOSTILE: dict[str, tuple[object, str]] = {
    "negative": ({"monthly_tokens": -1, "when_spent": "offline"}, "body.monthly_tokens"),
    "a string": ({"monthly_tokens": "1000", "when_spent": "offline"}, "body.monthly_tokens"),
    "a fraction": ({"monthly_tokens": 1.5, "when_spent": "offline"}, "body.monthly_tokens"),
    "a bool": ({"monthly_tokens": True, "when_spent": "offline"}, "body.monthly_tokens"),
    "too big": ({"monthly_tokens": 10**16, "when_spent": "offline"}, "body.monthly_tokens"),
    "huge": ({"monthly_tokens": 10**40, "when_spent": "offline"}, "body.monthly_tokens"),
    "unknown mode": ({"monthly_tokens": 1000, "when_spent": "stop"}, "body.when_spent"),
    "no mode": ({"monthly_tokens": 1000}, "body.when_spent"),
    "no tokens": ({"when_spent": "defer"}, "body.monthly_tokens"),
    "an extra field": (
        {"monthly_tokens": 1000, "when_spent": "offline", "company_id": "globex"},
        "body.company_id",
    ),
    "spent set by hand": (
        {"monthly_tokens": 1000, "when_spent": "offline", "spent_tokens": 0},
        "body.spent_tokens",
    ),
    "a list": ([1000, "offline"], "body"),
}


@pytest.mark.parametrize("case", HOSTILE, ids=list(HOSTILE))
async def test_a_hostile_budget_is_a_422_naming_the_field_and_changes_nothing(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI, case: str
) -> None:
    body, field = HOSTILE[case]

    response = await put_budget(client, auth, body)

    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert field in {error["field"] for error in response.json()["errors"]}
    assert await rows(app, "SELECT * FROM company_model_budgets") == []
    assert await budget_events(app) == []


async def test_users_and_space_admins_of_any_company_may_not_read_or_set_either(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_usage(app, "acme", TODAY)
    params = {"from": TODAY.isoformat(), "to": TODAY.isoformat()}
    body = {"monthly_tokens": 0, "when_spent": "defer"}
    for company in ("acme", "globex"):
        for roles in ((), SPACE_ADMIN):
            headers = auth("alice", company, roles)
            for url in (usage_url("acme"), usage_url("globex")):
                refused = await client.get(url, params=params, headers=headers)
                assert refused.status_code == 403, refused.text
                # the seeded count must not leak; the request id is random and may hold "300"
                leaked = {k: v for k, v in refused.json().items() if k != "request_id"}
                assert "300" not in str(leaked)
            assert (await client.get(budget_url("acme"), headers=headers)).status_code == 403
            assert (
                await client.put(budget_url("acme"), json=body, headers=headers)
            ).status_code == 403
    assert (await client.get(usage_url(), params=params)).status_code == 401
    assert await rows(app, "SELECT * FROM company_model_budgets") == []
