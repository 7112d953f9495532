"""Text analysis and ranking for keyword memory search, shared by every memory backend.

Search is over tokens, not substrings: ``"a"`` does not match ``"banana"``. Matches are
ranked with BM25 (Okapi, ``k1=1.2``, ``b=0.75``); ties go to the most recent memory.

>>> tokenize("Hello, World! hello")
['hello', 'world', 'hello']

Besides its words, a text's tokens hold forms added for matching: a word without its
diacritics (``"café"`` also gives ``"cafe"``, vocalized Arabic and Hebrew their bare
letters, tatweel removed), a word as written without the invisible format characters in it
(``"pass\u00adword"`` also gives ``"password"``), each emoji (with its skin tone,
variation selector or ZWJ sequence; a flag), each character of Bopomofo, the Katakana
phonetic extensions and CJK Extension B and on, and each two adjacent characters of
scripts written without spaces (``"小明"`` ranks a memory holding the name above one holding
``"明"`` and ``"小"`` apart). Queries get the same forms, after their words: the first
:data:`MAX_QUERY_TERMS` distinct terms of a query are the ones it had before those forms.

Memory indexed before these forms (Redis keeps each memory's tokens from when it was
added) is still found as it was: the tokens the first tokenizer made of a text are still
made of it, as many times (it is the first step, and the forms are merged after it: a
token appears as often as in whichever of the two analyses has it more), so every query
still has the terms that matched it. ASCII text gets no added form: its tokens are the
first tokenizer's, as fast. A memory's length is its number of words and emoji (or of
the first tokenizer's tokens when they are more: a word split by format characters counts
as its pieces, so no token occurs more often than the length, a bound search relies on):
the forms added are not counted, so a text without emoji, format characters or the newly
split scripts has the length it had.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from agentscope_serverless.schemas.agent_schemas import Message, TextContent

BM25_K1 = 1.2
BM25_B = 0.75
# The words of a query a search uses: its first distinct ones. Every memory a search meets
# is scored against every query word, so a longer query (a document pasted as a turn's
# input: the runner searches with it) would make one search cost as much as thousands, and
# on Redis hold the server (a script) for all that time, for no better ranking.
MAX_QUERY_TERMS = 128
# The characters of a message's text that memory indexes, and that a search reads of its
# query: its first ones. A reply of megabytes (a generated document) analysed and indexed
# whole would hold the process for as long as thousands of memories (and, on Redis, the
# server, for every user), for no better ranking; it is still stored and returned whole.
MAX_INDEXED_CHARS = 65_536

# Planes holding combining marks besides variation selectors (plane 14's are added below).
_MARK_PLANES = range(0x20000)
# What a capital dotted I ("İ", Turkish and Azeri) folds to: "i" and a combining dot above.
_DOTTED_I = "i\u0307"
_TATWEEL = "\u0640"
_ASCII_SEPARATORS = str.maketrans(
    {c: " " for c in map(chr, range(128)) if not re.fullmatch(r"\w", c)}
)
# Scripts written without spaces between words: each character is a token of its own, with
# the combining marks that follow it (CJK and Hangul; Thai, Lao, Myanmar and Khmer, whose
# vowel signs and tone marks are such marks). The ranges of the first tokenizer: what it
# made of a text is still made of it (see the module's docstring).
_UNSPACED = re.compile(
    r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff"
    r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
)
# All of them: also Bopomofo, the Katakana phonetic extensions and CJK Extension B and on.
_NEWLY_UNSPACED = r"\u3100-\u312f\u31f0-\u31ff\U00020000-\U0003134f"
_UNSPACED_ALL = re.compile(f"{_UNSPACED.pattern[:-1]}{_NEWLY_UNSPACED}]")
# Where the nonspacing marks a word's unmarked form goes without are: the combining
# diacritical marks (Latin, Greek, Cyrillic, Vietnamese accents), Hebrew points, Arabic,
# Syriac and Thaana vowel marks, and variation selectors.
_DIACRITIC_BLOCKS = (
    range(0x0300, 0x0370),
    range(0x0483, 0x048A),
    range(0x0591, 0x05C8),
    range(0x0610, 0x061B),
    range(0x064B, 0x0660),
    range(0x0670, 0x0671),
    range(0x06D6, 0x06EE),
    range(0x0730, 0x074B),
    range(0x07A6, 0x07B1),
    range(0x0898, 0x0900),
    range(0x1AB0, 0x1B00),
    range(0x1DC0, 0x1E00),
    range(0x20D0, 0x2100),
    range(0xFE00, 0xFE10),
    range(0xFE20, 0xFE30),
)
# What may follow an emoji within it: variation selectors, the keycap, skin tones, tags
# (subdivision flags).
_EMOJI_TAIL = "[\ufe0e\ufe0f\u20e3\U0001f3fb-\U0001f3ff\U000e0020-\U000e007f]*"


@dataclass(frozen=True)
class _Patterns:
    """Regular expressions over character categories, made on first use (about 25 ms):
    most texts are ASCII."""

    word: re.Pattern[str]  # the first tokenizer's words
    format: re.Pattern[str]  # an invisible format character (category Cf)
    word_or_emoji: re.Pattern[str]  # group 1: an emoji; else a word, format characters in it
    diacritic: re.Pattern[str]  # a nonspacing mark a word's unmarked form goes without
    special: re.Pattern[str]  # what the first tokenizer may have read otherwise than now


def _ranges(points: Iterable[int]) -> str:
    """A character class's body matching exactly ``points`` (ascending)."""
    ranges: list[str] = []
    start = previous = None
    for point in [*points, None]:
        if point is not None and previous is not None and point == previous + 1:
            previous = point
            continue
        if start is not None and previous is not None:
            ranges.append(f"\\U{start:08x}-\\U{previous:08x}")
        start = previous = point
    return "".join(ranges)


