"""The named failures of the company registry."""

from __future__ import annotations

from app.kit.errors import NotFound


class UnknownCompany(NotFound):
    """An operator named a company the registry does not hold."""

    def __init__(self, company_id: str) -> None:
        super().__init__(
            f"No company {company_id!r} is registered; create it with POST /v1/companies "
            '(`{"company_id": ...}`) first, or check the id.'
        )
