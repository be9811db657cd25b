"""The rate-limit rule without a database: limits, buckets, the share of each process, the
header fields and the memory bound."""

from __future__ import annotations

import pytest

from app.rate_limits.limiter import RateLimiter
from app.rate_limits.policy import ClassLimits, Limit, RouteClass, Scope


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limiter(
    user: str | None = "3/60", company: str | None = "5/60", *, processes: int = 1
) -> tuple[RateLimiter, Clock]:
    clock = Clock()
    limits = ClassLimits(
        Limit.parse(user) if user else None, Limit.parse(company) if company else None
    )
    return RateLimiter({RouteClass.TURNS: limits}, processes=processes, clock=clock), clock


@pytest.mark.parametrize(
    ("text", "expected"),
    [("120/60", Limit(120, 60)), ("1/1", Limit(1, 1)), ("off", None), ("0", None), (" OFF ", None)],
)
def test_a_limit_is_quota_per_window_or_off(text: str, expected: Limit | None) -> None:
    assert Limit.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["", "120", "/60", "120/", "0/60", "120/0", "-1/60", "1/86401", "a/b"]
)
def test_a_malformed_limit_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"quota|window|rate limit"):
        Limit.parse(text)


def test_a_user_gets_the_quota_then_is_refused_until_a_token_refills() -> None:
    rate, clock = limiter("3/60", None)
    verdicts = [rate.check(RouteClass.TURNS, "acme", "alice") for _ in range(4)]
    assert [v.allowed for v in verdicts] == [True, True, True, False]
    assert verdicts[2].checks[0].remaining == 0
    assert verdicts[3].retry_after_seconds == 20  # one token in 60/3 s
    clock.now += 19.9
    assert not rate.check(RouteClass.TURNS, "acme", "alice").allowed
    clock.now += 0.2
    assert rate.check(RouteClass.TURNS, "acme", "alice").allowed


def test_the_company_bucket_holds_all_of_its_users_and_no_other_company() -> None:
    rate, _ = limiter("3/60", "5/60")
    allowed = [rate.check(RouteClass.TURNS, "acme", f"user-{i}").allowed for i in range(7)]
    assert allowed == [True] * 5 + [False] * 2
    refused = rate.check(RouteClass.TURNS, "acme", "user-9")
    assert [c.name for c in refused.checks if not c.allows] == ["turns-company"]
    assert rate.check(RouteClass.TURNS, "globex", "user-0").allowed


def test_a_refused_request_takes_no_token_from_the_other_bucket() -> None:
    rate, _ = limiter("2/60", "10/60")
    for _ in range(5):
        rate.check(RouteClass.TURNS, "acme", "flooder")
    state = rate.check(RouteClass.TURNS, "acme", "bob")
    company = next(c for c in state.checks if c.name == "turns-company")
    assert company.remaining == 10 - 2 - 1  # two of the flooder's, then bob's own


def test_an_unlimited_class_has_no_checks_and_no_headers() -> None:
    rate, _ = limiter(None, None)
    verdict = rate.check(RouteClass.TURNS, "acme", "alice")
    assert verdict.allowed
    assert verdict.checks == ()
    assert rate.check(RouteClass.CONTEXT, "acme", "alice").checks == ()  # no default at all


def test_each_process_enforces_its_share_and_together_they_allow_no_more() -> None:
    shares = [limiter("10/60", "25/60", processes=3)[0] for _ in range(3)]
    allowed = sum(
        share.check(RouteClass.TURNS, "acme", "alice").allowed
        for share in shares
        for _ in range(10)
    )
    assert allowed == 9  # 3 per process: the quota 10 // 3
    assert shares[0].limits(RouteClass.TURNS, "acme").user == Limit(10, 60)  # the whole limit


def test_overrides_replace_the_defaults_per_scope() -> None:
    rate, _ = limiter("3/60", "5/60")
    rate.set_overrides("acme", {RouteClass.TURNS: {Scope.USER: Limit(100, 10)}})
    assert rate.limits(RouteClass.TURNS, "acme") == ClassLimits(Limit(100, 10), Limit(5, 60))
    assert rate.limits(RouteClass.TURNS, "globex") == ClassLimits(Limit(3, 60), Limit(5, 60))
    rate.set_overrides("acme", {RouteClass.TURNS: {Scope.COMPANY: None}})
    assert rate.limits(RouteClass.TURNS, "acme") == ClassLimits(Limit(3, 60), None)
    rate.set_overrides("acme", {})
    assert rate.limits(RouteClass.TURNS, "acme") == ClassLimits(Limit(3, 60), Limit(5, 60))


def test_the_header_fields_follow_the_ietf_draft() -> None:
    rate, _ = limiter("3/60", "5/60")
    rate.check(RouteClass.TURNS, "acme", "alice")
    fields = dict(rate.check(RouteClass.TURNS, "acme", "alice").header_fields())
    assert fields[b"ratelimit-policy"] == b'"turns-user";q=3;w=60, "turns-company";q=5;w=60'
    # r: tokens left; t: seconds until the bucket is full again (2 tokens at 20 s each)
    assert fields[b"ratelimit"] == b'"turns-user";r=1;t=40, "turns-company";r=3;t=24'


def test_buckets_stay_bounded_under_a_flood_of_users() -> None:
    clock = Clock()
    rate = RateLimiter(
        {RouteClass.TURNS: ClassLimits(Limit(5, 60), None)}, max_buckets=1000, clock=clock
    )
    for i in range(10_000):
        clock.now += 0.001
        rate.check(RouteClass.TURNS, "acme", f"user-{i}")
    assert rate.bucket_count() <= 1000
    # the newest user's bucket is kept: it is still refused once empty
    for _ in range(5):
        rate.check(RouteClass.TURNS, "acme", "user-9999")
    assert not rate.check(RouteClass.TURNS, "acme", "user-9999").allowed


def test_a_changed_limit_keeps_the_requests_already_counted() -> None:
    rate, _ = limiter("1/60", None)
    assert rate.check(RouteClass.TURNS, "acme", "alice").allowed
    assert not rate.check(RouteClass.TURNS, "acme", "alice").allowed
    rate.set_overrides("acme", {RouteClass.TURNS: {Scope.USER: Limit(3, 60)}})
    allowed = [rate.check(RouteClass.TURNS, "acme", "alice").allowed for _ in range(3)]
    assert allowed == [True, True, False]  # 3 less the one counted
