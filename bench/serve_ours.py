"""Run the service for `bench/run_bench.py`: one uvicorn worker on `app.main.create_app`, with
the flags the reference app runs with (`--loop uvloop --http httptools --no-access-log`); or,
with `--workers N` (default API_WORKERS), N processes under uvicorn's supervisor on the factory
`python -m app serve --workers N` uses.

    .venv/bin/python bench/serve_ours.py --port 8200 [--workers 2]

Settings come from the environment like `python -m app serve` (DATABASE_URL, JWT_SECRET,
WORKER_ENABLED, LOG_LEVEL, DB_POOL_SIZE, DB_MAX_OVERFLOW, DB_POOL_PRE_PING, ...). One knob exists
only for the benchmark, here, never in the app:

  BENCH_CPROFILE=PATH      run the process under cProfile and write the stats to PATH on exit
                           (one worker only)
"""

from __future__ import annotations

import argparse
import cProfile
import os
import signal
import sys
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import uvicorn

from app.cli import SERVED_APP_FACTORY
from app.kit.config import get_settings
from app.kit.observability import configure_logging
from app.main import create_app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=None, help="default API_WORKERS")
    args = parser.parse_args()

    settings = get_settings()
    workers: int = args.workers or settings.api_workers
    configure_logging(settings.log_level)
    print(
        f"bench: our service on {args.host}:{args.port}, {workers} process(es), pool "
        f"{settings.db_pool_size} + {settings.db_max_overflow} overflow, pre-ping "
        f"{settings.db_pool_pre_ping}",
        flush=True,
    )
    profile_path = os.environ.get("BENCH_CPROFILE")
    if workers > 1:
        if profile_path:
            parser.error("BENCH_CPROFILE profiles one process: run it with --workers 1")
        uvicorn.run(
            SERVED_APP_FACTORY,
            factory=True,
            host=args.host,
            port=args.port,
            workers=workers,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_config=None,
            proxy_headers=False,
        )
        return
    application = create_app(settings)

    profiler = cProfile.Profile() if profile_path else None
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it with the handler that was
    # installed before it started: make that one an orderly exit, so the profile gets written.
    signal.signal(signal.SIGTERM, _exit_quietly)
    if profiler is not None:
        profiler.enable()
    try:
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
    finally:
        if profiler is not None and profile_path:
            profiler.disable()
            profiler.dump_stats(profile_path)


def _exit_quietly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


if __name__ == "__main__":
    main()
