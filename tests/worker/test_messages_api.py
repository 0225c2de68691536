"""Anthropic's Messages API (``POST /v1/messages``, ``/v1/messages/count_tokens``): the pure
parser and encoder, then the official ``anthropic`` client against a served gemma (errors,
keys, the ring's refusals, streams, counts) and against the default model's real template and
tokenizer (thinking blocks, tool calls, structured output), and once over the ring with a
worker in a process of its own."""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from llmtrio.api import (
    ANTHROPIC_ERRORS,
    CHAT_PATH,
    COUNT_TOKENS_PATH,
    MESSAGES_PATH,
    OPENAI_ERRORS,
    error_family,
    invalid_api_key,
    no_worker,
    rate_limited,
    request_timeout,
    ring_full,
    server_error,
)
from llmtrio.engine import Done, StopReason, Timings, Token
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig
from llmtrio.worker import RequestLimits
from llmtrio.worker._encoding import ResponseMeta
from llmtrio.worker._messages_request import parse_messages_request
from llmtrio.worker._messages_response import MessageBody, MessageStream, signature
from llmtrio.worker._reasoning import ADAPTIVE_EFFORT, for_effort

from .._helpers import engine_config
from .._procs import Ring
from .._server import LiveServer, start_server

KEY = "sekret"
ORIGIN = "http://app.example"
WEATHER = {
    "name": "get_weather",
    "description": "The weather forecast for a city",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}
HELLO = [{"role": "user", "content": "Hello"}]
GREEDY = {"temperature": 0.0}  # older clients' field: sent as extra_body


def parse(**body: Any) -> Any:
    return parse_messages_request(json.dumps({"max_tokens": 32, **body}).encode())


def refusal(**body: Any) -> Any:
    with pytest.raises(Exception) as caught:
        parse(**body)
    error = caught.value
    assert error.status == 400  # type: ignore[attr-defined]
    return error


# -- the parser, pure ---------------------------------------------------------------------------


def test_a_conversation_becomes_the_templates_chat_messages() -> None:
    request = parse(
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "They want Oslo.", "signature": "x"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                     "input": {"city": "Oslo", "days": 1}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1",
                     "content": [{"type": "text", "text": "rain"}]},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "timeout",
                     "is_error": True},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        tools=[WEATHER],
        metadata={"user_id": "u"}, service_tier="auto", speed="standard", container=None,
        inference_geo="us", diagnostics={}, cache_control={"type": "ephemeral"},
    )  # fmt: skip
    messages = request.generate.messages
    assert [(m.role, m.content) for m in messages] == [
        ("system", "Be brief."),
        ("user", "Weather in Oslo?"),
        ("assistant", "Let me look."),
        ("tool", "rain"),
        ("tool", "Error: timeout"),
        ("user", "And tomorrow?"),
    ]
    (call,) = messages[2].tool_calls
    assert (call.id, call.name, json.loads(call.arguments)) == (
        "toolu_1",
        "get_weather",
        {"city": "Oslo", "days": 1},
    )
    assert [m.tool_call_id for m in messages[3:5]] == ["toolu_1", "toolu_2"]
    assert request.tools.mode == "auto" and request.tools.parses
    assert [t.name for t in request.generate.tools] == ["get_weather"]
    assert request.generate.max_tokens == 32 and not request.stream


def test_tool_choice_forces_a_call_and_turns_thinking_off() -> None:
    two = [WEATHER, {**WEATHER, "name": "other"}]
    forced = parse(messages=HELLO, tools=two, tool_choice={"type": "any"})
    assert forced.generate.tool_choice == "required" and forced.generate.tool_name is None
    assert forced.generate.think is False
    named = parse(
        messages=HELLO,
        tools=two,
        tool_choice={"type": "tool", "name": "other", "disable_parallel_tool_use": True},
        output_config={"effort": "high"},
    )
    assert named.generate.tool_name == "other" and named.generate.think is False
    assert named.generate.parallel_tool_calls is False
    none = parse(messages=HELLO, tools=[WEATHER], tool_choice={"type": "none"})
    assert not none.tools.parses and none.generate.tool_choice == "none"
    assert [t.name for t in none.generate.tools] == ["get_weather"]  # shown, not to be called
    error = refusal(
        messages=HELLO,
        tools=[WEATHER],
        tool_choice={"type": "any"},
        thinking={"type": "enabled", "budget_tokens": 2048},
    )
    assert error.param == "thinking"
    assert refusal(messages=HELLO, tools=[WEATHER], tool_choice={"type": "tool"}).param == (
        "tool_choice.name"
    )
    assert refusal(messages=HELLO, tool_choice={"type": "any"}).param == "tool_choice"


