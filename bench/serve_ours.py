"""Run the service for `bench/run_bench.py`: one uvicorn worker on `app.main.create_app`, with
the flags the reference app runs with (`--loop uvloop --http httptools --no-access-log`).

    .venv/bin/python bench/serve_ours.py --port 8200

Settings come from the environment like `python -m app serve` (DATABASE_URL, JWT_SECRET,
WORKER_ENABLED, LOG_LEVEL, ...). Two knobs exist only for the benchmark, here, never in the app:

  BENCH_POOL_PRE_PING=0    build the engine with pool_pre_ping=False (app/db.py hard-codes True)
  BENCH_CPROFILE=PATH      run the process under cProfile and write the stats to PATH on exit
"""

from __future__ import annotations

import argparse
import cProfile
import os
import sys
from pathlib import Path
from typing import Any

from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvicorn

from app import db
from app.config import get_settings
from app.main import create_app
from app.observability import configure_logging


def _engine_without_pre_ping(url: str | URL, **kwargs: Any) -> AsyncEngine:
    kwargs["pool_pre_ping"] = False
    return create_async_engine(url, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()

    pre_ping = os.environ.get("BENCH_POOL_PRE_PING", "1") != "0"
    if not pre_ping:
        # app.db.create_database looks the name up in its module at call time
        setattr(db, "create_async_engine", _engine_without_pre_ping)  # noqa: B010
    settings = get_settings()
    configure_logging(settings.log_level)
    print(f"bench: our service on {args.host}:{args.port}, pool_pre_ping={pre_ping}", flush=True)
    application = create_app(settings)

    profile_path = os.environ.get("BENCH_CPROFILE")
    profiler = cProfile.Profile() if profile_path else None
    if profiler is not None:
        profiler.enable()
    uvicorn.run(
        application,
        host=args.host,
        port=args.port,
        workers=1,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_config=None,
        proxy_headers=False,
    )
    if profiler is not None and profile_path:
        profiler.disable()
        profiler.dump_stats(profile_path)


if __name__ == "__main__":
    main()
