"""A JSON Schema ``pattern`` as an automaton over the string's characters. Pure.

JSON Schema patterns are ECMA-262 regular expressions that match anywhere in the string
unless anchored; validators in Python (``jsonschema``) run them with ``re.search``. The
subset here means the same under both, and is exact: what the automaton accepts is what the
pattern matches.

- characters and escapes: ``\\n \\r \\t \\f \\v \\0 \\xHH \\uHHHH``, an escaped punctuation
  character; ``.`` (anything but a line break: ``\\n \\r`` U+2028 U+2029);
- classes ``[a-z_]``, ``[^...]``, ``\\d \\w \\s`` (ASCII: ``[0-9]``, ``[A-Za-z0-9_]``,
  ``[ \\t\\n\\r\\f\\v]``); ``\\D \\W \\S`` and a negated class holding one of them stand for
  ASCII characters only (Unicode digits and letters differ between ECMA-262 and Python);
- quantifiers ``* + ? {n} {n,} {n,m}`` (lazy ``*?`` alike: same strings), up to 1000;
- groups ``( )``, ``(?: )``, ``(?<name> )``, alternation ``|``;
- anchors ``^`` and ``$`` at the start and end of the pattern or of a top-level alternative.

Refused, naming the construct: backreferences, lookaround, word boundaries (``\\b``), Unicode
property escapes, inline flags, anchors elsewhere.
"""

from __future__ import annotations

import functools
from typing import Any

from ._automaton import Dfa, Nfa
from ._gbnf import ANY_CHAR, CharSet, chars, complement, intersect, union

__all__ = ["PatternError", "pattern_dfa"]

MAX_REPEAT = 1000

_DIGIT = chars(("0", "9"))
_WORD = chars(("a", "z"), ("A", "Z"), ("0", "9"), "_")
_SPACE = chars(" \t\n\r\f\v")
_ASCII = chars((0, 0x7F))
_LINE_BREAK = chars("\n\r\u2028\u2029")
_SHORTHANDS = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_CONTROL_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "f": "\f", "v": "\v", "0": "\0"}


class PatternError(ValueError):
    """A pattern outside the supported subset (the message names the construct)."""


# The syntax tree: ("set", CharSet) | ("cat", [node]) | ("alt", [node])
# | ("rep", node, low, high or None) | ("bol",) | ("eol",)
Node = tuple[Any, ...]