def test_server_tools_are_left_out_of_what_the_model_is_offered() -> None:
    request = parse(
        messages=HELLO, tools=[{"type": "web_search_20250305", "name": "web_search"}, WEATHER]
    )
    assert [t.name for t in request.generate.tools] == ["get_weather"]


def test_thinking_and_effort_become_a_switch_and_a_budget() -> None:
    def reasoning(**body: Any) -> tuple[bool | None, int | None]:
        generate = parse(messages=HELLO, max_tokens=4096, **body).generate
        return generate.think, generate.reasoning_budget

    assert reasoning() == (None, None)  # the template's default
    assert reasoning(thinking={"type": "enabled", "budget_tokens": 100}) == (True, 100)
    assert reasoning(thinking={"type": "disabled"}, output_config={"effort": "max"}) == (
        False,
        None,
    )
    adaptive = for_effort(ADAPTIVE_EFFORT)
    assert reasoning(thinking={"type": "adaptive"}) == (True, adaptive.budget)
    assert reasoning(thinking={"type": "between_tools"}) == (True, adaptive.budget)
    low = for_effort("low")
    assert reasoning(thinking={"type": "adaptive"}, output_config={"effort": "low"}) == (
        True,
        low.budget,
    )
    assert reasoning(output_config={"effort": "low"}) == (True, low.budget)
    # Anthropic's bounds (>= 1024, < max_tokens) are not enforced.
    assert reasoning(thinking={"type": "enabled", "budget_tokens": 8000}) == (True, 8000)
    assert refusal(messages=HELLO, thinking={"type": "enabled"}).param == ("thinking.budget_tokens")


def test_output_config_format_is_a_json_schema_and_sampling_is_taken() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    request = parse(
        messages=HELLO,
        output_config={"format": {"type": "json_schema", "schema": schema}},
        temperature=0.2,
        top_p=0.5,
        top_k=7,
        stop_sequences=["END"],
    )
    generate = request.generate
    assert generate.json_schema == schema and generate.think is False
    assert (generate.sampling.temperature, generate.sampling.top_p) == (0.2, 0.5)
    assert generate.sampling.top_k == 7 and generate.stop == ("END",)


def test_what_cannot_be_taken_is_a_400_naming_it() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    error = refusal(messages=[{"role": "user", "content": [{"type": "text", "text": "x"}, image]}])
    assert error.param == "messages[0].content[1].source.data" and "image" in error.message
    image["source"] = {"type": "url", "url": "https://example.com/a.png"}
    error = refusal(messages=[{"role": "user", "content": [image]}])
    assert error.param == "messages[0].content[0].source.url" and "not fetched" in error.message
    document = {"type": "document", "source": {"type": "text", "data": "x"}}
    error = refusal(messages=[{"role": "user", "content": [document]}])
    assert error.param == "messages[0].content[0].type" and "document" in error.message
    assert refusal(messages=HELLO, max_tokens=0).param == "max_tokens"
    assert refusal(messages=HELLO, temperature=1.5).param == "temperature"
    assert refusal(messages=HELLO, mcp_servers=[{"url": "x"}]).param == "mcp_servers"
    prefill = refusal(messages=[*HELLO, {"role": "assistant", "content": "Sure"}])
    assert prefill.param == "messages[1]"
    assert refusal(messages=[{"role": "tool", "content": "x"}]).param == "messages[0].role"
    error = refusal(messages=[{"role": "user", "content": [{"type": "tool_use", "id": "a"}]}])
    assert error.param == "messages[0].content[0].type"
    with pytest.raises(Exception) as missing:
        parse_messages_request(json.dumps({"messages": HELLO}).encode())
    assert missing.value.param == "max_tokens"  # type: ignore[attr-defined]
    counted = parse_messages_request(
        json.dumps({"messages": HELLO}).encode(), RequestLimits(), endpoint="count_tokens"
    )
    assert counted.generate.max_tokens is None


