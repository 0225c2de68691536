"""The Responses API's ``namespace`` and ``custom`` tools (issue 42): a namespace's tools are
offered as ``namespace.name`` and called back with their ``namespace``; a custom tool's text
input (free, a regular expression, a Lark grammar) comes back as a ``custom_tool_call`` item,
and ``custom_tool_call_output`` is taken back. The parser pure; the calls forced on the
default model's real template (the XML call form) and on gemma (Hermes JSON), streamed and
whole, through the ``openai`` client."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import lark
import openai
import pytest

from llmtrio.api import ApiError
from llmtrio.engine import TEXT_INPUT, ToolCall
from llmtrio.engine.generate._chat import ChatTemplate
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig
from llmtrio.worker._responses_request import ResponsesRequest, parse_responses_request

from .._helpers import engine_config
from .._qwen35_real import QWEN35_TEMPLATE
from .._server import start_server

CLIENTS = Path(__file__).resolve().parents[1] / "data" / "clients"
SPAWN = {
    "type": "function",
    "name": "spawn_agent",
    "description": "Start a sub-agent.",
    "parameters": {
        "type": "object",
        "properties": {"task": {"type": "string", "maxLength": 12}},
        "required": ["task"],
        "additionalProperties": False,
    },
}
AGENTS = {"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [SPAWN]}
CODE = r"[0-9]{3}-[a-z]{2}"
TICKET = {
    "type": "custom",
    "name": "ticket",
    "description": "Files a ticket by its code.",
    "format": {"type": "grammar", "syntax": "regex", "definition": CODE},
}
LARK = 'start: "say " WORD "!"\nWORD: /[a-z]{1,6}/\n'
SAY = {
    "type": "custom",
    "name": "say",
    "format": {"type": "grammar", "syntax": "lark", "definition": LARK},
}
NOTE = {"type": "custom", "name": "note", "description": "Any text."}  # format: free text


def parse(**body: Any) -> ResponsesRequest:
    return parse_responses_request(json.dumps(body).encode())


# -- the parser, pure ----------------------------------------------------------------------------


def test_a_namespaces_tools_are_offered_by_flat_names() -> None:
    request = parse(input="Hi", tools=[SPAWN, AGENTS, TICKET])
    assert [t.name for t in request.tools.tools] == ["spawn_agent", "agents.spawn_agent", "ticket"]
    assert request.offered["agents.spawn_agent"].namespace == "agents"
    assert request.offered["agents.spawn_agent"].name == "spawn_agent"
    assert request.offered["ticket"].custom and not request.offered["spawn_agent"].custom
    assert [t["type"] for t in request.echo["tools"]] == ["function", "namespace", "custom"]
    assert request.echo["tools"][1]["tools"][0]["name"] == "spawn_agent"
    ticket = request.tools.tools[2]
    assert ticket.text is not None and (ticket.text.syntax, ticket.text.definition) == (
        "regex",
        CODE,
    )
    note = parse(input="Hi", tools=[NOTE]).tools.tools[0]
    assert note.text is not None and note.text.syntax is None


def test_codexs_bodies_offer_their_namespace_and_custom_tools() -> None:
    for name in ("codex-0.171.0.responses.json", "codex-0.171.0-freeform.responses.json"):
        body = json.loads((CLIENTS / name).read_text())["requests"][0]["body"]
        request = parse_responses_request(json.dumps(body).encode())
        names = [t.name for t in request.tools.tools]
        assert "multi_agent_v1.spawn_agent" in names  # was left out
        assert ("apply_patch" in names) == ("freeform" in name)  # was left out too


def test_tool_choice_names_a_custom_tool_or_a_namespaces_function() -> None:
    custom = parse(input="Hi", tools=[TICKET], tool_choice={"type": "custom", "name": "ticket"})
    assert custom.generate.tool_name == "ticket" and custom.generate.tool_choice == "required"
    spaced = {"type": "function", "name": "spawn_agent", "namespace": "agents"}
    assert parse(input="Hi", tools=[AGENTS], tool_choice=spaced).generate.tool_name == (
        "agents.spawn_agent"
    )
    flat = {"type": "function", "name": "agents.spawn_agent"}
    assert parse(input="Hi", tools=[AGENTS], tool_choice=flat).generate.tool_name == (
        "agents.spawn_agent"
    )
    with pytest.raises(ApiError) as caught:
        parse(input="Hi", tools=[AGENTS], tool_choice={"type": "function", "name": "x"})
    assert caught.value.param == "tool_choice"


def test_a_bad_tool_is_a_400_naming_it() -> None:
    cases = [
        ({"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "lark"}},
         "tools[0].format.definition"),
        ({"type": "custom", "name": "x", "format": {"type": "grammar", "syntax": "gbnf",
          "definition": "root ::= x"}}, "tools[0].format.syntax"),
        ({"type": "namespace", "name": "x"}, "tools[0].tools"),
        ({"type": "namespace", "name": "x", "tools": [{"type": "function"}]},
         "tools[0].tools[0].name"),
    ]  # fmt: skip
    for tool, param in cases:
        with pytest.raises(ApiError) as caught:
            parse(input="Hi", tools=[tool])
        assert caught.value.status == 400 and caught.value.param == param, tool
    with pytest.raises(ApiError) as twice:
        parse(input="Hi", tools=[AGENTS, {**SPAWN, "name": "agents.spawn_agent"}])
    assert "used twice" in twice.value.message


def test_custom_calls_and_their_outputs_come_back_in_the_input() -> None:
    request = parse(
        input=[
            {"type": "message", "role": "user", "content": "File it."},
            {"type": "custom_tool_call", "call_id": "c1", "name": "ticket", "input": "123-ab"},
            {"type": "function_call", "call_id": "c2", "name": "spawn_agent",
             "namespace": "agents", "arguments": '{"task": "x"}'},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "filed"},
            {"type": "function_call_output", "call_id": "c2", "output": [
                {"type": "input_text", "text": "started"}]},
        ],
        tools=[TICKET, AGENTS],
    )  # fmt: skip
    messages = request.generate.messages
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool"]
    assert messages[1].tool_calls == (
        ToolCall("c1", "ticket", json.dumps({TEXT_INPUT: "123-ab"})),
        ToolCall("c2", "agents.spawn_agent", '{"task": "x"}'),
    )
    assert (messages[2].content, messages[2].tool_call_id) == ("filed", "c1")
    # The template shows the call as the model was shown the tool: its one parameter.
    chat = ChatTemplate(
        QWEN35_TEMPLATE.read_text(), architecture="qwen35", bos_token="", eos_token="",
        render_builtin=None,
    )  # fmt: skip
    prompt = chat.render(messages, think=False, tools=request.tools.tools).text
    assert "<function=ticket>\n<parameter=input>\n123-ab\n</parameter>" in prompt
    assert "<function=agents.spawn_agent>" in prompt


# -- forced on the models, through the client -------------------------------------------------


@pytest.fixture(scope="module", params=["qwen35", "gemma"])
def client(
    request: pytest.FixtureRequest, qwen35_real_path: Path, gemma_path: Path
) -> Iterator[openai.OpenAI]:
    model = qwen35_real_path if request.param == "qwen35" else gemma_path
    server = start_server(
        engine_config(model, max_inflight=1, ctx_size=2048, threads=1),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=4), graceful_timeout=2),
    )
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client
    server.stop()


def forced(
    client: openai.OpenAI, tool: dict[str, Any], choice: dict[str, Any], limit: int = 200
) -> Any:
    return client.responses.create(
        model="m",
        input="Go.",
        tools=[tool],  # type: ignore[list-item]
        tool_choice=choice,  # type: ignore[arg-type]
        max_output_tokens=limit,
        temperature=0,
    )


def streamed(
    client: openai.OpenAI, tool: dict[str, Any], choice: dict[str, Any], limit: int = 200
) -> Any:
    with client.responses.stream(
        model="m",
        input="Go.",
        tools=[tool],  # type: ignore[list-item]
        tool_choice=choice,  # type: ignore[arg-type]
        max_output_tokens=limit,
        temperature=0,
    ) as stream:
        events = list(stream)
    # response.completed, or response.incomplete (free text may run to the output limit)
    assert events[-1].type in ("response.completed", "response.incomplete")
    return events, events[-1].response


def test_a_namespaces_function_is_called_with_its_namespace(client: openai.OpenAI) -> None:
    choice = {"type": "function", "name": "spawn_agent", "namespace": "agents"}
    response = forced(client, AGENTS, choice)
    (call,) = response.output
    assert call.type == "function_call" and response.status == "completed"
    assert (call.name, call.namespace) == ("spawn_agent", "agents")
    jsonschema.validate(json.loads(call.arguments), SPAWN["parameters"])
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    events, final = streamed(client, AGENTS, choice)
    done = [e for e in events if e.type == "response.output_item.done"]
    assert done[0].item.namespace == "agents" and done[0].item.name == "spawn_agent"
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == final.output[0].arguments == call.arguments  # greedy: the same


@pytest.mark.parametrize(
    ("tool", "check", "limit"),
    [
        (TICKET, lambda text: re.fullmatch(CODE, text) is not None, 200),
        (SAY, lambda text: lark.Lark(LARK).parse(text) is not None, 200),
        (NOTE, lambda text: isinstance(text, str), 24),
    ],
    ids=["regex", "lark", "text"],
)
def test_a_custom_tool_is_called_with_its_text(
    client: openai.OpenAI, tool: dict[str, Any], check: Any, limit: int
) -> None:
    choice = {"type": "custom", "name": tool["name"]}
    response = forced(client, tool, choice, limit)
    (call,) = response.output
    assert call.type == "custom_tool_call" and call.name == tool["name"]
    if response.status == "completed":  # free text may run to the output limit
        assert check(call.input), call.input
    events, final = streamed(client, tool, choice, limit)
    kinds = [e.type for e in events]
    assert "response.custom_tool_call_input.done" in kinds
    deltas = [e.delta for e in events if e.type == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == final.output[0].input == call.input
    # Its output comes back, and the conversation goes on.
    follow = client.responses.create(
        model="m",
        input=[
            {"type": "message", "role": "user", "content": "Go."},
            {"type": "custom_tool_call", "call_id": call.call_id, "name": call.name,
             "input": call.input},
            {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "done"},
        ],
        tools=[tool],  # type: ignore[list-item]
        max_output_tokens=4,
    )  # fmt: skip
    assert follow.status in ("completed", "incomplete") and follow.usage.input_tokens > 0


def test_a_grammar_that_cannot_be_translated_leaves_the_text_free(
    client: openai.OpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    odd = {
        "type": "custom",
        "name": "odd",
        "format": {"type": "grammar", "syntax": "lark", "definition": "%declare X\nstart: X"},
    }
    with caplog.at_level(logging.WARNING):
        response = forced(client, odd, {"type": "custom", "name": "odd"}, limit=24)
    assert response.output[0].type == "custom_tool_call"  # answered, not refused
    assert "cannot translate the lark grammar" in caplog.text
