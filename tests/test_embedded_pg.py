"""The embedded PostgreSQL starts, serves and stops cleanly, as root and as an ordinary user."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

from app.kit.config import PROJECT_ROOT

SCRIPT = """
import asyncio, sys
from pathlib import Path
import asyncpg
from app.kit.embedded_pg import EmbeddedPostgres

async def main(url: str) -> None:
    conn = await asyncpg.connect(url)
    print(await conn.fetchval("SELECT current_setting('server_version_num')"))
    await conn.close()

server = EmbeddedPostgres(Path(sys.argv[1]))
asyncio.run(main(server.start()))
server.stop()
print("stopped")
"""


def run_embedded(data_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", SCRIPT, str(data_dir)]
    return subprocess.run(
        command,
        cwd=PROJECT_ROOT,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(PROJECT_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def postmaster_running(data_dir: Path) -> bool:
    return (data_dir / "postmaster.pid").exists()


@pytest.mark.slow
def test_embedded_pg_as_the_current_user() -> None:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="emb-") as tmp:
        data_dir = Path(tmp) / "pg"
        result = run_embedded(data_dir)
        assert result.returncode == 0, result.stderr[-2000:]
        version, stopped = result.stdout.split()
        assert int(version) >= 160000
        assert stopped == "stopped"
        assert not postmaster_running(data_dir)  # stopped cleanly on release


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_embedded_pg_as_an_ordinary_user() -> None:
    """A forked child drops to `nobody` and runs the embedded server in a directory it owns.

    Forking (rather than starting a new interpreter as `nobody`) keeps the already-loaded
    interpreter: on some machines the Python installation itself is not readable by `nobody`.
    """
    import pwd  # noqa: PLC0415
    import warnings  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        import fasteners  # noqa: PLC0415
        import pgserver  # noqa: PLC0415 - loaded before dropping privileges
        from pgserver.postgres_server import PostgresServer  # noqa: PLC0415

    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="emb-user-", dir="/tmp"))
    os.chmod(base, 0o755)  # noqa: S103 - `nobody` must traverse it
    data_parent = base / "data"
    data_parent.mkdir()
    os.chown(data_parent, nobody.pw_uid, nobody.pw_gid)
    data_dir = data_parent / "pg"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            # pgserver computed its lock path when root imported it; an ordinary user's
            # process imports it fresh and gets a runtime dir of its own, as here:
            runtime = data_parent / "run"
            runtime.mkdir()
            PostgresServer.runtime_path = runtime
            PostgresServer._lock = fasteners.InterProcessLock(runtime / ".lockfile")
            # and has none of root's log files open: the suite's own embedded server logs to
            # var/, which `nobody` may not write (a handler closed meanwhile reopens on emit)
            logging.getLogger("pgserver").handlers.clear()
            from app.kit.embedded_pg import EmbeddedPostgres  # noqa: PLC0415

            server = EmbeddedPostgres(data_dir)
            url = server.start()
            psql = Path(pgserver.__file__).parent / "pginstall" / "bin" / "psql"
            answer = subprocess.run(
                [str(psql), url, "-Atc", "SELECT current_user || ' ' || 6*7"],
                capture_output=True,
                text=True,
                check=True,
                timeout=60,
            ).stdout.strip()
            server.stop()
            os.write(write_end, answer.encode())
            code = 0
        except BaseException as exc:
            os.write(write_end, f"error: {exc!r}\n{traceback.format_exc()}".encode())
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        _, status = os.waitpid(pid, 0)
        with os.fdopen(read_end) as pipe:
            output = pipe.read()
        assert os.waitstatus_to_exitcode(status) == 0, output
        assert output == "postgres 42"
        assert data_dir.stat().st_uid == nobody.pw_uid  # initdb ran as the ordinary user
        assert not postmaster_running(data_dir)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_start_creates_the_data_directory_before_pgserver_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """pgserver creates a missing data directory with `exist_ok=False` before it takes its
    inter-process lock: two processes starting at once on a fresh directory (the test workers
    of `make test`) raced there, and one failed with FileExistsError. The directory is ours to
    create, idempotently, before pgserver looks."""
    import pgserver  # noqa: PLC0415 - the module the embedded server imports on start

    from app.kit.embedded_pg import EmbeddedPostgres  # noqa: PLC0415

    seen: list[bool] = []

    class Started:
        def get_uri(self) -> str:
            return "postgresql://postgres@/postgres"

    def get_server(pgdata: Path, cleanup_mode: str | None = "stop") -> Started:
        seen.append(Path(pgdata).is_dir())
        return Started()

    monkeypatch.setattr(pgserver, "get_server", get_server)
    data_dir = tmp_path / "fresh" / "pg"
    EmbeddedPostgres(data_dir).start()
    assert seen == [True]
    EmbeddedPostgres(data_dir).start()  # already there: no error either
    assert seen == [True, True]


@pytest.mark.slow
def test_processes_starting_together_on_a_fresh_directory_all_start() -> None:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="emb-") as tmp:
        data_dir = Path(tmp) / "pg"
        command = [sys.executable, "-c", SCRIPT, str(data_dir)]
        environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(PROJECT_ROOT)}
        processes = [
            subprocess.Popen(
                command,
                cwd=PROJECT_ROOT,
                env=environ,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        results = [process.communicate(timeout=180) for process in processes]
        for process, (out, err) in zip(processes, results, strict=True):
            assert process.returncode == 0, err[-2000:]
            assert out.split()[-1] == "stopped"
        assert not postmaster_running(data_dir)
