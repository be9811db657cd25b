"""The named failures of the rate limits."""

from __future__ import annotations

from app.kit.errors import TooManyRequests


class RateLimited(TooManyRequests):
    """The request is over the limits named in `refused`; `Retry-After` says when to return."""

    def __init__(self, refused: str, retry_after_seconds: int) -> None:
        super().__init__(
            f"Over the rate limit ({refused}); retry after {retry_after_seconds} s.",
            retry_after_seconds=retry_after_seconds,
        )