@functools.cache
def _patterns() -> _Patterns:
    marks: list[int] = []
    formats: list[int] = []
    symbols: list[int] = []
    diacritics: list[int] = []
    for point in _MARK_PLANES:
        category = unicodedata.category(chr(point))
        if category[0] == "M":
            marks.append(point)
            if category == "Mn" and any(point in block for block in _DIACRITIC_BLOCKS):
                diacritics.append(point)
        elif category == "Cf":
            formats.append(point)
        elif category == "So":
            symbols.append(point)
    # Words: letters, digits, "_" and the combining marks that belong to them (vowel signs
    # of Indic scripts, Arabic harakat, Thai tone marks, accents written apart), which \w
    # leaves out; with variation selectors supplement.
    word = f"\\w{_ranges(marks)}\\U000e0100-\\U000e01ef"
    cf = f"{_ranges(formats)}\\U000e0001\\U000e0020-\\U000e007f"
    unit = f"[{_ranges(symbols)}]{_EMOJI_TAIL}"
    return _Patterns(
        word=re.compile(f"[{word}]+"),
        format=re.compile(f"[{cf}]"),
        word_or_emoji=re.compile(
            f"([\U0001f1e6-\U0001f1ff]{{2}}|{unit}(?:\u200d{unit})*)|[{word}{cf}]+"
        ),
        diacritic=re.compile(f"[{_ranges(diacritics)}]"),
        # Any character beyond the BMP: a class of few ranges is matched fast.
        special=re.compile(
            f"[{_ranges(p for p in [*formats, *symbols] if p < 0x10000)}"
            f"\u3100-\u312f\u31f0-\u31ff\U00010000-\U0010ffff]"
        ),
    )


