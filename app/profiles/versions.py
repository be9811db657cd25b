"""The rules of profile versions: what a stored version holds, what a user may write, how the
frontmatter is stamped, how versions are compared and diffed, and how HTTP preconditions
(ETag = version) are evaluated.

Pure: no session, no settings; the clock and the token counter arrive in a `VersionPolicy`.
The repository stores what these rules produce.
"""

from __future__ import annotations

import difflib
import hashlib
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, Literal

from opentelemetry.trace import Tracer

from app.enablement.models import MAX_MAX_TOKENS
from app.kit.errors import Unprocessable
from app.kit.tokens import TokenCounter
from app.kit.tracing import NO_TRACER
from app.profiles.document import (
    Frontmatter,
    Operation,
    OpKind,
    Profile,
    ProfileFormatError,
    parse_body,
    render_body,
)
from app.profiles.errors import (
    IfMatchRequired,
    NoProfileYet,
    ProfileAlreadyExists,
    ProfileVersionMismatch,
)
from app.profiles.policy import PolicyAction

VersionReason = Literal[
    "consolidation", "condensation", "truncation", "user_edit", "restore", "retention"
]
WorkerReason = Literal["consolidation", "condensation", "truncation"]

USER_EDIT_MAX_TOKENS: Final = MAX_MAX_TOKENS
"""The user API is space-independent: a profile the user writes may hold at most the largest
budget any space may allow (8000). Spaces with a smaller budget inject a truncated copy and
queue a condensation, exactly as when an admin lowers a budget."""


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _unobserved(_: Sequence[PolicyAction]) -> None:
    return None


@dataclass(frozen=True)
class VersionPolicy:
    """How versions are written, whoever writes them: the stored `tokens` counted by `counter`
    (`TokenCounters.stored`: the offline cl100k encoding over the profile *body*, what is
    injected and what budgets limit, so counts written by the worker and by the user API are
    comparable and the load path never re-counts), the newest `keep` versions retained,
    `last_updated` stamped by `clock`, and `on_policy_actions` told what the company's memory
    policy did at each write (the service's metrics; counted when the write is made, so a
    write rolled back afterwards, by a worker's lost lease say, is counted still). A user's
    first write creates their memory folder only while the company has fewer users with
    memory than `users_with_memory_quota` (0: no quota). The memory policy's screening of each
    write is a span of `tracer`."""

    counter: TokenCounter
    keep: int
    clock: Callable[[], datetime] = _utc_now
    on_policy_actions: Callable[[Sequence[PolicyAction]], None] = _unobserved
    users_with_memory_quota: int = 0
    tracer: Tracer = NO_TRACER


@dataclass(frozen=True)
class VersionSource:
    """Where a version came from, stored with it: why it was written and the operations that
    made it; for the worker's versions also the turns it read, the model that answered, the
    tokens it spent and the job that wrote it."""

    reason: VersionReason
    operations: tuple[Operation, ...] = ()
    source_turn_ids: tuple[str, ...] = ()
    model: str | None = None
    tokens_in: int | None = None
    tokens_out: int | None = None
    job_id: uuid.UUID | None = None


@dataclass(frozen=True)
class ExpectedHead:
    """Whose memory a write goes to and the head version it expects to find there: the
    compare-and-set token (0 before the first version)."""

    company_id: str
    user_id: str
    version: int


@dataclass(frozen=True)
class VersionInfo:
    """A stored version without its content (what version lists show)."""

    company_id: str
    user_id: str
    version: int
    sha256: str
    tokens: int
    reason: VersionReason
    operations: list[dict[str, str | None]]
    source_turn_ids: list[str]
    model: str | None
    tokens_in: int | None
    tokens_out: int | None
    job_id: uuid.UUID | None
    created_at: datetime

    @property
    def operation_counts(self) -> dict[str, int]:
        """How many ADD / UPDATE / DELETE operations the version recorded (zeros included)."""
        counts = Counter(str(op.get("op")) for op in self.operations)
        return {kind.value: counts.get(kind.value, 0) for kind in OpKind}


@dataclass(frozen=True)
class VersionRow(VersionInfo):
    """A stored, immutable version of a user's memory.md."""

    content: str


@dataclass(frozen=True)
class HeadState:
    """The memory.md row: its head version number (the compare-and-set token) and the head.

    `row` is None while the file has no profile: before the first version, or after a clear
    (which advances `head_version` without writing a version, see `repository.clear_profile`).
    """

    company_id: str
    user_id: str
    head_version: int
    row: VersionRow | None

    @property
    def expected(self) -> ExpectedHead:
        """The compare-and-set token of a write on this head."""
        return ExpectedHead(self.company_id, self.user_id, self.head_version)


def stamp(profile: Profile, *, user_id: str, now: datetime, turn_count: int) -> Profile:
    """`profile` with the frontmatter the service writes: the owner, schema 1, `now`, the count.

    Whatever frontmatter the profile carried (from a client, a model, or an older version) is
    replaced; sections and the truncation flag are kept.
    """
    frontmatter = Frontmatter(user_id=user_id, last_updated=now, turn_count=turn_count)
    return Profile(frontmatter=frontmatter, sections=profile.sections, truncated=profile.truncated)


