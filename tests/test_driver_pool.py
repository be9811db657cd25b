"""The hot path's driver pool: waiting longer than the connect timeout for a connection is a
`TimeoutError` (answered 503), as with the session's pool."""

from __future__ import annotations

import pytest

from app.kit.db.engine import create_database
from tests.helpers.apps import make_settings


async def test_waiting_longer_than_the_timeout_is_a_timeout(database_url: str) -> None:
    settings = make_settings(database_url, db_hot_pool_size=1, db_connect_timeout_seconds=0.2)
    database = create_database(database_url, settings)
    try:
        async with database.driver.connection():
            with pytest.raises(TimeoutError):
                async with database.driver.connection():
                    pass
    finally:
        await database.dispose()
