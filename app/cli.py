"""Command line: serve | worker | migrate | distribute | token | openapi (also the
`context-memory` script)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import yaml

from app.kit.config import PROJECT_ROOT, Settings, get_settings, is_loopback_host, to_asyncpg_url

if TYPE_CHECKING:
    from fastapi import FastAPI
    from prometheus_client import CollectorRegistry

logger = logging.getLogger("app.cli")

OPENAPI_PATH = PROJECT_ROOT / "openapi.yaml"
# What each process of `serve --workers N` (N > 1) imports and calls to build its app.
SERVED_APP_FACTORY = "app.cli:create_served_app"
# ... and the HTTP protocol each runs (by name: the spawned processes import it)
SERVED_HTTP_PROTOCOL = "app.kit.http_protocol:BoundedHttpToolsProtocol"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the API (and the in-process worker)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--workers",
        type=_positive_int,
        default=None,
        help="API processes sharing the port (default API_WORKERS, 1)",
    )

    worker = commands.add_parser("worker", help="run the consolidation worker only (to SIGTERM)")
    worker.add_argument(
        "--check", action="store_true", help="healthcheck: exit 0 if the worker loop is alive"
    )

    commands.add_parser(
        "migrate", help="alembic upgrade head (then distribute, on a Citus coordinator)"
    )
    commands.add_parser(
        "distribute",
        help="on a Citus coordinator: distribute the company tables by company_id, replicate "
        "the others (a no-op without Citus)",
    )

    token = commands.add_parser("token", help="print a JWT signed with the configured key")
    token.add_argument("--sub", required=True, help="user id")
    token.add_argument("--company", required=True, help="company id")
    token.add_argument("--role", action="append", default=[], choices=["space_admin", "operator"])
    token.add_argument("--ttl", type=int, default=3600, help="seconds until expiry")

    openapi = commands.add_parser("openapi", help="write openapi.yaml (or --check for drift)")
    openapi.add_argument("--check", action="store_true")
    openapi.add_argument("--output", type=Path, default=OPENAPI_PATH)

    args = parser.parse_args(argv)
    settings = get_settings()
    if args.command == "serve":
        workers = args.workers if args.workers is not None else settings.api_workers
        return _serve(settings, args.host, args.port, workers)
    if args.command == "worker":
        return _worker_check(settings) if args.check else _worker(settings)
    if args.command == "migrate":
        return _migrate(settings)
    if args.command == "distribute":
        return _distribute(settings)
    if args.command == "token":
        from app.kit.auth.mint import issue_token  # noqa: PLC0415
        from app.kit.principal import Principal  # noqa: PLC0415

        if "operator" in args.role and not settings.static_platform:
            print(
                "note: JWT_PLATFORM is off here, so the service drops this token's operator "
                "role (docs/identity.md#the-static-key)",
                file=sys.stderr,
            )
        print(
            issue_token(
                settings,
                Principal(args.sub, args.company, frozenset(args.role)),
                ttl_seconds=args.ttl,
            )
        )
        return 0
    if args.command == "openapi":
        return _openapi(settings, args.output, check=args.check)
    parser.error(f"unknown command {args.command}")  # pragma: no cover - argparse exits first
    return 2  # pragma: no cover


def render_openapi(settings: Settings) -> str:
    from app.main import create_app  # noqa: PLC0415

    spec = create_app(settings).openapi()
    return yaml.safe_dump(spec, sort_keys=False, allow_unicode=True, width=100)


def _openapi(settings: Settings, output: Path, *, check: bool) -> int:
    generated = render_openapi(settings)
    if check:
        current = output.read_text(encoding="utf-8") if output.exists() else ""
        if current != generated:
            print(f"{output} is out of date: run `make openapi`", file=sys.stderr)
            return 1
        print(f"{output} is up to date")
        return 0
    output.write_text(generated, encoding="utf-8")
    print(f"wrote {output}")
    return 0


def _migrate(settings: Settings) -> int:
    from app.kit.db.migrations import run_migrations  # noqa: PLC0415

    if settings.database_url:
        url = to_asyncpg_url(settings.database_url)
        run_migrations(url)
        print("migrated DATABASE_URL to head")
        _report_distribution(url, quiet=True)
        return 0
    from app.kit.embedded_pg import EmbeddedPostgres  # noqa: PLC0415

    embedded = EmbeddedPostgres(settings.embedded_pg_dir)
    try:
        run_migrations(to_asyncpg_url(embedded.start()))
    finally:
        embedded.stop()
    print(f"migrated the embedded database in {settings.embedded_pg_dir} to head")
    return 0


def _distribute(settings: Settings) -> int:
    """`distribute`: needs DATABASE_URL (the embedded database never runs Citus)."""
    if not settings.database_url:
        print("DATABASE_URL is unset: the embedded database has no Citus, nothing to distribute")
        return 0
    _report_distribution(to_asyncpg_url(settings.database_url), quiet=False)
    return 0


def _report_distribution(url: str, *, quiet: bool) -> None:
    from app.kit.citus import distribute  # noqa: PLC0415
    from app.models import metadata  # noqa: PLC0415

    outcome = asyncio.run(distribute(url, metadata))
    if not outcome.citus:
        if not quiet:
            print("no citus extension in the database: nothing to distribute")
        return
    print(
        f"citus: {len(outcome.distributed)} table(s) distributed by company_id, "
        f"{len(outcome.referenced)} made reference tables"
        + ("" if outcome.distributed or outcome.referenced else " (all were already)")
    )


def _event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop where it is installed (as `serve` runs, through uvicorn), else
    asyncio's own."""
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        return None
    return uvloop.new_event_loop