def tokenize(text: str) -> list[str]:
    """Case-folded tokens of ``text``, after compatibility normalization (NFKC: a
    decomposed ``é`` is the composed one, a full-width letter the letter): its words and
    emoji in order (characters of scripts written without spaces one by one, with their
    marks), then the forms added for matching (see the module's docstring). A capital
    dotted ``İ`` folds to ``i``, as the capital ``I`` does.

    >>> tokenize("मुझे किताब पसंद है")
    ['मुझे', 'किताब', 'पसंद', 'है']
    >>> tokenize("ชื่ออลิซ")
    ['ชื่', 'อ', 'อ', 'ลิ', 'ซ', 'ชื่อ', 'ออ', 'อลิ', 'ลิซ']
    """
    if text.isascii():  # the fast path, without a call more
        return text.lower().translate(_ASCII_SEPARATORS).split()
    return _analyze(text)[0]


def _analyze(text: str) -> tuple[list[str], int]:
    """The tokens of ``text`` and its length: the number of its words and emoji, or of the
    first tokenizer's tokens when they are more."""
    if text.isascii():
        # The same tokens, faster: every ASCII character that is not a word character
        # (letters, digits, "_") separates words, and nothing else is added.
        words = text.lower().translate(_ASCII_SEPARATORS).split()
        return words, len(words)
    folded = unicodedata.normalize("NFKC", text).casefold().replace(_DOTTED_I, "i")
    patterns = _patterns()
    words = patterns.word.findall(folded)
    first = _first_tokens(words)
    units = first  # words and emoji, as analyzed now: the first ones unless the text has
    if patterns.special.search(folded):  # format characters, symbols or newly split scripts
        units, words = [], []
        for match in patterns.word_or_emoji.finditer(folded):
            if match.group(1):
                units.append(match.group(1))
            elif word := patterns.format.sub("", match.group()):
                words.append(word)
                if _UNSPACED_ALL.search(word):
                    units.extend(_split_unspaced(word, _UNSPACED_ALL))
                else:
                    units.append(word)
    forms = [
        form
        for unit in units
        if not unit.isascii() and (form := _unmarked(unit, patterns.diacritic)) != unit and form
    ]
    if _UNSPACED_ALL.search(folded):
        forms.extend(_bigrams(words))
    if units is first and not forms:
        return first, len(first)
    # The first tokenizer splits a word at its format characters ("pass\u00adpass" holds
    # "pass" twice): counted as one word, its length would be below a term's frequency,
    # which search's early stop takes as a bound.
    return _merge(first, [*units, *forms]), max(len(first), len(units))


def _first_tokens(words: list[str]) -> list[str]:
    """What the first tokenizer made of a text's ``words``."""
    if not any(_UNSPACED.search(word) for word in words):
        return words
    tokens: list[str] = []
    for word in words:
        if _UNSPACED.search(word):
            tokens.extend(_split_unspaced(word, _UNSPACED))
        else:
            tokens.append(word)
    return tokens


def _merge(tokens: list[str], more: list[str]) -> list[str]:
    """``tokens``, then those of ``more`` beyond them: each token as many times as in
    whichever of the two has it more often."""
    left = Counter(tokens)
    merged = list(tokens)
    for token in more:
        if left[token]:
            left[token] -= 1
        else:
            merged.append(token)
    return merged


def _unmarked(word: str, diacritic: re.Pattern[str]) -> str:
    """``word`` without its diacritics (accents, harakat, niqqud, emoji variation
    selectors) nor tatweel. A character of a script written without spaces keeps its marks
    (a Thai vowel sign, a kana's voicing mark make another word), as Indic words do (their
    vowel signs are letters: "कुल", total, is not "कल", tomorrow)."""
    if _UNSPACED_ALL.match(word):
        return word
    decomposed = unicodedata.normalize("NFD", word)
    if _TATWEEL not in word and not diacritic.search(decomposed):
        return word
    bare = diacritic.sub("", decomposed)
    return unicodedata.normalize("NFC", bare).replace(_TATWEEL, "")


