"""The OpenAI chat-completions translation, without a server or a model: request bodies in,
response bytes out, checked by parsing them back and by the ``openai`` client's own types."""

from __future__ import annotations

import json
import math
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from llmtrio.api import ANTHROPIC_ERRORS, CHAT_PATH, OPENAI_ERRORS

try:  # the HTTP client the openai package is built on: httpx2 from openai 3, httpx before
    import httpx2 as httpx
except ImportError:  # pragma: no cover
    import httpx  # type: ignore[no-redef]

from llmtrio.api import (
    DEFAULT_MAX_BODY_BYTES,
    ApiError,
    invalid_request,
    method_not_allowed,
    not_found,
    request_too_large,
    ring_full,
    server_error,
)
from llmtrio.engine._errors import (
    DecodeError,
    EngineClosedError,
    InvalidRequestError,
    PromptTooLongError,
)
from llmtrio.engine._types import (
    ChatMessage,
    Done,
    GenerateRequest,
    Sampling,
    StopReason,
    Timings,
    Token,
)
from llmtrio.worker._chat_request import ChatCompletionRequest, parse_chat_request
from llmtrio.worker._chat_response import ChatBody, ChatStream, completion_body
from llmtrio.worker._encoding import ResponseMeta, from_engine_error, new_id

HI = [{"role": "user", "content": "hi"}]
DONE = Done(StopReason.END_OF_GENERATION, 7, 3, Timings(0.001, 0.02, 0.05), cached_tokens=2)
USAGE = {
    "prompt_tokens": 7,
    "completion_tokens": 3,
    "total_tokens": 10,
    "prompt_tokens_details": {"cached_tokens": 2},
}


def parse(**fields: Any) -> ChatCompletionRequest:
    fields.setdefault("messages", HI)
    return parse_chat_request(json.dumps(fields).encode())


def refused(body: bytes | dict[str, Any], **kwargs: Any) -> ApiError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(ApiError) as info:
        parse_chat_request(raw, **kwargs)
    return info.value


def event_json(event: bytes) -> Any:
    """The JSON of one ``data: ...\\n\\n`` event, checking its framing on the way."""
    (data,) = events_json(event)
    return data


def events_json(events: bytes) -> list[Any]:
    """The JSON of each ``data: ...\\n\\n`` event (``[DONE]`` as the string), checking the
    framing on the way."""
    assert events.startswith(b"data: ")
    assert events.endswith(b"\n\n")
    out = []
    for event in events[:-2].split(b"\n\n"):
        assert event.startswith(b"data: ")
        payload = event[len(b"data: ") :]
        assert b"\n" not in payload and b"\r" not in payload
        text = payload.decode("utf-8")  # strict UTF-8: no lone surrogates
        out.append(text if text == "[DONE]" else json.loads(text))
    return out


# ----------------------------------------------------------------------------------------------
# Parsing: what is accepted


def test_minimal_request_takes_the_defaults() -> None:
    request = parse()
    assert request == ChatCompletionRequest(
        model=None,
        generate=GenerateRequest(messages=[ChatMessage("user", "hi")], sampling=Sampling()),
        stream=False,
        include_usage=False,
    )
    # Absent sampling fields are llama.cpp server's defaults (the engine's), not OpenAI's 1.0.
    assert request.generate.sampling == Sampling(temperature=0.8, top_p=0.95, top_k=40, min_p=0.05)


def test_every_field_at_once() -> None:
    request = parse(
        model="qwen",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi", "name": "ann"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again"},
        ],
        max_tokens=64,
        temperature=0.5,
        top_p=0.9,
        top_k=20,
        min_p=0.1,
        seed=42,
        stop=["\n\n", "END"],
        stream=True,
        stream_options={"include_usage": True},
        n=1,
        think=False,
        ignore_eos=True,
        logit_bias={"15": 2.5, "7": -100},
        frequency_penalty=0.0,
        user="someone",
        tools=None,
    )
    assert request == ChatCompletionRequest(
        model="qwen",
        generate=GenerateRequest(
            messages=[
                ChatMessage("system", "be brief"),
                ChatMessage("user", "hi"),
                ChatMessage("assistant", "hello"),
                ChatMessage("user", "again"),
            ],
            max_tokens=64,
            sampling=Sampling(temperature=0.5, top_p=0.9, top_k=20, min_p=0.1, seed=42),
            stop=("\n\n", "END"),
            think=False,
            ignore_eos=True,
            logit_bias=((15, 2.5), (7, -math.inf)),
            model_name="qwen",  # a LoRA adapter's name chooses the adapter in the engine
        ),
        stream=True,
        include_usage=True,
    )