def _worker(settings: Settings) -> int:
    """Run the worker until SIGTERM or SIGINT, without the API (`app.worker_main`: it starts
    and migrates the embedded database when DATABASE_URL is unset, and stops the worker
    gracefully on the way out)."""
    from app.kit.observability import configure_logging  # noqa: PLC0415

    configure_logging(settings.log_level, settings.log_format)
    where = "DATABASE_URL" if settings.database_url else f"embedded ({settings.embedded_pg_dir})"
    print(f"Context Memory worker  database: {where}", flush=True)
    with asyncio.Runner(loop_factory=_event_loop_factory()) as runner:
        runner.run(_run_worker(settings.model_copy(update={"worker_enabled": True})))
    return 0


async def _run_worker(settings: Settings) -> None:
    with _no_cyclic_collection():
        from app.worker_main import running_worker  # noqa: PLC0415
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with (
        running_worker(settings) as metrics,
        _metrics_server(settings, metrics.registry),
    ):
        await stop.wait()


@contextlib.asynccontextmanager
async def _metrics_server(settings: Settings, registry: CollectorRegistry) -> AsyncIterator[None]:
    """The standalone worker's `/metrics` (it serves no API): prometheus-client's own HTTP
    server in a thread, on WORKER_METRICS_PORT when it is set."""
    if not settings.worker_metrics_port:
        yield
        return
    from prometheus_client import start_http_server  # noqa: PLC0415

    server, thread = start_http_server(
        settings.worker_metrics_port, addr=settings.worker_metrics_host, registry=registry
    )
    host, port = server.server_address[:2]
    logger.info("worker metrics on http://%s:%s/metrics", host, port)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _worker_check(settings: Settings) -> int:
    from app.jobs.worker import heartbeat_is_fresh  # noqa: PLC0415

    path = settings.worker_heartbeat_file
    if heartbeat_is_fresh(path, heartbeat_max_age_seconds(settings)):
        return 0
    print(f"worker heartbeat {path} is missing or stale", file=sys.stderr)
    return 1


def heartbeat_max_age_seconds(settings: Settings) -> float:
    """How old the heartbeat file may be for `worker --check`: a few poll intervals, but at
    least a lease (a slot busy with one long job does not touch the file meanwhile)."""
    return max(settings.worker_poll_seconds * 5, float(settings.job_lease_seconds))


def _positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


