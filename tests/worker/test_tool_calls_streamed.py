"""Forced tool calls streamed end to end through the official ``openai`` client's streaming
helper (``client.chat.completions.stream``), on the qwen35 test template (Qwen's XML calls)
and a Hermes template (JSON calls), served by ``llmtrio serve`` on the gemma test model: the
call's first delta carries its index, id, type and name, its arguments follow in pieces, and
they join to what the same request gets without streaming."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig

from .._helpers import engine_config
from .._server import LiveServer, start_server
from ..engine.test_tool_call_grammars import HERMES_TOOLS, WEATHER
from ..stack.test_serve import client
from .test_tool_fields import QWEN35_TOOLS

TOOLS: Any = [WEATHER.as_openai()]
FORCED: Any = {"type": "function", "function": {"name": "get_weather"}}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]
# Both requests ingest the whole prompt, greedy, on a server without speculative decoding
# (drafts, whose number follows measured step times, change batch shapes): their tokens are
# defined equal.
SAME: Any = {"temperature": 0, "max_tokens": 120, "extra_body": {"cache_prompt": False}}


@pytest.fixture(scope="module", params=[QWEN35_TOOLS, HERMES_TOOLS], ids=["xml", "json"])
def template_server(request: pytest.FixtureRequest, gemma_path: Path) -> Iterator[LiveServer]:
    server = start_server(
        engine_config(gemma_path, max_inflight=2, chat_template=request.param, spec=None),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=4), graceful_timeout=2),
    )
    yield server
    server.stop()


def test_a_forced_call_streams_its_arguments_in_pieces(template_server: LiveServer) -> None:
    api = client(template_server)
    chunks = []
    events = []
    with api.chat.completions.stream(
        model="any", messages=ASK, tools=TOOLS, tool_choice=FORCED, **SAME
    ) as stream:
        for event in stream:
            events.append(event)
            if event.type == "chunk":
                chunks.append(event.chunk)
        final = stream.get_final_completion()
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    head, pieces = deltas[0], deltas[1:]
    assert head.index == 0 and head.id and head.id.startswith("call_")
    assert head.type == "function" and head.function is not None
    assert head.function.name == "get_weather"
    assert len(pieces) > 2, deltas  # streamed as generated, not one delta per call
    assert all(d.id is None and d.function and d.function.name is None for d in pieces)
    streamed = "".join(d.function.arguments or "" for d in pieces if d.function)
    # The helper's own events: argument deltas, then the call's done event.
    assert (
        "".join(
            e.arguments_delta for e in events if e.type == "tool_calls.function.arguments.delta"
        )
        == streamed
    )
    [done] = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert (done.name, done.arguments) == ("get_weather", streamed)
    jsonschema.validate(json.loads(streamed), WEATHER.parameters)
    [call] = final.choices[0].message.tool_calls or []
    assert call.function.arguments == streamed
    assert final.choices[0].finish_reason == "tool_calls"
    # Without streaming, the same request gets the same arguments.
    whole = api.chat.completions.create(
        model="any", messages=ASK, tools=TOOLS, tool_choice=FORCED, **SAME
    )
    [plain] = whole.choices[0].message.tool_calls or []
    assert plain.function.arguments == streamed  # type: ignore[union-attr]
