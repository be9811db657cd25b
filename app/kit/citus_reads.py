"""Reads sent to the Citus worker node that holds a company's shards, not through the
coordinator (`CITUS_WORKER_READS`, docs/scaling.md).

Through the coordinator, a company function's call is planned there, sent to the worker that
holds the company's shards, planned again and run there: on the test cluster, one `/context`
read took about 520 µs one call after another, against 240 µs sent to that worker directly
(Citus lets any node with metadata take queries). `WorkerReads` hands out a connection of a
pool of that worker instead of the coordinator's. The worker is found once per company and
`ROUTE_SECONDS` (one query on the coordinator), and nothing else depends on the answer being
current: a call that reaches a worker after the company's shards moved away is sent on by
Citus there (a worker delegates a function call as the coordinator does), and the company
function itself checks that the shards it runs the statement on are that node's. A worker
that cannot be reached is forgotten for the company and the read goes through the
coordinator.

Only statements that run alone, outside a transaction block, go this way: a transaction's
statements stay on the coordinator, which coordinates them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Final

import asyncpg

from app.kit.db.driver_pool import DriverPool

ROUTE_SECONDS: Final = 30.0
"""How long the worker found for a company is used before it is asked again."""

_NODE_OF_COMPANY: Final = (
    "SELECT n.nodename, n.nodeport FROM pg_dist_placement p"
    " JOIN pg_dist_node n ON n.groupid = p.groupid"
    " WHERE p.shardid = get_shard_id_for_distribution_column('turns', $1::varchar)"
    " AND n.isactive AND n.noderole = 'primary'"
    " LIMIT 1"
)
_UNREACHABLE: Final = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidPasswordError,
)

Node = tuple[str, int]


class WorkerReads:
    """Connections to the worker node holding a company's shards, one `DriverPool` per node
    (the coordinator's connect arguments, another host and port), the coordinator's pool where
    no worker is known or reachable. `served`: reads per kind of pool (`worker`,
    `coordinator`), for the tests and the figures."""

    def __init__(
        self,
        coordinator: DriverPool,
        connect_kwargs: Mapping[str, object],
        *,
        max_size: int,
        timeout: float,
    ) -> None:
        self._coordinator = coordinator
        self._connect_kwargs = dict(connect_kwargs)
        self._max_size = max_size
        self._timeout = timeout
        self._routes: dict[str, tuple[Node | None, float]] = {}
        self._pools: dict[Node, DriverPool] = {}
        self.served = {"worker": 0, "coordinator": 0}

    @asynccontextmanager
    async def connection(self, company_id: str) -> AsyncIterator[asyncpg.Connection]:
        """A connection of the pool of the worker holding `company_id`'s shards, else of the
        coordinator's; for statements that run alone."""
        node = await self._node(company_id)
        if node is not None:
            stack = AsyncExitStack()
            try:
                conn = await stack.enter_async_context(self._pool(node).connection())
            except _UNREACHABLE:
                await stack.aclose()
                self._routes[company_id] = (None, time.monotonic() + ROUTE_SECONDS)
            else:
                async with stack:
                    self.served["worker"] += 1
                    yield conn
                return
        async with self._coordinator.connection() as conn:
            self.served["coordinator"] += 1
            yield conn

    def route(self, company_id: str, node: Node | None) -> None:
        """Use `node` for `company_id` from now on (until `ROUTE_SECONDS` have passed)."""
        self._routes[company_id] = (node, time.monotonic() + ROUTE_SECONDS)

    async def _node(self, company_id: str) -> Node | None:
        known = self._routes.get(company_id)
        now = time.monotonic()
        if known is not None and known[1] > now:
            return known[0]
        async with self._coordinator.connection() as conn:
            row = await conn.fetchrow(_NODE_OF_COMPANY, company_id)
        node = None if row is None else (str(row["nodename"]), int(row["nodeport"]))
        if len(self._routes) > 10_000:  # bounded: companies seen in the last ROUTE_SECONDS
            self._routes = {k: v for k, v in self._routes.items() if v[1] > now}
        self._routes[company_id] = (node, now + ROUTE_SECONDS)
        return node

    def _pool(self, node: Node) -> DriverPool:
        pool = self._pools.get(node)
        if pool is None:
            host, port = node
            kwargs = self._connect_kwargs | {"host": host, "port": port}
            kwargs.pop("target_session_attrs", None)  # one node: no choice of server
            # a worker hides its shards from the catalogs of client sessions with a filter
            # evaluated per row: asyncpg's type introspection over pg_type then took longer
            # than the statement timeout on a worker holding a few hundred shards
            given = kwargs.get("server_settings")
            settings = dict(given) if isinstance(given, Mapping) else {}
            kwargs["server_settings"] = settings | {"citus.override_table_visibility": "off"}
            pool = DriverPool(kwargs, max_size=self._max_size, timeout=self._timeout)
            self._pools[node] = pool
        return pool

    async def close(self) -> None:
        for pool in self._pools.values():
            await pool.close()
        self._pools.clear()
