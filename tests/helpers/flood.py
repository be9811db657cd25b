"""A client flooding the service with turn-saves from its own process (so that its CPU is not
the measuring test's): `python -m tests.helpers.flood URL TOKEN COUNT CONNECTIONS` prints one
JSON object: every answer's status in order, the turn ids acknowledged, and whether every 429
carried `Retry-After` and the rate-limit fields.

It speaks HTTP/1.1 itself over keep-alive connections: a general client spends more CPU per
request than the service does on a 429, and on a small machine that CPU would be taken from the
service under test rather than spent on flooding it."""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from urllib.parse import urlsplit

import orjson


def request_bytes(host: str, token: str, index: int) -> bytes:
    body = orjson.dumps(
        {
            "space_id": "space-1",
            "messages": [{"role": "user", "content": f"Flood message {index}."}],
            "response": {"role": "assistant", "content": "Noted."},
        }
    )
    head = (
        f"POST /v1/chats/flood-{uuid.uuid4().hex[:12]}/turns HTTP/1.1\r\n"
        f"Host: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def flood(url: str, token: str, count: int, connections: int) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    statuses: list[int] = [0] * count
    acknowledged: list[str] = []
    refusals_well_formed = True
    next_index = 0

    async def sender() -> None:
        nonlocal next_index, refusals_well_formed
        reader, writer = await asyncio.open_connection(host, port)
        try:
            while next_index < count:
                index = next_index
                next_index += 1
                writer.write(request_bytes(f"{host}:{port}", token, index))
                status, headers, body = await read_response(reader)
                statuses[index] = status
                if status in (201, 202):
                    acknowledged.append(orjson.loads(body)["turn_id"])
                elif status == 429:
                    refusals_well_formed &= (
                        headers.get("retry-after", "").isdigit()
                        and "ratelimit-policy" in headers
                        and "ratelimit" in headers
                    )
        finally:
            writer.close()

    started = time.monotonic()
    await asyncio.gather(*(sender() for _ in range(connections)))
    return {
        "statuses": statuses,
        "acknowledged": acknowledged,
        "refusals_well_formed": refusals_well_formed,
        "seconds": time.monotonic() - started,
    }


if __name__ == "__main__":
    target, bearer, total, parallel = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(flood(target, bearer, total, parallel))))
