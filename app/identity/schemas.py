"""The caller as `GET /v1/me` answers it."""

from __future__ import annotations

from pydantic import BaseModel


class Me(BaseModel):
    user_id: str
    company_id: str
    roles: list[str]
