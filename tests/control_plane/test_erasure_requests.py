"""A user's erasure on request, carried out by an operator of the company: the same proof over
the whole schema as `DELETE /v1/me` (tests/erasure/test_whole_schema_proof.py, whose seed and
sweep this reuses): nothing of the user is left but the one `user.erased` record, which names
the operator who asked; another user of the company is untouched; another company's operator
gets a 404 and changes nothing."""

from __future__ import annotations

from typing import Final

import httpx
from fastapi import FastAPI

from tests.erasure.test_whole_schema_proof import (
    COMPANY,
    KEPT_BY_ERASURE,
    Table,
    footprint,
    left_over,
    schema,
    seeded_pair,
)
from tests.helpers.apps import OPERATOR, AuthFactory
from tests.helpers.sweep import every_row as rows

__all__ = ["schema"]  # the fixture, discovering every table

CORA: Final = ("cora", COMPANY, ("company_operator",))


async def test_an_erasure_request_leaves_only_the_record_naming_the_operator(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, schema: list[Table]
) -> None:
    subject, bystander, bystander_before = await seeded_pair(app, client, auth, schema)
    turns = await rows(app, "SELECT id FROM turns WHERE user_id = :u", u=subject.user_id)

    response = await client.delete(
        f"/v1/companies/{COMPANY}/users/{subject.user_id}", headers=auth(*CORA)
    )

    assert response.status_code == 200, response.text
    receipt = response.json()
    assert (receipt["company_id"], receipt["user_id"]) == (COMPANY, subject.user_id)
    assert receipt["deleted"]["turns"] == len(turns) > 0
    assert receipt["deleted"]["profile"] is True
    assert await left_over(app, schema, subject, KEPT_BY_ERASURE) == {}
    (record,) = await rows(
        app,
        "SELECT actor_company_id, actor_id, target_kind, target_id, new FROM audit_events"
        " WHERE action = 'user.erased'",
    )
    assert (record.actor_company_id, record.actor_id) == (COMPANY, "cora")
    assert (record.target_kind, record.target_id) == ("user", subject.user_id)
    assert record.new == {"deleted": receipt["deleted"], "anonymised": receipt["anonymised"]}
    assert await footprint(app, schema, bystander) == bystander_before


async def test_a_second_request_and_a_platform_operators_find_nothing_and_answer_zeros(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, schema: list[Table]
) -> None:
    subject, _, _ = await seeded_pair(app, client, auth, schema)
    path = f"/v1/companies/{COMPANY}/users/{subject.user_id}"
    first = await client.delete(path, headers=auth(*CORA))

    again = await client.delete(path, headers=auth("olga", "platform", OPERATOR))

    assert (first.status_code, again.status_code) == (200, 200)
    counts = {**again.json()["deleted"], **again.json()["anonymised"]}
    assert not any(counts.values())
    assert len(await rows(app, "SELECT 1 FROM audit_events WHERE action = 'user.erased'")) == 1


async def test_another_companys_operator_gets_a_404_and_changes_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, schema: list[Table]
) -> None:
    subject, _, _ = await seeded_pair(app, client, auth, schema)
    before = await footprint(app, schema, subject)

    for user_id in (subject.user_id, "nobody", "x" * 257, "a%00b"):
        response = await client.delete(
            f"/v1/companies/{COMPANY}/users/{user_id}",
            headers=auth("otto", "globex", ("company_operator",)),
        )
        assert response.status_code == 404, (user_id, response.text)
        assert response.headers["content-type"] == "application/problem+json"
    for headers in (auth("sam", COMPANY, ("space_admin",)), auth(subject.user_id, COMPANY)):
        refused = await client.delete(
            f"/v1/companies/{COMPANY}/users/{subject.user_id}", headers=headers
        )
        assert refused.status_code == 403
    assert await footprint(app, schema, subject) == before


async def test_a_hostile_user_id_is_a_422_and_erases_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, schema: list[Table]
) -> None:
    subject, _, _ = await seeded_pair(app, client, auth, schema)
    before = await footprint(app, schema, subject)

    for user_id in ("x" * 257, "a%00b", "a%07b"):
        response = await client.delete(
            f"/v1/companies/{COMPANY}/users/{user_id}", headers=auth(*CORA)
        )
        assert response.status_code == 422, (user_id, response.text)
        assert response.json()["errors"][0]["field"] == "path.user_id"
    assert await footprint(app, schema, subject) == before
