"""LangChain adapters (the `langchain` extra): a chat message history over the service's stored
chats, and a runnable that wraps any chat model with the orchestrator's two calls.

- `MemoryChatMessageHistory` — a `BaseChatMessageHistory`: `messages` lists the chat's stored
  messages, `add_messages` saves each human/AI exchange as a turn, `clear` deletes the chat.
- `ContextMemoryRunnable` — input → `POST /context` (memory injected, history resolved by mode)
  → the chat model → `POST /turns` (saved, consolidation queued). With a `ChatPromptTemplate`
  whose history sits in a placeholder (`("placeholder", "{chat_history}")`), the messages given
  for that variable go to the service as `placeholder_history`, so `auto` mode skips its own
  stored history instead of duplicating it (seed scenario S4).

Both take a sync `MemoryClient` for the sync methods and an `AsyncMemoryClient` for the async
ones; give either or both (without the async one, LangChain runs the sync path in an executor).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any, cast

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnableConfig

from context_memory_client.async_client import AsyncMemoryClient
from context_memory_client.errors import NotFound
from context_memory_client.models import (
    ContextRequest,
    ContextResponse,
    HistoryMode,
    MessageIn,
    ResponseIn,
    Role,
    TurnRequest,
    TurnSaved,
)
from context_memory_client.sync_client import MemoryClient

__all__ = ["ContextMemoryRunnable", "MemoryChatMessageHistory", "from_langchain", "to_langchain"]

RunnableInput = str | Sequence[BaseMessage] | PromptValue | Mapping[str, Any]


def to_langchain(role: Role, content: str) -> BaseMessage:
    """A service message as the LangChain message of its role."""
    if role == "system":
        return SystemMessage(content=content)
    if role == "assistant":
        return AIMessage(content=content)
    return HumanMessage(content=content)


def from_langchain(message: BaseMessage) -> MessageIn:
    """A LangChain message as a service message (`ValueError` for tool or function messages,
    which the service does not store)."""
    roles: dict[str, Role] = {"system": "system", "human": "user", "ai": "assistant"}
    if message.type not in roles:
        raise ValueError(f"a {message.type!r} message has no role in the service's history")
    return MessageIn(role=roles[message.type], content=message.text)


class _Clients:
    def __init__(self, client: MemoryClient | None, async_client: AsyncMemoryClient | None) -> None:
        if client is None and async_client is None:
            raise ValueError("give a MemoryClient, an AsyncMemoryClient, or both")
        self._sync, self._async = client, async_client

    @property
    def sync(self) -> MemoryClient:
        if self._sync is None:
            raise RuntimeError("this adapter has only an AsyncMemoryClient: use the async methods")
        return self._sync

    @property
    def async_(self) -> AsyncMemoryClient | None:
        return self._async


class MemoryChatMessageHistory(BaseChatMessageHistory):
    """One chat of the token's user, as LangChain chat history.

    The service stores exchanges, so `add_messages` saves a turn each time an AI message
    follows human (or system) messages; messages added without their answer yet are kept in
    this object (and listed last by `messages`) until it arrives. Turns are saved in
    `record_all` mode, so every added message is stored, and each saved turn queues a
    consolidation of the user's memory when context memory is active in `space_id`.
    """

    def __init__(
        self,
        chat_id: str,
        *,
        space_id: str,
        client: MemoryClient | None = None,
        async_client: AsyncMemoryClient | None = None,
    ) -> None:
        self.chat_id, self.space_id = chat_id, space_id
        self._clients = _Clients(client, async_client)
        self._pending: list[BaseMessage] = []

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override] # a read-only view
        try:
            stored = list(self._clients.sync.iter_messages(self.chat_id))
        except NotFound:  # no turn saved yet: an empty chat
            stored = []
        return [to_langchain(m.role, m.content) for m in stored] + self._pending

    async def aget_messages(self) -> list[BaseMessage]:
        client = self._clients.async_
        if client is None:
            return await super().aget_messages()
        stored: list[BaseMessage] = []
        try:
            async for m in client.iter_messages(self.chat_id):
                stored.append(to_langchain(m.role, m.content))
        except NotFound:
            stored = []
        return stored + self._pending

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        for turn in self._complete_turns(messages):
            self._clients.sync.save_turn(self.chat_id, turn)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        client = self._clients.async_
        if client is None:
            await super().aadd_messages(messages)
            return
        for turn in self._complete_turns(messages):
            await client.save_turn(self.chat_id, turn)

    def clear(self) -> None:
        self._pending.clear()
        with suppress(NotFound):  # nothing stored: already clear
            self._clients.sync.delete_chat(self.chat_id)

    async def aclear(self) -> None:
        client = self._clients.async_
        if client is None:
            await super().aclear()
            return
        self._pending.clear()
        with suppress(NotFound):
            await client.delete_chat(self.chat_id)

    def _complete_turns(self, messages: Sequence[BaseMessage]) -> list[TurnRequest]:
        turns: list[TurnRequest] = []
        for message in messages:
            if message.type != "ai":
                from_langchain(message)  # refuse what cannot be stored before saving anything
                self._pending.append(message)
                continue
            if not self._pending:
                raise ValueError("an AI message needs the human message it answers before it")
            request = [from_langchain(m) for m in self._pending]
            self._pending = []
            turns.append(
                TurnRequest(
                    space_id=self.space_id,
                    messages=request,
                    response=ResponseIn(content=message.text),
                    history_mode="record_all",
                )
            )
        return turns


class ContextMemoryRunnable(Runnable[RunnableInput, AIMessage]):
    """`model` wrapped in the two calls of a chat turn: context before it, turn-save after.

    Input: a string (one human message), a list of messages or a `PromptValue` (the current
    input), or with `prompt` a mapping of the template's variables, where `history_key` (default
    `chat_history`) holds the placeholder history. A leading system message becomes the
    request's `system_prompt`, which the service composes with the "What I know about you"
    section. The answer is the model's `AIMessage`, with `response_metadata["context_memory"]`
    holding the saved turn's id and consolidation.
    """

    def __init__(  # noqa: PLR0913 - the turn's settings are keyword-only
        self,
        model: BaseChatModel,
        *,
        chat_id: str,
        space_id: str,
        client: MemoryClient | None = None,
        async_client: AsyncMemoryClient | None = None,
        prompt: ChatPromptTemplate | None = None,
        history_mode: HistoryMode = "auto",
        history_key: str = "chat_history",
        language_model: str | None = None,
    ) -> None:
        self.model, self.chat_id, self.space_id = model, chat_id, space_id
        self.language_model = language_model  # the model's name, recorded with each turn
        self.prompt, self.history_mode, self.history_key = prompt, history_mode, history_key
        self._clients = _Clients(client, async_client)

    def invoke(
        self, input: RunnableInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AIMessage:
        system_prompt, current, placeholder = self._split(input)
        context = self._clients.sync.load_context(
            self.chat_id, self._context_request(system_prompt, current, placeholder)
        )
        answer = self.model.invoke(_model_input(context), config, **kwargs)
        saved = self._clients.sync.save_turn(
            self.chat_id, self._turn_request(current, placeholder, answer)
        )
        return _with_turn(answer, saved)

    async def ainvoke(
        self, input: RunnableInput, config: RunnableConfig | None = None, **kwargs: Any
    ) -> AIMessage:
        client = self._clients.async_
        if client is None:
            return await super().ainvoke(input, config, **kwargs)
        system_prompt, current, placeholder = self._split(input)
        context = await client.load_context(
            self.chat_id, self._context_request(system_prompt, current, placeholder)
        )
        answer = await self.model.ainvoke(_model_input(context), config, **kwargs)
        saved = await client.save_turn(
            self.chat_id, self._turn_request(current, placeholder, answer)
        )
        return _with_turn(answer, saved)

    def _split(
        self, value: RunnableInput
    ) -> tuple[str | None, list[MessageIn], list[MessageIn] | None]:
        """(system prompt, current messages, placeholder history) of one input."""
        placeholder: list[MessageIn] | None = None
        if isinstance(value, Mapping):
            if self.prompt is None:
                raise TypeError("a mapping input needs `prompt`, the template it fills")
            history = list(value.get(self.history_key) or [])
            placeholder = [from_langchain(m) for m in history] or None
            messages = self.prompt.format_messages(**{**value, self.history_key: []})
        elif isinstance(value, str):
            messages = [HumanMessage(content=value)]
        elif isinstance(value, PromptValue):
            messages = value.to_messages()
        else:
            messages = list(value)
        system_prompt = None
        if messages and messages[0].type == "system":
            system_prompt, messages = messages[0].text, messages[1:]
        return system_prompt, [from_langchain(m) for m in messages], placeholder

    def _context_request(
        self,
        system_prompt: str | None,
        current: list[MessageIn],
        placeholder: list[MessageIn] | None,
    ) -> ContextRequest:
        return ContextRequest(
            space_id=self.space_id,
            messages=current,
            history_mode=self.history_mode,
            system_prompt=system_prompt,
            placeholder_history=placeholder,
        )

    def _turn_request(
        self, current: list[MessageIn], placeholder: list[MessageIn] | None, answer: BaseMessage
    ) -> TurnRequest:
        return TurnRequest(
            space_id=self.space_id,
            messages=[m for m in current if m.role != "system"],
            response=ResponseIn(content=answer.text),
            history_mode=self.history_mode,
            placeholder_history=placeholder,
            language_model=self.language_model,
        )


def _model_input(context: ContextResponse) -> list[BaseMessage]:
    return [to_langchain(m.role, m.content) for m in context.messages]


def _with_turn(answer: BaseMessage, saved: TurnSaved) -> AIMessage:
    metadata = {
        **answer.response_metadata,
        "context_memory": {
            "turn_id": saved.turn_id,
            "consolidation": saved.consolidation.status,
            "job_id": saved.consolidation.job_id,
        },
    }
    return cast(AIMessage, answer.model_copy(update={"response_metadata": metadata}))
