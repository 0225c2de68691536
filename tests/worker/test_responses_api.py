"""OpenAI's Responses API (``POST /v1/responses``, ``/v1/responses/input_tokens``): the parser
and the encoders without a server, then the official ``openai`` client against a server of the
gemma test model and one of the default model's real template and tokenizer (reasoning items,
Qwen's XML tool calls), and once over the ring with a remote worker."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import httpx
import jsonschema
import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel

from llmtrio.api import RESPONSES_INPUT_TOKENS_PATH, RESPONSES_PATH, ApiError, server_error
from llmtrio.engine import ChatMessage, Done, StopReason, Timings, Token, ToolCall
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig
from llmtrio.worker._encoding import ResponseMeta
from llmtrio.worker._responses_output import ResponsesBody, ResponsesStream
from llmtrio.worker._responses_request import ResponsesRequest, parse_responses_request

from .._helpers import engine_config, wait_until
from .._procs import Ring
from .._server import LiveServer, start_server

#: The SDK's type of each stream event, by its ``type``.
EVENTS: dict[str, type[BaseModel]] = {
    get_args(kind.model_fields["type"].annotation)[0]: kind
    for kind in get_args(get_args(ResponseStreamEvent)[0])
}


def sdk_event(event: dict[str, Any]) -> Any:
    """``event`` as the SDK reads it, checked against its type."""
    return EVENTS[event["type"]].model_validate(event)


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather forecast for a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
    "strict": True,
}
ASK = "What is the weather in Paris?"


def parse(**body: Any) -> ResponsesRequest:
    return parse_responses_request(json.dumps(body).encode())


def refused(**body: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(**body)
    assert caught.value.status == 400
    return caught.value


# -- the parser ------------------------------------------------------------------------------


def test_input_items_become_the_conversation_chat_would_template() -> None:
    request = parse(
        instructions="Be brief.",
        input=[
            {"role": "developer", "content": "Use tools."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ASK}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me look."}],
            },
            {"type": "function_call", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city": "Paris", "days": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "get_weather",
             "arguments": '{"city": "Rome", "days": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            {"type": "function_call_output", "call_id": "c2",
             "output": [{"type": "input_text", "text": "Rain"}]},
        ],
        tools=[WEATHER],
    )  # fmt: skip
    assert request.generate.messages == (
        ChatMessage("system", "Be brief."),
        ChatMessage("system", "Use tools."),
        ChatMessage("user", ASK),
        ChatMessage(
            "assistant",
            "Let me look.",
            tool_calls=[
                ToolCall("c1", "get_weather", '{"city": "Paris", "days": 1}'),
                ToolCall("c2", "get_weather", '{"city": "Rome", "days": 1}'),
            ],
        ),
        ChatMessage("tool", "Sunny", tool_call_id="c1"),
        ChatMessage("tool", "Rain", tool_call_id="c2"),
    )
    assert request.tools.mode == "auto" and [t.name for t in request.tools.tools] == ["get_weather"]


def test_settings_map_onto_the_engine_request_and_are_echoed() -> None:
    request = parse(
        input="Hi",
        max_output_tokens=7,
        temperature=0.0,
        top_p=0.5,
        metadata={"k": "v"},
        user="u",
        store=True,
        reasoning={"effort": "medium", "summary": "auto"},
        include=["message.output_text.logprobs", "reasoning.encrypted_content"],
        top_logprobs=2,
        prompt_cache_key="x",
        service_tier="auto",
        truncation="auto",
        text={"verbosity": "low"},
    )
    generate = request.generate
    assert (generate.max_tokens, generate.sampling.temperature, generate.sampling.top_p) == (
        7,
        0.0,
        0.5,
    )
    assert (generate.think, generate.reasoning_budget, generate.logprobs) == (True, 4096, 2)
    assert request.logprobs
    echo = request.echo
    assert echo["metadata"] == {"k": "v"} and echo["max_output_tokens"] == 7
    assert echo["reasoning"] == {"effort": "medium", "summary": None}
    assert echo["text"] == {"format": {"type": "text"}} and echo["top_logprobs"] == 2


def test_a_body_as_codex_sends_it_is_taken() -> None:
    """Codex's shape: hosted and namespace tools beside its function tools, no output limit,
    encrypted reasoning items and annotated assistant text in the history, and fields that
    change nothing here."""
    request = parse(
        model="qwen",
        instructions="You are Codex.",
        input=[
            {"type": "message", "role": "developer",
             "content": [{"type": "input_text", "text": "<permissions>"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ls"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "."}],
             "encrypted_content": "opaque"},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "shell",
             "arguments": '{"command": ["ls"]}', "status": "completed"},
            {"type": "function_call_output", "call_id": "c1", "output": "README.md"},
            {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
             "content": [{"type": "output_text", "text": "One file.", "annotations": []}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "ok"}]},
        ],
        tools=[
            {"type": "function", "name": "shell", "description": "Runs a command.",
             "strict": False, "parameters": {"type": "object", "properties": {
                 "command": {"type": "array", "items": {"type": "string"}}},
                 "required": ["command"], "additionalProperties": False}},
            {"type": "web_search", "external_web_access": False},
            {"type": "namespace", "name": "mcp__x", "description": "", "tools": []},
            {"type": "custom", "name": "apply_patch",
             "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "x"'}},
        ],
        tool_choice="auto",
        parallel_tool_calls=False,
        reasoning={"effort": "medium", "summary": "auto"},
        store=False,
        stream=True,
        include=["reasoning.encrypted_content"],
        prompt_cache_key="019a-session",
        text={"verbosity": "low"},
    )  # fmt: skip
    roles = [m.role for m in request.generate.messages or ()]
    assert roles == ["system", "system", "user", "assistant", "tool", "assistant", "user"]
    assert [t.name for t in request.tools.tools] == ["shell", "apply_patch"]
    assert not request.tools.parallel
    assert request.generate.max_tokens is None and request.generate.reasoning_budget == 4096
    assert request.stream and request.call_limit == 1


@pytest.mark.parametrize(
    ("effort", "think", "budget"),
    [(None, None, None), ("none", False, None), ("minimal", False, None), ("low", True, 1024),
     ("high", True, 16384), ("max", True, None)],
)  # fmt: skip
def test_reasoning_effort_maps_onto_thinking_and_its_budget(
    effort: str | None, think: bool | None, budget: int | None
) -> None:
    generate = parse(input="Hi", reasoning={"effort": effort}).generate
    assert (generate.think, generate.reasoning_budget) == (think, budget)


def test_a_forced_call_or_a_json_format_turns_thinking_off() -> None:
    forced = parse(input="Hi", tools=[WEATHER], tool_choice={"type": "function",
                   "name": "get_weather"}, reasoning={"effort": "high"})  # fmt: skip
    assert forced.generate.think is False and forced.generate.tool_name == "get_weather"
    assert forced.generate.tool_choice == "required"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "name": "a", "schema": schema, "strict": True}
    structured = parse(input="Hi", text={"format": fmt}, reasoning={"effort": "low"})
    assert structured.generate.json_schema == schema and structured.generate.think is False
    assert structured.echo["text"]["format"]["name"] == "a"
    assert parse(input="Hi", text={"format": {"type": "json_object"}}).generate.grammar


def test_tools_the_server_cannot_run_are_left_out_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "llmtrio.worker"):
        request = parse(
            input="Hi",
            tools=[{"type": "web_search"}, WEATHER,
                   {"type": "namespace", "name": "x", "tools": [{"type": "file_search"}]}],
        )  # fmt: skip
    assert [t.name for t in request.tools.tools] == ["get_weather"]
    assert [t["name"] for t in request.echo["tools"]] == ["get_weather", "x"]
    assert "file_search (in namespace x), web_search" in caplog.text
    # Only tools it cannot run: nothing is offered, and "auto" asks for nothing.
    assert parse(input="Hi", tools=[{"type": "web_search"}]).tools.mode == "none"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"background_options": {}}, "background_options", "unsupported_parameter"),
        ({"prompt": {"id": "p"}}, "prompt", "unsupported_parameter"),
        ({"image": {}}, "image", "unsupported_parameter"),
        ({"tools": [{"type": "web_search"}], "tool_choice": {"type": "web_search"}},
         "tool_choice", "invalid_value"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}},
         "tool_choice", "invalid_value"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
        ({"temperature": 3}, "temperature", "decimal_above_max_value"),
        ({"max_output_tokens": 0}, "max_output_tokens", "integer_below_min_value"),
        ({"reasoning": {"effort": "huge"}}, "reasoning.effort", "invalid_value"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name",
         "missing_required_parameter"),
        ({"tools": [{"type": "function"}]}, "tools[0].name", "invalid_type"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(body: dict[str, Any], param: str, code: str) -> None:
    error = refused(input="Hi", **body)
    assert (error.param, error.code) == (param, code)


@pytest.mark.parametrize(
    ("item", "param"),
    [
        ({"role": "user", "content": [{"type": "input_image", "image_url": "x"}]},
         "input[0].content[0].image_url"),
        ({"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]},
         "input[0].content[0].file_id"),
        ({"role": "user", "content": [{"type": "input_image", "detail": "low"}]},
         "input[0].content[0].image_url"),
        ({"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]},
         "input[0].content[0].type"),
        ({"type": "item_reference", "id": "msg_1"}, "input[0].type"),
        ({"type": "web_search_call", "id": "ws_1"}, "input[0].type"),
        ({"role": "tool", "content": "x"}, "input[0].role"),
        ({"type": "function_call", "call_id": "c", "name": "f"}, "input[0].arguments"),
        ({"type": "function_call_output", "output": "x"}, "input[0].call_id"),
    ],
)  # fmt: skip
def test_input_items_this_server_cannot_take_are_400s_naming_them(
    item: dict[str, Any], param: str
) -> None:
    assert refused(input=[item]).param == param
    assert refused().param == "input"


# -- the encoders ----------------------------------------------------------------------------

META = ResponseMeta("resp-1", 1_700_000_000, "m")
TIMINGS = Timings(0.0, 0.0, 0.0)


def done(stop: StopReason = StopReason.END_OF_GENERATION, **counts: int) -> Done:
    return Done(stop, counts.get("prompt", 10), counts.get("completion", 5), TIMINGS,
                cached_tokens=counts.get("cached", 0),
                reasoning_tokens=counts.get("reasoning", 0))  # fmt: skip


def sse_events(data: bytes) -> list[dict[str, Any]]:
    events = []
    for block in data.decode().split("\n\n"):
        if block:
            kind, payload = block.split("\n")
            event = json.loads(payload.removeprefix("data: "))
            assert kind == "event: " + event["type"]
            events.append(event)
    return events


def test_a_stream_writes_reasoning_then_a_message_in_openais_events() -> None:
    stream = ResponsesStream(parse(input="Hi", stream=True), META)
    out = stream.start()
    for token in (Token("Let me", reasoning=True), Token(" think.", reasoning=True),
                  Token("\n"), Token("Hello"), Token(" there")):  # fmt: skip
        out += stream.event(token)
    out += stream.finish(done(completion=9, reasoning=4))
    events = sse_events(out)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed",
    ]  # fmt: skip
    for event in events:
        sdk_event(event)  # the SDK's own types
    final = Response.model_validate(events[-1]["response"])
    assert final.status == "completed" and final.output_text == "\nHello there"
    reasoning = final.output[0]
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "Let me think."
    assert final.usage is not None and final.usage.output_tokens_details.reasoning_tokens == 4


def test_a_call_streams_its_arguments_as_they_are_generated() -> None:
    stream = ResponsesStream(parse(input="Hi", tools=[WEATHER], stream=True), META)
    out = stream.start()
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n'
    for i in range(0, len(call), 7):
        out += stream.event(Token(call[i : i + 7]))
    out += stream.event(Token("</tool_call>"))
    out += stream.finish(done())
    events = sse_events(out)
    kinds = [e["type"] for e in events]
    deltas = [e["delta"] for e in events if e["type"].endswith("arguments.delta")]
    assert len(deltas) > 1 and json.loads("".join(deltas)) == {"city": "Paris", "days": 2}
    assert "response.output_text.delta" not in kinds
    final = Response.model_validate(events[-1]["response"])
    [item] = final.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert item.call_id.startswith("call_") and item.status == "completed"
    assert stream.finish_reason(done()) == "tool_calls"


def test_max_tool_calls_and_parallel_tool_calls_bound_the_calls_kept() -> None:
    calls = "".join(
        f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{c}", "days": 1}}}}\n'
        "</tool_call>\n"
        for c in ("A", "B", "C")
    )
    for extra, kept in (({}, 3), ({"max_tool_calls": 2}, 2), ({"parallel_tool_calls": False}, 1)):
        body = ResponsesBody(parse(input="Hi", tools=[WEATHER], **extra), META)
        body.event(Token(calls))
        final = Response.model_validate_json(body.finish(done()))
        assert [json.loads(i.arguments)["city"] for i in final.output] == ["A", "B", "C"][:kept]  # type: ignore[union-attr]


def test_an_output_limit_reached_is_an_incomplete_response() -> None:
    body = ResponsesBody(parse(input="Hi", max_output_tokens=2), META)
    body.event(Token("Hel"))
    final = Response.model_validate_json(body.finish(done(StopReason.MAX_TOKENS)))
    assert final.status == "incomplete" and final.incomplete_details is not None
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete"  # type: ignore[union-attr]
    assert final.max_output_tokens == 2 and final.store is False


def test_a_failure_after_the_head_is_response_failed() -> None:
    stream = ResponsesStream(parse(input="Hi", stream=True), META)
    out = stream.start() + stream.event(Token("Hi")) + stream.failure(server_error())
    events = sse_events(out)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    failed = sdk_event(events[-1])
    assert failed.type == "response.failed"
    assert failed.response.error is not None and failed.response.error.code == "server_error"


# -- the official client, on the gemma test model --------------------------------------------


@pytest.fixture(scope="module")
def server(gemma_path: Path) -> Iterator[LiveServer]:
    server = start_server(
        engine_config(gemma_path, max_inflight=2, ctx_size=1024, threads=1),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=8), graceful_timeout=2),
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


@pytest.fixture(scope="module")
def model_id(server: LiveServer) -> str:
    return str(httpx.get(server.url + "/v1/models").json()["data"][0]["id"])


def test_create_answers_a_response(client: openai.OpenAI, model_id: str) -> None:
    response = client.responses.create(
        model=model_id,
        instructions="Answer briefly.",
        input="Name a colour.",
        max_output_tokens=8,
        temperature=0,
        metadata={"run": "1"},
        store=True,
        user="tester",
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    assert response.object == "response" and response.model == model_id
    assert response.status in ("completed", "incomplete")
    assert response.output_text and response.metadata == {"run": "1"}
    assert response.store is False and response.temperature == 0
    usage = response.usage
    assert usage is not None and 0 < usage.output_tokens <= 8
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    [message] = response.output
    assert message.type == "message"
    logprobs = message.content[0].logprobs  # type: ignore[union-attr]
    assert logprobs is not None and len(logprobs) == usage.output_tokens
    assert all(len(entry.top_logprobs) == 2 for entry in logprobs)


PICK = {
    "type": "object",
    "properties": {"colour": {"enum": ["red", "green", "blue"]}, "n": {"type": "integer"}},
    "required": ["colour", "n"],
    "additionalProperties": False,
}
PICK_FORMAT = {"format": {"type": "json_schema", "name": "pick", "schema": PICK, "strict": True}}


def test_stream_with_get_final_response(client: openai.OpenAI, model_id: str) -> None:
    """``get_final_response`` needs ``response.completed``: a JSON answer ends by itself."""
    kinds, deltas = [], []
    body: dict[str, Any] = {
        "model": model_id,
        "input": "Pick a colour and a number.",
        "text": PICK_FORMAT,
        "max_output_tokens": 60,
        "temperature": 0,
    }
    with client.responses.stream(**body) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed" and "response.output_text.done" in kinds
    assert len(deltas) > 1 and final.output_text == "".join(deltas)
    jsonschema.validate(json.loads(final.output_text), PICK)
    assert client.responses.create(**body).output_text == final.output_text


def test_a_stream_cut_by_its_output_limit_ends_incomplete(
    client: openai.OpenAI, model_id: str
) -> None:
    events = list(client.responses.create(
        model=model_id, input="Tell a long story.", max_output_tokens=3, stream=True
    ))  # fmt: skip
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"
    assert last.response.usage is not None and last.response.usage.output_tokens == 3
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_tool_round_trip_forced_with_tool_choice(client: openai.OpenAI, model_id: str) -> None:
    ask: list[Any] = [{"role": "user", "content": ASK}]
    first = client.responses.create(
        model=model_id,
        input=ask,
        tools=[WEATHER, {"type": "web_search"}],  # type: ignore[list-item]
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=60,
    )
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER["parameters"])
    assert [tool.type for tool in first.tools] == ["function"]  # web_search left out
    second = client.responses.create(
        model=model_id,
        input=[
            *ask,
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": "Sunny, 24 degrees.",
            },
        ],
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="none",
        max_output_tokens=12,
        temperature=0,
    )
    assert [item.type for item in second.output] == ["message"] and second.output_text
    # The call and its result are in the prompt: 2 more messages than the question alone.
    alone = client.responses.input_tokens.count(model=model_id, input=ask)
    assert second.usage is not None and second.usage.input_tokens > alone.input_tokens + 10


def test_a_json_schema_answer_follows_its_schema(client: openai.OpenAI, model_id: str) -> None:
    response = client.responses.create(
        model=model_id, input="Pick a colour and a number.", text=PICK_FORMAT,  # type: ignore[arg-type]
        # Greedy, with room: a sampled answer may spend its tokens on the whitespace the
        # grammar allows and end incomplete (one did in a CI run at 60 tokens).
        max_output_tokens=200, temperature=0,
    )  # fmt: skip
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), PICK)
    assert response.text is not None and response.text.format is not None
    assert response.text.format.type == "json_schema"


def test_input_tokens_counts_what_the_generation_ingests(
    client: openai.OpenAI, model_id: str
) -> None:
    body: dict[str, Any] = {
        "model": model_id,
        "instructions": "Answer briefly.",
        "input": [{"role": "user", "content": ASK}],
        "tools": [WEATHER],
    }
    counted = client.responses.input_tokens.count(**body)
    assert counted.object == "response.input_tokens"
    response = client.responses.create(**body, max_output_tokens=2)
    assert response.usage is not None and counted.input_tokens == response.usage.input_tokens


def test_turn_two_reuses_turn_ones_prompt(client: openai.OpenAI, model_id: str) -> None:
    turn: list[Any] = [{"role": "user", "content": "Tell me about the sea. " * 20}]
    first = client.responses.create(model=model_id, input=turn, max_output_tokens=6, temperature=0)
    turn += [
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "And the mountains?"},
    ]
    second = client.responses.create(model=model_id, input=turn, max_output_tokens=6, temperature=0)
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens - 2


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"input": "word " * 2000}, 400, "input", "context_length_exceeded"),
        ({"input": "Hi", "temperature": "hot"}, 400, "temperature", "invalid_type"),
        ({"input": "Hi", "previous_response_id": "resp_1"}, 400, "previous_response_id",
         "unsupported_parameter"),
    ],
)  # fmt: skip
def test_errors_in_openais_shape(
    client: openai.OpenAI, model_id: str, body: dict[str, Any], status: int, param: str,
    code: str,
) -> None:  # fmt: skip
    body = {"model": model_id, **body}
    with pytest.raises(openai.APIStatusError) as caught:
        client.responses.create(**body)
    assert caught.value.status_code == status
    error = caught.value.body
    assert isinstance(error, dict) and (error["param"], error["code"]) == (param, code)


def test_a_client_that_hangs_up_frees_the_slot(server: LiveServer, model_id: str) -> None:
    count = ", ".join(str(n) for n in range(1, 30))
    body = {"model": model_id, "input": f"Count to 1000: {count},", "stream": True,
            "max_output_tokens": 800, "temperature": 0}  # fmt: skip
    with (
        httpx.Client(base_url=server.url, timeout=60) as http,
        http.stream("POST", RESPONSES_PATH, json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()  # one iterator: leaving it would close the stream
        while next(lines) != "event: response.output_text.delta":
            pass
        wait_until(lambda: server.inflight() == 1)
    server.wait_idle()


# -- the default model's own template and tokenizer ------------------------------------------


@pytest.fixture(scope="module")
def qwen(qwen35_real_path: Path) -> Iterator[openai.OpenAI]:
    server = start_server(
        engine_config(qwen35_real_path, max_inflight=2, ctx_size=1024, threads=1),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=4), graceful_timeout=2),
    )
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client
    server.stop()


def test_reasoning_comes_back_as_a_reasoning_item(qwen: openai.OpenAI) -> None:
    """Qwen3.5's template opens ``<think>``: the random model's words are reasoning until the
    output limit; ``reasoning.effort: none`` turns it off."""
    on = qwen.responses.create(model="qwen", input=ASK, max_output_tokens=6)
    off = qwen.responses.create(
        model="qwen", input=ASK, max_output_tokens=6, reasoning={"effort": "none"}
    )
    assert on.status == off.status == "incomplete"
    [reasoning] = on.output
    assert reasoning.type == "reasoning" and reasoning.content and reasoning.content[0].text
    assert on.usage is not None and on.usage.output_tokens_details.reasoning_tokens == 6
    assert [item.type for item in off.output] == ["message"] and off.output_text
    assert off.usage is not None and off.usage.output_tokens_details.reasoning_tokens == 0


def test_a_forced_call_in_qwens_xml_form(qwen: openai.OpenAI) -> None:
    kinds, deltas = [], []
    with qwen.responses.stream(
        model="qwen",
        input=ASK,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=120,
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    [call] = final.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert len(deltas) > 1 and "".join(deltas) == call.arguments
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    assert "response.reasoning_text.delta" not in kinds  # a forced call: thinking off


# -- over the ring, with a remote worker ------------------------------------------------------


def test_over_the_ring_with_a_remote_worker(tmp_path: Path, gemma_path: Path) -> None:
    with Ring.opened(tmp_path, gemma_path) as ring:
        ingress = ring.ingress("ingress")
        ring.worker("w", [ingress])
        ingress.wait_workers({"w"}, timeout=120)
        client = openai.OpenAI(base_url=ingress.url + "/v1", api_key="none", max_retries=0)
        with client:
            body: dict[str, Any] = {
                "model": gemma_path.stem,
                "input": "Pick a colour and a number.",
            }
            answer = {"text": PICK_FORMAT, "max_output_tokens": 60, "temperature": 0}
            response = client.responses.create(**body, **answer)
            with client.responses.stream(**body, **answer) as stream:
                final = stream.get_final_response()
            counted = client.responses.input_tokens.count(**body)
            with pytest.raises(openai.BadRequestError) as caught:
                client.responses.create(**body, conversation="conv_1")
            with pytest.raises(openai.NotFoundError) as unknown:
                client.responses.create(model="no-such-model", input="Hi", max_output_tokens=2)
        assert final.output_text == response.output_text and response.output_text
        assert response.usage is not None and counted.input_tokens == response.usage.input_tokens
        assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "conversation"
        assert isinstance(unknown.value.body, dict) and unknown.value.body["param"] == "model"
        assert unknown.value.body["code"] == "model_not_found"
        raw = httpx.post(ingress.url + RESPONSES_INPUT_TOKENS_PATH, json={"input": 5}, timeout=30)
        assert raw.status_code == 400 and raw.json()["error"]["param"] == "input"
