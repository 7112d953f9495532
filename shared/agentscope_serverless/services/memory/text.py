"""Text analysis and ranking for keyword memory search, shared by every memory backend.

Search is over tokens, not substrings: ``"a"`` does not match ``"banana"``. Matches are
ranked with BM25 (Okapi, ``k1=1.2``, ``b=0.75``); ties go to the most recent memory.

>>> tokenize("Hello, World! hello")
['hello', 'world', 'hello']
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

# Planes holding combining marks besides variation selectors (plane 14's are added below).
_MARK_PLANES = range(0x20000)
# What a capital dotted I ("İ", Turkish and Azeri) folds to: "i" and a combining dot above.
_DOTTED_I = "i\u0307"
_ASCII_SEPARATORS = str.maketrans(
    {c: " " for c in map(chr, range(128)) if not re.fullmatch(r"\w", c)}
)
# Scripts written without spaces between words: each character is a token of its own, with
# the combining marks that follow it (CJK and Hangul; Thai, Lao, Myanmar and Khmer, whose
# vowel signs and tone marks are such marks).
_UNSPACED = re.compile(
    r"[\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff"
    r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]"
)


@functools.cache
def _word() -> re.Pattern[str]:
    """A word: letters, digits, ``_`` and the combining marks that belong to them (vowel
    signs of Indic scripts, Arabic harakat, Thai tone marks, accents written apart), which
    ``\\w`` leaves out. Made on first use (about 20 ms): most texts are ASCII."""
    ranges: list[str] = []
    start: int | None = None
    for point in [*_MARK_PLANES, 0x20000]:
        mark = point < 0x20000 and unicodedata.category(chr(point)).startswith("M")
        if mark and start is None:
            start = point
        elif not mark and start is not None:
            ranges.append(f"\\U{start:08x}-\\U{point - 1:08x}")
            start = None
    ranges.append("\\U000e0100-\\U000e01ef")  # variation selectors supplement
    return re.compile(f"[\\w{''.join(ranges)}]+")


def tokenize(text: str) -> list[str]:
    """Case-folded word tokens of ``text``, in order (characters of scripts written without
    spaces one by one, with their marks), after compatibility normalization (NFKC: a
    decomposed ``é`` is the composed one, a full-width letter the letter). A capital dotted
    ``İ`` folds to ``i``, as the capital ``I`` does.

    >>> tokenize("मुझे किताब पसंद है")
    ['मुझे', 'किताब', 'पसंद', 'है']
    >>> tokenize("ชื่ออลิซ")
    ['ชื่', 'อ', 'อ', 'ลิ', 'ซ']
    """
    if text.isascii():
        # The same tokens, faster: every ASCII character that is not a word character
        # (letters, digits, "_") separates words.
        return text.lower().translate(_ASCII_SEPARATORS).split()
    folded = unicodedata.normalize("NFKC", text).casefold().replace(_DOTTED_I, "i")
    words = _word().findall(folded)
    if not _UNSPACED.search(folded):
        return words
    tokens: list[str] = []
    for word in words:
        if _UNSPACED.search(word):
            tokens.extend(_split_unspaced(word))
        else:
            tokens.append(word)
    return tokens


def _split_unspaced(word: str) -> Iterable[str]:
    """The characters of scripts written without spaces in ``word``, each with the marks
    following it, and the runs of other characters between them."""
    run, unspaced = "", False
    for char in word:
        if _UNSPACED.match(char):
            if unspaced and unicodedata.category(char).startswith("M"):
                run += char
                continue
            if run:
                yield run
            run, unspaced = char, True
        elif unspaced and unicodedata.category(char).startswith("M"):
            run += char  # a mark from outside those ranges (a variation selector) stays with it
        else:
            if unspaced:
                yield run
                run, unspaced = "", False
            run += char
    if run:
        yield run


def message_text(message: Message) -> str:
    """All the text parts of a message, joined by spaces: what memory search indexes."""
    return " ".join(
        part.text for part in message.content or [] if isinstance(part, TextContent) and part.text
    )


def query_terms(message: Message | None) -> list[str]:
    """The distinct tokens of a query message, in first-seen order: the first
    :data:`MAX_QUERY_TERMS` of them."""
    if message is None:
        return []
    return list(dict.fromkeys(tokenize(message_text(message))))[:MAX_QUERY_TERMS]


def term_frequencies(text: str) -> tuple[Counter[str], int]:
    """The tokens of a memory's text with their counts, and its length in tokens."""
    tokens = tokenize(text)
    return Counter(tokens), len(tokens)


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
    "MAX_QUERY_TERMS",
    "CorpusStats",
    "bm25_score",
    "idf",
    "message_text",
    "query_terms",
    "term_frequencies",
    "tokenize",
]
