"""An orchestrator's chat turn over the Context Memory Service: context → model → turn-save.

It speaks the HTTP API directly (httpx), so it reads as the protocol itself; the typed client in
`client/` wraps the same calls. The model is any OpenAI-compatible endpoint, through the `openai`
SDK (`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `DEMO_MODEL`); with none configured a canned reply
stands in, so the loop runs offline and memory still appears (the service's offline engine
consolidates it).

    python -m examples.orchestrator --url http://127.0.0.1:8000 --token "$TOKEN" --space demo

reads one user message per line from stdin and prints each answer.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_MODEL = "gpt-4o-mini"
SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly."
MEMORY_SECTION = "## What I know about you"
FINISHED_JOB = frozenset({"succeeded", "dead"})

Message = dict[str, str]


class ChatModel(Protocol):
    """What the orchestrator needs of a model: the final message list in, the answer out."""

    name: str

    async def answer(self, messages: Sequence[Message]) -> str: ...


class OpenAICompatibleModel:
    """Any OpenAI-compatible chat completions endpoint, through the `openai` SDK."""

    def __init__(self, *, base_url: str | None, api_key: str | None, model: str) -> None:
        # A local server often needs no key; the SDK insists on one, so send a dummy.
        self._client = AsyncOpenAI(base_url=base_url, api_key=api_key or "not-needed")
        self.name = model

    async def answer(self, messages: Sequence[Message]) -> str:
        completion = await self._client.chat.completions.create(
            model=self.name,
            messages=[_openai_message(m) for m in messages],
        )
        return completion.choices[0].message.content or ""

    async def aclose(self) -> None:
        await self._client.close()


def _openai_message(message: Message) -> ChatCompletionMessageParam:
    content = message["content"]
    if message["role"] == "system":
        return {"role": "system", "content": content}
    if message["role"] == "assistant":
        return {"role": "assistant", "content": content}
    return {"role": "user", "content": content}


class CannedModel:
    """No model configured: a fixed, honest reply that shows what the model would have seen."""

    name = "canned-reply"

    async def answer(self, messages: Sequence[Message]) -> str:
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        knows = "with" if MEMORY_SECTION in system else "without"
        earlier = sum(1 for m in messages if m["role"] != "system") - 1
        return (
            f"(canned reply: no model configured) I got your message {knows} a memory section "
            f"and {earlier} earlier message(s) of this chat."
        )


def model_from_env(environ: dict[str, str] | None = None) -> ChatModel:
    """The OpenAI-compatible model when `OPENAI_BASE_URL` or `OPENAI_API_KEY` is set (model
    `DEMO_MODEL`, default gpt-4o-mini), else the canned reply."""
    env = os.environ if environ is None else environ
    base_url, api_key = env.get("OPENAI_BASE_URL"), env.get("OPENAI_API_KEY")
    if not (base_url or api_key):
        return CannedModel()
    return OpenAICompatibleModel(
        base_url=base_url, api_key=api_key, model=env.get("DEMO_MODEL", DEFAULT_MODEL)
    )


@dataclass(frozen=True)
class TurnOutcome:
    """What one turn did: the context the model got, its answer, and the saved turn."""

    context: dict[str, Any]
    reply: str
    saved: dict[str, Any]

    @property
    def job_id(self) -> str | None:
        job: str | None = self.saved["consolidation"]["job_id"]
        return job


class Orchestrator:
    """One chat of one user: each `run_turn` makes the service's two calls around the model."""

    def __init__(
        self, http: httpx.AsyncClient, model: ChatModel, *, space_id: str, chat_id: str
    ) -> None:
        self.http, self.model, self.space_id, self.chat_id = http, model, space_id, chat_id

    async def run_turn(self, user_text: str) -> TurnOutcome:
        current = [{"role": "user", "content": user_text}]
        # 1. Load and inject: memory in the system prompt, stored history resolved by mode.
        context = await self._post(
            f"/v1/chats/{self.chat_id}/context",
            {"space_id": self.space_id, "system_prompt": SYSTEM_PROMPT, "messages": current},
        )
        # 2. The model call, on exactly the messages the service composed.
        reply = await self.model.answer(context["messages"])
        # 3. Turn-save: the same input and the answer; memory is consolidated in the background.
        # The Idempotency-Key makes a retry of this call safe (nothing saved twice).
        saved = await self._post(
            f"/v1/chats/{self.chat_id}/turns",
            {
                "space_id": self.space_id,
                "messages": current,
                "response": {"content": reply},
                "language_model": self.model.name,
            },
            headers={"Idempotency-Key": str(uuid.uuid4())},
        )
        return TurnOutcome(context, reply, saved)

    async def wait_for_job(self, job_id: str, timeout_seconds: float = 30.0) -> dict[str, Any]:
        """Poll `GET /v1/jobs/{id}` until the consolidation succeeded or died (or the timeout)."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            response = await self.http.get(f"/v1/jobs/{job_id}")
            response.raise_for_status()
            job: dict[str, Any] = response.json()
            if job["status"] in FINISHED_JOB or time.monotonic() >= deadline:
                return job
            await asyncio.sleep(0.1)

    async def _post(
        self, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> dict[str, Any]:
        response = await self.http.post(path, json=body, headers=headers)
        if response.is_error:
            raise ServiceError(response)
        answer: dict[str, Any] = response.json()
        return answer


class ServiceError(RuntimeError):
    """The service refused a call; the message carries its problem+json title and detail."""

    def __init__(self, response: httpx.Response) -> None:
        try:
            problem = response.json()
            detail = f"{problem.get('title')}: {problem.get('detail')}"
        except ValueError:
            detail = response.text[:200]
        super().__init__(
            f"{response.request.method} {response.request.url.path} -> "
            f"{response.status_code} {detail}"
        )
        self.status_code = response.status_code


def memory_section(system_prompt: str | None) -> str | None:
    """The injected "What I know about you" section of a composed system prompt, if any."""
    if not system_prompt or MEMORY_SECTION not in system_prompt:
        return None
    return system_prompt[system_prompt.index(MEMORY_SECTION) :]


def service_client(url: str, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30.0
    )


async def chat_loop(url: str, token: str, *, space_id: str, chat_id: str) -> None:
    model = model_from_env()
    async with service_client(url, token) as http:
        orchestrator = Orchestrator(http, model, space_id=space_id, chat_id=chat_id)
        print(f"chat {chat_id} in space {space_id}, model {model.name}; one message per line")
        for line in sys.stdin:
            if not line.strip():
                continue
            outcome = await orchestrator.run_turn(line.strip())
            print(f"assistant> {outcome.reply}", flush=True)
    if isinstance(model, OpenAICompatibleModel):
        await model.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("CMS_URL", DEFAULT_URL))
    parser.add_argument("--token", default=os.environ.get("CMS_TOKEN"), required=False)
    parser.add_argument("--space", default="demo-space")
    parser.add_argument("--chat", default=f"chat-{uuid.uuid4().hex[:8]}")
    args = parser.parse_args(argv)
    if not args.token:
        parser.error("a token is needed: --token or CMS_TOKEN (python -m app token ...)")
    asyncio.run(chat_loop(args.url, args.token, space_id=args.space, chat_id=args.chat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
