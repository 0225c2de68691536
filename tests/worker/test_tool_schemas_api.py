"""Real tool schemas through the three APIs (issue 42): Claude Code's ``TaskCreate``,
``TaskUpdate`` and ``WebFetch`` (``propertyNames`` with ``"additionalProperties": {}``, a
``uri`` format) and MCP's ``fetch`` are served, never refused, in the XML and JSON call forms;
``strict`` schemas are refused naming the keyword, the same on every route; and a grammar the
server itself wrote wrongly is a 500 in the route family's shape, never the client's fault.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from llmtrio.api import CHAT_PATH, MESSAGES_PATH, RESPONSES_PATH
from llmtrio.engine import GenerateRequest, Grammar, InvalidRequestError, Tool
from llmtrio.engine.generate import _inputs
from llmtrio.engine.tools import tool_call_grammar
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig

from .._helpers import engine_config
from .._server import LiveServer, start_server

CLIENTS = Path(__file__).resolve().parents[1] / "data" / "clients"
CLAUDE = json.loads((CLIENTS / "claude-code-2.1.197.messages.json").read_text())
CLAUDE_TOOLS = {t["name"]: t for t in CLAUDE["requests"][0]["body"]["tools"]}
FETCH = json.loads((CLIENTS / "mcp" / "mcp-server-fetch-2026.10.24.tools.json").read_text())
FETCH_SCHEMA = FETCH["tools"][0]["inputSchema"]
#: The three schemas the issue found refused (descriptions left out: short prompts).
SCHEMAS = {
    name: CLAUDE_TOOLS[name]["input_schema"] for name in ("TaskCreate", "TaskUpdate", "WebFetch")
}


@pytest.fixture(scope="module")
def server(gemma_path: Path) -> Iterator[LiveServer]:
    """gemma served with room for these schemas in the prompt (2 slots of 2048 tokens)."""
    found = start_server(
        engine_config(gemma_path, max_inflight=2, ctx_size=2048, threads=1),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=8), graceful_timeout=2),
    )
    yield found
    found.stop()


def anthropic_tools(*names: str) -> list[dict[str, Any]]:
    return [{"name": name, "input_schema": SCHEMAS[name]} for name in names]


def post(server: LiveServer, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "any", **body}, timeout=120)


@pytest.mark.parametrize("xml", [False, True], ids=["json", "xml"])
def test_the_three_schemas_compile_to_grammars_llama_cpp_parses(
    xml: bool, gemma_path: Path
) -> None:
    """Main wrote a rule with no body for them in the JSON form (llama.cpp: "failed to parse
    grammar") and refused them by name in the XML form; each now compiles, alone or with
    the rest of Claude Code's tools."""
    from .._grammar_probe import GrammarProbe

    probe = GrammarProbe(gemma_path)
    try:
        everything = [Tool(t["name"], "", t["input_schema"]) for t in CLAUDE_TOOLS.values()]
        for tools in ([Tool(n, "", s) for n, s in SCHEMAS.items()], everything):
            with probe.grammar(tool_call_grammar(tools, xml=xml, parallel=True)):
                pass
    finally:
        probe.close()


def test_claude_codes_tools_are_served_on_messages(server: LiveServer) -> None:
    """``tool_choice`` auto with the three tools: main answered 400 ``invalid grammar``."""
    body = {
        "max_tokens": 4,
        "tools": anthropic_tools("TaskCreate", "TaskUpdate", "WebFetch"),
        "messages": [{"role": "user", "content": "Say hi"}],
    }
    response = post(server, MESSAGES_PATH, body)
    assert response.status_code == 200, response.text
    assert response.json()["type"] == "message"


@pytest.mark.parametrize("name", ["TaskCreate", "WebFetch"])
def test_a_forced_call_of_a_relaxed_tool_validates(server: LiveServer, name: str) -> None:
    """Forced (main: a 400 naming the keyword), the call is one of the tool, and its input
    validates against the schema (``propertyNames: {type: string}`` holds for any JSON
    object; the ``uri`` format is not checked by ``jsonschema`` without its extra)."""
    body = {
        "max_tokens": 120,
        "tools": anthropic_tools(name),
        "tool_choice": {"type": "tool", "name": name},
        "messages": [{"role": "user", "content": "Use the tool."}],
    }
    response = post(server, MESSAGES_PATH, body)
    assert response.status_code == 200, response.text
    message = response.json()
    if message["stop_reason"] == "tool_use":
        (call,) = [b for b in message["content"] if b["type"] == "tool_use"]
        assert call["name"] == name
        jsonschema.validate(call["input"], SCHEMAS[name])


def chat_tool(schema: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "fetch", "parameters": schema, **extra}}


