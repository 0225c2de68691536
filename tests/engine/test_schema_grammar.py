"""JSON Schema to grammar, checked against llama.cpp's own grammar engine (the sampler the
engine uses, driven byte by byte with the gemma test model's vocabulary): every string it
accepts validates (``jsonschema`` with its format checker, numbers compared exactly), and
valid values written in the grammar's forms are accepted."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from llmtrio.engine import InvalidRequestError, json_schema_grammar

from .._grammar_probe import GrammarProbe
from .._schemas import FORMATS, canonical, instances, schemas, validator

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def probe(gemma_path: Path) -> Iterator[GrammarProbe]:
    probe = GrammarProbe(gemma_path)
    yield probe
    probe.close()


def test_the_format_checker_checks_every_enforced_format() -> None:
    # jsonschema skips a format it has no checker for (a missing extra): that would make
    # every check below pass without looking.
    assert set(FORMATS) <= set(Draft202012Validator.FORMAT_CHECKER.checkers)


def grammar_of(schema: object) -> str:
    """The schema's grammar; a random schema nothing can satisfy is skipped (the converter
    finds that out and refuses it: a grammar that accepts nothing would leave a model stuck)."""
    try:
        return json_schema_grammar(schema)
    except InvalidRequestError as exc:
        assume("no string meets" not in str(exc) and "no number meets" not in str(exc))
        raise


def walk(probe: GrammarProbe, grammar: str, data: st.DataObject) -> str:
    def choose(n: int, can_end: bool) -> int:
        if can_end and data.draw(st.booleans()):
            return -1
        return data.draw(st.integers(0, n - 1))

    text = probe.walk(grammar, choose)
    assume(text is not None)
    assert text is not None
    return text


@PROPERTY
@given(schema=schemas(), data=st.data())
def test_what_the_grammar_accepts_validates(
    probe: GrammarProbe, schema: dict[str, Any], data: st.DataObject
) -> None:
    grammar = grammar_of(schema)
    for _ in range(2):
        text = walk(probe, grammar, data)
        errors = list(validator(schema).iter_errors(json.loads(text, parse_float=Decimal)))
        assert not errors, (text, errors[0].message)


@PROPERTY
@given(schema=schemas(), data=st.data())
def test_valid_values_are_accepted(
    probe: GrammarProbe, schema: dict[str, Any], data: st.DataObject
) -> None:
    grammar = grammar_of(schema)
    for _ in range(2):
        value = data.draw(instances(schema))
        assert not list(validator(schema).iter_errors(value)), value
        assert probe.accepts(grammar, canonical(value)), canonical(value)


@pytest.mark.parametrize(
    ("schema", "accepted", "refused"),
    [
        (
            {"type": "integer", "minimum": 0, "maximum": 150},
            ["0", "7", "99", "150"],
            ["-1", "151", "007", "1.0", "1e2", "-0"],
        ),
        (
            {"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 20, "multipleOf": 4},
            ["0", "4", "16"],
            ["-4", "20", "2", "-3"],
        ),
        (
            {"type": "number", "exclusiveMinimum": 0.5, "maximum": 2.25},
            ["0.51", "1", "2.25", "2.2499"],
            ["0.5", "0.50", "2.26", "-1", "2.250001"],
        ),
        ({"type": "number", "multipleOf": 0.25}, ["0.75", "-2", "3.5"], ["0.3", "0.125"]),
        ({"type": "string", "pattern": "[0-9]{3}"}, ['"ab123cd"', '"123"'], ['"12a3"', '""']),
        ({"type": "string", "pattern": "^a|b$"}, ['"ax"', '"xb"'], ['"xa"', '"bx"']),
        (
            {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3},
            ['"ab"', '"abc"'],
            ['"a"', '"abcd"', '"aB"'],
        ),
        (
            {"type": "string", "format": "date"},
            ['"2024-02-29"', '"2000-02-29"'],
            ['"2023-02-29"', '"1900-02-29"', '"2024-13-01"', '"0000-01-01"'],
        ),
        ({"type": "string", "format": "ipv4"}, ['"10.0.0.255"'], ['"10.0.0.256"', '"01.2.3.4"']),
        (
            {"type": "string", "maxLength": 2},
            ['"é\\n"', '"\\"\\\\"', '"\\u007f"'],
            ['"abc"', '"\n"'],
        ),
        (
            {"type": ["integer", "null"], "minimum": 1},
            ["1", "null"],
            ["0", '"1"'],
        ),
        (
            {"enum": ["a", 1, None], "type": "string"},
            ['"a"'],
            ["1", "null"],
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
                "required": ["b"],
                "additionalProperties": False,
            },
            ['{"b": true}', '{"a": 1, "b": false}', '{\n  "a": 1,\n  "b": true\n}'],
            ["{}", '{"a": 1}', '{"b": true, "c": 1}', '{"b": true, "a": 1}'],
        ),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "additionalProperties": {"type": "boolean"},
            },
            ['{"a": 1, "b": true}', '{"x": false}'],
            ['{"a": true}', '{"a": 1, "a": true}', '{"b": 1}'],
        ),
        (
            {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 2},
            ["[true]", "[true, false]"],
            ["[]", "[true, true, true]"],
        ),
    ],
)
def test_keywords_hold_exactly(
    probe: GrammarProbe, schema: dict[str, Any], accepted: list[str], refused: list[str]
) -> None:
    grammar = json_schema_grammar(schema)
    for text in accepted:
        assert probe.accepts(grammar, text), text
        assert not list(validator(schema).iter_errors(json.loads(text, parse_float=Decimal))), text
    for text in refused:
        assert not probe.accepts(grammar, text), text


def test_recursive_references(probe: GrammarProbe) -> None:
    tree = {
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string", "maxLength": 3},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
                "required": ["label", "children"],
                "additionalProperties": False,
            }
        },
        "$ref": "#/$defs/Node",
    }
    grammar = json_schema_grammar(tree)
    deep = (
        '{"label": "a", "children": [{"label": "b", "children": [{"label": "c", "children": []}]}]}'
    )
    assert probe.accepts(grammar, deep)
    assert not probe.accepts(
        grammar, '{"label": "a", "children": [{"label": "toolong", "children": []}]}'
    )


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems'"),
        ({"not": {"type": "string"}}, "'not'"),
        ({"properties": {"a": {"if": {}, "then": {}}}}, "'if'"),
        ({"type": "object", "minProperties": 1}, "'minProperties'"),
        ({"type": "string", "format": "uri"}, "'uri'"),
        ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
        ({"type": "string", "pattern": "a(?=b)"}, "lookaround"),
        ({"type": "string", "pattern": "\\bword"}, "word boundary"),
        ({"type": "string", "pattern": "(?i)abc"}, "flag"),
        ({"type": "integer", "multipleOf": 101}, "'multipleOf' 101"),
        ({"type": "number", "multipleOf": 0.0101}, "'multipleOf' 0.0101"),
        ({"type": "integer", "minimum": 5, "maximum": 4}, "no number"),
        ({"type": "string", "minLength": 3, "maxLength": 2}, "'minLength' is above"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "'oneOf'"),
        ({"$ref": "https://example.com/schema"}, "local references"),
        ({"type": "decimal"}, "unknown type"),
        (False, "matches nothing"),
    ],
)
def test_what_a_grammar_cannot_enforce_is_refused_by_name(schema: object, words: str) -> None:
    with pytest.raises(InvalidRequestError, match=words.replace("(", r"\(")):
        json_schema_grammar(schema)


def test_a_discriminated_one_of_is_enforced(probe: GrammarProbe) -> None:
    cat = {
        "type": "object",
        "properties": {
            "kind": {"const": "cat"},
            "lives": {"type": "integer", "minimum": 1, "maximum": 9},
        },
        "required": ["kind", "lives"],
        "additionalProperties": False,
    }
    dog = {
        "type": "object",
        "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
        "required": ["kind", "good"],
        "additionalProperties": False,
    }
    grammar = json_schema_grammar({"oneOf": [cat, dog], "discriminator": {"propertyName": "kind"}})
    assert probe.accepts(grammar, '{"kind": "cat", "lives": 9}')
    assert not probe.accepts(grammar, '{"kind": "cat", "good": true}')


PATTERN_CASES = [
    "[a-z]+",
    "^[a-z]+$",
    "^a|b$",
    "^[0-9]{2,3}$",
    "ab*c",
    "^(foo|bar)+baz?$",
    "colou?r",
    "^.{2,4}$",
    "x{2,}",
    "^[^a-c]x",
    r"\.",
    "(?:ab|c)d",
    "^$",
]


@given(
    pattern=st.sampled_from(PATTERN_CASES),
    text=st.text(st.sampled_from(list("abcdfoxyrzu019.-é\n")), max_size=8),
)
def test_patterns_mean_what_python_re_search_means(pattern: str, text: str) -> None:
    """What a pattern's automaton accepts, ``re.search`` matches; and the converse, but for
    Python's ``$`` also matching before a final newline (a grammar writes no such string)."""
    from llmtrio.engine.grammar._regex import pattern_dfa

    accepted = pattern_dfa(pattern).accepts(text)
    if accepted:
        assert re.search(pattern, text)
    elif re.search(pattern, text):
        assert re.search(pattern.replace("$", r"\Z"), text) is None