def test_null_is_the_same_as_absent() -> None:
    nulls = dict.fromkeys(
        [
            "model",
            "max_tokens",
            "max_completion_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "stop",
            "stream",
            "stream_options",
            "n",
            "think",
            "chat_template_kwargs",
            "ignore_eos",
            "cache_prompt",
            "logit_bias",
        ]
    )
    assert parse(**nulls) == parse()


def test_cache_prompt_is_llama_cpp_servers() -> None:
    assert parse().generate.cache_prompt is True
    assert parse(cache_prompt=True).generate.cache_prompt is True
    assert parse(cache_prompt=False).generate.cache_prompt is False


def test_content_as_text_parts_is_joined_with_newlines() -> None:
    content = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    request = parse(messages=[{"role": "user", "content": content}])
    assert request.generate.messages == (ChatMessage("user", "one\ntwo"),)


def test_developer_is_a_system_message() -> None:
    request = parse(messages=[{"role": "developer", "content": "rules"}, *HI])
    assert request.generate.messages == (ChatMessage("system", "rules"), ChatMessage("user", "hi"))


@pytest.mark.parametrize("assistant", [{"content": None}, {}])
def test_assistant_content_may_be_null_or_absent(assistant: dict[str, Any]) -> None:
    request = parse(messages=[*HI, {"role": "assistant", **assistant}, *HI])
    assert request.generate.messages is not None
    assert request.generate.messages[1] == ChatMessage("assistant", "")


def test_unicode_content_survives() -> None:
    text = 'emoji 😀, "quotes", \\backslash\\, new\nline, 日本語, \u2028'
    body = json.dumps({"messages": [{"role": "user", "content": text}]}).encode()
    assert parse_chat_request(body).generate.messages == (ChatMessage("user", text),)
    # Raw UTF-8 and \u escapes (a surrogate pair) read the same.
    raw = '{"messages": [{"role": "user", "content": "😀 \\ud83d\\ude00"}]}'.encode()
    assert parse_chat_request(raw).generate.messages == (ChatMessage("user", "😀 😀"),)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"max_tokens": 10}, 10),
        ({"max_completion_tokens": 20}, 20),
        ({"max_tokens": 10, "max_completion_tokens": 20}, 20),
        ({"max_tokens": 10, "max_completion_tokens": None}, 10),
        ({}, None),
    ],
)
def test_max_completion_tokens_wins(fields: dict[str, Any], expected: int | None) -> None:
    assert parse(**fields).generate.max_tokens == expected


def test_temperature_zero_is_greedy_and_integers_are_numbers() -> None:
    assert parse(temperature=0).generate.sampling.greedy
    sampling = parse(temperature=2, top_p=1, min_p=0).generate.sampling
    assert (sampling.temperature, sampling.top_p, sampling.min_p) == (2.0, 1.0, 0.0)
    assert isinstance(sampling.temperature, float)
    assert parse(top_k=0).generate.sampling.top_k == 0


@pytest.mark.parametrize(
    ("stop", "expected"),
    [("END", ("END",)), (["a", "b", "c", "d"], ("a", "b", "c", "d")), ([], ()), (None, ())],
)
def test_stop(stop: object, expected: tuple[str, ...]) -> None:
    assert parse(stop=stop).generate.stop == expected


