"""What a process of the service does on its way up, whichever it is (`serve`, `worker`): the
database to use (DATABASE_URL, or the embedded one, started and migrated), and, once everything
lasting is built, the start-up objects moved out of the collector's view and the heap's free
pages handed back."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc

from app.kit.config import Settings, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from app.kit.embedded_pg import EmbeddedPostgres


async def database_url(settings: Settings) -> tuple[str, EmbeddedPostgres | None]:
    """DATABASE_URL, or (unset) the embedded PostgreSQL's, started and migrated to head: the
    URL for SQLAlchemy's asyncpg dialect, and the embedded server to stop at the end, if any."""
    url = settings.async_database_url
    if url is not None:
        return url, None
    embedded = EmbeddedPostgres(settings.embedded_pg_dir)
    url = to_asyncpg_url(await asyncio.to_thread(embedded.start))
    await asyncio.to_thread(run_migrations, url)
    return url, embedded


# Allocations between two collections of the youngest generation (CPython's default: 700). A
# request allocates a few hundred container objects, nearly all freed by reference counting:
# at the default the collector ran every other request for little. 20,000 costs at most a few
# MB more between collections (RSS under wrk: 204-206 MiB either way) and, in the same runs of
# `make bench`'s harness, cut the server's CPU per turn-save at c=16 by 8-38 % (docs/benchmarks.md).
YOUNG_GENERATION_THRESHOLD = 20_000


def release_free_heap() -> None:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`): start-up frees
    more than it keeps (the token encoding's ranks are read into a dict, handed to the
    tokenizer and dropped: ~14 MiB), and glibc keeps what it freed mapped until told. Elsewhere
    (musl, macOS) nothing is done."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def freeze_startup_objects() -> None:
    """Move everything built at start-up (modules, models, routes, ~170k objects) out of the
    cyclic collector's view: they live as long as the process, and a full collection that
    scans them takes 70-200 ms, which every request in flight waits for. Requests' own garbage
    is collected as before, its youngest generation less often (`YOUNG_GENERATION_THRESHOLD`)."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, older, oldest)
    release_free_heap()
