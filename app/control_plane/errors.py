"""The named failures of the operators' company operations."""

from __future__ import annotations

from app.kit.errors import Conflict, NotFound


class CompanyBeingRemoved(Conflict):
    """A registration met the company's offboarding, which erased it between two reads."""

    def __init__(self) -> None:
        super().__init__("The company is being removed; send the request again.")


class CompanyNameTaken(Conflict):
    """A registration of a registered company under another display name."""

    def __init__(self, company_id: str, display_name: str) -> None:
        super().__init__(f"Company {company_id!r} is registered already, as {display_name!r}.")


class NeverOffboarded(NotFound):
    """The receipt of an offboarding asked for a company that was never offboarded."""

    def __init__(self, company_id: str) -> None:
        super().__init__(f"Company {company_id!r} was never offboarded.")