def test_stream_options() -> None:
    assert parse(stream=True).include_usage is False
    assert parse(stream=True, stream_options={}).include_usage is False
    assert parse(stream=True, stream_options={"include_usage": False}).include_usage is False
    assert parse(stream=True, stream_options={"include_usage": True}).include_usage is True
    assert parse(stream=False, stream_options=None).stream is False


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, None),
        ({"think": True}, True),
        ({"chat_template_kwargs": {"enable_thinking": False}}, False),
        ({"chat_template_kwargs": {"other": 1}}, None),
        ({"think": True, "chat_template_kwargs": {"enable_thinking": False}}, True),
        ({"think": None, "chat_template_kwargs": {"enable_thinking": True}}, True),
    ],
)
def test_think_wins_over_enable_thinking(fields: dict[str, Any], expected: bool | None) -> None:
    assert parse(**fields).generate.think is expected


def test_logit_bias_minus_100_bans() -> None:
    bias = parse(logit_bias={"0": -100, "1": -99.5, "2": 100, "3": 0}).generate.logit_bias
    assert bias == ((0, -math.inf), (1, -99.5), (2, 100.0), (3, 0.0))


def test_the_parser_leaves_the_body_size_to_the_ingress() -> None:
    """One body limit, enforced once, at the ingress: a body larger than the default limit
    parses here (the ingress may allow it with --max-body-bytes)."""
    big = "x" * DEFAULT_MAX_BODY_BYTES
    body = json.dumps({"messages": [{"role": "user", "content": big}]}).encode()
    assert len(body) > DEFAULT_MAX_BODY_BYTES
    assert parse_chat_request(body).generate.messages[0].content == big


# ----------------------------------------------------------------------------------------------
# Parsing: what is refused


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"messages": [{"role": "user", "content": "\xff"}]}', "not valid UTF-8"),
        (b'{"messages": ', "could not parse the JSON body"),
        (b"", "could not parse the JSON body"),
        (b'{"messages": [], }', "could not parse the JSON body"),
        (b'{"temperature": NaN, "messages": []}', "NaN is not valid JSON"),
        (b'{"temperature": Infinity, "messages": []}', "Infinity is not valid JSON"),
        (b"\xef\xbb\xbf{}", "could not parse the JSON body"),
        (b"[" * 100_000 + b"]" * 100_000, "could not parse the JSON body"),
        (b'{"seed": ' + b"9" * 5000 + b"}", "could not parse the JSON body"),
        (b"[]", "must be a JSON object, but got an array"),
        (b'"hi"', "must be a JSON object, but got a string"),
        (b"null", "must be a JSON object, but got null"),
    ],
)
def test_unreadable_bodies_are_400(body: bytes, words: str) -> None:
    error = refused(body)
    assert (error.status, error.type, error.param) == (400, "invalid_request_error", None)
    assert words in error.message


