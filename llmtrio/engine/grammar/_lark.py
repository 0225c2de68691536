"""Lark grammars (the syntax of the Responses API's ``custom`` tools) and whole-text regular
expressions, as GBNF. Pure.

The subset of Lark translated is what tool grammars use: rules and terminals (``name: ...``,
``NAME: ...``, a priority ``.n`` ignored), alternatives ``|`` (continued on a line that
starts with ``|``), groups ``( )``, optional ``[ ]`` and ``?``, ``*``, ``+``, ``~ n`` and
``~ n..m``, string literals (``"..."``, ``"..."i``), ranges (``"a".."z"``), regular
expressions (``/.../`` with the ``s`` flag or none: Python's syntax, as far as
:mod:`._regex` reads it, ``.`` being any character but a newline), aliases (``-> name``,
ignored), rule names' ``?``, ``!`` and ``_`` prefixes (tree shaping, ignored), comments,
``%import common.NAME`` (Lark's ``common.lark`` terminals) and ``%ignore`` (the ignored
terminals may stand before any terminal of a rule and at the end). The grammar starts at
``start``.

The text a translation accepts is the text the Lark grammar's rules derive, terminals read
as the character strings they match: a lexer's longest match, which can refuse some of those
texts, is not modelled. Anything else (template rules, ``%declare``, ``%override``, imports
from elsewhere, other regex flags, constructs :mod:`._regex` refuses, llguidance's
extensions) is a :class:`CannotTranslateError` saying what, never a wrong grammar.

Each translation writes its rules into a :class:`Rules` under a name hint, either raw (the
text itself) or ``json_string`` (the text as it is written inside a JSON string, escaped
where JSON must be: the same text once decoded); ``forbid`` keeps a string out of every
regular-expression terminal (so a raw XML parameter cannot close early inside one).
"""

from __future__ import annotations

import ast
import functools
import re
from typing import Any

from ._automaton import Dfa, TooComplexError, explore, to_gbnf, without
from ._gbnf import CharSet, Rules, chars, literal
from ._regex import PatternError, pattern_dfa
from ._schema_keywords import json_text

__all__ = ["CannotTranslateError", "lark_grammar", "lark_rules", "regex_rules"]


class CannotTranslateError(ValueError):
    """A grammar outside the subset translated (the message says what)."""


# Lark's common.lark terminals (the ones a tool grammar may import).
_COMMON = r"""
DIGIT: "0".."9"
HEXDIGIT: "a".."f" | "A".."F" | DIGIT
INT: DIGIT+
SIGNED_INT: ["+" | "-"] INT
DECIMAL: INT "." INT? | "." INT
_EXP: ("e" | "E") SIGNED_INT
FLOAT: INT _EXP | DECIMAL _EXP?
SIGNED_FLOAT: ["+" | "-"] FLOAT
NUMBER: FLOAT | INT
SIGNED_NUMBER: ["+" | "-"] NUMBER
ESCAPED_STRING: /"([^"\\\n]|\\[^\n])*"/
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
WORD: LETTER+
CNAME: ("_" | LETTER) ("_" | LETTER | DIGIT)*
WS_INLINE: (" " | /\t/)+
WS: /[ \t\f\r\n]/+
CR: /\r/
LF: /\n/
NEWLINE: (CR? LF)+
SH_COMMENT: /#[^\n]*/
CPP_COMMENT: /\/\/[^\n]*/
C_COMMENT: "/*" /([^*]|\*+[^*\/])*/ "*"+ "/"
SQL_COMMENT: /--[^\n]*/
"""

