"""Lark grammars as GBNF (``llmtrio.engine.grammar``'s translator for text tools): what the
translation accepts, asked of llama.cpp's grammar engine, against what Lark itself parses;
the JSON-string form; and a clear "cannot translate" for what is outside the subset."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import lark
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmtrio.engine import CannotTranslateError, lark_grammar
from llmtrio.engine.grammar import Rules, lark_rules

from .._grammar_probe import GrammarProbe

ARITHMETIC = r"""
// sums of integers and parenthesized sums, spaces anywhere between tokens
start: expr
expr: term (("+" | "-") term)*
?term: INT
     | "(" expr ")"
%import common.INT
%import common.WS
%ignore WS
"""
SELECT = r"""
start: "select"i _SP name ("," _SP? name)~0..2 [_SP "limit" _SP NUMBER]
name: /[a-z_][a-z0-9_]*/ | QUOTED
QUOTED: "\"" /[^"\n]+/ "\""
_SP: " "+
%import common (NUMBER)
"""
LINES = r"""
start: line+
line: ("#" | ">") [/.+/] "\n" -> marked
    | /[a-c]{2,3}/ "\n"
"""


@pytest.fixture(scope="module")
def probe(gemma_path: Path) -> Iterator[GrammarProbe]:
    found = GrammarProbe(gemma_path)
    yield found
    found.close()


def lark_accepts(parser: lark.Lark, text: str) -> bool:
    try:
        parser.parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


@pytest.mark.parametrize(
    ("grammar", "accepted", "refused"),
    [
        (ARITHMETIC, ["1", "1+2", " ( 3 - 40 ) +5 ", "((7))", "1 "], ["", "1+", "(1", "+1", "1 2"]),
        (
            SELECT,
            ["SELECT a", "select a, b,c", 'Select "x y" limit 1.5e3', "select a_1, b, c"],
            ["select", "selecta", "select a, b, c, d", "select A", 'select "x\ny"'],
        ),
        (LINES, ["#\n", "> any text\n#x\nab\n", "abc\n"], ["", "a\n", "abcd\n", "#x"]),
    ],
    ids=["arithmetic", "select", "lines"],
)
def test_the_translation_accepts_what_lark_parses(
    probe: GrammarProbe, grammar: str, accepted: list[str], refused: list[str]
) -> None:
    gbnf = lark_grammar(grammar)
    parser = lark.Lark(grammar, parser="earley")
    for text in accepted:
        assert lark_accepts(parser, text), text
        assert probe.accepts(gbnf, text), text
    for text in refused:
        assert not lark_accepts(parser, text), text
        assert not probe.accepts(gbnf, text), text


@settings(max_examples=150, deadline=None)
@given(text=st.text(st.sampled_from(list("12+-() ")), max_size=9))
def test_the_translation_and_lark_agree_on_any_text(probe: GrammarProbe, text: str) -> None:
    parser = _arithmetic()
    assert probe.accepts(lark_grammar(ARITHMETIC), text) == lark_accepts(parser, text)


@functools.cache
def _arithmetic() -> lark.Lark:
    return lark.Lark(ARITHMETIC, parser="earley")


def test_the_json_string_form_takes_the_text_escaped(probe: GrammarProbe) -> None:
    """Inside a JSON string the same texts are accepted, written as JSON writes them
    (quotes, backslashes and newlines escaped)."""
    grammar = 'start: "say " /"[^"]*"/ "\\n" ("\\\\" | "ok")\n'
    rules = Rules()
    rules.define("root", "")
    start = lark_rules(grammar, rules, "t", json_string=True)
    rules.define("root", f'"\\"" {start} "\\""')
    json_form = rules.text()
    raw_form = lark_grammar(grammar)
    for text, ok in (('say "hi"\n\\', True), ('say "a b"\nok', True), ("say hi\nok", False)):
        assert probe.accepts(raw_form, text) is ok
        assert probe.accepts(json_form, json.dumps(text)) is ok
        assert not probe.accepts(json_form, '"' + text + '"') or text == json.dumps(text)[1:-1]


def test_the_s_flag_lets_dot_take_a_newline(probe: GrammarProbe) -> None:
    assert probe.accepts(lark_grammar("start: /a.b/s\n"), "a\nb")
    assert not probe.accepts(lark_grammar("start: /a.b/\n"), "a\nb")
    assert probe.accepts(lark_grammar("start: /a.b/\n"), "a\rb")  # Python's dot takes \r


@pytest.mark.parametrize(
    ("grammar", "words"),
    [
        ('start: _sep{"a", ","}\n_sep{x, sep}: x (sep x)*\n', "template"),
        ("start: A\n%declare A\n", "%declare"),
        ("start: NAME\n%import python.NAME\n", "'python'"),
        ("start: /a(?=b)/\n", "lookaround"),
        ("start: /abc/i\n", "flag 'i'"),
        ("start: other\n", "other is used but not defined"),
        ('main: "a"\n', "no 'start' rule"),
        ('start: "a"\nstart: "b"\n', "defined twice"),
        ('%llguidance {}\nstart: "a"\n', "%llguidance is not translated"),
        ('start: "a" %ignore\n', "unexpected '%ignore'"),
        ('start: "a" @ "b"\n', "cannot read"),
    ],
)
def test_what_cannot_be_translated_says_what(grammar: str, words: str) -> None:
    with pytest.raises(CannotTranslateError, match=words.replace("(", r"\(")):
        lark_grammar(grammar)