# (fields added to a valid body, param, code, words the message must contain)
BAD_FIELDS: list[tuple[dict[str, Any], str, str, str]] = [
    ({"model": 3}, "model", "invalid_type", "expected a string, but got an integer"),
    ({"messages": None}, "messages", "missing_required_parameter", "'messages'"),
    ({"messages": "hi"}, "messages", "invalid_type", "expected an array, but got a string"),
    ({"messages": []}, "messages", "empty_array", "empty array"),
    ({"messages": ["hi"]}, "messages[0]", "invalid_type", "expected an object"),
    ({"messages": [{"content": "x"}]}, "messages[0].role", "missing_required_parameter", "role"),
    ({"messages": [{"role": 1, "content": "x"}]}, "messages[0].role", "invalid_type", "string"),
    (
        {"messages": [{"role": "user", "content": "x", "name": -16331014181079037855662080}]},
        "messages[0].name",
        "invalid_type",
        "expected a string, but got an integer",
    ),
    ({"messages": [{"role": "bot", "content": "x"}]}, "messages[0].role", "invalid_value", "'bot'"),
    (
        {"messages": [{"role": "function", "content": "x", "name": "f"}]},
        "messages[0].role",
        "invalid_value",
        "use 'tool'",
    ),
    (
        {"messages": [*HI, {"role": "user", "content": None}]},
        "messages[1].content",
        "missing_required_parameter",
        "only assistant messages may omit it",
    ),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "missing_required_parameter", ""),
    (
        {"messages": [{"role": "user", "content": 5}]},
        "messages[0].content",
        "invalid_type",
        "expected a string or an array of text parts, but got an integer",
    ),
    (
        {"messages": [{"role": "user", "content": []}]},
        "messages[0].content",
        "empty_array",
        "empty array",
    ),
    (
        {"messages": [{"role": "user", "content": ["hi"]}]},
        "messages[0].content[0]",
        "invalid_type",
        "expected an object",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
        "messages[0].content[0].input_audio.data",
        "missing_required_parameter",
        "data",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "file", "file": {}}]}]},
        "messages[0].content[0].type",
        "invalid_value",
        "'file'. This server accepts text content parts ('text'), and image parts "
        "('image_url') and audio parts ('input_audio')",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0].image_url.url",
        "missing_required_parameter",
        "url",
    ),
    (
        {"messages": [{"role": "user", "content": [{"text": "hi"}]}]},
        "messages[0].content[0].type",
        "missing_required_parameter",
        "type",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
        "messages[0].content[0].text",
        "invalid_type",
        "expected a string, but got null",
    ),
    ({"max_tokens": 0}, "max_tokens", "integer_below_min_value", ">= 1, but got 0"),
    ({"max_tokens": -5}, "max_tokens", "integer_below_min_value", "-5"),
    ({"max_tokens": 2**31}, "max_tokens", "integer_above_max_value", "2147483647"),
    ({"max_tokens": 10.0}, "max_tokens", "invalid_type", "expected an integer, but got a decimal"),
    ({"max_tokens": "10"}, "max_tokens", "invalid_type", "but got a string"),
    ({"max_tokens": True}, "max_tokens", "invalid_type", "but got a boolean"),
    ({"max_completion_tokens": 0}, "max_completion_tokens", "integer_below_min_value", ">= 1"),
    ({"max_tokens": 0, "max_completion_tokens": 5}, "max_tokens", "integer_below_min_value", ""),
    ({"temperature": 2.5}, "temperature", "decimal_above_max_value", "<= 2, but got 2.5"),
    ({"temperature": -0.1}, "temperature", "decimal_below_min_value", ">= 0"),
    ({"temperature": "0.5"}, "temperature", "invalid_type", "expected a number, but got a string"),
    ({"temperature": True}, "temperature", "invalid_type", "expected a number, but got a boolean"),
    ({"top_p": 0}, "top_p", "decimal_below_min_value", "> 0, but got 0"),
    ({"top_p": 1.01}, "top_p", "decimal_above_max_value", "<= 1"),
    ({"top_k": -1}, "top_k", "integer_below_min_value", ">= 0"),
    ({"top_k": 1.5}, "top_k", "invalid_type", "integer"),
    ({"min_p": 1.5}, "min_p", "decimal_above_max_value", "<= 1"),
    ({"min_p": -1}, "min_p", "decimal_below_min_value", ">= 0"),
    ({"seed": 1.5}, "seed", "invalid_type", "integer"),
    ({"seed": 2**63}, "seed", "integer_above_max_value", ""),
    ({"stop": 5}, "stop", "invalid_type", "a string or an array of strings"),
    ({"stop": ["a", 5]}, "stop[1]", "invalid_type", "expected a string, but got an integer"),
    ({"stop": ""}, "stop", "invalid_value", "must not be empty"),
    (
        {"stop": ["a", ""]},
        "stop[1]",
        "invalid_value",
        "'stop[1]': stop sequences must not be empty",
    ),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "array_above_max_length", "maximum length 4"),
    ({"stream": 1}, "stream", "invalid_type", "expected a boolean, but got an integer"),
    ({"stream": "true"}, "stream", "invalid_type", "expected a boolean, but got a string"),
    (
        {"stream_options": {"include_usage": True}},
        "stream_options",
        "invalid_value",
        "only allowed when 'stream' is enabled",
    ),
    ({"stream": True, "stream_options": True}, "stream_options", "invalid_type", "object"),
    (
        {"stream": True, "stream_options": {"include_usage": 1}},
        "stream_options.include_usage",
        "invalid_type",
        "boolean",
    ),
    ({"n": 2}, "n", "integer_above_max_value", "<= 1, but got 2"),
    ({"n": 0}, "n", "integer_below_min_value", ">= 1, but got 0"),
    ({"n": "1"}, "n", "invalid_type", "integer"),
    ({"think": "yes"}, "think", "invalid_type", "boolean"),
    ({"chat_template_kwargs": []}, "chat_template_kwargs", "invalid_type", "object"),
    (
        {"chat_template_kwargs": {"enable_thinking": 0}},
        "chat_template_kwargs.enable_thinking",
        "invalid_type",
        "boolean",
    ),
    ({"ignore_eos": 0}, "ignore_eos", "invalid_type", "boolean"),
    ({"cache_prompt": "no"}, "cache_prompt", "invalid_type", "boolean"),
    ({"logit_bias": [[1, 2]]}, "logit_bias", "invalid_type", "object"),
    ({"logit_bias": {"abc": 1}}, "logit_bias", "invalid_value", "token ids"),
    ({"logit_bias": {"-1": 1}}, "logit_bias", "invalid_value", "'-1'"),
    ({"logit_bias": {"1.5": 1}}, "logit_bias", "invalid_value", "token ids"),
    ({"logit_bias": {"99999999999": 1}}, "logit_bias", "invalid_value", "token ids"),
    ({"logit_bias": {"5": 101}}, "logit_bias.5", "decimal_above_max_value", "<= 100, but got 101"),
    ({"logit_bias": {"5": -101}}, "logit_bias.5", "decimal_below_min_value", ">= -100"),
    ({"logit_bias": {"5": "1"}}, "logit_bias.5", "invalid_type", "number"),
    ({"logit_bias": {"5": False}}, "logit_bias.5", "invalid_type", "boolean"),
]