_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\f\r]+|\\\n)
  | (?P<comment>//[^\n]*|\#[^\n]*)
  | (?P<newline>\n)
  | (?P<string>"(?:[^"\\\n]|\\.)*"i?)
  | (?P<regexp>/(?!/)(?:\\.|[^/\\\n])+/[imslux]*)
  | (?P<arrow>->)
  | (?P<dots>\.\.)
  | (?P<directive>%[a-z]+)
  | (?P<name>[!?]?_*[A-Za-z][A-Za-z0-9_]*)
  | (?P<number>[0-9]+)
  | (?P<op>[+*?])
  | (?P<punct>[:|()\[\]{},~.])
    """,
    re.VERBOSE,
)

# The syntax tree: ("alt", [node]) | ("seq", [node]) | ("rep", node, low, high or None)
# | ("lit", text, ignore_case) | ("re", pattern, flags) | ("range", low, high) | ("ref", name)
Node = tuple[Any, ...]


def _tokens(text: str) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    at = 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise CannotTranslateError(f"cannot read the grammar at {text[at : at + 20]!r}")
        at = match.end()
        kind = match.lastgroup
        assert kind is not None
        if kind in ("space", "comment"):
            continue
        out.append((kind, match.group()))
    # A newline before '|' continues the definition; runs of newlines are one.
    kept: list[tuple[str, str]] = []
    for i, token in enumerate(out):
        if token[0] == "newline":
            later = next((t for t in out[i + 1 :] if t[0] != "newline"), None)
            if later == ("punct", "|") or (kept and kept[-1][0] == "newline") or not kept:
                continue
        kept.append(token)
    return kept


class _Parser:
    """One definition (a line, with its continuations) at a time."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.at = 0

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "")

    def take(self, kind: str, text: str | None = None) -> str:
        got = self.peek()
        if got[0] != kind or (text is not None and got[1] != text):
            raise CannotTranslateError(f"unexpected {got[1] or 'end'!r} in the grammar")
        self.at += 1
        return got[1]

    def expansions(self) -> Node:
        branches = [self.alias()]
        while self.peek() == ("punct", "|"):
            self.at += 1
            branches.append(self.alias())
        return ("alt", branches) if len(branches) > 1 else branches[0]

    def alias(self) -> Node:
        items = []
        while self.peek()[0] in ("string", "regexp", "name") or self.peek()[1] in ("(", "["):
            items.append(self.expr())
        if self.peek()[0] == "arrow":
            self.at += 1
            self.take("name")
        return ("seq", items)

    def expr(self) -> Node:
        atom = self.atom()
        kind, text = self.peek()
        if kind == "op":
            self.at += 1
            return ("rep", atom, 1 if text == "+" else 0, 1 if text == "?" else None)
        if (kind, text) == ("punct", "~"):
            self.at += 1
            low = int(self.take("number"))
            high = low
            if self.peek()[0] == "dots":
                self.at += 1
                high = int(self.take("number"))
            if high < low:
                raise CannotTranslateError(f"the repetition ~ {low}..{high} is empty")
            return ("rep", atom, low, high)
        return atom

    def atom(self) -> Node:
        kind, text = self.peek()
        if text in ("(", "["):
            self.at += 1
            inner = self.expansions()
            self.take("punct", ")" if text == "(" else "]")
            return inner if text == "(" else ("rep", inner, 0, 1)
        self.at += 1
        if kind == "string":
            value, ignore_case = _string(text)
            if self.peek()[0] == "dots":
                self.at += 1
                high, _ = _string(self.take("string"))
                if len(value) != 1 or len(high) != 1:
                    raise CannotTranslateError("a range's ends must be single characters")
                return ("range", value, high)
            return ("lit", value, ignore_case)
        if kind == "regexp":
            end = text.rindex("/")
            return ("re", text[1:end], text[end + 1 :])
        if kind == "name":
            if self.peek() == ("punct", "{"):
                raise CannotTranslateError(f"template rules ({text}{{...}}) are not translated")
            return ("ref", text.lstrip("!?"))
        raise CannotTranslateError(f"unexpected {text!r} in the grammar")


def _string(token: str) -> tuple[str, bool]:
    ignore_case = token.endswith("i")
    body = token[:-1] if ignore_case else token
    try:
        value = ast.literal_eval(body)
    except (ValueError, SyntaxError):
        raise CannotTranslateError(f"cannot read the string {token}") from None
    if not isinstance(value, str) or not value:
        raise CannotTranslateError(f"the string {token} is empty")
    return value, ignore_case


_Definitions = dict[str, Node]


def _parse(text: str) -> tuple[_Definitions, dict[str, str], list[Node]]:
    """The definitions by name, the imports (local name: common name), the ignored."""
    tokens = _tokens(text)
    definitions: _Definitions = {}
    imports: dict[str, str] = {}
    ignored: list[Node] = []
    parser = _Parser(tokens)
    while parser.peek()[0] != "end":
        kind, word = parser.peek()
        if kind == "newline":
            parser.at += 1
            continue
        if kind == "directive":
            parser.at += 1
            if word == "%ignore":
                ignored.append(parser.expansions())
            elif word == "%import":
                _import(parser, imports)
            else:
                raise CannotTranslateError(f"{word} is not translated")
        else:
            name = parser.take("name").lstrip("!?")
            if parser.peek() == ("punct", "{"):
                raise CannotTranslateError(f"template rules ({name}{{...}}) are not translated")
            if parser.peek() == ("punct", "."):
                parser.at += 1
                parser.take("number")
            parser.take("punct", ":")
            if name in definitions:
                raise CannotTranslateError(f"{name} is defined twice")
            definitions[name] = parser.expansions()
        if parser.peek()[0] not in ("newline", "end"):
            raise CannotTranslateError(f"unexpected {parser.peek()[1]!r} in the grammar")
    return definitions, imports, ignored


