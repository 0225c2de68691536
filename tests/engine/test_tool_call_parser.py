"""The streaming tool-call parser, without a model: calls in either format, split anywhere,
give their id and name first and then argument pieces that concatenate to the arguments; a
call cut short keeps a prefix of them; what is not a call stays content."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from llmtrio.engine import (
    Tool,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallParser,
    ToolCallStart,
    ToolCallStream,
)

LOOKUP = Tool(
    "lookup",
    "",
    {
        "type": "object",
        "properties": {
            "q": {"type": "string"},
            "n": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "mode": {"enum": ["fast", "slow"]},
        },
    },
)
TIME = Tool("get_time", "", {"type": "object", "properties": {}})
TOOLS = (LOOKUP, TIME)

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
_plain = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="<"), max_size=15)


@st.composite
def calls(draw: Any) -> tuple[str, str, dict[str, Any]]:
    """A call's text in either form, its tool's name, and its arguments."""
    if draw(st.booleans()):
        return "<tool_call>\n<function=get_time>\n</function>\n</tool_call>", "get_time", {}
    arguments: dict[str, Any] = {}
    if draw(st.booleans()):
        arguments["q"] = draw(_text)
    if draw(st.booleans()):
        arguments["n"] = draw(st.integers(-(10**9), 10**9))
    if draw(st.booleans()):
        arguments["tags"] = draw(st.lists(_text, max_size=3))
    if draw(st.booleans()):
        arguments["mode"] = draw(st.sampled_from(["fast", "slow"]))
    if draw(st.booleans()):  # JSON, spaced as the model likes
        indent = draw(st.sampled_from([None, 2]))
        body = json.dumps({"name": "lookup", "arguments": arguments}, indent=indent)
        return f"<tool_call>\n{body}\n</tool_call>", "lookup", arguments
    parameters = "".join(
        f"<parameter={key}>\n{value if key in ('q', 'mode') else json.dumps(value)}\n</parameter>\n"
        for key, value in arguments.items()
    )
    return (
        f"<tool_call>\n<function=lookup>\n{parameters}</function>\n</tool_call>",
        "lookup",
        arguments,
    )


def feed_text(stream: ToolCallStream, text: str, cuts: list[int]) -> list[tuple[Any, int]]:
    events: list[tuple[Any, int]] = []
    at, i = 0, 0
    while at < len(text):
        step = cuts[i % len(cuts)]
        events += [(event, at + step) for event in stream.feed(text[at : at + step])]
        at += step
        i += 1
    return events


def arguments_of(events: list[Any], index: int) -> str:
    return "".join(e.text for e in events if isinstance(e, ToolCallArguments) and e.index == index)


@given(
    pieces=st.lists(st.one_of(_plain, calls()), max_size=5),
    cuts=st.lists(st.integers(1, 9), min_size=1, max_size=20),
)
def test_calls_stream_as_start_then_argument_pieces(pieces: list[Any], cuts: list[int]) -> None:
    text = "".join(p if isinstance(p, str) else p[0] for p in pieces)
    expected = [p for p in pieces if not isinstance(p, str)]
    stream = ToolCallStream(TOOLS)
    timed = feed_text(stream, text, cuts) + [(e, len(text)) for e in stream.finish()]
    events = [e for e, _ in timed]
    assert "".join(e for e in events if isinstance(e, str)) == "".join(
        p for p in pieces if isinstance(p, str)
    )
    starts = [e for e in events if isinstance(e, ToolCallStart)]
    assert [(s.index, s.name) for s in starts] == [(i, c[1]) for i, c in enumerate(expected)]
    assert len({s.id for s in starts}) == len(starts)
    assert [e for e in events if isinstance(e, ToolCallEnd)] == [
        ToolCallEnd(i, True) for i in range(len(expected))
    ]
    for i, (_, _, arguments) in enumerate(expected):
        own = [e for e in events if getattr(e, "index", None) == i]
        assert isinstance(own[0], ToolCallStart) and isinstance(own[-1], ToolCallEnd)
        assert all(isinstance(e, ToolCallArguments) for e in own[1:-1])
        assert json.loads(arguments_of(events, i)) == arguments
    # Read whole, the reply gives the same calls.
    whole = ToolCallParser(TOOLS)
    items = whole.feed(text) + whole.flush()
    assert [(c.name, c.arguments) for c in items if isinstance(c, ToolCall)] == [
        (s.name, arguments_of(events, s.index)) for s in starts
    ]


@given(call=calls(), cut=st.integers(0, 10_000))
def test_a_call_cut_short_keeps_a_prefix_of_its_arguments(
    call: tuple[str, str, dict[str, Any]], cut: int
) -> None:
    text = call[0]
    whole = ToolCallStream(TOOLS)
    full = arguments_of(whole.feed(text) + whole.finish(), 0)
    cut %= len(text)
    stream = ToolCallStream(TOOLS)
    events = stream.feed(text[:cut]) + stream.finish()
    arguments = arguments_of(events, 0)
    assert arguments == full[: len(arguments)]
    ends = [e for e in events if isinstance(e, ToolCallEnd)]
    if any(isinstance(e, ToolCallStart) for e in events):
        assert ends == [ToolCallEnd(0, arguments == full)]
    else:  # cut before the name: the text is content, as it stands
        assert "".join(e for e in events if isinstance(e, str)) == text[:cut]


def test_arguments_stream_before_the_call_ends() -> None:
    body = json.dumps({"name": "lookup", "arguments": {"q": "x" * 40}})
    for text in (
        f"<tool_call>\n{body}\n</tool_call>",
        "<tool_call>\n<function=lookup>\n<parameter=q>\n"
        + "x" * 40
        + "\n</parameter>\n</function>\n</tool_call>",
    ):
        timed = feed_text(ToolCallStream(TOOLS), text, [1])
        first = next(at for e, at in timed if isinstance(e, ToolCallArguments))
        start = next(at for e, at in timed if isinstance(e, ToolCallStart))
        end = next(at for e, at in timed if isinstance(e, ToolCallEnd))
        pieces = [e for e, _ in timed if isinstance(e, ToolCallArguments)]
        assert start < first < end - 40 and len(pieces) > 40


def events_of(text: str) -> list[Any]:
    stream = ToolCallStream(TOOLS)
    return stream.feed(text) + stream.finish()


def test_what_is_not_a_call_is_content() -> None:
    for text in (
        "a <tool_call>not json</tool_call> b",
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        "<tool_call><function=nope></function></tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        "x <tool_",
        '<tool_call>\n{"name": ',
    ):
        events = events_of(text)
        assert all(isinstance(e, str) for e in events) and "".join(events) == text, text


def test_json_forms() -> None:
    late = events_of('<tool_call>{"arguments": {"q": "a"}, "name": "lookup"}</tool_call>')
    assert [type(e) for e in late] == [ToolCallStart, ToolCallArguments, ToolCallEnd]
    assert arguments_of(late, 0) == '{"q": "a"}'
    as_string = events_of('<tool_call>{"name": "lookup", "arguments": "{\\"n\\": 1}"}</tool_call>')
    assert arguments_of(as_string, 0) == '{"n": 1}'
    none = events_of('<tool_call>{"name": "get_time"}</tool_call>')
    assert arguments_of(none, 0) == "{}"
    # The object closed: whole, even if the reply ends before the closing tag.
    assert events_of('<tool_call>{"name": "get_time"}')[-1] == ToolCallEnd(0, True)
    assert events_of('<tool_call>{"name": "get_time", "argu')[-1] == ToolCallEnd(0, False)
    inside = events_of(
        '<tool_call>{"name": "lookup", "arguments": {"q": "</tool_call>"}}</tool_call>'
    )
    assert json.loads(arguments_of(inside, 0)) == {"q": "</tool_call>"}


def test_xml_values() -> None:
    text = (
        "<tool_call>\n<function=lookup>\n<parameter=q>\na < b\n\nc\n</parameter>\n"
        "<parameter=n>\nnot a number\n</parameter>\n<parameter=mode>\n1\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    assert json.loads(arguments_of(events_of(text), 0)) == {
        "q": "a < b\n\nc",
        "n": "not a number",  # a value that is not JSON is passed on as a string
        "mode": "1",  # an enum of strings is written raw
    }


def test_a_call_malformed_after_it_started_keeps_what_was_sent() -> None:
    broken = events_of('<tool_call>{"name": "lookup", "arguments": {"q": "x"</tool_call> after')
    assert [type(e) for e in broken] == [ToolCallStart, ToolCallArguments, ToolCallEnd, str]
    assert arguments_of(broken, 0) == '{"q": "x"'
    assert broken[2] == ToolCallEnd(0, False) and broken[3] == " after"  # not whole
    cut = events_of("<tool_call>\n<function=lookup>\n<parameter=q>\nPar")
    assert arguments_of(cut, 0) == '{"q": "Par' and cut[-1] == ToolCallEnd(0, False)
