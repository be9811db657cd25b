"""Imports every table so that `metadata` is complete (for Alembic and `alembic check`), and
every module that registers a company function (`app.kit.citus.on_company_node`), so that
`distribute` creates them all."""

from app.companies import models as company_models
from app.conversations import models as conversation_models
from app.enablement import models as enablement_models
from app.folders import models as folder_models
from app.jobs import models as job_models
from app.kit.db.base import Base
from app.profiles import models as profile_models
from app.quotas import models as quota_models
from app.rate_limits import models as rate_limit_models
from app.turns import repository as turn_statements
from app.usage import models as usage_models

metadata = Base.metadata

__all__ = [
    "company_models",
    "conversation_models",
    "enablement_models",
    "folder_models",
    "job_models",
    "metadata",
    "profile_models",
    "quota_models",
    "rate_limit_models",
    "turn_statements",
    "usage_models",
]