def _import(parser: _Parser, imports: dict[str, str]) -> None:
    path = parser.take("name")
    while parser.peek() == ("punct", "."):
        parser.at += 1
        path += "." + parser.take("name")
    module, _, name = path.rpartition(".")
    if parser.peek() == ("punct", "("):  # %import common (A, B)
        parser.at += 1
        module, names = path, [parser.take("name")]
        while parser.peek() == ("punct", ","):
            parser.at += 1
            names.append(parser.take("name"))
        parser.take("punct", ")")
    else:
        names = [name]
    if module != "common":
        raise CannotTranslateError(f"%import from {module or path!r} (only 'common' is known)")
    alias = None
    if parser.peek()[0] == "arrow":
        parser.at += 1
        alias = parser.take("name")
    for one in names:
        if one not in _common():
            raise CannotTranslateError(f"common.{one} is not a terminal of Lark's common.lark")
        imports[alias or one] = one


@functools.cache
def _common() -> _Definitions:
    return _parse(_COMMON)[0]


def _python_pattern(pattern: str, flags: str) -> str:
    """A Lark (Python ``re``) pattern in :mod:`._regex`'s syntax: ``.`` is any character
    but a newline (or any at all with the ``s`` flag), ``(?P<name>`` is ``(?<name>``."""
    unknown = set(flags) - {"s", "u", "l"}
    if unknown:
        raise CannotTranslateError(f"the regex flag {''.join(sorted(unknown))!r} is not translated")
    dot = "(?:[^\\n]|\\n)" if "s" in flags else "[^\\n]"
    out, i, in_class = [], 0, False
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern):
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            out.append("[")
            i += 1
            if pattern[i : i + 1] == "^":
                out.append("^")
                i += 1
            if pattern[i : i + 1] == "]":  # a ']' first in a class is literal
                out.append("\\]")
                i += 1
            continue
        elif char == ".":
            out.append(dot)
            i += 1
            continue
        elif pattern.startswith("(?P<", i):
            out.append("(?<")
            i += 4
            continue
        out.append(char)
        i += 1
    return "".join(out)


