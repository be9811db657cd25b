"""The process's usage meter as a FastAPI dependency (and `LeanRoute` provider)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.usage.meter import UsageMeter


async def usage_meter(request: Request) -> UsageMeter:
    """Dependency (and `LeanRoute` provider): the process's meter, made by the lifespan."""
    meter: UsageMeter = request.app.state.usage_meter
    return meter


UsageMeterDep = Annotated[UsageMeter, Depends(usage_meter)]
