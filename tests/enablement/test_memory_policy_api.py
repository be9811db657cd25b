"""The company's memory policy over HTTP: operators only, the defaults until saved, the whole
policy in every PUT (strictly typed, nothing unknown), each change audited old -> new."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.detectors import Category
from app.enablement.schemas import MemoryPolicyIn
from tests.helpers.apps import OPERATOR, AuthFactory
from tests.helpers.settings import memory_policy_body, register_company, set_memory_policy

DEFAULTS = {
    "secrets": "drop",
    "payment_cards": "drop",
    "bank_accounts": "drop",
    "national_ids": "drop",
    "email_addresses": "redact",
    "phone_numbers": "redact",
    "instructions": "drop",
    "recent_topics_days": 90,
    "inactive_memory_days": 0,
}


@pytest.fixture(autouse=True)
async def _registered_companies(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    """The companies these tests' operators write to are registered (`POST /v1/companies`)."""
    for company in ("acme", "globex"):
        await register_company(client, auth, company)


def policy_url(company: str = "acme") -> str:
    return f"/v1/companies/{company}/memory-policy"


async def get_policy(
    client: httpx.AsyncClient, auth: AuthFactory, company: str = "acme"
) -> dict[str, Any]:
    response = await client.get(policy_url(company), headers=auth("olga", "platform", OPERATOR))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def policy_events(client: httpx.AsyncClient, auth: AuthFactory) -> list[dict[str, Any]]:
    response = await client.get(
        "/v1/companies/acme/audit-events", headers=auth("olga", "platform", OPERATOR)
    )
    assert response.status_code == 200, response.text
    return [e for e in response.json()["items"] if e["action"] == "memory_policy.set"]


def test_the_request_names_every_category_and_both_retention_fields() -> None:
    categories = {category.value for category in Category}
    assert set(MemoryPolicyIn.model_fields) == categories | {
        "recent_topics_days",
        "inactive_memory_days",
    }
    assert set(memory_policy_body()) == set(DEFAULTS)


async def test_a_company_that_saved_nothing_reads_as_the_defaults(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    body = await get_policy(client, auth)

    assert body == {
        "company_id": "acme",
        **DEFAULTS,
        "default": True,
        "updated_at": None,
        "updated_by_company_id": None,
        "updated_by": None,
    }


async def test_an_operator_of_any_company_sets_the_whole_policy_and_it_is_audited(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    saved = await set_memory_policy(
        client, auth, email_addresses="drop", secrets="allow", recent_topics_days=30
    )

    assert {key: saved[key] for key in DEFAULTS} == DEFAULTS | {
        "email_addresses": "drop",
        "secrets": "allow",
        "recent_topics_days": 30,
    }
    assert saved["default"] is False
    assert (saved["updated_by_company_id"], saved["updated_by"]) == ("platform", "olga")
    assert await get_policy(client, auth) == saved
    [event] = await policy_events(client, auth)
    assert (event["actor_company_id"], event["actor_id"]) == ("platform", "olga")
    assert (event["target_kind"], event["target_id"]) == ("memory_policy", "acme")
    assert event["old"] == {
        "actions": {"email_addresses": "redact", "secrets": "drop"},
        "recent_topics_days": 90,
    }
    assert event["new"] == {
        "actions": {"email_addresses": "drop", "secrets": "allow"},
        "recent_topics_days": 30,
    }


async def test_a_policy_equal_to_the_one_in_force_writes_nothing_and_records_nothing(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    unchanged = await set_memory_policy(client, auth)  # the defaults, never saved
    assert unchanged["default"] is True

    saved = await set_memory_policy(client, auth, phone_numbers="allow")
    again = await set_memory_policy(client, auth, phone_numbers="allow")

    assert again == saved
    assert len(await policy_events(client, auth)) == 1


async def test_a_second_change_audits_only_what_it_changed(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await set_memory_policy(client, auth, phone_numbers="allow")
    await set_memory_policy(client, auth, phone_numbers="allow", inactive_memory_days=365)

    newest, _ = await policy_events(client, auth)
    assert (newest["old"], newest["new"]) == (
        {"inactive_memory_days": 0},
        {"inactive_memory_days": 365},
    )


async def test_policies_belong_to_one_company(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await set_memory_policy(client, auth, "acme", secrets="allow")

    globex = await get_policy(client, auth, "globex")
    assert (globex["secrets"], globex["default"]) == ("drop", True)


async def test_users_and_space_admins_may_not_read_or_set_it(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    for roles in ((), ("space_admin",)):
        headers = auth("alice", "acme", roles)
        assert (await client.get(policy_url(), headers=headers)).status_code == 403
        put = await client.put(policy_url(), json=memory_policy_body(), headers=headers)
        assert put.status_code == 403
    assert (await get_policy(client, auth))["default"] is True


HOSTILE: dict[str, dict[str, Any]] = {
    "a category missing": {k: v for k, v in DEFAULTS.items() if k != "secrets"},
    "a retention field missing": {k: v for k, v in DEFAULTS.items() if k != "recent_topics_days"},
    "an unknown category": DEFAULTS | {"passwords": "drop"},
    "an extra field": DEFAULTS | {"company_id": "globex"},
    "an editor named in the body": DEFAULTS | {"updated_by": "mallory"},
    "an unknown action": DEFAULTS | {"secrets": "hash"},
    "an action in capitals": DEFAULTS | {"secrets": "DROP"},
    "an action as a boolean": DEFAULTS | {"secrets": True},
    "an action as a number": DEFAULTS | {"secrets": 1},
    "an action as null": DEFAULTS | {"secrets": None},
    "an action as a list": DEFAULTS | {"secrets": ["drop"]},
    "days as a string": DEFAULTS | {"recent_topics_days": "90"},
    "days as a boolean": DEFAULTS | {"recent_topics_days": True},
    "days with a fraction": DEFAULTS | {"recent_topics_days": 1.5},
    "negative days": DEFAULTS | {"inactive_memory_days": -1},
    "days past ten years": DEFAULTS | {"inactive_memory_days": 3651},
    "a huge number of days": DEFAULTS | {"recent_topics_days": 10**40},
    "days as null": DEFAULTS | {"inactive_memory_days": None},
}


@pytest.mark.parametrize("body", HOSTILE.values(), ids=HOSTILE.keys())
async def test_a_body_that_is_not_a_whole_valid_policy_is_422_and_changes_nothing(
    client: httpx.AsyncClient, auth: AuthFactory, body: dict[str, Any]
) -> None:
    response = await client.put(policy_url(), json=body, headers=auth("olga", "platform", OPERATOR))

    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["errors"]
    assert (await get_policy(client, auth))["default"] is True
    assert await policy_events(client, auth) == []


@pytest.mark.parametrize("body", ["[]", '"drop"', "null", "{", "1e999"])
async def test_a_body_that_is_not_an_object_is_refused(
    client: httpx.AsyncClient, auth: AuthFactory, body: str
) -> None:
    response = await client.put(
        policy_url(),
        content=body,
        headers=auth("olga", "platform", OPERATOR) | {"Content-Type": "application/json"},
    )

    assert response.status_code in (400, 422), response.text
    assert (await get_policy(client, auth))["default"] is True


async def test_the_longest_retention_and_whole_number_floats_are_accepted(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    body = DEFAULTS | {"recent_topics_days": 3650.0, "inactive_memory_days": 3650}
    response = await client.put(policy_url(), json=body, headers=auth("olga", "p", OPERATOR))

    assert response.status_code == 200, response.text
    assert (response.json()["recent_topics_days"], response.json()["inactive_memory_days"]) == (
        3650,
        3650,
    )