def _bigrams(words: list[str]) -> Iterable[str]:
    """Each two adjacent characters (with their marks) of scripts written without spaces
    in ``words``: a memory holding a word of them ranks above one holding its characters
    in another order or apart."""
    for word in words:
        if not _UNSPACED_ALL.search(word):
            continue
        previous = ""
        for unit in _split_unspaced(word, _UNSPACED_ALL):
            if _UNSPACED_ALL.match(unit):
                if previous:
                    yield previous + unit
                previous = unit
            else:
                previous = ""


def _split_unspaced(word: str, unspaced: re.Pattern[str]) -> Iterable[str]:
    """The characters of scripts written without spaces (``unspaced``) in ``word``, each
    with the marks following it, and the runs of other characters between them."""
    run, inside = "", False
    for char in word:
        if unspaced.match(char):
            if inside and unicodedata.category(char).startswith("M"):
                run += char
                continue
            if run:
                yield run
            run, inside = char, True
        elif inside and unicodedata.category(char).startswith("M"):
            run += char  # a mark from outside those ranges (a variation selector) stays with it
        else:
            if inside:
                yield run
                run, inside = "", False
            run += char
    if run:
        yield run


def message_text(message: Message) -> str:
    """The text parts of a message, joined by spaces, up to :data:`MAX_INDEXED_CHARS`
    characters: what memory search indexes."""
    parts: list[str] = []
    left = MAX_INDEXED_CHARS
    for part in message.content or []:
        if left > 0 and isinstance(part, TextContent) and part.text:
            parts.append(part.text[:left])
            left -= len(parts[-1]) + 1  # and the space before the next
    return " ".join(parts)


def query_terms(message: Message | None) -> list[str]:
    """The distinct tokens of a query message, in first-seen order: the first
    :data:`MAX_QUERY_TERMS` of them."""
    if message is None:
        return []
    return list(dict.fromkeys(tokenize(message_text(message))))[:MAX_QUERY_TERMS]


def term_frequencies(text: str) -> tuple[Counter[str], int]:
    """The tokens of a memory's text with their counts, and its length: the number of its
    words and emoji (or of the first tokenizer's tokens when they are more), not of the
    forms added for them; never below a count.

    >>> term_frequencies("pass\u00adpass word")
    (Counter({'pass': 2, 'word': 1, 'passpass': 1}), 3)
    """
    if text.isascii():  # the fast path, without a call more
        tokens = text.lower().translate(_ASCII_SEPARATORS).split()
        return Counter(tokens), len(tokens)
    tokens, length = _analyze(text)
    return Counter(tokens), length


@dataclass(frozen=True)
class CorpusStats:
    """What BM25 needs to know about a user's whole memory."""

    documents: int
    total_length: int

    @property
    def average_length(self) -> float:
        return self.total_length / self.documents if self.documents else 0.0


def idf(documents: int, document_frequency: int) -> float:
    """BM25's inverse document frequency (always positive)."""
    return math.log(1.0 + (documents - document_frequency + 0.5) / (document_frequency + 0.5))


def bm25_score(
    term_counts: dict[str, int],
    length: int,
    idfs: dict[str, float],
    stats: CorpusStats,
) -> float:
    """The BM25 score of one memory for the query terms whose ``idfs`` are given."""
    avg = stats.average_length or 1.0
    score = 0.0
    for term, term_idf in idfs.items():
        tf = term_counts.get(term, 0)
        if tf:
            norm = tf + BM25_K1 * (1 - BM25_B + BM25_B * length / avg)
            score += term_idf * tf * (BM25_K1 + 1) / norm
    return score


__all__ = [
    "BM25_B",
    "BM25_K1",
    "MAX_INDEXED_CHARS",
    "MAX_QUERY_TERMS",
    "CorpusStats",
    "bm25_score",
    "idf",
    "message_text",
    "query_terms",
    "term_frequencies",
    "tokenize",
]