class _Writer:
    """Writes a parsed grammar's rules (one GBNF rule per Lark definition reached)."""

    def __init__(
        self,
        rules: Rules,
        hint: str,
        definitions: _Definitions,
        imports: dict[str, str],
        ignored: list[Node],
        *,
        json_string: bool,
        forbid: str | None,
    ) -> None:
        self.rules, self.hint = rules, hint
        self.spaces = {"": definitions, "common": _common()}
        self.imports = imports
        self.json_string, self.forbid = json_string, forbid
        self.names: dict[tuple[str, str], str] = {}
        self.ignore = ""
        if ignored:
            body = " | ".join(self.expression(node, "", terminal=True) for node in ignored)
            self.ignore = self.rules.add(f"{hint}-ignored", f"( {body} )*")

    def definition(self, space: str, name: str) -> str:
        """The GBNF rule of ``name`` (defined once, on first use: recursion is fine)."""
        if space == "" and name not in self.spaces[""] and name in self.imports:
            space, name = "common", self.imports[name]
        known = self.names.get((space, name))
        if known is not None:
            return known
        node = self.spaces[space].get(name)
        if node is None:
            raise CannotTranslateError(f"{name} is used but not defined")
        rule = self.names[(space, name)] = self.rules.name(f"{self.hint}-{name.lower()}")
        terminal = name.lstrip("_")[:1].isupper()
        self.rules.define(rule, self.expression(node, space, terminal=terminal))
        return rule

    def expression(self, node: Node, space: str, *, terminal: bool) -> str:
        """GBNF for ``node``; inside a rule (not ``terminal``) each terminal may follow the
        ignored ones."""
        kind = node[0]
        if kind == "alt":
            parts = [self.expression(n, space, terminal=terminal) for n in node[1]]
            return "( " + " | ".join(parts) + " )"
        if kind == "seq":
            parts = [self.expression(n, space, terminal=terminal) for n in node[1]]
            return " ".join(parts) if parts else '""'
        if kind == "rep":
            inner = self.expression(node[1], space, terminal=terminal)
            low, high = node[2], node[3]
            if (low, high) == (0, 1):
                return f"( {inner} )?"
            if high is None:
                return f"( {inner} )" + ("*" if low == 0 else "+" if low == 1 else f"{{{low},}}")
            return f"( {inner} ){{{low},{high}}}"
        if kind == "ref":
            rule = self.definition(space, node[1])
            ref_terminal = node[1].lstrip("_")[:1].isupper()
            return self._ignorable(rule, ref_terminal and not terminal)
        return self._ignorable(self._terminal(node), not terminal)

    def _ignorable(self, text: str, inside_rule: bool) -> str:
        return f"{self.ignore} {text}" if self.ignore and inside_rule else text

    def _terminal(self, node: Node) -> str:
        kind = node[0]
        if kind == "lit":
            text, ignore_case = node[1], node[2]
            if self.forbid and self.forbid in text:
                raise CannotTranslateError(f"the literal {text!r} holds {self.forbid!r}")
            if not ignore_case:
                return self._literal(text)
            parts = []
            for char in text:
                cased = chars(char.lower(), char.upper())
                parts.append(self._chars(cased) if len(cased) > 1 else self._literal(char))
            return " ".join(parts)
        if kind == "range":
            return self._chars(chars((node[1], node[2])))
        pattern = _python_pattern(node[1], node[2])
        try:
            dfa = pattern_dfa(f"^(?:{pattern})$", search=False)
            if self.forbid:
                dfa = dfa.intersect(without(self.forbid))
        except PatternError as exc:
            raise CannotTranslateError(f"the regex /{node[1]}/ uses {exc}") from None
        except TooComplexError:
            raise CannotTranslateError(f"the regex /{node[1]}/ is too large") from None
        return self._dfa(dfa, f"/{node[1]}/")

    def _literal(self, text: str) -> str:
        return literal(json_text(text)[1:-1] if self.json_string else text)

    def _chars(self, charset: CharSet) -> str:
        one = explore(0, lambda s: s == 1, lambda s: [(charset, 1)] if s == 0 else [])
        return self._dfa(one, "a character range")

    def _dfa(self, dfa: Dfa, what: str) -> str:
        if dfa.empty:
            raise CannotTranslateError(f"{what} matches nothing")
        return to_gbnf(dfa, self.rules, f"{self.hint}-re", json_string=self.json_string)


def lark_rules(
    definition: str, rules: Rules, hint: str, *, json_string: bool, forbid: str | None = None
) -> str:
    """Rules (into ``rules``, named from ``hint``) for the text the Lark grammar
    ``definition`` accepts from its ``start`` rule; returns the start's rule name.

    Error handling: :class:`CannotTranslateError` for a grammar outside the subset (nothing
    is then left in ``rules`` that the returned rules use; half-written ones may be).
    """
    definitions, imports, ignored = _parse(definition)
    if "start" not in definitions:
        raise CannotTranslateError("the grammar has no 'start' rule")
    writer = _Writer(
        rules, hint, definitions, imports, ignored, json_string=json_string, forbid=forbid
    )
    start = writer.definition("", "start")
    if writer.ignore:
        return rules.add(f"{hint}-text", f"{start} {writer.ignore}")
    return start


def regex_rules(
    pattern: str, rules: Rules, hint: str, *, json_string: bool, forbid: str | None = None
) -> str:
    """Rules for the texts ``pattern`` matches whole (the ``regex`` syntax of a ``custom``
    tool: :mod:`._regex`'s subset); returns the start rule's name.

    Error handling: :class:`CannotTranslateError` for a pattern outside the subset.
    """
    try:
        dfa = pattern_dfa(f"^(?:{pattern})$", search=False)
        if forbid:
            dfa = dfa.intersect(without(forbid))
    except PatternError as exc:
        raise CannotTranslateError(f"the regex uses {exc}") from None
    except TooComplexError:
        raise CannotTranslateError("the regex is too large a grammar") from None
    if dfa.empty:
        raise CannotTranslateError("the regex matches nothing")
    return to_gbnf(dfa, rules, f"{hint}-re", json_string=json_string)


def lark_grammar(definition: str) -> str:
    """The whole GBNF grammar (root rule ``root``) of the Lark grammar ``definition``.

    Error handling: :class:`CannotTranslateError`.
    """
    rules = Rules()
    rules.define("root", "")
    rules.define("root", lark_rules(definition, rules, "lark", json_string=False))
    return rules.text()
