"""Writing GBNF, llama.cpp's grammar format: literals, character classes, repetitions, and a
rule set with readable, unique names. Pure.

Character sets are tuples of disjoint, sorted, inclusive code-point intervals
(:data:`CharSet`); surrogates (U+D800-U+DFFF) are never in one, since UTF-8 cannot carry them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = [
    "ANY_CHAR",
    "SPACE",
    "CharSet",
    "Rules",
    "char_class",
    "chars",
    "complement",
    "contains",
    "intersect",
    "literal",
    "repetition",
    "subtract",
    "union",
]

CharSet = tuple[tuple[int, int], ...]

#: Every code point UTF-8 can carry.
ANY_CHAR: CharSet = ((0, 0xD7FF), (0xE000, 0x10FFFF))

#: llama.cpp's whitespace between JSON tokens: none, one space, or up to two newlines and an
#: indent of up to 20 (bounded, so a model cannot pad forever).
SPACE = '| " " | "\\n"{1,2} [ \\t]{0,20}'


def _normal(intervals: Iterable[tuple[int, int]]) -> CharSet:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)


def chars(*items: str | tuple[str, str] | tuple[int, int]) -> CharSet:
    """A set from single characters (a string adds each of its characters) and ranges."""
    intervals: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, str):
            intervals += [(ord(c), ord(c)) for c in item]
        else:
            lo, hi = item
            intervals.append(
                (ord(lo) if isinstance(lo, str) else lo, ord(hi) if isinstance(hi, str) else hi)
            )
    return intersect(_normal(intervals), ANY_CHAR)


def union(*sets: CharSet) -> CharSet:
    return _normal(interval for s in sets for interval in s)


def intersect(a: CharSet, b: CharSet) -> CharSet:
    out: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


def complement(a: CharSet) -> CharSet:
    """Every code point not in ``a`` (surrogates excluded)."""
    out: list[tuple[int, int]] = []
    at = 0
    for lo, hi in a:
        if lo > at:
            out.append((at, lo - 1))
        at = hi + 1
    if at <= 0x10FFFF:
        out.append((at, 0x10FFFF))
    return intersect(tuple(out), ANY_CHAR)


def subtract(a: CharSet, b: CharSet) -> CharSet:
    return intersect(a, complement(b))


def contains(a: CharSet, code: int) -> bool:
    return any(lo <= code <= hi for lo, hi in a)


def _escape(code: int, specials: str) -> str:
    char = chr(code)
    if 0x20 <= code < 0x7F and char not in specials:
        return char
    if code > 0x7F and char.isprintable():
        return char
    if code <= 0xFF:
        return f"\\x{code:02X}"
    if code <= 0xFFFF:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def literal(text: str) -> str:
    """``text`` as a GBNF string literal."""
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        else:
            out.append(_escape(ord(char), ""))
    return '"' + "".join(out) + '"'


def char_class(charset: CharSet) -> str:
    """``charset`` as a GBNF character class (``[a-z0-9]``)."""
    specials = '[]\\-^"'
    parts = []
    for lo, hi in charset:
        if lo == hi:
            parts.append(_escape(lo, specials))
        elif hi == lo + 1:
            parts.append(_escape(lo, specials) + _escape(hi, specials))
        else:
            parts.append(_escape(lo, specials) + "-" + _escape(hi, specials))
    return "[" + "".join(parts) + "]"


def repetition(item: str, low: int, high: int | None, separator: str = "") -> str:
    """``item`` repeated ``low`` to ``high`` (``None``: no limit) times, ``separator`` between
    two (llama.cpp's ``build_repetition``)."""
    if high == 0:
        return '""'
    if low == 0 and high == 1:
        return f"( {item} )?"
    if not separator:
        if high is None:
            return f"( {item} )" + ("+" if low == 1 else "*" if low == 0 else f"{{{low},}}")
        return f"( {item} ){{{low},{high}}}"
    rest = repetition(f"{separator} {item}", max(low - 1, 0), None if high is None else high - 1)
    body = f"{item} {rest}"
    return f"( {body} )?" if low == 0 else body


_NAME = re.compile(r"[^a-zA-Z0-9-]+")


class Rules:
    """A grammar under construction: rule names kept unique and readable, one rule per
    distinct body. A :meth:`checkpoint` and :meth:`rollback` undo what a failed translation
    half wrote (a rule reserved and never defined would break the grammar)."""

    def __init__(self) -> None:
        self._rules: dict[str, str] = {}
        self._by_body: dict[str, str] = {}
        # Every change, to undo: (table, key, the value before or None when it was new).
        self._journal: list[tuple[dict[str, str], str, str | None]] = []

    def _set(self, table: dict[str, str], key: str, value: str) -> None:
        self._journal.append((table, key, table.get(key)))
        table[key] = value

    def name(self, hint: str) -> str:
        """A fresh rule name based on ``hint``, reserved (define it with :meth:`define`)."""
        base = _NAME.sub("-", hint).strip("-") or "rule"
        name, n = base, 1
        while name in self._rules:
            n += 1
            name = f"{base}-{n}"
        self._set(self._rules, name, "")
        return name

    def define(self, name: str, body: str) -> str:
        self._set(self._rules, name, body)
        return name

    def add(self, hint: str, body: str) -> str:
        """A rule for ``body``: an existing one when that body was added before."""
        known = self._by_body.get(body)
        if known is not None:
            return known
        name = self.define(self.name(hint), body)
        self._set(self._by_body, body, name)
        return name

    def checkpoint(self) -> int:
        """A mark of the rules as they are now, for :meth:`rollback`."""
        return len(self._journal)

    def rollback(self, mark: int) -> None:
        """Back to the rules as they were at :meth:`checkpoint` ``mark``."""
        while len(self._journal) > mark:
            table, key, before = self._journal.pop()
            if before is None:
                del table[key]
            else:
                table[key] = before

    def has(self, name: str) -> bool:
        return name in self._rules

    def __len__(self) -> int:
        return len(self._rules)

    def text(self, root: str = "root") -> str:
        """The grammar, ``root`` first."""
        names = [root, *sorted(n for n in self._rules if n != root)]
        return "".join(f"{n} ::= {self._rules[n]}\n" for n in names if n in self._rules)