# -- the encoders, pure -------------------------------------------------------------------------


def _done(stop: StopReason = StopReason.END_OF_GENERATION, **rest: Any) -> Done:
    return Done(stop, 20, 7, Timings(0.0, 0.0, 0.0), cached_tokens=5, **rest)


def _events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.decode().split("\n\n"):
        if chunk:
            name, data = chunk.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            payload = json.loads(data.removeprefix("data: "))
            assert payload["type"] == name.removeprefix("event: ")
            events.append((payload["type"], payload))
    return events


def test_a_stream_is_anthropics_event_sequence() -> None:
    request = parse(messages=HELLO, tools=[WEATHER], stream=True)
    meta = ResponseMeta("msg-1", 0, "m", prompt_tokens=20)
    encoder = MessageStream(request, meta)
    out = encoder.start()
    for token in (
        Token("Hmm, ", reasoning=True),
        Token("weather.", reasoning=True),
        Token("Checking.\n"),
        Token('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '),
        Token('"days": 2}}\n</tool_call>'),
    ):
        out += encoder.event(token)
    out += encoder.finish(_done())
    events = _events(out)
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "content_block_start", *["content_block_delta"] * (len(events) - 13),
        "content_block_stop",
        "message_delta", "message_stop",
    ]  # fmt: skip
    start = events[0][1]["message"]
    assert start["usage"]["input_tokens"] == 20 and start["content"] == []
    thinking = [e["delta"] for n, e in events if n == "content_block_delta" and e["index"] == 0]
    assert [d["type"] for d in thinking] == ["thinking_delta", "thinking_delta", "signature_delta"]
    assert thinking[2]["signature"] == signature("Hmm, weather.")
    blocks = [e["content_block"] for n, e in events if n == "content_block_start"]
    assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"]
    assert blocks[2]["name"] == "get_weather" and blocks[2]["input"] == {}
    arguments = "".join(
        e["delta"]["partial_json"]
        for n, e in events
        if n == "content_block_delta" and e["index"] == 2
    )
    assert json.loads(arguments) == {"city": "Oslo", "days": 2}
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": 15,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 5,
        "output_tokens": 7,
    }
    assert encoder.finish_reason(_done()) == "tool_calls"


def test_a_whole_message_has_its_blocks_and_stop_reason() -> None:
    request = parse(messages=HELLO, tools=[WEATHER])
    body = MessageBody(request, ResponseMeta("msg-1", 0, "m"))
    for token in (
        Token("ponder", reasoning=True),
        Token('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}'),
        Token("\n</tool_call>"),
    ):
        body.event(token)
    message = json.loads(body.finish(_done()))
    assert [b["type"] for b in message["content"]] == ["thinking", "tool_use"]
    assert message["content"][0]["signature"] == signature("ponder")
    assert message["content"][1]["input"] == {"city": "Oslo", "days": 2}
    assert message["stop_reason"] == "tool_use" and message["type"] == "message"
    plain = MessageBody(parse(messages=HELLO), ResponseMeta("msg-2", 0, "m"))
    plain.event(Token("Hello"))
    stopped = json.loads(plain.finish(_done(StopReason.STOP_STRING, stop_string="END")))
    assert stopped["content"] == [{"type": "text", "text": "Hello"}]
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")
    cut = json.loads(MessageBody(parse(messages=HELLO), ResponseMeta("m", 0, "m")).finish(
        _done(StopReason.MAX_TOKENS)
    ))  # fmt: skip
    assert cut["stop_reason"] == "max_tokens" and cut["content"] == []