@contextlib.contextmanager
def _no_cyclic_collection() -> Iterator[None]:
    """The cyclic garbage collector off while the app's modules are imported and its app
    built: they allocate ~1M objects that all live on, and the collections that allocating
    them set off (full ones among them, each scanning all that came before) took 0.1-0.3 s
    of a process's start on 2 cores. The lifespan collects once and freezes what was built
    (`app.kit.startup.freeze_startup_objects`)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _serve(settings: Settings, host: str, port: int, workers: int) -> int:
    import uvicorn  # noqa: PLC0415

    from app.kit.auth.mint import issue_token  # noqa: PLC0415
    from app.kit.http_protocol import BoundedHttpToolsProtocol  # noqa: PLC0415
    from app.kit.observability import configure_logging  # noqa: PLC0415
    from app.kit.principal import Principal  # noqa: PLC0415

    with _no_cyclic_collection():
        from app.main import create_app  # noqa: PLC0415

    configure_logging(settings.log_level, settings.log_format)
    development_secret = settings.uses_development_jwt_secret and settings.static_hmac_enabled
    if development_secret and not is_loopback_host(host):
        print(
            f"refusing to serve on {host}: JWT_SECRET is the built-in development secret, "
            "which anybody can read; set a real JWT_SECRET (or AUTH_ISSUERS outside "
            "development), or bind 127.0.0.1",
            file=sys.stderr,
            flush=True,
        )
        return 2
    where = "DATABASE_URL" if settings.database_url else f"embedded ({settings.embedded_pg_dir})"
    processes = f"  processes: {workers}" if workers > 1 else ""
    print(
        f"Context Memory Service on http://{host}:{port}  database: {where}{processes}", flush=True
    )
    base = f"http://{host}:{port}"
    print(
        f"Swagger UI: {base}/docs  ReDoc: {base}/redoc  memory page: {base}/ui/memory", flush=True
    )
    if development_secret:
        token = issue_token(
            settings,
            Principal("alice", "acme", frozenset(["space_admin", "operator"])),
            ttl_seconds=12 * 3600,
        )
        print(f"Development token (alice@acme, space_admin+operator, 12 h):\n{token}", flush=True)
        print(f"alice's memory page: {base}/ui/memory#token={token}", flush=True)
    if workers > 1:
        return _serve_processes(settings, host, port, workers)
    with _no_cyclic_collection():
        # one process: its share of each rate limit is the whole replica's
        app = create_app(settings.model_copy(update={"api_workers": 1}))
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        proxy_headers=False,
        http=BoundedHttpToolsProtocol,  # deadlines and size limits on request heads
    )
    return 0


def _serve_processes(settings: Settings, host: str, port: int, workers: int) -> int:
    """Serve with `workers` processes on one listening socket, under uvicorn's supervisor
    (it restarts a process that dies, and on SIGINT or SIGTERM stops them all, each
    gracefully, before it returns).

    Each process runs the app's own lifespan, so with `WORKER_ENABLED` each also runs a
    consolidation worker: N x WORKER_CONCURRENCY slots on the one queue, which is safe
    (`claim_next_job` claims with SKIP LOCKED and serialises per user).

    On the embedded database this process starts and migrates it, once, and hands it to the
    workers as DATABASE_URL (they never start one of their own); it stops it after the
    supervisor has stopped every worker. Until the supervisor takes over the signals, SIGTERM
    ends the start-up the way Ctrl-C does, through the same clean-up.
    """
    from uvicorn import Config  # noqa: PLC0415
    from uvicorn.config import STARTUP_FAILURE  # noqa: PLC0415
    from uvicorn.supervisors import Multiprocess  # noqa: PLC0415

    signal.signal(signal.SIGTERM, _interrupt)
    embedded = None
    try:
        if settings.uses_embedded_database:
            from app.kit.db.migrations import run_migrations  # noqa: PLC0415
            from app.kit.embedded_pg import EmbeddedPostgres  # noqa: PLC0415

            embedded = EmbeddedPostgres(settings.embedded_pg_dir)
            url = embedded.start()
            run_migrations(to_asyncpg_url(url))
            os.environ["DATABASE_URL"] = url  # read by the workers' settings
        os.environ["API_WORKERS"] = str(workers)  # each process's share of the rate limits
        config = Config(
            SERVED_APP_FACTORY,
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_config=None,
            access_log=False,
            proxy_headers=False,
            http=SERVED_HTTP_PROTOCOL,
        )
        listener = config.bind_socket()
        supervisor = Multiprocess(config, sockets=[listener])
        try:
            supervisor.run()
        finally:
            listener.close()
        failed = [p.pid for p in supervisor.processes if p.exitcode == STARTUP_FAILURE]
    except KeyboardInterrupt:
        return 0
    finally:
        if embedded is not None:
            embedded.stop()
    if failed:
        print(f"serve: API process {failed[0]} failed to start (its log is above)", file=sys.stderr)
        return STARTUP_FAILURE
    return 0


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def create_served_app() -> FastAPI:
    """The app of one process of `serve --workers N` (uvicorn's factory, called in the spawned
    process): settings from the environment the supervisor passed on, and the JSON logs, which
    a spawned process does not inherit."""
    from app.kit.observability import configure_logging  # noqa: PLC0415

    with _no_cyclic_collection():
        from app.main import create_app  # noqa: PLC0415

    settings = get_settings()
    configure_logging(settings.log_level, settings.log_format)
    with _no_cyclic_collection():
        return create_app(settings)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
