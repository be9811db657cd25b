"""The embedded PostgreSQL (used when DATABASE_URL is unset): the only importer of pgserver.

pgserver ships real PostgreSQL binaries and listens on a Unix socket inside the data directory.
Run as root it creates and uses an unprivileged `pgserver` system user; as an ordinary user it
runs as that user. Several processes may share one data directory; the last one out stops it.

What pgserver says while it runs initdb and pg_ctl (many multi-line records) goes to a file of
its own beside the data directory (`var/pg.log` for `var/pg`), not to the service's log; the
server's own log is `<data dir>/log`. When the server cannot start, the tail of both is logged
with the error.
"""

from __future__ import annotations

import logging
import threading
import warnings
from pathlib import Path
from typing import Any

logger = logging.getLogger("app.kit.embedded_pg")
_lock = threading.Lock()
_TAIL_LINES = 15


def chatter_log_path(data_dir: Path) -> Path:
    """Where pgserver's messages go: `<data dir>.log`, beside the data directory."""
    return data_dir.with_name(f"{data_dir.name}.log")


def _route_chatter(path: Path) -> None:
    """Send the `pgserver` logger's records to `path` only (once per process and path)."""
    chatter = logging.getLogger("pgserver")
    chatter.propagate = False
    if any(getattr(h, "baseFilename", None) == str(path) for h in chatter.handlers):
        return
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    chatter.addHandler(handler)
    if chatter.level == logging.NOTSET:
        chatter.setLevel(logging.INFO)


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_TAIL_LINES:])


class EmbeddedPostgres:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir.expanduser().resolve()
        self._server: Any = None

    def start(self) -> str:
        """Start (or join) the server and return a `postgresql://` URL for its `postgres` db."""
        with _lock:
            if self._server is None:
                # the data directory itself, not only its parent: pgserver creates a missing
                # one with exist_ok=False before taking its inter-process lock, so processes
                # starting together on a fresh directory (test workers) raced to create it
                self.data_dir.mkdir(parents=True, exist_ok=True)
                _route_chatter(self.chatter_log)
                try:
                    self._server = self._start_server()
                except Exception:
                    logger.error(
                        "embedded PostgreSQL failed to start in %s%s", self.data_dir, self._tails()
                    )
                    raise
                logger.info(
                    "embedded PostgreSQL running in %s (its messages: %s)",
                    self.data_dir,
                    self.chatter_log,
                )
            return str(self._server.get_uri())

    @property
    def chatter_log(self) -> Path:
        return chatter_log_path(self.data_dir)

    def _start_server(self) -> Any:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; harmless here
            warnings.simplefilter("ignore")
            import pgserver  # noqa: PLC0415 - heavy import, only when embedded

            return pgserver.get_server(  # type: ignore[attr-defined]
                self.data_dir, cleanup_mode="stop"
            )

    def _tails(self) -> str:
        """The last lines of the server's own log (why it would not start), or of pgserver's
        messages when the server never wrote one (initdb failed, say)."""
        for path in (self.data_dir / "log", self.chatter_log):
            tail = _tail(path)
            if tail:
                return f"; last lines of {path}:\n{tail}"
        return f"; nothing in {self.chatter_log}"

    def stop(self) -> None:
        """Release this process's handle; the server stops when no process uses it any more."""
        with _lock:
            if self._server is not None:
                self._server.cleanup()
                self._server = None
                logger.info("embedded PostgreSQL released")
