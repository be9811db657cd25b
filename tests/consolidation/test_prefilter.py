"""The pre-filter's table: turns that state something durable must reach the model, chit-chat
must not, and turns the offline engine reads go to the operations call without the gate."""

from datetime import UTC, datetime

import pytest

from app.consolidation.prefilter import is_clearly_non_durable, prefilter
from app.consolidation.rules import Exchange, consolidate_with_rules
from app.consolidation.small_talk import words
from app.profiles.document import empty_profile

NOW = datetime(2026, 6, 17, 11, 40, tzinfo=UTC)

CHIT_CHAT = [
    "Hi there!",
    "Hello again!",
    "Good morning!",
    "Thanks, that helps!",
    "Thank you so much!",
    "Ok, great.",
    "Cool, thanks!",
    "Perfect, thanks a lot.",
    "Haha, nice one.",
    "See you later!",
    "Great, bye!",
    "👍",
    "",
    "What is the difference between IFRS 9 stage 2 and stage 3?",
    "Which central bank sets Swiss interest rates?",
    "What does LGD stand for?",
    "Why do banks hold capital buffers?",
    "How does the SNB's policy rate affect mortgage pricing?",
    "How do I compute a lifetime PD from a 12-month PD?",
    "What can we do about a non-stationary time series?",
    "Can you write a Python function that discounts a list of cash flows?",
    "Explain the difference between a VaR and an expected shortfall.",
    "Write a SQL query that lists the ten largest exposures.",
    "Summarise the Basel IV output floor.",
    "Tell me about the history of the Swiss franc.",
    "Thanks! What is a credit conversion factor?",
    "Can you help me understand the output floor?",
    "Could you walk me through a Monte Carlo VaR?",
    "Help me debug this query.",
    "Thanks, that's clear.",
    "Thanks, you've been helpful.",
    "Fair enough.",
    "Okay, bye for now.",
    "That's a pity, but fine.",
    "Ha. How far away is the Moon?",
    "Any tips for a smooth cutover?",
]

MUST_REACH_THE_MODEL = [
    # first-person statements, in any shape
    "I'm a credit risk analyst at a Swiss private bank.",
    "Hi, I'm Anna.",
    "Hi Anna here",
    "Thanks! By the way, I moved to Geneva.",
    "Most of my week now goes into the Basel IV output floor impact study.",
    "My English is fine, but German is my mother tongue.",
    "We are migrating our PD models to Python.",
    "As a quant I mostly care about the maths.",
    "What is IFRS 9? Btw I'm a quant.",
    "How do I tell my boss I'm leaving?",
    "Should I learn Rust?",
    "Can I use pandas for this at my job?",
    "What's the weather in Zurich, where I live?",
    # standing preferences and memory requests without "I" or "my"
    "Use tables when comparing numbers.",
    "Always answer in German.",
    "Keep answers short.",
    "Could you answer in German from now on?",
    "No emojis, please.",
    "Remember that the audit is on Friday.",
    "Forget the report.",
    "Could you forget about the ICAAP?",
    "Explain things with examples from now on.",
    "Write shorter answers.",
    # confirmations that may accept something the assistant proposed
    "Yes",
    "Yes, please.",
    "Sure",
    "No",
    # other languages, third-person self-descriptions, anything else
    "Ich arbeite bei der UBS.",
    "Wo arbeite ich?",
    "Je suis analyste à Genève.",
    "The user is a data scientist.",
    "Data scientist, 5 years, Python.",
    "Anything else?",
    "Can you help me with my thesis?",
    "Tell me what my name is.",
    "Help me, I'm new to Rust.",
    # long messages
    "What is a hash map? " * 40,
]


@pytest.mark.parametrize("text", CHIT_CHAT)
def test_chit_chat_needs_no_model_call(text: str) -> None:
    assert is_clearly_non_durable(text)
    assert prefilter([text], engine_reads_facts=False, forget_requested=False) == "noop"


@pytest.mark.parametrize("text", MUST_REACH_THE_MODEL)
def test_anything_that_may_be_durable_reaches_the_model(text: str) -> None:
    result = consolidate_with_rules(empty_profile("u"), [Exchange(text, "Noted.", NOW)])

    decision = prefilter([text], result.decision == "UPDATE", result.forget_requested)

    assert decision in {"gate", "operations"}


@pytest.mark.parametrize(
    "text",
    [
        "I'm a credit risk analyst at a Swiss private bank.",
        "Please keep answers concise.",
        "Remind me to check the scenario weights next week.",
        "From now on, call me Dana.",
        "Please forget my employer.",  # a forget request, even when nothing matches
    ],
)
def test_what_the_offline_engine_reads_skips_the_gate(text: str) -> None:
    result = consolidate_with_rules(empty_profile("u"), [Exchange(text, "Noted.", NOW)])

    assert prefilter([text], result.decision == "UPDATE", result.forget_requested) == "operations"


def test_one_durable_message_in_a_batch_sends_the_batch_to_the_model() -> None:
    batch = ["Thanks!", "What does LGD stand for?", "Most of my week goes into the ICAAP."]

    assert prefilter(batch, engine_reads_facts=False, forget_requested=False) == "gate"
    assert prefilter(batch[:2], engine_reads_facts=False, forget_requested=False) == "noop"


# --- every script -----------------------------------------------------------------------------

