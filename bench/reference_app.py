# The baseline app, kept as written (only these header lines added, so lint and the type
# checker leave it alone).
# ruff: noqa
# mypy: ignore-errors
# fmt: off
"""reference_app.py -- the bare database work of the two hot-path calls, for side-by-side ratios.

Endpoints (all return the same ~8 KB JSON shape {"user_id","version","body"} unless noted):
  GET  /const             constant dict, FastAPI default serialization     -> framework ceiling
  GET  /const_raw         constant pre-encoded bytes (Response)             -> absolute HTTP floor
  GET  /apg/pk/{uid}      1 PK select via raw asyncpg pool
  GET  /sqla/pk/{uid}     1 PK select via SQLAlchemy 2 async ORM (AsyncSession + select())
  GET  /apg/inject/{uid}  "load/inject" shape: profile PK select + last 20 messages (2 queries, asyncpg)
  GET  /sqla/inject/{uid} same via SQLAlchemy ORM
  POST /apg/turn/{cid}    "turn-save" shape: 1 txn = 2 message INSERTs + 1 jobs INSERT (asyncpg)
  POST /sqla/turn/{cid}   same via SQLAlchemy ORM (session.add_all + commit)

Seed its database once (10k ~8 KB profiles, 10k conversations x 20 messages of ~512 chars):

  create table profile(user_id int primary key, version int not null default 1,
                       body text not null, updated_at timestamptz not null default now());
  insert into profile(user_id, body)
    select g, (select string_agg(md5(g::text || ':' || i::text), '') from generate_series(1,256) i)
    from generate_series(1,10000) g;
  create table messages(id bigserial primary key, conversation_id bigint not null, role text not null,
                        content text not null, created_at timestamptz not null default now());
  insert into messages(conversation_id, role, content)
    select c, case when m % 2 = 0 then 'user' else 'assistant' end,
           (select string_agg(md5(c::text || ':' || m::text || ':' || i::text), '') from generate_series(1,16) i)
    from generate_series(1,10000) c, generate_series(1,20) m;
  create index messages_conv_id on messages(conversation_id, id);
  create table jobs(id bigserial primary key, kind text not null, conversation_id bigint not null,
                    status text not null default 'queued', created_at timestamptz not null default now());
  vacuum analyze;

Env: PG_DSN (e.g. postgresql://postgres@127.0.0.1:5432/appbench), POOL (pool size, default 20).
Run: uvicorn reference_app:app --host 127.0.0.1 --port 8101 --workers 1 --loop uvloop --http httptools --no-access-log
Load: wrk -t1 -c16 -d15s --latency -s wrk_randpath.lua http://127.0.0.1:8101 -- /apg/inject/ 10000
      wrk -t1 -c16 -d15s --latency -s wrk_post_turn.lua http://127.0.0.1:8101 -- /apg/turn/ 10000
"""
import json as _json
import os
from contextlib import asynccontextmanager
from datetime import datetime

import asyncpg
from fastapi import FastAPI, Request, Response
from sqlalchemy import BigInteger, DateTime, Integer, Text, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

DSN = os.environ.get("PG_DSN", "postgresql://postgres@127.0.0.1:5432/appbench")
POOL = int(os.environ.get("POOL", "20"))

BODY = "".join(f"{i:08x}" for i in range(1024))  # 8192 chars
CONST = {"user_id": 1, "version": 1, "body": BODY}
CONST_BYTES = _json.dumps(CONST).encode()


class Base(DeclarativeBase):
    pass


class Profile(Base):
    __tablename__ = "profile"
    user_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    body: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Message(Base):
    __tablename__ = "messages"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    conversation_id: Mapped[int] = mapped_column(BigInteger)
    role: Mapped[str] = mapped_column(Text)
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=True)
    kind: Mapped[str] = mapped_column(Text)
    conversation_id: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[str] = mapped_column(Text, server_default="queued")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


state: dict = {}


@asynccontextmanager
async def lifespan(app: FastAPI):
    state["pool"] = await asyncpg.create_pool(DSN, min_size=POOL, max_size=POOL)
    engine = create_async_engine(DSN.replace("postgresql://", "postgresql+asyncpg://"),
                                 pool_size=POOL, max_overflow=0)
    state["engine"] = engine
    state["sm"] = async_sessionmaker(engine, expire_on_commit=False)
    yield
    await state["pool"].close()
    await engine.dispose()


app = FastAPI(lifespan=lifespan)


@app.get("/const")
async def const():
    return CONST


@app.get("/const_raw")
async def const_raw():
    return Response(CONST_BYTES, media_type="application/json")


# ---------------- one PK select
@app.get("/apg/pk/{uid}")
async def apg_pk(uid: int):
    async with state["pool"].acquire() as c:
        r = await c.fetchrow("SELECT user_id, version, body FROM profile WHERE user_id = $1", uid)
    return {"user_id": r["user_id"], "version": r["version"], "body": r["body"]}


@app.get("/sqla/pk/{uid}")
async def sqla_pk(uid: int):
    async with state["sm"]() as s:
        p = (await s.execute(select(Profile).where(Profile.user_id == uid))).scalar_one()
    return {"user_id": p.user_id, "version": p.version, "body": p.body}


# ---------------- load/inject shape: profile + last 20 messages
@app.get("/apg/inject/{uid}")
async def apg_inject(uid: int):
    async with state["pool"].acquire() as c:
        p = await c.fetchrow("SELECT user_id, version, body FROM profile WHERE user_id = $1", uid)
        rows = await c.fetch(
            "SELECT id, role, content, created_at FROM messages WHERE conversation_id = $1 "
            "ORDER BY id DESC LIMIT 20", uid)
    return {"profile": {"user_id": p["user_id"], "version": p["version"], "body": p["body"]},
            "messages": [{"id": r["id"], "role": r["role"], "content": r["content"],
                          "created_at": r["created_at"].isoformat()} for r in reversed(rows)]}


@app.get("/sqla/inject/{uid}")
async def sqla_inject(uid: int):
    async with state["sm"]() as s:
        p = (await s.execute(select(Profile).where(Profile.user_id == uid))).scalar_one()
        msgs = (await s.execute(select(Message).where(Message.conversation_id == uid)
                                .order_by(Message.id.desc()).limit(20))).scalars().all()
    return {"profile": {"user_id": p.user_id, "version": p.version, "body": p.body},
            "messages": [{"id": m.id, "role": m.role, "content": m.content,
                          "created_at": m.created_at.isoformat()} for m in reversed(msgs)]}


# ---------------- turn-save shape: 2 message rows + 1 job row in one transaction
@app.post("/apg/turn/{cid}")
async def apg_turn(cid: int, request: Request):
    b = await request.json()
    async with state["pool"].acquire() as c:
        async with c.transaction():
            await c.executemany(
                "INSERT INTO messages(conversation_id, role, content) VALUES ($1, $2, $3)",
                [(cid, "user", b["user"]), (cid, "assistant", b["assistant"])])
            jid = await c.fetchval(
                "INSERT INTO jobs(kind, conversation_id) VALUES ('consolidate', $1) RETURNING id", cid)
    return {"ok": True, "job_id": jid}


@app.post("/sqla/turn/{cid}")
async def sqla_turn(cid: int, request: Request):
    b = await request.json()
    async with state["sm"]() as s:
        async with s.begin():
            s.add_all([Message(conversation_id=cid, role="user", content=b["user"]),
                       Message(conversation_id=cid, role="assistant", content=b["assistant"])])
            job = Job(kind="consolidate", conversation_id=cid)
            s.add(job)
            await s.flush()
            jid = job.id
    return {"ok": True, "job_id": jid}