@pytest.mark.parametrize(("fields", "param", "code", "words"), BAD_FIELDS)
def test_bad_fields_are_400_naming_the_param(
    fields: dict[str, Any], param: str, code: str, words: str
) -> None:
    error = refused({"messages": HI, **fields})
    assert (error.status, error.type, error.param, error.code) == (
        400,
        "invalid_request_error",
        param,
        code,
    )
    assert f"'{param.split('[')[0]}" in error.message or f"'{param}" in error.message
    assert words in error.message


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
        (
            b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
            "messages[0].content[0].text",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}], "stop": "\\ud800"}', "stop"),
        (b'{"messages": [{"role": "user", "content": "x"}], "model": "\\udfff"}', "model"),
    ],
)
def test_lone_surrogates_in_text_are_400(raw: bytes, param: str) -> None:
    error = refused(raw)
    assert (error.status, error.param, error.code) == (400, param, "invalid_value")
    assert "lone UTF-16 surrogate" in error.message
    event_json(OPENAI_ERRORS.event(error))  # the message itself stays valid UTF-8 JSON


def test_long_values_are_clipped_in_messages() -> None:
    error = refused({"messages": [{"role": "x" * 10_000, "content": "hi"}]})
    assert len(error.message) < 200
    assert "..." in error.message


# ----------------------------------------------------------------------------------------------
# Errors


def test_error_body_and_sse_shapes() -> None:
    error = invalid_request("bad 'x'", param="x", code="invalid_value")
    expected = {
        "error": {
            "message": "bad 'x'",
            "type": "invalid_request_error",
            "param": "x",
            "code": "invalid_value",
        }
    }
    assert json.loads(OPENAI_ERRORS.body(error)) == expected
    assert event_json(OPENAI_ERRORS.event(error)) == expected
    assert OPENAI_ERRORS.event(error) == b"data: " + OPENAI_ERRORS.body(error) + b"\n\n"
    status, headers, body = OPENAI_ERRORS.response(error)
    assert (status, headers, body) == (400, (("content-type", "application/json"),), body)
    assert json.loads(body) == expected
    assert str(error) == "bad 'x'"
    assert "400" in repr(error)


