"""Small talk in the languages the service recognises, and the Unicode reading it rests on.

Pure, no I/O. A text's words are runs of letters, marks and digits of any script (Unicode
categories L, M and N); everything else (spaces, punctuation, symbols, emoji, format characters
such as zero-width joiners and bidi controls) separates them. A word is compared by its key:
NFKC, case-folded, without the optional marks of Latin, Greek, Cyrillic, Hebrew and Arabic
writing (accents, vowel points, harakat, tatweel), so "Adiós", "adios" and "ＡＤＩＯＳ" are one
word, as are "شكرًا" and "شكرا".

Scripts written without spaces (Chinese, Japanese, Thai) have no words to look up one by one:
a run of them is a word only as a whole, so the lists hold whole small-talk phrases there
("谢谢", "ありがとうございます"), and "谢谢你的帮助" is not small talk.

`SMALL_TALK_LANGUAGES` names the languages whose small talk is listed (docs/model-cost.md).
Deliberately left out of every language: yes, no, sure and please ("ja", "oui", "да", "はい",
"bitte", "пожалуйста", ...): they may confirm or refuse something the assistant proposed to
remember.
"""

from __future__ import annotations

import unicodedata
from typing import Final

SMALL_TALK_LANGUAGES: Final = (
    "English",
    "German",
    "French",
    "Spanish",
    "Italian",
    "Portuguese",
    "Russian",
    "Greek",
    "Arabic",
    "Hebrew",
    "Hindi",
    "Chinese",
    "Japanese",
    "Korean",
    "Thai",
    "Turkish",
)

MAX_SMALL_TALK_WORDS: Final = 10
"""A longer sentence is not small talk, whatever its words."""

_ENGLISH: Final = """
hi hello hey hiya howdy thanks thank thx ty cheers you so much very really a lot again ok okay
cool great nice perfect awesome excellent wonderful brilliant fantastic amazing good morning
afternoon evening night day bye goodbye see later soon that this it helps helped helpful was is
that's it's makes sense got understood alright fine lol haha hehe wow all there everyone have
take care one job well done clear useful interesting ha right fair enough for now today tomorrow
been you've you're pity but
"""
_GERMAN: Final = """
hallo hi hey moin servus grüezi guten gute morgen tag abend nacht danke dankeschön vielen
vielmals herzlichen dank sehr super toll prima klasse perfekt genial alles klar gut okay
tschüss tschüs ciao bis bald später dann auf wiedersehen schönen schön
"""
_FRENCH: Final = """
bonjour bonsoir salut coucou merci beaucoup mille fois bonne journée soirée nuit au revoir à
bientôt plus tard demain d'accord parfait super génial top excellent très bien c'est cool
"""
_SPANISH: Final = """
hola buenos buenas días tardes noches gracias muchas muchísimas mil adiós chao chau hasta luego
pronto mañana vale perfecto genial estupendo excelente muy bien
"""
_ITALIAN: Final = """
ciao salve buongiorno buonasera buonanotte grazie mille tante arrivederci presto perfetto
ottimo benissimo va bene
"""
_PORTUGUESE: Final = """
olá oi bom boa dia tarde noite obrigado obrigada muito tchau até logo mais perfeito ótimo
valeu beleza
"""
_RUSSIAN: Final = """
привет здравствуйте здравствуй спасибо большое огромное пока до свидания скорого доброе утро
добрый день вечер спокойной ночи отлично хорошо понятно ясно круто супер класс ок окей ладно
всё все
"""
_GREEK: Final = """
γεια σου σας χαίρετε καλημέρα καλησπέρα καληνύχτα ευχαριστώ πολύ αντίο τα λέμε εντάξει
τέλεια ωραία
"""
_ARABIC: Final = """
مرحبا أهلا اهلا السلام عليكم وعليكم شكرا جزيلا صباح مساء الخير النور مع السلامة وداعا
تمام ممتاز رائع حسنا
"""
_HEBREW: Final = """
שלום היי תודה רבה להתראות ביי בוקר ערב לילה טוב מעולה סבבה אחלה יופי בסדר
"""
_HINDI: Final = """
नमस्ते नमस्कार धन्यवाद शुक्रिया बहुत बहुत अलविदा फिर मिलेंगे ठीक है अच्छा बढ़िया शुभ रात्रि
"""
_KOREAN: Final = """
안녕하세요 안녕 감사합니다 고맙습니다 고마워요 고마워 정말 대단히 좋아요 좋네요 알겠습니다
알겠어요 안녕히 가세요 계세요 수고하세요
"""
_TURKISH: Final = """
merhaba selam teşekkürler teşekkür ederim sağ ol olun çok güle hoşça kal tamam harika süper
"""
_WHOLE_PHRASES: Final = """
你好 您好 大家好 早上好 早安 下午好 晚上好 晚安 谢谢 谢谢你 谢谢您 多谢 非常感谢 感谢 太感谢了
再见 拜拜 回头见 好的 好 明白了 知道了 太好了 不错 哈哈 哈哈哈 謝謝 謝謝你 謝謝您 多謝 非常感謝
再見 早晨
こんにちは こんばんは おはよう おはようございます ありがとう
ありがとうございます ありがとうございました どうもありがとう どうも
ございます さようなら またね じゃあね おやすみ おやすみなさい 了解
了解です わかりました 分かりました なるほど すごい いいね お疲れ様です
สวัสดี สวัสดีครับ สวัสดีค่ะ ขอบคุณ ขอบคุณครับ ขอบคุณค่ะ ขอบคุณมาก ลาก่อน โอเค
"""

