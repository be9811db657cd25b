"""Disguised values and facts in every script, by every write path: eval/corpus-disguises.yaml
(card, IBAN and id numbers in the digits of other scripts, glued labels, zero-width and bidi
characters, look-alike letters, full-width punctuation, Markdown and HTML wrappers, odd digit
groups, promotion phrased as a preference) and eval/corpus-benign-scripts.yaml (facts in eight
scripts and more, with numbers that are not identifiers) replayed through a real service on a
scratch database, with a model that writes whatever the user asks into memory: chat turns
consolidated by the worker, `PUT /v1/me/memory`, MCP `edit_memory`, the restore of a version,
the user's import of their export and a company import. Every stored version, policy record and
user export is read back: no disguised value may be in any of them (compared in canonical form,
so a value stored undisguised counts), and at least 98 % of the benign facts must be stored
exactly as written (NFC-equal). The corpora themselves are checked: their numbers are valid once
undisguised, every class is there, and a malformed corpus is refused naming what is wrong.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from pathlib import Path

import phonenumbers
import pytest
from stdnum import iban, luhn
from stdnum.ch import ssn as ahv
from stdnum.de import idnr
from stdnum.fr import nir
from stdnum.us import ssn

from app.detectors import Category
from eval.__main__ import main as eval_main
from eval.corpus import Corpus, CorpusError
from eval.policy import PathFigures, PolicyReport, canonical, holds, kept_in
from eval.policy_corpus import (
    BENIGN_SCRIPTS,
    DISGUISES,
    BenignTurn,
    load_policy_corpus,
)
from eval.policy_replay import PATHS
from eval.report import Prices, render
from eval.run import RunOptions, run_eval

CORPUS = load_policy_corpus(DISGUISES, BENIGN_SCRIPTS)
TARGET_EXACT = 0.98
CLASSES = {
    "fullwidth-digits",
    "arabic-indic-digits",
    "extended-arabic-indic-digits",
    "devanagari-digits",
    "bengali-digits",
    "thai-digits",
    "math-bold-digits",
    "math-monospace-digits",
    "glued-label",
    "zero-width-space",
    "zero-width-non-joiner",
    "zero-width-joiner",
    "word-joiner",
    "soft-hyphen",
    "bidi-controls",
    "cyrillic-lookalike",
    "greek-lookalike",
    "fullwidth-colon",
    "fullwidth-at",
    "quote-marker",
    "parentheses",
    "backticks",
    "emphasis",
    "strong",
    "strikethrough",
    "html-comment",
    "markdown-escape",
    "spaced-digits",
    "dotted-digits",
    "dashed-digits",
    "preference-promotion",
}
SCRIPTS: tuple[str, ...] = ("HIRAGANA|KATAKANA", "HANGUL", "CJK", "ARABIC", "HEBREW", "CYRILLIC")
SCRIPTS += ("DEVANAGARI", "GREEK")
"""Unicode's names of the eight scripts' letters (Japanese before the Chinese characters it
also writes)."""
IDS: dict[int, Callable[[str], bool]] = {
    9: ssn.is_valid,
    11: idnr.is_valid,
    13: ahv.is_valid,
    15: nir.is_valid,
}
_IBAN = re.compile(r"[A-Z]{2}\d{2}[A-Z0-9]{10,30}")


def _undisguised(value: str) -> str:
    """The value's letters and digits as plain ASCII (look-alike letters are left as they are:
    no number holds one)."""
    return re.sub(r"[\W_]+", "", canonical(value))


def _values(category: Category) -> list[str]:
    return [v for turn in CORPUS.attack_turns if category in turn.categories for v in turn.values]


# --- the corpora ----------------------------------------------------------------------------------


def test_the_disguise_corpus_holds_150_values_of_every_class_and_category() -> None:
    turns = CORPUS.attack_turns
    values = [value for turn in turns for value in turn.values]
    assert len(values) >= 150
    assert {turn.disguise for turn in turns} >= CLASSES
    assert {c for turn in turns for c in turn.categories} == set(Category)
    for category in Category:  # each category disguised in more than one way
        assert len({turn.disguise for turn in turns if category in turn.categories}) >= 3
    for user in CORPUS.attacker:  # a value is searched in its user's texts: no two alike there
        own = [canonical(value) for turn in user.turns for value in turn.values]
        assert len(set(own)) == len(own), user.id
    misses = CORPUS.missed_turns
    assert {turn.disguise for turn in misses} >= {"split-bullets", "split-turns", "base64"}
    assert all(turn.reason for turn in misses)
    assert not {turn.owner for turn in misses} & {turn.owner for turn in turns}


def test_every_disguised_number_is_valid_once_undisguised() -> None:
    cards = _values(Category.PAYMENT_CARDS)
    assert len(cards) >= 30
    assert all(luhn.is_valid(re.sub(r"\D", "", _undisguised(card))) for card in cards), cards
    accounts = _values(Category.BANK_ACCOUNTS)
    assert len(accounts) >= 15
    for account in accounts:
        found = _IBAN.search(_undisguised(account).upper())
        assert found is not None, account
        assert iban.is_valid(found[0]), account
    ids = _values(Category.NATIONAL_IDS)
    assert len(ids) >= 15
    kinds = set()
    for value in ids:
        digits = re.sub(r"\D", "", _undisguised(value))
        assert IDS[len(digits)](digits), value
        kinds.add(len(digits))
    assert kinds == set(IDS)
    phones = _values(Category.PHONE_NUMBERS)
    assert len(phones) >= 10
    for phone in phones:
        number = phonenumbers.parse("+" + re.sub(r"\D", "", _undisguised(phone)))
        assert phonenumbers.is_valid_number(number), phone


def _script(text: str) -> str:
    names = [unicodedata.name(char, "") for char in text if char.isalpha()]
    for script in SCRIPTS:
        if any(re.match(script, name) for name in names):
            return script
    return "other"


def test_the_benign_corpus_holds_100_facts_in_eight_scripts_with_numbers() -> None:
    facts = CORPUS.benign_turns
    assert len(facts) >= 100
    assert all(fact.exact and fact.keep == fact.user for fact in facts)
    assert all(unicodedata.normalize("NFC", fact.user) == fact.user for fact in facts)
    by_script: dict[str, int] = {}
    for fact in facts:
        by_script[_script(fact.user)] = by_script.get(_script(fact.user), 0) + 1
    assert all(by_script.get(script, 0) >= 10 for script in SCRIPTS), by_script
    numbers = [fact for fact in facts if any(char.isdigit() for char in fact.user)]
    assert len(numbers) >= 0.6 * len(facts)
    native = [f for f in facts if any(c.isdigit() and not c.isascii() for c in f.user)]
    assert len(native) >= 8  # years, amounts and team sizes in the script's own digits


def test_the_search_finds_a_value_however_it_is_disguised_or_undone() -> None:
    card = "４５３２ ０１３４ ６０３３ ６９０４"
    for stored in ("Card 4532013460336904", "٤٥٣٢٠١٣٤٦٠٣٣٦٩٠٤", "4532\u200b0134 6033 6904"):
        assert holds(card, stored.casefold(), [stored]), stored
    split = "- Card starts 4532 0134\n- and ends 6033 6904"
    assert holds("4532013460336904", split, split.splitlines())
    redacted = "Card ４５３２ ０１３４ [redacted: card] ６９０４"
    assert not holds(card, redacted.casefold(), [redacted])
    assert holds("p\u0430ssword", "my p\u0430ssword", ["my p\u0430ssword"])
    assert not holds("p\u0430ssword", "my password", ["my password"])  # not folded as one


def test_a_fact_compared_as_written_is_kept_only_nfc_equal() -> None:
    fact = BenignTurn(
        "Café 2019.", "Ok.", "Café 2019.", CORPUS.benign_turns[0].section, "Café 2019."
    )
    exact = BenignTurn(fact.user, fact.assistant, fact.bullet, fact.section, fact.keep, True)
    decomposed = unicodedata.normalize("NFD", "- Café 2019.")
    assert kept_in(exact, decomposed)
    assert kept_in(fact, "- CAFÉ 2019.")
    assert not kept_in(exact, "- CAFÉ 2019.")
    assert not kept_in(exact, "- Cafe 2019.")


HOSTILE = {
    "a known miss without its reason": (
        "users: [{id: a, turns: [{user: 'x 1', assistant: 'y', category: secrets, "
        "values: ['x 1']}]}]\nknown_misses: [{id: b, turns: [{user: 'z 2', assistant: 'y', "
        "category: secrets, class: base64, values: ['z 2']}]}]",
        "reason",
    ),
    "a class that is not a name": (
        "users: [{id: a, turns: [{user: 'x 1', assistant: 'y', category: secrets, "
        "class: 'Full Width!', values: ['x 1']}]}]",
        "class",
    ),
    "a value the user did not write": (
        "users: [{id: a, turns: [{user: 'x 1', assistant: 'y', category: secrets, "
        "class: glued-label, values: ['4111']}]}]",
        "every value",
    ),
    "an unknown top-level key": (
        "users: [{id: a, turns: [{user: 'x 1', assistant: 'y', category: secrets, "
        "values: ['x 1']}]}]\nknwon_misses: []",
        "unknown keys",
    ),
    "an unknown key in a turn": (
        "users: [{id: a, turns: [{user: 'x 1', assistant: 'y', category: secrets, "
        "values: ['x 1'], klass: plain}]}]",
        "expected exactly the keys",
    ),
    "empty values outside the known misses": (
        "users: [{id: a, turns: [{user: 'x 1', assistant: 'y', category: secrets, values: []}]}]",
        "values",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_malformed_disguise_corpus_is_refused_naming_the_field(tmp_path: Path, case: str) -> None:
    text, named = HOSTILE[case]
    path = tmp_path / "attacker.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CorpusError, match=named):
        load_policy_corpus(path, BENIGN_SCRIPTS)


@pytest.mark.parametrize("compare", ["casefold", "", "[nfc]"])
def test_a_benign_corpus_with_an_unknown_comparison_is_refused(
    tmp_path: Path, compare: str
) -> None:
    path = tmp_path / "benign.yaml"
    body = BENIGN_SCRIPTS.read_text(encoding="utf-8").replace("compare: nfc", f"compare: {compare}")
    path.write_text(body, encoding="utf-8")
    with pytest.raises(CorpusError, match="compare"):
        load_policy_corpus(DISGUISES, path)


@pytest.mark.parametrize("paths", ["chat,bogus", "", " , ", "PUT"])
def test_make_eval_refuses_a_write_path_it_does_not_know(
    paths: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert eval_main(["--suite", "policy", "--paths", paths]) == 2
    assert "--paths must name some of chat, put, mcp, restore, import, company" in (
        capsys.readouterr().err
    )


# --- both corpora through every write path --------------------------------------------------------


@pytest.fixture(scope="module")
async def report(server_url: str) -> PolicyReport:
    """Both corpora through every path once (each user's chat turns in one burst), with the
    obedient model: about a minute on a quiet machine."""
    options = RunOptions(
        engine="obedient",
        model="gpt-4o-mini",
        prices=Prices(0.15, 0.6),
        policy=CORPUS,
        policy_names=("disguises", "benign scripts"),
        policy_burst=True,
    )
    run, _ = await run_eval(Corpus(()), options, server=server_url)
    assert run.policy is not None
    assert "Values stored per class of disguise" in render(run)
    return run.policy


def _path(report: PolicyReport, name: str) -> PathFigures:
    index = PATHS.index(name)
    assert len(report.paths) == len(PATHS)
    return report.paths[index]


@pytest.mark.parametrize("name", PATHS)
async def test_no_disguised_value_is_stored_by_the_path(report: PolicyReport, name: str) -> None:
    path = _path(report, name)
    stored = sorted(
        {(leak.disguise, leak.value, leak.user_id) for leak in path.leaks if not leak.missed}
    )
    assert stored == [], f"{path.path}: {len(stored)} disguised values stored"
    assert path.notes == ()
    if path.refused is not None:  # an edit: refused exactly when a category is dropped
        assert path.refused == path.refusals_expected
    # The known misses went through the path too (searched, reported, not counted).
    assert len(path.users) == len(CORPUS.attackers) + len(CORPUS.benign)


@pytest.mark.parametrize("name", PATHS)
async def test_benign_facts_in_every_script_are_stored_as_written(
    report: PolicyReport, name: str
) -> None:
    path = _path(report, name)
    assert path.facts == len(CORPUS.benign_turns)
    assert path.kept / path.facts >= TARGET_EXACT, [(f.user_id, f.text) for f in path.lost]


async def test_the_search_reads_every_version_and_export_of_every_path(
    report: PolicyReport,
) -> None:
    """The leak search is not vacuous: it read the versions, records and exports of every
    user of every path, the chat turns were consolidated, and what the policy refused or
    redacted is recorded."""
    chat = _path(report, "chat")
    assert chat.jobs.get("updated", 0) > len(CORPUS.attackers)
    assert not any(key.startswith("dead") for key in chat.jobs)
    users = len(PATHS) * (len(CORPUS.attackers) + len(CORPUS.benign))
    assert report.texts_searched > 4 * users  # each user's versions, twice (table, export)
    assert report.values == sum(len(turn.values) for turn in CORPUS.attack_turns)
    dropped = {key.split()[0] for key in report.records if key.endswith(" drop")}
    assert dropped == {c.value for c in Category} - {"email_addresses", "phone_numbers"}
    assert report.records.get("phone_numbers redact", 0) > 0
    assert {figures.disguise for figures in report.classes if not figures.missed} >= CLASSES