@pytest.mark.parametrize(
    ("error", "status", "type_", "code", "headers"),
    [
        (request_too_large(1024), 413, "invalid_request_error", "request_too_large", ()),
        (not_found("GET", "/v1/nope"), 404, "invalid_request_error", "unknown_url", ()),
        (
            method_not_allowed("GET", CHAT_PATH),
            405,
            "invalid_request_error",
            "method_not_allowed",
            (("Allow", "POST"),),
        ),
        (ring_full(), 503, "server_error", "ring_full", ()),
        (ring_full(2), 503, "server_error", "ring_full", (("Retry-After", "2"),)),
        (server_error(), 500, "server_error", None, ()),
    ],
)
def test_error_helpers(
    error: ApiError,
    status: int,
    type_: str,
    code: str | None,
    headers: tuple[tuple[str, str], ...],
) -> None:
    assert (error.status, error.type, error.code, error.headers) == (status, type_, code, headers)
    body = json.loads(OPENAI_ERRORS.body(error))["error"]
    assert body == {"message": error.message, "type": type_, "param": None, "code": code}
    assert error.message


def test_not_found_and_method_messages_name_the_request() -> None:
    assert not_found("GET", "/v1/nope").message == "Invalid URL (GET /v1/nope)"
    error = method_not_allowed("PUT", CHAT_PATH, ("GET", "POST"))
    assert "PUT /v1/chat/completions" in error.message
    assert error.headers == (("Allow", "GET, POST"),)


def test_prompt_too_long_is_context_length_exceeded() -> None:
    error = from_engine_error(PromptTooLongError(5000, 4096))
    assert (error.status, error.type, error.param, error.code) == (
        400,
        "invalid_request_error",
        "messages",
        "context_length_exceeded",
    )
    assert "maximum context length is 4096 tokens" in error.message
    assert "5000 tokens" in error.message
    # Anthropic's routes word it as Anthropic does (Claude Code matches "prompt is too long").
    anthropic = from_engine_error(PromptTooLongError(5000, 4096), ANTHROPIC_ERRORS)
    assert (anthropic.status, anthropic.param, anthropic.code) == (
        400,
        "messages",
        "context_length_exceeded",
    )
    assert anthropic.message == (
        "prompt is too long: 5000 tokens > 4095 maximum (this model's context is 4096 tokens, "
        "and at least one is left to generate)."
    )


def test_other_engine_errors() -> None:
    error = from_engine_error(
        InvalidRequestError("token id 99999 is out of range", param="logit_bias")
    )
    assert (error.status, error.param, error.message) == (
        400,
        "logit_bias",
        "token id 99999 is out of range",
    )
    closed = from_engine_error(EngineClosedError("closed"))
    assert (closed.status, closed.type) == (503, "server_error")
    failed = from_engine_error(DecodeError("llama_decode returned -1"))
    assert (failed.status, failed.type) == (500, "server_error")
    assert "llama_decode returned -1" in failed.message


# ----------------------------------------------------------------------------------------------
# Streaming


META = ResponseMeta("chatcmpl-abc", 1700000000, "qwen")


def stream(meta: ResponseMeta = META, **fields: Any) -> ChatStream:
    return ChatStream(parse(stream=True, **fields), meta)


def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "qwen",
        "choices": choices,
        **extra,
    }


