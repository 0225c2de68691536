"""Finite automata over code points, for the string and number grammars. Pure.

A regular pattern, a string format and a numeric range all become a :class:`Dfa`; two of them
intersect (a pattern and a format, a pattern and a length), an empty one is found before any
grammar is written, and a minimal one becomes GBNF rules: one rule per state, so llama.cpp's
grammar engine follows a single path through it (no ambiguity to track).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

import attrs

from ._gbnf import ANY_CHAR, CharSet, Rules, char_class, chars, intersect, literal, subtract, union

__all__ = [
    "ANY_STRING",
    "Dfa",
    "Nfa",
    "TooComplexError",
    "explore",
    "none_of",
    "one_of",
    "to_gbnf",
    "without",
]

# States past which a pattern, format or range is refused as too large a grammar.
MAX_STATES = 6000


class TooComplexError(ValueError):
    """An automaton grew past :data:`MAX_STATES` states."""


class Nfa:
    """A nondeterministic automaton under construction (Thompson's construction)."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[CharSet, int]]] = []
        self.empty: list[list[int]] = []

    def state(self) -> int:
        if len(self.edges) >= 8 * MAX_STATES:
            raise TooComplexError("too many states")
        self.edges.append([])
        self.empty.append([])
        return len(self.edges) - 1

    def edge(self, src: int, charset: CharSet, dst: int) -> None:
        if charset:
            self.edges[src].append((charset, dst))

    def epsilon(self, src: int, dst: int) -> None:
        self.empty[src].append(dst)

    def closure(self, states: Iterable[int]) -> frozenset[int]:
        seen = set(states)
        todo = list(seen)
        while todo:
            for nxt in self.empty[todo.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return frozenset(seen)

    def determinize(self, start: int, accept: int) -> Dfa:
        """The equivalent :class:`Dfa` (subset construction)."""

        def moves(current: frozenset[int]) -> list[tuple[CharSet, frozenset[int]]]:
            edges = [edge for state in current for edge in self.edges[state]]
            return [(charset, self.closure(targets)) for charset, targets in _split(edges)]

        return explore(self.closure([start]), lambda states: accept in states, moves)


def _split(edges: Sequence[tuple[CharSet, int]]) -> list[tuple[CharSet, frozenset[int]]]:
    """The edges' character sets cut into disjoint pieces, each with every target whose set
    holds it; pieces with the same targets joined."""
    points = sorted({p for charset, _ in edges for lo, hi in charset for p in (lo, hi + 1)})
    groups: dict[frozenset[int], list[tuple[int, int]]] = {}
    for i in range(len(points) - 1):
        lo, hi = points[i], points[i + 1] - 1
        targets = frozenset(t for charset, t in edges if _holds(charset, lo))
        if targets:
            groups.setdefault(targets, []).append((lo, hi))
    return [(union(tuple(intervals)), targets) for targets, intervals in groups.items()]


def _holds(charset: CharSet, code: int) -> bool:
    at = bisect.bisect_right(charset, (code, 0x10FFFF + 1)) - 1
    return at >= 0 and charset[at][0] <= code <= charset[at][1]


@attrs.frozen
class Dfa:
    """A deterministic automaton: state 0 starts; ``edges[s]`` are ``s``'s transitions
    (disjoint character sets); ``accepting`` the states where a string may end."""

    edges: tuple[tuple[tuple[CharSet, int], ...], ...]
    accepting: frozenset[int]

    @property
    def empty(self) -> bool:
        """Whether it accepts no string at all."""
        return not self.accepting

    def accepts(self, text: str) -> bool:
        state = 0
        for char in text:
            code = ord(char)
            for charset, target in self.edges[state]:
                if _holds(charset, code):
                    state = target
                    break
            else:
                return False
        return state in self.accepting

    def intersect(self, other: Dfa) -> Dfa:
        """The strings both accept."""
        return _product(self, other, lambda a, b: a in self.accepting and b in other.accepting)

    def bounded(self, low: int, high: int | None) -> Dfa:
        """The strings it accepts that are ``low`` to ``high`` characters long."""
        cap = low if high is None else high

        return explore(
            (0, 0),
            lambda s: s[0] in self.accepting and s[1] >= low,
            lambda state: [
                (cs, (t, min(state[1] + 1, cap)))
                for cs, t in self.edges[state[0]]
                if high is None or state[1] < high
            ],
        )

    def minimal(self) -> Dfa:
        """An equivalent automaton with dead states removed and equivalent states merged.

        States are merged from the ends backwards (two states with the same ending and the
        same moves to the same states are one), until nothing changes: this is the minimal
        automaton for an acyclic one and close to it otherwise, in a few linear passes (a
        long counted repetition takes Moore's refinement one pass per state).
        """
        live = self._live()
        if 0 not in live:
            return Dfa(((),), frozenset())
        parent = {s: s for s in live}

        def find(s: int) -> int:
            while parent[s] != s:
                parent[s] = parent[parent[s]]
                s = parent[s]
            return s

        walk = self._walk(live)
        changed = True
        while changed:
            changed = False
            seen: dict[tuple[object, ...], int] = {}
            for s in reversed(walk):
                if find(s) != s:
                    continue
                signature = (s in self.accepting, *self._moves(s, find, live))
                other = seen.setdefault(signature, s)
                if other != s:
                    parent[s] = other
                    changed = True
        number: dict[int, int] = {}
        order: list[int] = []
        for s in walk:
            if find(s) not in number:
                number[find(s)] = len(order)
                order.append(find(s))
        edges = tuple(tuple((cs, number[t]) for cs, t in self._moves(s, find, live)) for s in order)
        accepting = frozenset(i for i, s in enumerate(order) if s in self.accepting)
        return Dfa(edges, accepting)

    def _walk(self, live: frozenset[int]) -> list[int]:
        """The live states in the order a breadth-first walk from the start meets them."""
        order, seen = [0], {0}
        for s in order:
            for _, t in self.edges[s]:
                if t in live and t not in seen:
                    seen.add(t)
                    order.append(t)
        return order

    def _moves(
        self, state: int, find: Callable[[int], int], live: frozenset[int]
    ) -> list[tuple[CharSet, int]]:
        by_target: dict[int, CharSet] = {}
        for charset, target in self.edges[state]:
            if target in live:
                t = find(target)
                by_target[t] = union(by_target.get(t, ()), charset)
        return sorted(((cs, t) for t, cs in by_target.items()), key=lambda m: m[0])

    def _live(self) -> frozenset[int]:
        """The states from which an accepting state can be reached."""
        back: dict[int, list[int]] = {}
        for s, out in enumerate(self.edges):
            for _, t in out:
                back.setdefault(t, []).append(s)
        live = set(self.accepting)
        todo = list(live)
        while todo:
            for s in back.get(todo.pop(), ()):
                if s not in live:
                    live.add(s)
                    todo.append(s)
        return frozenset(live)


def _product(a: Dfa, b: Dfa, accepting: Callable[[int, int], bool]) -> Dfa:
    def moves(state: tuple[int, int]) -> list[tuple[CharSet, tuple[int, int]]]:
        return [
            (intersect(ca, cb), (ta, tb))
            for ca, ta in a.edges[state[0]]
            for cb, tb in b.edges[state[1]]
        ]

    return explore((0, 0), lambda s: accepting(s[0], s[1]), moves)


State = TypeVar("State", bound=Hashable)


def explore(
    start: State,
    accepting: Callable[[State], bool],
    moves: Callable[[State], Iterable[tuple[CharSet, State]]],
) -> Dfa:
    """The minimal :class:`Dfa` of the states reachable from ``start``; ``moves(state)`` gives
    a state's transitions, whose character sets must be disjoint."""
    index = {start: 0}
    order = [start]
    edges: list[tuple[tuple[CharSet, int], ...]] = []
    while len(edges) < len(order):
        out = []
        for charset, target in moves(order[len(edges)]):
            if not charset:
                continue
            if target not in index:
                if len(order) >= MAX_STATES:
                    raise TooComplexError("too many states")
                index[target] = len(order)
                order.append(target)
            out.append((charset, index[target]))
        edges.append(tuple(out))
    final = frozenset(i for i, s in enumerate(order) if accepting(s))
    return Dfa(tuple(edges), final).minimal()


#: Any string at all.
ANY_STRING = Dfa((((ANY_CHAR, 0),),), frozenset({0}))


def _trie(words: tuple[str, ...], *, listed: bool) -> Dfa:
    prefixes = {w[:i] for w in words for i in range(len(w) + 1)}

    def moves(state: str | None) -> list[tuple[CharSet, str | None]]:
        if state is None:
            return [(ANY_CHAR, None)]
        nexts = sorted(
            {p[len(state)] for p in prefixes if len(p) == len(state) + 1 and p.startswith(state)}
        )
        out: list[tuple[CharSet, str | None]] = [(chars(c), state + c) for c in nexts]
        return out if listed else [*out, (subtract(ANY_CHAR, chars(*nexts)), None)]

    start: str | None = ""
    if listed:
        return explore(start, lambda s: s in words, moves)
    return explore(start, lambda s: s is None or s not in words, moves)


def one_of(words: tuple[str, ...]) -> Dfa:
    """Exactly ``words``."""
    return _trie(words, listed=True)


def none_of(words: tuple[str, ...]) -> Dfa:
    """Every string but ``words``."""
    return _trie(words, listed=False)


def without(text: str) -> Dfa:
    """The strings that do not hold ``text`` (a string matcher's automaton)."""
    letters = sorted(set(text))

    def after(k: int, char: str) -> int:
        seen = text[:k] + char
        return next(j for j in range(min(len(seen), len(text)), -1, -1) if seen.endswith(text[:j]))

    def moves(k: int) -> list[tuple[CharSet, int]]:
        if k == len(text):
            return []
        out = [(chars(c), after(k, c)) for c in letters]
        return [*out, (subtract(ANY_CHAR, chars(*letters)), 0)]

    return explore(0, lambda k: k != len(text), moves)


# JSON string content: what must be escaped, and how.
_QUOTE_BACKSLASH = chars('"\\')
_CONTROL = chars((0, 0x1F), "\x7f")
_SHORT = {
    0x08: "\\b",
    0x0C: "\\f",
    0x0A: "\\n",
    0x0D: "\\r",
    0x09: "\\t",
    0x22: '\\"',
    0x5C: "\\\\",
}


def _json_alternatives(charset: CharSet) -> list[str]:
    """GBNF for one JSON-string character of ``charset``: raw where JSON allows it, escaped
    where it must be (quote, backslash, control characters)."""
    out = []
    raw = subtract(charset, union(_QUOTE_BACKSLASH, _CONTROL))
    if raw:
        out.append(char_class(raw))
    specials = [
        c
        for lo, hi in intersect(charset, union(_QUOTE_BACKSLASH, _CONTROL))
        for c in range(lo, hi + 1)
    ]
    controls = [c for c in specials if c <= 0x1F]
    if len(controls) == 32:
        out.append('"\\\\u00" [01] [0-9a-fA-F]')
        out.append('"\\\\" [bfnrt]')
        specials = [c for c in specials if c > 0x1F]
    for code in specials:
        escaped = _SHORT.get(code, f"\\u{code:04x}")
        out.append(literal(escaped))
    return out


def to_gbnf(dfa: Dfa, rules: Rules, hint: str, *, json_string: bool) -> str:
    """Rules for ``dfa`` (which must not be empty); returns the start state's rule name.
    ``json_string``: each character is written as inside a JSON string (escaped where JSON
    needs it), else raw."""
    names = [rules.name(f"{hint}-{i}") if dfa.edges[i] else "" for i in range(len(dfa.edges))]
    if not names[0]:
        return rules.define(rules.name(hint), '""')
    for state, out in enumerate(dfa.edges):
        if not out:
            continue
        alternatives = []
        for charset, target in out:
            tail = f" {names[target]}" if names[target] else ""
            pieces = _json_alternatives(charset) if json_string else [char_class(charset)]
            if len(pieces) == 1:
                alternatives.append(pieces[0] + tail)
            else:
                alternatives.append("( " + " | ".join(pieces) + " )" + tail)
        body = " | ".join(alternatives)
        if state in dfa.accepting:
            body = f"( {body} )?"
        rules.define(names[state], body)
    return names[0]
