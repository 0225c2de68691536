"""The OpenAI API beyond plain chat, end to end through the official client: structured output,
forced tool calls, logprobs, ``/v1/completions``, and 400s for what is not implemented."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest

from llmtrio.api import CHAT_PATH, COMPLETIONS_PATH

from .._server import LiveServer
from ..stack.test_serve import client, sse_events


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=20)
    country: str = pydantic.Field(max_length=20)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    age: int
    role: Literal["admin", "user", "guest"]
    hobbies: list[str] = pydantic.Field(max_length=3)
    address: Address


WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 30},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast for a city",
            "parameters": WEATHER_PARAMETERS,
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time now", "parameters": {}},
    },
]
ASK: Any = [{"role": "user", "content": "What will the weather be in Paris for 3 days?"}]
FORCED: Any = {"type": "function", "function": {"name": "get_weather"}}


def test_parse_with_a_pydantic_model(live_server: LiveServer) -> None:
    for seed in (1, 2):
        completion = client(live_server).chat.completions.parse(
            model="any",
            messages=[{"role": "user", "content": "Describe a person as JSON."}],
            response_format=Person,
            max_tokens=200,
            seed=seed,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Person)
        jsonschema.validate(json.loads(choice.message.content or ""), Person.model_json_schema())


def test_json_object_streamed_parses_or_ran_out(live_server: LiveServer) -> None:
    finished = 0
    for seed in range(1, 7):
        stream = client(live_server).chat.completions.create(
            model="any",
            messages=[{"role": "user", "content": "A JSON object with keys a and b:"}],
            response_format={"type": "json_object"},
            max_tokens=120,
            seed=seed,
            stream=True,
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        [finish] = [
            c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
        ]
        if finish == "stop":  # the grammar closed the object: it parses
            assert isinstance(json.loads(text), dict), text
            finished += 1
        else:  # out of tokens inside an unbounded object
            assert finish == "length" and text.lstrip().startswith("{"), text
    assert finished >= 2


def test_forced_tool_call_not_streamed(live_server: LiveServer) -> None:
    completion = client(live_server).chat.completions.create(
        model="any", messages=ASK, tools=TOOLS, tool_choice=FORCED, max_tokens=120
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMETERS)  # type: ignore[union-attr]
    assert not choice.message.content


@pytest.mark.parametrize("choice", [FORCED, "required"])
def test_forced_tool_call_streamed(live_server: LiveServer, choice: Any) -> None:
    stream = client(live_server).chat.completions.create(
        model="any",
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        parallel_tool_calls=False,  # "required" may call several tools otherwise
        max_tokens=120,
        stream=True,
    )
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas, chunks
    assert {d.index for d in deltas} == {0}
    name = "".join(d.function.name or "" for d in deltas if d.function)
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert name in (("get_weather",) if choice == FORCED else ("get_weather", "get_time"))
    schema = WEATHER_PARAMETERS if name == "get_weather" else {"type": "object"}
    jsonschema.validate(json.loads(arguments), schema)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in content


def test_tool_history_is_accepted(live_server: LiveServer) -> None:
    messages: Any = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "unit": "celsius", "days": 3}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees."},
    ]
    completion = client(live_server).chat.completions.create(
        model="any", messages=messages, tools=TOOLS, max_tokens=8, temperature=0
    )
    assert completion.usage is not None and completion.usage.completion_tokens >= 1


def check_logprobs(entries: Any, top: int) -> None:
    assert entries
    for entry in entries:
        assert entry.logprob <= 0
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
        values = [alt.logprob for alt in entry.top_logprobs]
        assert len(values) == top
        assert values == sorted(values, reverse=True)


def test_logprobs_streamed_and_not(live_server: LiveServer) -> None:
    # Compared only where they are defined equal: both requests ingest the whole prompt
    # (``cache_prompt: false``), so both run the same batch shapes. With reuse, the second
    # would compute its first logits from a one-token batch over the first one's memory,
    # which can move them in the last bits and flip a greedy near-tie on some CPUs.
    args: Any = {
        "model": "any",
        "messages": [{"role": "user", "content": "Count to five."}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_body": {"cache_prompt": False},
    }
    whole = client(live_server).chat.completions.create(**args)
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    check_logprobs(logprobs.content, 3)
    assert "".join(e.token for e in logprobs.content) == whole.choices[0].message.content
    # Greedy: the chosen token is the most likely one.
    assert all(e.top_logprobs[0].logprob == e.logprob for e in logprobs.content)

    chunks = list(client(live_server).chat.completions.create(**args, stream=True))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content or []
    ]
    check_logprobs(streamed, 3)
    assert [e.token for e in streamed] == [e.token for e in logprobs.content]
    assert [e.logprob for e in streamed] == [e.logprob for e in logprobs.content]
    assert [e.top_logprobs for e in streamed] == [e.top_logprobs for e in logprobs.content]


def test_completions_not_streamed(live_server: LiveServer) -> None:
    completion = client(live_server).completions.create(
        model="any", prompt="The capital of France is", max_tokens=6, temperature=0, logprobs=2
    )
    assert completion.object == "text_completion"
    choice = completion.choices[0]
    assert choice.text and choice.finish_reason in ("length", "stop")
    assert completion.usage is not None and completion.usage.completion_tokens <= 6
    assert choice.logprobs is not None and choice.logprobs.tokens is not None
    assert "".join(choice.logprobs.tokens) == choice.text
    assert choice.logprobs.text_offset is not None and choice.logprobs.text_offset[0] == 0
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs or [])

    ids = client(live_server).completions.create(
        model="any", prompt=[2, 818, 5279, 529, 7001, 563], max_tokens=3, temperature=0
    )
    assert ids.choices[0].text


def test_completions_streamed(live_server: LiveServer) -> None:
    # Both ingest the whole prompt (``cache_prompt: false``): the same batch shapes, the same
    # greedy tokens (with reuse, the second's logits could differ in the last bits).
    args: Any = {
        "model": "any",
        "prompt": "Once upon a time",
        "max_tokens": 10,
        "temperature": 0,
        "extra_body": {"cache_prompt": False},
    }
    whole = client(live_server).completions.create(**args)
    stream = client(live_server).completions.create(
        **args, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10


@pytest.mark.parametrize(
    ("path", "fields", "param", "words"),
    [
        (CHAT_PATH, {"audio": {"voice": "alloy"}}, "audio", "audio output"),
        (CHAT_PATH, {"modalities": ["text", "audio"]}, "modalities", "modalities"),
        (CHAT_PATH, {"prediction": {"type": "content"}}, "prediction", "predicted"),
        (CHAT_PATH, {"web_search_options": {}}, "web_search_options", "web search"),
        (CHAT_PATH, {"n": 2}, "n", "Expected a value <= 1, but got 2"),
        (
            CHAT_PATH,
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "properties": {"n": {"not": {}}}},
                        "strict": True,
                    },
                }
            },
            "json_schema",  # refused by the engine, which compiles the schema
            "'not' is not supported",
        ),
        (CHAT_PATH, {"top_logprobs": 2}, "top_logprobs", "'logprobs' must be"),
        (CHAT_PATH, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "value <= 20"),
        (CHAT_PATH, {"presence_penalty": 2.5}, "presence_penalty", "value <= 2, but"),
        (COMPLETIONS_PATH, {"echo": True}, "echo", "echoing"),
        (COMPLETIONS_PATH, {"suffix": "end"}, "suffix", "suffix"),
        (COMPLETIONS_PATH, {"best_of": 3}, "best_of", "Expected a value <= 1"),
        (COMPLETIONS_PATH, {"n": 2}, "n", "Expected a value <= 1"),
        (COMPLETIONS_PATH, {"prompt": ["a", "b"]}, "prompt", "one prompt per request"),
    ],
)
def test_unimplemented_fields_are_400_naming_them(
    live_server: LiveServer, path: str, fields: dict[str, Any], param: str, words: str
) -> None:
    body: dict[str, Any] = {"model": "any", "max_tokens": 2}
    if path == COMPLETIONS_PATH:
        body["prompt"] = "Hello"
    else:
        body["messages"] = [{"role": "user", "content": "Hi"}]
    body.update(fields)
    response = httpx.post(live_server.url + path, json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param
    assert words in error["message"]


def test_completions_raw_sse(live_server: LiveServer) -> None:
    response = httpx.post(
        live_server.url + COMPLETIONS_PATH,
        json={"prompt": "Hi", "max_tokens": 3, "stream": True, "temperature": 0},
        timeout=30,
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.content)
    assert events[-1] == "[DONE]"
    assert all(json.loads(e)["object"] == "text_completion" for e in events[:-1])


def test_bad_request_via_client_is_bad_request_error(live_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError):
        client(live_server).completions.create(model="any", prompt="x", echo=True)