def test_a_tool_that_is_not_strict_is_never_refused_on_chat(server: LiveServer) -> None:
    """Main: 400 "the string format 'uri' is not supported" for a tool that is not strict."""
    for extra in ({}, {"strict": False}):
        body = {
            "max_tokens": 4,
            "tools": [chat_tool(FETCH_SCHEMA, **extra)],
            "tool_choice": {"type": "function", "function": {"name": "fetch"}},
            "messages": [{"role": "user", "content": "Fetch it."}],
        }
        response = post(server, CHAT_PATH, body)
        assert response.status_code == 200, response.text


def test_a_tool_that_is_not_strict_is_never_refused_on_responses(server: LiveServer) -> None:
    tool = {"type": "function", "name": "fetch", "parameters": FETCH_SCHEMA, "strict": False}
    body = {"max_output_tokens": 16, "tools": [tool], "tool_choice": "required", "input": "Go."}
    response = post(server, RESPONSES_PATH, body)
    assert response.status_code == 200, response.text


def _refusal(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_a_strict_schema_is_refused_naming_the_keyword_on_every_route(
    server: LiveServer,
) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    chat = post(
        server,
        CHAT_PATH,
        {"max_tokens": 4, "messages": messages, "tools": [chat_tool(FETCH_SCHEMA, strict=True)]},
    )
    error = _refusal(chat)
    assert "'uri'" in error["message"] and error["type"] == "invalid_request_error"
    assert error["param"] == "tools"
    strict_tool = {"type": "function", "name": "fetch", "parameters": FETCH_SCHEMA, "strict": True}
    responses = post(
        server,
        RESPONSES_PATH,
        {"max_output_tokens": 16, "tools": [strict_tool], "input": "Hi"},
    )
    assert "'uri'" in _refusal(responses)["message"]
    anthropic = post(
        server,
        MESSAGES_PATH,
        {
            "max_tokens": 4,
            "messages": messages,
            "tools": [
                {"name": "TaskCreate", "input_schema": SCHEMAS["TaskCreate"], "strict": True}
            ],
        },
    )
    refused = _refusal(anthropic)
    assert "'propertyNames'" in refused["message"] and refused["type"] == "invalid_request_error"


URI_OBJECT = {
    "type": "object",
    "properties": {"url": {"type": "string", "format": "uri"}},
    "required": ["url"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("strict", [False, True])
def test_response_format_follows_the_same_rule(server: LiveServer, strict: bool) -> None:
    """``response_format``'s ``json_schema``: relaxed unless ``strict``, as a tool is."""
    json_schema = {"name": "link", "schema": URI_OBJECT, "strict": strict}
    body = {
        "max_tokens": 40,
        "messages": [{"role": "user", "content": "A link, as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": json_schema},
    }
    response = post(server, CHAT_PATH, body)
    if strict:
        assert "'uri'" in _refusal(response)["message"]
        return
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        jsonschema.validate(json.loads(choice["message"]["content"]), URI_OBJECT)


def test_anthropic_structured_output_is_always_strict(server: LiveServer) -> None:
    body = {
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}],
        "output_config": {"format": {"type": "json_schema", "schema": URI_OBJECT}},
    }
    refused = _refusal(post(server, MESSAGES_PATH, body))
    assert "'uri'" in refused["message"]


def test_the_engine_relaxes_what_a_request_does_not_mark_strict() -> None:
    request = GenerateRequest.user("hi", json_schema=URI_OBJECT)
    assert request.json_schema_strict is False
    with pytest.raises(InvalidRequestError, match="'uri'"):
        tool_call_grammar([Tool("f", "", URI_OBJECT, strict=True)])


@pytest.mark.parametrize(
    ("path", "body", "family"),
    [
        (
            CHAT_PATH,
            {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
            "openai",
        ),
        (
            MESSAGES_PATH,
            {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]},
            "anthropic",
        ),
    ],
    ids=["chat", "messages"],
)
def test_a_grammar_the_server_wrote_wrongly_is_a_500_logged_with_its_schema(
    server: LiveServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    path: str,
    body: dict[str, Any],
    family: str,
) -> None:
    """A grammar llama.cpp cannot parse that the server wrote (here: one whose rule names a
    rule never written, as main's JSON form did for Claude Code's tools) is the server's
    bug: a 500 ``server_error`` (Anthropic's ``api_error``), the schema in the log."""
    broken = Grammar("root ::= never-written\n")
    monkeypatch.setattr(_inputs, "request_grammar", lambda request, **_: broken)
    tools = {
        "openai": {"tools": [chat_tool(FETCH_SCHEMA)]},
        "anthropic": {"tools": anthropic_tools("WebFetch")},
    }[family]
    with caplog.at_level("ERROR", logger="llmtrio.engine"):
        response = post(server, path, {**body, **tools})
    assert response.status_code == 500, response.text
    data = response.json()
    if family == "anthropic":
        assert data["type"] == "error" and data["error"]["type"] == "api_error"
    else:
        assert data["error"]["type"] == "server_error"
    assert "invalid_request_error" not in response.text
    logged = [
        r.getMessage() for r in caplog.records if "cannot parse the grammar" in r.getMessage()
    ]
    assert logged and '"format": "uri"' in logged[0] and "never-written" in logged[0]
