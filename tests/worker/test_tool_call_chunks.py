"""Streamed tool calls in the chat encoder, without a model: a call's first delta carries its
index, id, type and name, later deltas pieces of its arguments, as the text arrives; the
official client's own stream accumulator (``ChatCompletionStreamState``, what
``client.chat.completions.stream`` runs) reads them; the pieces join to the non-streamed
arguments; a call that turns out malformed keeps what was sent."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from llmtrio.engine import Done, StopReason, Timings, Token
from llmtrio.worker._chat_request import parse_chat_request
from llmtrio.worker._chat_response import ChatBody, ChatStream
from llmtrio.worker._encoding import ResponseMeta

from .test_chat_translation import events_json
from .test_tool_fields import TOOLS_JSON, body

META = ResponseMeta("chatcmpl-abc", 1700000000, "qwen")
DONE = Done(StopReason.END_OF_GENERATION, 7, 30, Timings(0.001, 0.02, 0.05))
ARGUMENTS = {"city": "New York", "unit": "c", "days": 3}
XML_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    "<parameter=unit>\nc\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
    "</function>\n</tool_call>"
)
JSON_CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": '
    '{"city": "New York", "unit": "c", "days": 3}}\n</tool_call>'
)
TIME_CALL = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def encode(text: str, cuts: list[int], done: Done = DONE, **fields: Any) -> tuple[list[Any], bytes]:
    """The chunks a stream sends for ``text`` generated in pieces of the ``cuts`` sizes, and
    the body the same request gets without streaming."""
    fields.setdefault("tools", TOOLS_JSON)
    stream = ChatStream(parse_chat_request(body(stream=True, **fields)), META)
    whole = ChatBody(parse_chat_request(body(**fields)), META)
    out = stream.start()
    at, i = 0, 0
    while at < len(text):
        step = cuts[i % len(cuts)]
        out += stream.event(Token(text[at : at + step]))
        whole.event(Token(text[at : at + step]))
        at, i = at + step, i + 1
    out += stream.finish(done)
    chunks = events_json(out)
    assert chunks[-1] == "[DONE]"
    return chunks[:-1], whole.finish(done)


def tool_deltas(chunks: list[Any]) -> list[dict[str, Any]]:
    return [d for c in chunks for d in c["choices"][0]["delta"].get("tool_calls", [])]


def accumulate(chunks: list[Any]) -> tuple[Any, list[Any]]:
    """What the official client makes of the chunks: its final completion and its events."""
    state = ChatCompletionStreamState(input_tools=TOOLS_JSON)
    events = []
    for data in chunks:
        events += state.handle_chunk(ChatCompletionChunk.model_validate(data))
    return state.get_final_completion(), events


@pytest.mark.parametrize("text", [XML_CALL, JSON_CALL], ids=["xml", "json"])
def test_a_call_streams_its_head_then_argument_pieces(text: str) -> None:
    chunks, whole = encode("Sure. " + text, [3])
    deltas = tool_deltas(chunks)
    head, rest = deltas[0], deltas[1:]
    assert head["index"] == 0 and head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "get_weather", "arguments": ""}
    assert len(rest) > 3  # in pieces, as generated
    assert all(
        set(d) == {"index", "function"} and set(d["function"]) == {"arguments"} for d in rest
    )
    assert {d["index"] for d in rest} == {0}
    arguments = "".join(d["function"]["arguments"] for d in rest)
    assert json.loads(arguments) == ARGUMENTS
    # The official client's accumulator reads the same call, and its events name it.
    final, events = accumulate(chunks)
    [call] = final.choices[0].message.tool_calls
    assert (call.id, call.function.name) == (head["id"], "get_weather")
    assert call.function.arguments == arguments
    assert final.choices[0].finish_reason == "tool_calls"
    pieces = [e for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert "".join(e.arguments_delta for e in pieces) == arguments
    [done] = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert done.name == "get_weather" and done.arguments == arguments
    # Without streaming: the same arguments, the same content.
    message = json.loads(whole)["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["arguments"] == arguments
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content.strip() == message["content"] == "Sure."


@settings(deadline=None, max_examples=50)  # shared CPUs: no per-example deadline
@given(
    calls=st.lists(st.sampled_from([XML_CALL, JSON_CALL, TIME_CALL]), min_size=1, max_size=3),
    cuts=st.lists(st.integers(1, 7), min_size=1, max_size=10),
    parallel=st.booleans(),
)
def test_streamed_pieces_join_to_the_arguments_not_streamed(
    calls: list[str], cuts: list[int], parallel: bool
) -> None:
    chunks, whole = encode("\n".join(calls), cuts, parallel_tool_calls=parallel)
    expected = json.loads(whole)["choices"][0]["message"]["tool_calls"]
    assert len(expected) == (len(calls) if parallel else 1)
    final, _ = accumulate(chunks)
    streamed = final.choices[0].message.tool_calls
    assert [(c.index, c.function.name, c.function.arguments) for c in streamed] == [
        (i, e["function"]["name"], e["function"]["arguments"]) for i, e in enumerate(expected)
    ]
    heads = [d for d in tool_deltas(chunks) if "id" in d]
    assert [d["index"] for d in heads] == list(range(len(expected)))


def test_a_call_malformed_after_it_started_keeps_what_was_sent() -> None:
    """The arguments break off mid-object (no grammar held the model): what went out stays
    out, the arguments end where they broke, the rest of the block is dropped, and the reply
    still ends with ``tool_calls``; the body without streaming says the same."""
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3 <oops>'
        " more}}\n</tool_call>\nAfter."
    )
    chunks, whole = encode(text, [2])
    deltas = tool_deltas(chunks)
    assert deltas[0]["function"]["name"] == "get_weather"
    arguments = "".join(d["function"]["arguments"] for d in deltas)
    assert arguments == '{"city": "Paris", "days": 3 '  # a prefix: not valid JSON
    final, _ = accumulate(chunks)
    assert final.choices[0].message.tool_calls[0].function.arguments == arguments
    assert final.choices[0].finish_reason == "tool_calls"
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert content.strip() == "After."
    message = json.loads(whole)["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["arguments"] == arguments
    assert message["content"] == "After."


@pytest.mark.parametrize(
    ("text", "until"), [(XML_CALL, "New"), (JSON_CALL, '"New')], ids=["xml", "json"]
)
def test_arguments_go_out_before_the_call_closes(text: str, until: str) -> None:
    stream = ChatStream(parse_chat_request(body(stream=True, tools=TOOLS_JSON)), META)
    stream.start()
    cut = text.index(until) + len(until)
    deltas = tool_deltas(events_json(stream.event(Token(text[:cut]))))
    assert deltas[0]["function"]["name"] == "get_weather"
    assert "".join(d["function"]["arguments"] for d in deltas) == '{"city": "New'


def test_a_call_cut_short_by_max_tokens_keeps_its_prefix_and_says_length() -> None:
    cut = XML_CALL[: XML_CALL.index("York") + 2]
    chunks, whole = encode(cut, [4], done=attrs.evolve(DONE, stop=StopReason.MAX_TOKENS))
    arguments = "".join(d["function"]["arguments"] for d in tool_deltas(chunks))
    assert arguments == '{"city": "New Yo'
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    choice = json.loads(whole)["choices"][0]
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == arguments
    assert choice["finish_reason"] == "length"
