"""The embedded PostgreSQL (used when DATABASE_URL is unset): the only importer of pgserver.

pgserver ships real PostgreSQL binaries and listens on a Unix socket inside the data directory.
Run as root it creates and uses an unprivileged `pgserver` system user; as an ordinary user it
runs as that user. Several processes may share one data directory; the last one out stops it.
"""

from __future__ import annotations

import logging
import threading
import warnings
from pathlib import Path
from typing import Any

logger = logging.getLogger("app.embedded_pg")
_lock = threading.Lock()


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._server: Any = None

    def start(self) -> str:
        """Start (or join) the server and return a `postgresql://` URL for its `postgres` db."""
        with _lock:
            if self._server is None:
                self.data_dir.parent.mkdir(parents=True, exist_ok=True)
                with warnings.catch_warnings():
                    # platformdirs warns when XDG_RUNTIME_DIR is unset; harmless here
                    warnings.simplefilter("ignore")
                    import pgserver  # noqa: PLC0415 - heavy import, only when embedded

                    self._server = pgserver.get_server(  # type: ignore[attr-defined]
                        self.data_dir, cleanup_mode="stop"
                    )
                logger.info("embedded PostgreSQL running in %s", self.data_dir)
            return str(self._server.get_uri())

    def stop(self) -> None:
        """Release this process's handle; the server stops when no process uses it any more."""
        with _lock:
            if self._server is not None:
                self._server.cleanup()
                self._server = None
                logger.info("embedded PostgreSQL released")