def choice(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


def test_stream_chunk_shapes() -> None:
    s = stream()
    assert event_json(s.start()) == chunk([choice({"role": "assistant", "content": ""})])
    assert event_json(s.event(Token("Hel"))) == chunk([choice({"content": "Hel"})])
    assert event_json(s.event(Token("hmm", reasoning=True))) == chunk(
        [choice({"reasoning_content": "hmm"})]
    )
    finish, done = events_json(s.finish(DONE))
    timings = finish.pop("timings")
    assert finish == chunk([choice({}, "stop")])
    assert timings == {
        "queue_ms": 1.0,
        "cache_n": 2,
        "prompt_n": 5,
        "prompt_ms": 20.0,
        "prompt_per_second": 250.0,
        "predicted_n": 3,
        "predicted_ms": 50.0,
        "predicted_per_second": 40.0,
    }
    assert done == "[DONE]"
    *_, usage, done = events_json(stream(stream_options={"include_usage": True}).finish(DONE))
    assert usage == {**chunk([], usage=USAGE)}
    assert done == "[DONE]"


def test_include_usage_puts_null_usage_in_every_other_chunk() -> None:
    s = stream(stream_options={"include_usage": True})
    finish, usage, _ = events_json(s.finish(DONE))
    for event in (
        event_json(s.start()),
        event_json(s.event(Token("a"))),
        event_json(s.event(Token("b", reasoning=True))),
        finish,
    ):
        assert event["usage"] is None
    assert usage["usage"]["total_tokens"] == 10
    for events in (stream().start(), stream().event(Token("a")), stream().finish(DONE)):
        assert all("usage" not in e for e in events_json(events) if e != "[DONE]")


def test_escaped_identity() -> None:
    s = stream(ResponseMeta("chatcmpl-\\", 1, 'my "model" 😀'))
    events = [s.start(), s.event(Token("x")), s.finish(DONE)]
    for data in (e for event in events for e in events_json(event) if e != "[DONE]"):
        assert (data["model"], data["id"]) == ('my "model" 😀', "chatcmpl-\\")


@pytest.mark.parametrize(
    ("stop", "finish_reason"),
    [
        (StopReason.END_OF_GENERATION, "stop"),
        (StopReason.STOP_STRING, "stop"),
        (StopReason.CANCELLED, "stop"),
        (StopReason.MAX_TOKENS, "length"),
        (StopReason.CONTEXT_END, "length"),
    ],
)
def test_finish_reasons(stop: StopReason, finish_reason: str) -> None:
    done = Done(stop, 1, 1, Timings(0.0, 0.0, 0.0))
    finish = events_json(stream().finish(done))[0]
    assert finish["choices"][0]["finish_reason"] == finish_reason
    # No division by zero: undefined rates are null.
    assert finish["timings"]["predicted_per_second"] is None
    assert finish["timings"]["prompt_per_second"] is None


@pytest.mark.parametrize(
    ("piece", "expected"),
    [
        ('say "hi"', 'say "hi"'),
        ("back\\slash", "back\\slash"),
        ("two\nlines\r\n", "two\nlines\r\n"),
        ("tab\tnul\x00unit\x1fdel\x7f", "tab\tnul\x00unit\x1fdel\x7f"),
        ("😀 日本語 ü", "😀 日本語 ü"),
        ("sep\u2028\u2029\x85", "sep\u2028\u2029\x85"),
        ("</script>", "</script>"),
        ("", ""),
        ("lone \ud800 high", "lone \ufffd high"),
        ("lone \udfff low", "lone \ufffd low"),
        ("pair \ud83d\ude00 split", "pair \ufffd\ufffd split"),
    ],
)
def test_pieces_are_escaped_into_valid_json(piece: str, expected: str) -> None:
    for s in (stream(), stream(logprobs=True)):  # the plain and the extended path
        assert event_json(s.event(Token(piece)))["choices"][0]["delta"] == {"content": expected}
        reasoning = event_json(s.event(Token(piece, reasoning=True)))
        assert reasoning["choices"][0]["delta"] == {"reasoning_content": expected}


def test_the_openai_types_read_every_chunk() -> None:
    s = stream(stream_options={"include_usage": True})
    role = ChatCompletionChunk.model_validate(event_json(s.start()))
    assert role.choices[0].delta.role == "assistant"
    assert role.choices[0].delta.content == ""
    token = ChatCompletionChunk.model_validate(event_json(s.event(Token("ok"))))
    assert token.choices[0].delta.content == "ok"
    thought = ChatCompletionChunk.model_validate(event_json(s.event(Token("hm", reasoning=True))))
    assert thought.choices[0].delta.content is None
    assert (thought.choices[0].delta.model_extra or {})["reasoning_content"] == "hm"
    finish_json, usage_json, _ = events_json(s.finish(DONE))
    finish = ChatCompletionChunk.model_validate(finish_json)
    assert finish.choices[0].finish_reason == "stop"
    usage = ChatCompletionChunk.model_validate(usage_json)
    assert usage.choices == []
    assert usage.usage is not None
    assert (usage.usage.prompt_tokens, usage.usage.completion_tokens, usage.usage.total_tokens) == (
        7,
        3,
        10,
    )


# ----------------------------------------------------------------------------------------------
# Whole responses


def test_completion_body_shape() -> None:
    body = json.loads(completion_body("Hello!", "", DONE, META))
    timings = body.pop("timings")
    assert (timings["prompt_n"], timings["cache_n"]) == (5, 2)
    assert body == {
        "id": "chatcmpl-abc",
        "object": "chat.completion",
        "created": 1700000000,
        "model": "qwen",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hello!"},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": USAGE,
    }


def test_completion_body_with_reasoning_and_length() -> None:
    done = Done(StopReason.MAX_TOKENS, 4, 16, Timings(0.0, 0.01, 0.1))
    raw = completion_body("Answer", "I think", done, ResponseMeta("chatcmpl-x", 1, "m"))
    completion = ChatCompletion.model_validate(json.loads(raw))
    assert completion.choices[0].finish_reason == "length"
    assert completion.choices[0].message.content == "Answer"
    assert (completion.choices[0].message.model_extra or {})["reasoning_content"] == "I think"
    assert completion.usage is not None and completion.usage.total_tokens == 20
    ChatCompletion.model_validate(json.loads(completion_body("", "", DONE, META)))


def test_completion_body_escapes_text() -> None:
    raw = completion_body('a "b"\n😀 \ud800', "", DONE, META)
    body = json.loads(raw.decode("utf-8"))
    assert body["choices"][0]["message"]["content"] == 'a "b"\n😀 \ufffd'
    assert b"\n" not in raw


def test_completion_ids_are_fresh() -> None:
    ids = {new_id("chatcmpl") for _ in range(100)}
    assert len(ids) == 100
    assert all(i.startswith("chatcmpl-") and i[9:].isalnum() for i in ids)


# ----------------------------------------------------------------------------------------------
# The openai client reading our bytes (a MockTransport stands in for the socket only)


def fake_server(pieces: list[Token]) -> httpx.MockTransport:
    """A /v1/chat/completions that answers ``pieces`` through this module's encoders."""

    def handle(request: httpx.Request) -> httpx.Response:
        try:
            parsed = parse_chat_request(request.content)
        except ApiError as error:
            return httpx.Response(error.status, content=OPENAI_ERRORS.body(error))
        meta = ResponseMeta("chatcmpl-1", 1, parsed.model or "local")
        done = Done(StopReason.END_OF_GENERATION, 5, len(pieces), Timings(0.0, 0.01, 0.02))
        encoder = ChatStream(parsed, meta) if parsed.stream else ChatBody(parsed, meta)
        events = [encoder.start(), *(encoder.event(p) for p in pieces), encoder.finish(done)]
        kind = "text/event-stream" if parsed.stream else "application/json"
        return httpx.Response(200, content=b"".join(events), headers={"content-type": kind})

    return httpx.MockTransport(handle)


PIECES = [Token("hmm", reasoning=True), Token("Hel"), Token('lo "😀"\n')]


def client() -> openai.OpenAI:
    return openai.OpenAI(
        api_key="none",
        base_url="http://test/v1",
        http_client=httpx.Client(transport=fake_server(PIECES)),
        max_retries=0,
    )


def test_openai_client_reads_a_stream() -> None:
    chunks = list(
        client().chat.completions.create(
            model="qwen",
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == 'Hello "😀"\n'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_openai_client_reads_a_completion() -> None:
    completion = client().chat.completions.create(
        model="qwen", messages=[{"role": "user", "content": "hi"}]
    )
    assert completion.choices[0].message.content == 'Hello "😀"\n'
    assert completion.model == "qwen"


def test_openai_client_raises_our_errors() -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client().chat.completions.create(
            model="qwen", messages=[{"role": "user", "content": "hi"}], n=3
        )
    assert info.value.status_code == 400
    assert info.value.param == "n"
    assert info.value.code == "integer_above_max_value"
    assert info.value.type == "invalid_request_error"