def same_sections(old: Profile, new: Profile) -> bool:
    """True when a write would change nothing a user can see (bullets in their sections).

    The truncation marker is ignored: a client that sends back a truncated profile unchanged
    (marker included, which `parse_body` drops) has not edited it.
    """
    return old.sections == new.sections


# --- what a user may write ----------------------------------------------------------------------

CONTENT_FIELD: Final = "body.content"


def count_tokens(profile: Profile, counter: TokenCounter) -> int:
    """The `tokens` stored with a version: the body, counted by `VersionPolicy.counter`."""
    return counter.count(render_body(profile))


def parse_user_profile(content: str, user_id: str) -> Profile:
    """A client's memory.md as a profile of `user_id` (its frontmatter ignored), or a 422
    naming `body.content` with the parser's line-numbered detail."""
    try:
        return parse_body(content, user_id)
    except ProfileFormatError as exc:
        message = f"Not a valid memory profile: {exc.detail}"
        raise Unprocessable.field(CONTENT_FIELD, message) from exc


def check_user_profile_size(profile: Profile, counter: TokenCounter) -> None:
    """422 when the body exceeds `USER_EDIT_MAX_TOKENS`."""
    tokens = count_tokens(profile, counter)
    if tokens > USER_EDIT_MAX_TOKENS:
        message = f"The profile holds {tokens} tokens; at most {USER_EDIT_MAX_TOKENS} are allowed."
        raise Unprocessable.field(CONTENT_FIELD, message)


# --- stored content -------------------------------------------------------------------------------


def content_sha256(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def operations_json(operations: Sequence[Operation]) -> list[dict[str, str | None]]:
    """The versions-table form of operations (`Operation.to_json`)."""
    return [op.to_json() for op in operations]


def unified_diff(old: str, new: str, *, old_version: int, new_version: int) -> str:
    """A unified diff of two stored documents; version 0 is the empty document."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"memory.md@{old_version}",
        tofile=f"memory.md@{new_version}",
    )
    return "".join(lines)


# --- conditional requests (ETag = the version number) --------------------------------------------


def etag(version: int) -> str:
    return f'"{version}"'


@dataclass(frozen=True)
class EntityTags:
    """A parsed If-Match / If-None-Match value: `*`, or strong and weak tags."""

    any: bool
    strong: frozenset[str]
    weak: frozenset[str]

    def matches(self, version: int, *, weak: bool) -> bool:
        """Strong comparison for If-Match, weak (W/ tags too) for If-None-Match."""
        tag = str(version)
        return self.any or tag in self.strong or (weak and tag in self.weak)


@dataclass(frozen=True)
class WriteConditions:
    """The conditional headers of a write request, parsed (None where absent)."""

    if_match: EntityTags | None = None
    if_none_match: EntityTags | None = None


def parse_entity_tags(header: str | None) -> EntityTags | None:
    """The tags of a conditional header, or None when it is absent.

    Malformed members (unquoted values, say) are kept as tags no version matches, so a client
    that sends `If-Match: 3` gets a 412 naming the expected form rather than a blind write.
    """
    if header is None:
        return None
    if header.strip() == "*":
        return EntityTags(any=True, strong=frozenset(), weak=frozenset())
    strong: set[str] = set()
    weak: set[str] = set()
    for member in (part.strip() for part in header.split(",")):
        is_weak = member.startswith("W/")
        raw = member[2:] if is_weak else member
        if len(raw) >= 2 and raw[0] == raw[-1] == '"':
            (weak if is_weak else strong).add(raw[1:-1])
    return EntityTags(any=False, strong=frozenset(strong), weak=frozenset(weak))


def is_not_modified(current: int, if_none_match: EntityTags | None) -> bool:
    """GET: True when the client's copy is current (answer 304)."""
    return if_none_match is not None and if_none_match.matches(current, weak=True)


def check_write_preconditions(
    current: int | None,
    if_match: EntityTags | None,
    if_none_match: EntityTags | None,
    *,
    may_create: bool,
) -> None:
    """Raise unless a write against the head `current` (None: no profile) may proceed.

    - `If-Match` must name the current version (strong comparison); against no profile it fails.
    - `If-None-Match: *` (or a tag matching the head) fails when a profile exists.
    - Replacing an existing profile needs `If-Match` (428 without it); creating one (only where
      `may_create`) needs `If-None-Match: *` — an unconditional write is never accepted.
    """
    if if_match is not None and (current is None or not if_match.matches(current, weak=False)):
        raise ProfileVersionMismatch
    if (
        if_none_match is not None
        and current is not None
        and if_none_match.matches(current, weak=True)
    ):
        raise ProfileAlreadyExists
    if current is not None and if_match is None:
        raise IfMatchRequired
    if current is None and if_match is None and not (may_create and _creates(if_none_match)):
        raise NoProfileYet(may_create=may_create)


def _creates(if_none_match: EntityTags | None) -> bool:
    return if_none_match is not None and if_none_match.any