class _Parser:
    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.at = 0

    def peek(self) -> str:
        return self.text[self.at] if self.at < len(self.text) else ""

    def take(self) -> str:
        char = self.peek()
        if not char:
            raise PatternError("the pattern ends too early")
        self.at += 1
        return char

    def alternation(self) -> Node:
        branches = [self.sequence()]
        while self.peek() == "|":
            self.at += 1
            branches.append(self.sequence())
        return ("alt", branches) if len(branches) > 1 else branches[0]

    def sequence(self) -> Node:
        items: list[Node] = []
        while self.peek() and self.peek() not in "|)":
            items.append(self.quantified())
        return ("cat", items)

    def quantified(self) -> Node:
        atom = self.atom()
        while True:
            bounds = self.quantifier()
            if bounds is None:
                return atom
            if atom[0] in ("bol", "eol"):
                raise PatternError("a quantifier on an anchor")
            if atom[0] == "rep":
                raise PatternError("a quantifier right after another (possessive or nested)")
            atom = ("rep", atom, *bounds)
            if self.peek() == "?":
                self.at += 1  # lazy: the same strings match

    def quantifier(self) -> tuple[int, int | None] | None:
        char = self.peek()
        if char in ("*", "+", "?"):
            self.at += 1
            return {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
        if char != "{":
            return None
        end = self.text.find("}", self.at)
        body = self.text[self.at + 1 : end] if end > 0 else ""
        low, comma, high = body.partition(",")
        if not low.isdigit() or (high and not high.isdigit()):
            if low == "" and comma and high.isdigit():
                raise PatternError("the quantifier '{,n}' (write '{0,n}')")
            return None  # a literal '{', as in ECMA-262 and Python
        self.at = end + 1
        bounds = (int(low), (int(high) if high else None) if comma else int(low))
        if max(bounds[0], bounds[1] or 0) > MAX_REPEAT:
            raise PatternError(f"a repetition over {MAX_REPEAT}")
        if bounds[1] is not None and bounds[1] < bounds[0]:
            raise PatternError(f"the quantifier {{{body}}} (its maximum is below its minimum)")
        return bounds

    def atom(self) -> Node:
        char = self.take()
        if char == "(":
            return self.group()
        if char == "[":
            return ("set", self.char_class())
        if char == ".":
            return ("set", complement(_LINE_BREAK))
        if char == "^":
            return ("bol",)
        if char == "$":
            return ("eol",)
        if char == "\\":
            return ("set", self.escape(in_class=False))
        if char in "*+?":
            raise PatternError(f"'{char}' with nothing to repeat")
        return ("set", chars(char))

    def group(self) -> Node:
        if self.peek() == "?":
            self.at += 1
            kind = self.take()
            if kind == "<" and self.peek() not in "=!":
                end = self.text.find(">", self.at)
                if end < 0:
                    raise PatternError("an unterminated group name")
                self.at = end + 1
            elif kind in "=!" or (kind == "<" and self.peek() in "=!"):
                raise PatternError("lookaround ('(?=', '(?!', '(?<=', '(?<!')")
            elif kind != ":":
                raise PatternError(f"the group or flag syntax '(?{kind}'")
        node = self.alternation()
        if self.peek() != ")":
            raise PatternError("an unbalanced '('")
        self.at += 1
        return node

    def char_class(self) -> CharSet:
        negated = self.peek() == "^"
        if negated:
            self.at += 1
        members: list[CharSet] = []
        ascii_only = False
        first = True
        while True:
            char = self.take()
            if char == "]" and not first:
                break
            first = False
            if char == "\\":
                code = self.peek()
                low = self.escape(in_class=True)
                ascii_only |= code in "DWS" or (negated and code in "dws")
                if code in "dwsDWS":
                    members.append(low)
                    continue
            else:
                low = chars(char)
            if self.peek() == "-" and self.text[self.at + 1 : self.at + 2] not in ("]", ""):
                self.at += 1
                high_char = self.take()
                high = self.escape(in_class=True) if high_char == "\\" else chars(high_char)
                if len(low) != 1 or len(high) != 1 or low[0][0] != low[0][1]:
                    raise PatternError("a class range with a shorthand ('\\d', '\\w') as an end")
                if high[0][0] != high[0][1]:
                    raise PatternError("a class range with a shorthand ('\\d', '\\w') as an end")
                if high[0][0] < low[0][0]:
                    raise PatternError("a class range out of order")
                members.append(chars((low[0][0], high[0][0])))
            else:
                members.append(low)
        charset = union(*members)
        if negated:
            charset = complement(charset)
        return intersect(charset, _ASCII) if ascii_only else charset

    def escape(self, *, in_class: bool) -> CharSet:
        char = self.take()
        if char in _SHORTHANDS:
            return _SHORTHANDS[char]
        if char.lower() in _SHORTHANDS:
            return intersect(complement(_SHORTHANDS[char.lower()]), _ASCII)
        if char in _CONTROL_ESCAPES:
            if char == "0" and self.peek().isdigit():
                raise PatternError("an octal escape")
            return chars(_CONTROL_ESCAPES[char])
        if char == "b" and in_class:
            return chars("\b")
        if char in "xu":
            digits = 2 if char == "x" else 4
            code = self.text[self.at : self.at + digits]
            if len(code) != digits or any(c not in "0123456789abcdefABCDEF" for c in code):
                raise PatternError(f"a malformed '\\{char}' escape")
            self.at += digits
            return chars(chr(int(code, 16))) if not 0xD800 <= int(code, 16) <= 0xDFFF else ()
        if char.isdigit():
            raise PatternError(f"the backreference '\\{char}'")
        if char in "bB":
            raise PatternError(f"the word boundary '\\{char}'")
        if char in "pP":
            raise PatternError(f"the Unicode property escape '\\{char}'")
        if char.isalnum():
            raise PatternError(f"the escape '\\{char}'")
        return chars(char)


def _build(nfa: Nfa, node: Node, start: int) -> int:
    """Add ``node`` after state ``start``; returns its end state."""
    kind = node[0]
    if kind == "set":
        end = nfa.state()
        nfa.edge(start, node[1], end)
        return end
    if kind == "cat":
        for item in node[1]:
            start = _build(nfa, item, start)
        return start
    if kind == "alt":
        end = nfa.state()
        for branch in node[1]:
            nfa.epsilon(_build(nfa, branch, start), end)
        return end
    if kind == "rep":
        _, item, low, high = node
        for _ in range(low):
            start = _build(nfa, item, start)
        if high is None:
            loop = nfa.state()
            nfa.epsilon(start, loop)
            nfa.epsilon(_build(nfa, item, loop), loop)
            return loop
        end = nfa.state()
        nfa.epsilon(start, end)
        for _ in range(high - low):
            start = _build(nfa, item, start)
            nfa.epsilon(start, end)
        return end
    raise PatternError("'^' or '$' inside the pattern (only at its start or end)")


def _anchors(branch: Node) -> tuple[Node, bool, bool]:
    items = list(branch[1]) if branch[0] == "cat" else [branch]
    starts = bool(items) and items[0][0] == "bol"
    if starts:
        items = items[1:]
    ends = bool(items) and items[-1][0] == "eol"
    if ends:
        items = items[:-1]
    return ("cat", items), starts, ends


@functools.lru_cache(maxsize=256)
def pattern_dfa(pattern: str, *, search: bool = True) -> Dfa:
    """The strings ``pattern`` matches somewhere (``search``, JSON Schema's meaning), or
    matches whole.

    Error handling: :class:`PatternError` naming what is outside the subset;
    :class:`TooComplexError` for a pattern whose automaton is too large.
    """
    parser = _Parser(pattern)
    tree = parser.alternation()
    if parser.at != len(pattern):
        raise PatternError("an unbalanced ')'")
    branches = tree[1] if tree[0] == "alt" else [tree]
    nfa = Nfa()
    start, accept = nfa.state(), nfa.state()
    for branch in branches:
        body, starts, ends = _anchors(branch)
        at = start
        if search and not starts:
            at = _build(nfa, ("rep", ("set", ANY_CHAR), 0, None), at)
        at = _build(nfa, body, at)
        if search and not ends:
            at = _build(nfa, ("rep", ("set", ANY_CHAR), 0, None), at)
        nfa.epsilon(at, accept)
    return nfa.determinize(start, accept)