def test_the_route_family_decides_the_error_shape() -> None:
    assert error_family(MESSAGES_PATH) == error_family(COUNT_TOKENS_PATH) == ANTHROPIC_ERRORS
    assert error_family("/v1/messages/batches") == ANTHROPIC_ERRORS
    assert error_family(CHAT_PATH) == error_family("/v1/messagesx") == OPENAI_ERRORS
    full = ring_full(2)
    assert (OPENAI_ERRORS.status(full), ANTHROPIC_ERRORS.status(full)) == (503, 529)
    assert json.loads(ANTHROPIC_ERRORS.body(full)) == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": full.message},
    }
    assert ANTHROPIC_ERRORS.status(no_worker(5.0)) == 529
    assert json.loads(ANTHROPIC_ERRORS.body(invalid_api_key()))["error"]["type"] == (
        "authentication_error"
    )
    limited = json.loads(ANTHROPIC_ERRORS.body(rate_limited(10, 6)))
    assert limited["error"]["type"] == "rate_limit_error"
    assert ANTHROPIC_ERRORS.status(request_timeout(30)) == 504
    assert ANTHROPIC_ERRORS.event(server_error()).startswith(b"event: error\ndata: {")
    assert OPENAI_ERRORS.event(server_error()).startswith(b'data: {"error":')


# -- the anthropic client against gemma -------------------------------------------------------


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[LiveServer]:
    server = start_server(
        engine_config(gemma_path, max_inflight=2, ctx_size=1024, threads=1),
        ServeConfig(
            host="127.0.0.1",
            port=0,
            ring=RingConfig(max_streams=2),
            graceful_timeout=1,
            api_keys=(KEY,),
            allowed_origins=(ORIGIN,),
        ),
    )
    yield server
    server.stop()


def client_of(server: LiveServer, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, **{"api_key": KEY, **options})