_OPTIONAL_MARKS: Final = (
    (0x0300, 0x036F),  # combining diacritics of Latin, Greek and Cyrillic (accents, breve, ...)
    (0x0591, 0x05C7),  # Hebrew points and cantillation
    (0x0610, 0x061A),  # Arabic signs above and below
    (0x064B, 0x065F),  # Arabic harakat and tanween
    (0x0670, 0x0670),  # Arabic superscript alef
)
_TATWEEL: Final = "\u0640"


def word_key(word: str) -> str:
    """`word` as it is compared with the lists (module docstring)."""
    folded = unicodedata.normalize("NFKC", word).casefold().replace(_TATWEEL, "")
    bare = "".join(
        char
        for char in unicodedata.normalize("NFD", folded)
        if not any(low <= ord(char) <= high for low, high in _OPTIONAL_MARKS)
    )
    return unicodedata.normalize("NFC", bare)


def _is_word_char(char: str) -> bool:
    return unicodedata.category(char)[0] in "LMN"


def _is_letter_or_digit(char: str) -> bool:
    return unicodedata.category(char)[0] in "LN"


def words(text: str) -> list[str]:
    """The words of `text`, as keys: runs of letters, marks and digits of any script, with an
    apostrophe inside a word kept ("that's", "d'accord"); a run of marks alone is no word."""
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'").replace("\u02bc", "'")
    runs = "".join(char if char == "'" or _is_word_char(char) else " " for char in text)
    found = []
    for run in runs.split():
        word = run.strip("'")
        if any(_is_letter_or_digit(char) for char in word):
            found.append(word_key(word))
    return found


def has_letters_or_digits(text: str) -> bool:
    """Whether `text` holds a letter or a digit of any script (else it is punctuation, symbols,
    emoji or white space only)."""
    return any(_is_letter_or_digit(char) for char in text)


def latin_only(text: str) -> bool:
    """Whether every letter of `text` (after NFKC) is a Latin one: a text the English rules can
    read at all. Modifier letters (such as the Japanese prolonged-sound mark) do not decide."""
    for char in unicodedata.normalize("NFKC", text):
        category = unicodedata.category(char)
        if category in {"Lu", "Ll", "Lt", "Lo"} and not unicodedata.name(char, "").startswith(
            "LATIN "
        ):
            return False
    return True


SMALL_TALK_WORDS: Final = frozenset(
    word_key(word)
    for words_of_a_language in (
        _ENGLISH,
        _GERMAN,
        _FRENCH,
        _SPANISH,
        _ITALIAN,
        _PORTUGUESE,
        _RUSSIAN,
        _GREEK,
        _ARABIC,
        _HEBREW,
        _HINDI,
        _KOREAN,
        _TURKISH,
        _WHOLE_PHRASES,
    )
    for word in words_of_a_language.split()
)
"""Words of greetings, thanks, farewells and acknowledgements, and (for scripts without
spaces) whole small-talk phrases, as keys."""


def is_small_talk(sentence: str) -> bool:
    """Whether `sentence` is at most `MAX_SMALL_TALK_WORDS` words, each a small-talk word or
    (in a script without spaces) a whole small-talk phrase."""
    found = words(sentence)
    return (
        bool(found)
        and len(found) <= MAX_SMALL_TALK_WORDS
        and all(word in SMALL_TALK_WORDS for word in found)
    )