FACTS_IN_EVERY_SCRIPT = {
    "Chinese": "我搬到了里斯本。",
    "Japanese": "私は大阪に住んでいます。",
    "Korean": "저는 서울에서 간호사로 일해요.",
    "Arabic": "أعمل مهندسة برمجيات في دبي.",
    "Hebrew": "אני גר בחיפה ועובד כמורה.",
    "Russian": "Я переехал в Казань.",
    "Hindi": "मैं पुणे में डेटा वैज्ञानिक हूँ।",
    "Greek": "Μένω στη Θεσσαλονίκη και διδάσκω φυσική.",
    "Thai": "ผมทำงานเป็นนักบัญชีที่เชียงใหม่",
    "Armenian": "Ես ապրում եմ Երևանում։",
    "Georgian": "მე ვცხოვრობ თბილისში.",
    "Persian": "من در تهران زندگی می‌کنم.",
    "Ukrainian": "Я працюю лікаркою у Львові.",
    "Tamil": "நான் சென்னையில் வசிக்கிறேன்.",
}
"""A fact in each of these scripts; the first eight are the end-to-end tests' too."""

SMALL_TALK_IN_OTHER_LANGUAGES = [
    "谢谢",
    "谢谢！",
    "好的，谢谢！",
    "非常感谢。",
    "謝謝你！",
    "ありがとうございます！",
    "おはようございます。",
    "감사합니다!",
    "정말 감사합니다.",
    "спасибо",
    "Спасибо большое!",
    "Привет!",
    "До свидания!",
    "شكرا",
    "شكرًا جزيلاً!",
    "مع السلامة",
    "תודה רבה!",
    "शुक्रिया!",
    "धन्यवाद।",
    "Ευχαριστώ πολύ!",
    "Καλημέρα!",
    "merci beaucoup",
    "Merci, au revoir !",
    "Danke schön!",
    "Vielen Dank, tschüss!",
    "¡Muchas gracias!",
    "Adios, hasta luego.",
    "Grazie mille!",
    "Obrigada, tchau!",
    "ขอบคุณครับ",
    "Teşekkürler!",
    "Ｔｈａｎｋｓ！",  # full-width letters are the same words
    "❤️",  # a variation selector is a mark, not a letter
    "👨‍👩‍👧 🎉",  # joiners between emoji
    "…",
]


@pytest.mark.parametrize("language", FACTS_IN_EVERY_SCRIPT)
def test_a_fact_in_any_script_reaches_the_model(language: str) -> None:
    text = FACTS_IN_EVERY_SCRIPT[language]
    result = consolidate_with_rules(
        empty_profile("u"), [Exchange(text, "Noted.", NOW)], keep_unread=False
    )

    assert not is_clearly_non_durable(text)
    assert prefilter([text], result.decision == "UPDATE", result.forget_requested) == "gate"
    assert prefilter(["Thanks!", text], False, False) == "gate"


@pytest.mark.parametrize("text", SMALL_TALK_IN_OTHER_LANGUAGES)
def test_small_talk_it_recognises_in_another_language_needs_no_model_call(text: str) -> None:
    assert is_clearly_non_durable(text)
    assert prefilter([text], engine_reads_facts=False, forget_requested=False) == "noop"


@pytest.mark.parametrize(
    "text",
    [
        # small talk with a fact after it, without a space or a full stop between them
        "谢谢我搬到了里斯本",
        "谢谢！我搬到了里斯本",
        "Thanks! 我搬到了里斯本。",
        "谢谢你的帮助，我明天去东京。",  # "thanks for your help" is not a listed phrase
        "Спасибо, я переехал в Казань.",
        "Merci, je suis analyste à Genève.",
        # look-alike letters: a Cyrillic "Т" and "а" in "Thanks" is not the English word
        "Тhаnks!",
        # digits of any script are not emoji: a number may answer the assistant's question
        "2026",
        "٢٠٢٦",
        "४२",
        # an English question or task holding words it cannot read
        "What is 我的名字?",
        "Translate 我搬到了里斯本 into English.",
        "Is this right: Я живу в Москве?",
        # zero-width and bidi controls between the words of a fact
        "Я\u200bпереехал\u200bв\u200bКазань.",
        "\u202eأعمل في دبي\u202c",
        # eleven listed words are too many for small talk
        "спасибо " * 11,
    ],
)
def test_hostile_or_mixed_text_is_not_taken_for_small_talk(text: str) -> None:
    assert not is_clearly_non_durable(text)
    assert prefilter([text], engine_reads_facts=False, forget_requested=False) == "gate"


def test_a_message_of_marks_alone_has_no_words() -> None:
    assert words("\u0301\u0301\u064b") == []
    assert is_clearly_non_durable("\u0301\u0301")


def test_words_are_read_in_every_script_and_compared_without_optional_marks() -> None:
    assert words("Μένω στη Θεσσαλονίκη!") == ["μενω", "στη", "θεσσαλονικη"]
    assert words("मैं पुणे में हूँ।") == ["मैं", "पुणे", "में", "हूँ"]
    assert words("شكرًا جزيلاً") == words("شكرا جزيلا")
    assert words("d’accord, c'est ça") == ["d'accord", "c'est", "ca"]
    assert words("好的，谢谢！") == ["好的", "谢谢"]
