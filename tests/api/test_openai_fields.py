"""The new OpenAI request fields, parsed without a model: response_format, penalties,
logprobs, refused fields, ``/v1/completions`` bodies, every nested field the field table
names; the tool-call parser under any split."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmtrio.api import (
    FIELDS,
    MESSAGE_FIELDS,
    NAMED_TOOL_CHOICE,
    RESPONSE_FORMAT_JSON_SCHEMA,
    TEXT_PARTS,
    ApiError,
    Field,
)
from llmtrio.engine import (
    JSON_OBJECT_GRAMMAR,
    InvalidRequestError,
    Tool,
    ToolCall,
    ToolCallParser,
    json_schema_grammar,
)
from llmtrio.worker._chat_request import parse_chat_request
from llmtrio.worker._completions import parse_completion_request

HI = [{"role": "user", "content": "Hi"}]


def chat(**fields: Any) -> Any:
    return parse_chat_request(json.dumps({"messages": HI, **fields}).encode())


def refused(parse: Any, **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse(**fields)
    assert info.value.status == 400
    return info.value


def test_response_formats() -> None:
    assert chat(response_format={"type": "text"}).generate.grammar is None
    assert chat(response_format={"type": "json_object"}).generate.grammar == JSON_OBJECT_GRAMMAR
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    request = chat(
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": True},
        }
    )
    # The engine compiles the schema (off the event loop, once per schema).
    assert request.generate.json_schema == schema and request.generate.grammar is None
    assert request.generate.think is False
    assert refused(chat, response_format={"type": "yaml"}).param == "response_format.type"
    missing = refused(chat, response_format={"type": "json_schema", "json_schema": {"schema": {}}})
    assert missing.param == "response_format.json_schema.name"
    not_a_schema = refused(
        chat, response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}
    )
    assert not_a_schema.param == "response_format.json_schema.schema"


def test_the_keywords_a_grammar_cannot_enforce_are_named() -> None:
    # Each refusal names its keyword; tests/engine/test_schema_grammar.py has them all.
    for schema, words in (
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "'uniqueItems'"),
        ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
        ({"properties": {"a": {"if": {}, "then": {}}}}, "'if'"),
    ):
        with pytest.raises(InvalidRequestError, match=words) as info:
            json_schema_grammar(schema)
        assert info.value.param == "json_schema"


def test_annotations_and_refs_are_fine() -> None:
    grammar = json_schema_grammar(
        {
            "title": "T",
            "description": "d",
            "$defs": {"Item": {"type": "string", "enum": ["a", "b"]}},
            "type": "object",
            "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}}},
            "required": ["items"],
            "additionalProperties": False,
        }
    )
    assert "root ::=" in grammar
    # JSON strings cannot hold raw control characters: the grammar must not allow them.
    strings = json_schema_grammar({"type": "object", "properties": {"s": {"type": "string"}}})
    assert r'char ::= [^"\\\x7F\x00-\x1F]' in strings


def test_penalties_and_logprobs() -> None:
    sampling = chat(presence_penalty=1.5, frequency_penalty=-0.5, repeat_penalty=1.1).generate
    assert (sampling.sampling.presence_penalty, sampling.sampling.frequency_penalty) == (1.5, -0.5)
    assert sampling.sampling.repeat_penalty == 1.1 and sampling.sampling.penalized
    assert not chat().generate.sampling.penalized
    assert chat(logprobs=True).generate.logprobs == 0
    assert chat(logprobs=True, top_logprobs=20).generate.logprobs == 20
    assert chat(logprobs=False).generate.logprobs is None
    assert refused(chat, frequency_penalty=-3).param == "frequency_penalty"
    assert refused(chat, repeat_penalty=0).param == "repeat_penalty"
    assert refused(chat, logprobs="yes").param == "logprobs"


@pytest.mark.parametrize(
    "field",
    [
        {"audio": {"voice": "alloy", "format": "wav"}},
        {"modalities": ["audio"]},
        {"prediction": {"type": "content", "content": "x"}},
        {"web_search_options": {}},
        {"functions": [{"name": "f"}]},
        {"function_call": "auto"},
    ],
)
def test_unimplemented_openai_fields_are_refused(field: dict[str, Any]) -> None:
    [name] = field
    error = refused(chat, **field)
    assert error.param == name and error.code == "unsupported_parameter"


def test_reasoning_effort_sets_thinking_and_its_budget() -> None:
    """OpenAI's effort levels (and llmtrio's ``max``) through ``_reasoning.EFFORTS``; an
    explicit ``think``/``enable_thinking`` wins on the switch, the budget stays."""

    def reasoning(**fields: Any) -> tuple[bool | None, int | None]:
        generate = chat(**fields).generate
        return generate.think, generate.reasoning_budget

    assert reasoning() == (None, None)
    assert reasoning(reasoning_effort="none") == (False, 0)
    assert reasoning(reasoning_effort="minimal") == (False, 0)
    assert reasoning(reasoning_effort="low") == (True, 1024)
    assert reasoning(reasoning_effort="medium") == (True, 4096)
    assert reasoning(reasoning_effort="high") == (True, 16384)
    assert reasoning(reasoning_effort="xhigh") == (True, 32768)
    assert reasoning(reasoning_effort="max") == (True, None)
    assert reasoning(reasoning_effort="high", think=False) == (False, 16384)
    kwargs = {"enable_thinking": True}
    assert reasoning(reasoning_effort="none", chat_template_kwargs=kwargs) == (True, 0)
    # A grammar turns thinking off; an effort does not make that a 400 (``think`` does).
    json_object = {"type": "json_object"}
    assert reasoning(reasoning_effort="high", response_format=json_object) == (False, 16384)
    for bad in ("extreme", 3, ""):
        error = refused(chat, reasoning_effort=bad)
        assert (error.param, error.code) == ("reasoning_effort", "invalid_value")


@pytest.mark.parametrize(
    "fields",
    [
        {"user": "u", "metadata": {"a": "b"}, "store": False, "service_tier": "auto"},
        {"modalities": ["text"]},
        {"some_other_server_field": 1},
    ],
)
def test_bookkeeping_and_foreign_fields_are_ignored(fields: dict[str, Any]) -> None:
    # Parsed to the very request the body without them gives: nothing of them reaches the
    # generation, the tools, the stream or the model asked for.
    base = {"max_tokens": 7, "temperature": 0.5, "stream": True}
    assert chat(**base, **fields) == chat(**base)


# A chat body with every nested field of the field table given, and where each of the
# table's nested fields sits in it.
WEATHER = {"name": "get_weather", "description": "w", "parameters": {"type": "object"}}
NESTED_BODY: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "s", "name": "n"},
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                          "arguments": "{}"}}]},
        {"role": "tool", "content": "r", "tool_call_id": "c1"},
    ],
    "tools": [{"type": "function", "function": WEATHER}],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "response_format": {"type": "json_schema",
                        "json_schema": {"name": "x", "schema": {}, "strict": True}},
    "stream": True,
    "stream_options": {"include_usage": True},
    "chat_template_kwargs": {"enable_thinking": False},
}  # fmt: skip
_CHAT_FIELDS = {f.name: f for f in FIELDS if "chat" in f.endpoints}
NESTED_SPECS: list[tuple[str, Field]] = [
    *((f"messages[{i}]", MESSAGE_FIELDS[m["role"]]) for i, m in enumerate(NESTED_BODY["messages"])),
    ("messages[1].content", TEXT_PARTS),
    *((name, _CHAT_FIELDS[name])
      for name in ("tools", "response_format", "stream_options", "chat_template_kwargs")),
    ("response_format.json_schema", RESPONSE_FORMAT_JSON_SCHEMA),
    ("tool_choice", NAMED_TOOL_CHOICE),
]  # fmt: skip
_WRONG = {"string": 5, "boolean": "yes", "object": "x", "array": "x", "schema": "x"}


def _wrong_values(spec: Field, param: str, owner: str) -> Any:
    """``(param, wrong value, the param its error names)`` for ``spec`` and every field nested
    in it; a ``whole`` field names itself for any fault within."""
    owner = param if spec.whole else owner
    if spec.enum:
        yield param, "nope", owner or param
    elif spec.type in _WRONG:
        yield param, _WRONG[spec.type], owner or param
    for part in spec.properties:
        yield from _wrong_values(part, f"{param}.{part.name}", owner)
    if spec.items is not None:
        yield from _wrong_values(spec.items, f"{param}[0]", owner)


def _set(body: Any, param: str, value: Any) -> None:
    path = param.replace("[", ".").replace("]", "").split(".")
    keys = [int(k) if k.isdigit() else k for k in path]
    for key in keys[:-1]:
        body = body[key]
    body[keys[-1]] = value


def test_the_nested_body_is_accepted() -> None:
    request = parse_chat_request(json.dumps(NESTED_BODY).encode())
    assert request.tools.mode == "required"
    assert [m.role for m in request.generate.messages] == ["system", "user", "assistant", "tool"]


@pytest.mark.parametrize(
    ("param", "value", "named"),
    [
        wrong
        for where, spec in NESTED_SPECS
        for wrong in _wrong_values(spec, where, "")
        # The type of a union's branch is the endpoint's to tell (a message, a content).
        if wrong[0] != where or spec.name == where
    ],
)
def test_every_nested_field_of_the_table_is_checked(param: str, value: Any, named: str) -> None:
    """A wrong value anywhere the field table describes is refused, naming that field (or the
    field whose faults are reported whole): the validator checks what the document says."""
    body = json.loads(json.dumps(NESTED_BODY))
    _set(body, param, value)
    with pytest.raises(ApiError) as info:
        parse_chat_request(json.dumps(body).encode())
    error = info.value
    assert (error.status, error.param) == (400, named)
    assert error.code in ("invalid_type", "invalid_value", "missing_required_parameter")


def completion(**fields: Any) -> Any:
    return parse_completion_request(json.dumps(fields).encode())


def test_completion_bodies() -> None:
    text = completion(prompt="Once", stream=True, stream_options={"include_usage": True})
    assert text.prompt == "Once" and text.stream and text.include_usage
    assert text.options["max_tokens"] == 16  # OpenAI's default
    assert completion(prompt=[1, 2, 3]).prompt == (1, 2, 3)
    assert completion(prompt=["only one"]).prompt == "only one"
    assert completion(prompt=[[5, 6]]).prompt == (5, 6)
    generate = completion(prompt="x", logprobs=3, max_tokens=5).generate(lambda t: [7, 8])
    assert generate.tokens == (7, 8) and generate.logprobs == 3 and generate.max_tokens == 5
    assert generate.cache_prompt is True
    no_reuse = completion(prompt="x", cache_prompt=False).generate(lambda t: [7])
    assert no_reuse.cache_prompt is False
    assert completion(prompt="x", n=1, best_of=1, echo=False).options
    for fields, param in (
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "best_of": 2}, "best_of"),
        ({"prompt": "x", "n": 3}, "n"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "x", "logprobs": 21}, "logprobs"),
        ({"prompt": [1, "a"]}, "prompt"),
        ({"prompt": "x", "cache_prompt": 1}, "cache_prompt"),
    ):
        assert refused(completion, **fields).param == param, fields


TOOLS = (
    Tool("lookup", "", {"type": "object", "properties": {"q": {"type": "string"}}}),
    Tool("count", "", {"type": "object", "properties": {"n": {"type": "integer"}}}),
)
_plain = st.text(alphabet=st.characters(blacklist_characters="<"), max_size=20)


@given(
    pieces=st.lists(
        st.one_of(
            _plain,
            st.builds(
                lambda q: ("lookup", {"q": q}),
                st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=10),
            ),
            st.builds(lambda n: ("count", {"n": n}), st.integers()),
        ),
        max_size=6,
    ),
    cuts=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=30),
)
def test_parser_finds_every_call_under_any_split(pieces: list[Any], cuts: list[int]) -> None:
    text = ""
    expected: list[str | tuple[str, Any]] = []
    for piece in pieces:
        if isinstance(piece, str):
            text += piece
            expected.append(piece)
        else:
            name, arguments = piece
            call = json.dumps({"name": name, "arguments": arguments})
            text += f"<tool_call>\n{call}\n</tool_call>"
            expected.append(piece)
    parser = ToolCallParser(TOOLS)
    items: list[str | ToolCall] = []
    at, i = 0, 0
    while at < len(text):
        step = cuts[i % len(cuts)]
        items += parser.feed(text[at : at + step])
        at += step
        i += 1
    items += parser.flush()
    calls = [(c.name, json.loads(c.arguments)) for c in items if isinstance(c, ToolCall)]
    assert calls == [p for p in expected if isinstance(p, tuple)]
    content = "".join(c for c in items if isinstance(c, str))
    assert content == "".join(p for p in expected if isinstance(p, str))
