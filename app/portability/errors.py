"""The named failures of a company's import."""

from __future__ import annotations

from app.kit.errors import Conflict, Unprocessable
from app.portability.format import StreamError


class CompanyHoldsData(Conflict):
    """An import into a company that holds data, other than the very stream imported last."""

    def __init__(self, company_id: str) -> None:
        super().__init__(
            f"Company {company_id!r} already holds data; an import needs an empty company "
            "(or the very stream imported into it last, which changes nothing)."
        )


class InvalidImportLine(Unprocessable):
    """A line of the import stream breaks the format; `errors` names its line (and field)."""

    def __init__(self, error: StreamError) -> None:
        location = f"body.lines.{error.line}" + ("" if error.field is None else f".{error.field}")
        message = f"Line {error.line}: {error.message}"
        super().__init__(
            f"{message}. Nothing was imported.", errors=[{"field": location, "message": message}]
        )