def test_a_message_streamed_and_whole_and_its_count(gemma: LiveServer) -> None:
    client = client_of(gemma)
    message = client.messages.create(
        model="gemma", max_tokens=12, messages=HELLO, extra_body=GREEDY
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 12
    assert [block.type for block in message.content] == ["text"]
    count = client.messages.count_tokens(model="gemma", messages=HELLO)
    assert count.input_tokens == message.usage.input_tokens + (
        message.usage.cache_read_input_tokens or 0
    )
    with client.messages.stream(
        model="gemma", max_tokens=12, messages=HELLO, extra_body=GREEDY
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 1
    assert final.content[0].type == "text"
    assert final.content[0].text == message.content[0].text  # greedy: the same reply
    assert final.usage.output_tokens == 12 and final.stop_reason == "max_tokens"
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == (
        count.input_tokens
    )
    gemma.wait_idle()


def test_a_stop_sequence_ends_the_reply_and_is_named(gemma: LiveServer) -> None:
    client = client_of(gemma)
    first = client.messages.create(model="g", max_tokens=16, messages=HELLO, extra_body=GREEDY)
    text = first.content[0].text  # type: ignore[union-attr]
    words = [w for w in text.split() if len(w) > 2]
    assert words, text
    stop = words[0]
    second = client.messages.create(
        model="g", max_tokens=16, messages=HELLO, stop_sequences=[stop], extra_body=GREEDY
    )
    assert second.stop_reason == "stop_sequence" and second.stop_sequence == stop
    assert text.startswith(second.content[0].text if second.content else "")  # type: ignore[union-attr]


def test_turn_two_reuses_turn_ones_prompt(gemma: LiveServer) -> None:
    client = client_of(gemma)
    turn = [{"role": "user", "content": "Tell me about the sea and the ships on it."}]
    first = client.messages.create(model="g", max_tokens=8, messages=turn)
    reply = {"role": "assistant", "content": first.content[0].text}  # type: ignore[union-attr]
    second = client.messages.create(
        model="g", max_tokens=8, messages=[*turn, reply, {"role": "user", "content": "More."}]
    )
    assert (second.usage.cache_read_input_tokens or 0) > 0
    assert second.usage.input_tokens > 0


def test_two_requests_differing_only_in_the_billing_stamp_share_their_prompt(
    gemma: LiveServer,
) -> None:
    """Claude Code stamps its first system block anew each request (``cch=``); normalized as
    llama.cpp's server does, the second request reads the whole prompt but the reply's place
    from the cache (on 0ba4590: 41 of its 323 tokens; the stamp came first)."""
    client = client_of(gemma)
    gemma.wait_idle()
    usages = []
    for stamp in ("a5145", "0aaa9"):
        system = [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.123; "
             f"cc_entrypoint=sdk-cli; cch={stamp};"},
            {"type": "text", "text": "You help with the sea and its ships. " * 30},
        ]  # fmt: skip
        message = client.messages.create(model="g", max_tokens=2, system=system, messages=HELLO)
        usages.append(message.usage)
    prompt = usages[1].input_tokens + (usages[1].cache_read_input_tokens or 0)
    assert prompt > 200
    assert (usages[1].cache_read_input_tokens or 0) >= prompt - 8  # all but the last few


def test_refusals_are_in_anthropics_shape(gemma: LiveServer) -> None:
    client = client_of(gemma, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as long:
        client.messages.create(
            model="g", max_tokens=8, messages=[{"role": "user", "content": "word " * 2000}]
        )
    assert long.value.body["type"] == "error"  # type: ignore[index]
    assert long.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert long.value.body["error"]["message"].startswith("prompt is too long")  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as bad:
        client.messages.create(
            model="g", max_tokens=8, messages=HELLO, extra_body={"temperature": 5}
        )
    assert "temperature" in bad.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as image:
        client.messages.create(
            model="g",
            max_tokens=8,
            messages=[{"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}],
        )  # fmt: skip
    assert "messages[0].content[0]" in image.value.body["error"]["message"]  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="g", messages=[{"role": "user", "content": 5}])  # type: ignore[typeddict-item]
    # The ingress's own refusals on the route are in its shape too.
    headers = {"x-api-key": KEY}
    foreign = httpx.post(
        gemma.url + MESSAGES_PATH, json={}, headers={**headers, "origin": "http://evil.example"}
    )
    assert foreign.status_code == 403
    assert foreign.json()["error"]["type"] == "permission_error"
    huge = httpx.post(gemma.url + MESSAGES_PATH, content=b"x" * (2 << 20), headers=headers)
    assert huge.status_code == 413 and huge.json()["error"]["type"] == "request_too_large"
    # Paths under the route share its shape; other routes keep OpenAI's.
    batches = httpx.post(gemma.url + "/v1/messages/batches", json={}, headers=headers)
    assert batches.status_code == 404 and batches.json()["error"]["type"] == "not_found_error"
    chat = httpx.post(gemma.url + CHAT_PATH, json={"messages": 1}, headers=headers)
    assert chat.status_code == 400 and chat.json()["error"]["code"] == "invalid_type"


def test_the_key_goes_in_x_api_key_or_bearer(gemma: LiveServer) -> None:
    bearer = anthropic.Anthropic(base_url=gemma.url, api_key=None, auth_token=KEY)
    assert bearer.messages.count_tokens(model="g", messages=HELLO).input_tokens > 0
    with pytest.raises(anthropic.AuthenticationError) as wrong:
        client_of(gemma, api_key="wrong", max_retries=0).messages.create(
            model="g", max_tokens=4, messages=HELLO
        )
    assert wrong.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    versioned = httpx.post(
        gemma.url + COUNT_TOKENS_PATH,
        json={"messages": HELLO},
        headers={"x-api-key": KEY, "anthropic-version": "2023-06-01",
                 "anthropic-beta": "prompt-caching-2024-07-31"},
    )  # fmt: skip
    assert versioned.status_code == 200 and versioned.json()["input_tokens"] > 0
    preflight = httpx.options(
        gemma.url + MESSAGES_PATH,
        headers={"origin": ORIGIN, "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 204
    allowed = preflight.headers["access-control-allow-headers"].lower()
    assert {"x-api-key", "anthropic-version", "anthropic-beta"} <= {
        name.strip() for name in allowed.split(",")
    }


def _stream_open(client: httpx.Client, max_tokens: int) -> Any:
    return client.stream(
        "POST",
        MESSAGES_PATH,
        json={"max_tokens": max_tokens, "messages": HELLO, "stream": True, "ignore_eos": True},
    )


def test_a_full_ring_is_529_and_a_client_that_hangs_up_frees_its_slot(gemma: LiveServer) -> None:
    gemma.wait_idle()
    http = httpx.Client(base_url=gemma.url, headers={"x-api-key": KEY}, timeout=60)
    with http, _stream_open(http, 900) as one, _stream_open(http, 900) as two:
        lines = [one.iter_lines(), two.iter_lines()]  # (a line iterator dropped closes)
        assert one.status_code == two.status_code == 200
        assert [next(line) for line in lines] == ["event: message_start"] * 2
        full = http.post(MESSAGES_PATH, json={"max_tokens": 4, "messages": HELLO})
        assert full.status_code == 529 and "retry-after" in full.headers
        assert full.json()["error"]["type"] == "overloaded_error"
        assert gemma.inflight() == 2
    # both clients hung up mid-stream
    gemma.wait_idle()
    again = client_of(gemma).messages.create(model="g", max_tokens=2, messages=HELLO)
    assert again.usage.output_tokens == 2


def test_a_long_prompt_is_kept_alive_with_pings(
    gemma: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the prompt is ingested (here: any prompt takes longer than the keep-alive), the
    stream opens with ``message_start`` and pings until the first token."""
    monkeypatch.setattr(MessageStream, "keepalive_s", 1e-4)
    body = {"max_tokens": 3, "stream": True,
            "messages": [{"role": "user", "content": "Tell me a story. " * 40}]}  # fmt: skip
    answer = httpx.post(gemma.url + MESSAGES_PATH, json=body, headers={"x-api-key": KEY})
    assert answer.status_code == 200
    names = [line.removeprefix("event: ") for line in answer.text.splitlines()
             if line.startswith("event: ")]  # fmt: skip
    assert names[:2] == ["message_start", "ping"]
    first_block = names.index("content_block_start")
    assert set(names[1:first_block]) == {"ping"}
    assert names.count("message_start") == 1 and names[-1] == "message_stop"


def test_a_stream_cut_by_the_deadline_ends_with_anthropics_error_event(gemma_path: Path) -> None:
    server = start_server(
        engine_config(gemma_path, max_inflight=1, ctx_size=1024, threads=1),
        ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1, request_timeout=2.0),
    )
    try:
        body = {"max_tokens": 900, "stream": True, "ignore_eos": True, "messages": HELLO}
        answer = httpx.post(server.url + MESSAGES_PATH, json=body, timeout=60)
        assert answer.status_code == 200
        chunks = [c for c in answer.text.split("\n\n") if c]
        assert chunks[0].startswith("event: message_start")
        name, data = chunks[-1].split("\n")
        assert name == "event: error"
        error = json.loads(data.removeprefix("data: "))
        assert error["type"] == "error" and error["error"]["type"] == "timeout_error"
        client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
        stream = client.messages.stream(
            model="g", max_tokens=900, messages=HELLO, extra_body={"ignore_eos": True}
        )
        # the SDK raises the error event
        with pytest.raises(anthropic.APIStatusError) as cut, stream as events:
            for _ in events:
                pass
        assert cut.value.body["error"]["type"] == "timeout_error"  # type: ignore[index]
        server.wait_idle()
    finally:
        server.stop()


# -- the default model's template and tokenizer ------------------------------------------------

qwen_config = partial(engine_config, max_inflight=2, ctx_size=1024, threads=1)


@pytest.fixture(scope="module")
def qwen(qwen35_real_path: Path) -> Iterator[LiveServer]:
    server = start_server(
        qwen_config(qwen35_real_path),
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=4), graceful_timeout=1),
    )
    yield server
    server.stop()


def test_thinking_comes_back_as_thinking_blocks_with_a_signature(qwen: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=qwen.url, api_key="none")
    thinking = {"type": "enabled", "budget_tokens": 512}
    message = client.messages.create(model="q", max_tokens=6, messages=HELLO, thinking=thinking)
    assert message.content[0].type == "thinking" and message.stop_reason == "max_tokens"
    assert message.content[0].signature == signature(message.content[0].thinking)
    with client.messages.stream(
        model="q", max_tokens=6, messages=HELLO, thinking=thinking
    ) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert "thinking_delta" in deltas and deltas[-1] == "signature_delta"
    assert final.content[0].type == "thinking"
    assert final.content[0].signature == signature(final.content[0].thinking)
    off = client.messages.create(
        model="q", max_tokens=4, messages=HELLO, thinking={"type": "disabled"}
    )
    assert all(block.type != "thinking" for block in off.content)


def test_a_tool_round_trip_forced_with_tool_choice(qwen: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=qwen.url, api_key="none")
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    first = client.messages.create(
        model="q", max_tokens=120, messages=ask, tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_weather"},
    )  # fmt: skip
    assert first.stop_reason == "tool_use"
    (call,) = [block for block in first.content if block.type == "tool_use"]
    assert call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    with client.messages.stream(
        model="q", max_tokens=120, messages=ask, tools=[WEATHER],  # type: ignore[list-item]
        tool_choice={"type": "any"},
    ) as stream:  # fmt: skip
        partial_json = "".join(
            e.delta.partial_json
            for e in stream
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta"
        )
        streamed = stream.get_final_message()
    (streamed_call,) = [block for block in streamed.content if block.type == "tool_use"]
    assert streamed_call.input == json.loads(partial_json)
    jsonschema.validate(streamed_call.input, WEATHER["input_schema"])
    second_turn = [
        *ask,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                      "content": "Sunny, 21 C"}]},
    ]  # fmt: skip
    answer = client.messages.create(
        model="q", max_tokens=6, messages=second_turn, tools=[WEATHER],  # type: ignore[arg-type, list-item]
        tool_choice={"type": "none"}, thinking={"type": "disabled"},
    )  # fmt: skip
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert all(block.type != "tool_use" for block in answer.content)
    counted = client.messages.count_tokens(
        model="q", messages=second_turn, tools=[WEATHER],  # type: ignore[arg-type, list-item]
        tool_choice={"type": "none"}, thinking={"type": "disabled"},
    )  # fmt: skip
    assert counted.input_tokens == answer.usage.input_tokens + (
        answer.usage.cache_read_input_tokens or 0
    )
    assert (answer.usage.cache_read_input_tokens or 0) > 0  # turn 1's prompt, reused


def test_a_json_schema_answer(qwen: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=qwen.url, api_key="none")
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    message = client.messages.create(
        model="q",
        max_tokens=40,
        messages=[{"role": "user", "content": "A digit, as JSON."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    assert message.stop_reason == "end_turn"
    jsonschema.validate(json.loads(message.content[0].text), schema)  # type: ignore[union-attr]


# -- over the ring, a worker in a process of its own ------------------------------------------


def test_over_the_ring_with_a_remote_worker(tmp_path: Path, gemma_path: Path) -> None:
    with Ring.opened(tmp_path, gemma_path) as ring:
        ingress = ring.ingress("ingress")
        ring.worker("w-gemma", [ingress])
        ingress.wait_workers({"w-gemma"})
        client = anthropic.Anthropic(base_url=ingress.url, api_key="none", max_retries=0)
        model = gemma_path.stem
        message = client.messages.create(model=model, max_tokens=4, messages=HELLO)
        assert message.model == model and message.usage.output_tokens == 4
        with client.messages.stream(model=model, max_tokens=4, messages=HELLO) as stream:
            final = stream.get_final_message()
        assert final.usage.output_tokens == 4 and final.content[0].type == "text"
        count = client.messages.count_tokens(model=model, messages=HELLO)
        assert count.input_tokens == final.usage.input_tokens + (
            final.usage.cache_read_input_tokens or 0
        )
        with pytest.raises(anthropic.NotFoundError) as unknown:
            client.messages.create(model="nope", max_tokens=4, messages=HELLO)
        assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
