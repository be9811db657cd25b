"""Imports every table so that `metadata` is complete (for Alembic and `alembic check`)."""

from app.consolidation import models as consolidation_models
from app.conversations import models as conversation_models
from app.db import Base
from app.enablement import models as enablement_models
from app.folders import models as folder_models
from app.profiles import models as profile_models

metadata = Base.metadata

__all__ = [
    "consolidation_models",
    "conversation_models",
    "enablement_models",
    "folder_models",
    "metadata",
    "profile_models",
]
