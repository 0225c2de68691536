"""A differential check of the public API: the same corpus of requests sent to ``llmtrio serve``
from two installs (a base, e.g. the main a redesign started from, and this tree), the answers
compared field by field.

    .venv/bin/python benchmarks/differential.py --base /path/to/base/.venv/bin/python

Each server runs alone (one, then the other) on the gemma test model, greedy, with prompt reuse
off (so an aborted request leaves nothing that changes a later one) and speculation off (its
budget drafts by measured step times, so a batch's shape, and with it a greedy near-tie, can
change from run to run: one tree alone gives two answers to one tool call with it on), and
gets the corpus one request at a time. Compared: the status, the content type, JSON bodies
with what must differ masked (ids, ``created``, ``timings``), the events of a stream in order
(each masked the same way), error bodies whole, and, for a request the client aborts after two
chunks, those chunks.
Every difference is printed (with the request's name) and the count of requests that differ;
``--show-equal`` lists the equal ones too.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx

from llmtrio.engine import demo_model_path

CHAT = "/v1/chat/completions"
TEXT = "/v1/completions"
HI = [{"role": "user", "content": "Say hello."}]
_MASKED = {"id", "created", "timings", "system_fingerprint"}


@attrs.frozen
class Case:
    """One request of the corpus: ``abort`` closes the stream after that many events."""

    name: str
    method: str = "POST"
    path: str = CHAT
    body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = attrs.field(factory=dict)
    abort: int | None = None


def _chat(name: str, **fields: Any) -> Case:
    body = {"messages": HI, "max_tokens": 6, "temperature": 0, **fields}
    return Case(name, body=body)


def _text(name: str, **fields: Any) -> Case:
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, **fields}
    return Case(name, path=TEXT, body=body)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}


def corpus() -> list[Case]:
    """At least 200 requests: valid ones of every endpoint and form, then every kind of
    refusal, then aborted streams and HTTP-level errors."""
    cases: list[Case] = []
    # -- valid: chat
    for stream in (False, True):
        s = {"stream": stream}
        cases += [
            _chat(f"chat plain stream={stream}", **s),
            _chat(f"chat long stream={stream}", max_tokens=24, **s),
            _chat(
                f"chat system stream={stream}",
                messages=[{"role": "system", "content": "Answer briefly."}, *HI],
                **s,
            ),
            _chat(
                f"chat developer+parts stream={stream}",
                messages=[
                    {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Hi"},
                            {"type": "text", "text": "there"},
                        ],
                        "name": "ann",
                    },
                ],
                **s,
            ),
            _chat(f"chat logprobs stream={stream}", logprobs=True, top_logprobs=3, **s),
            _chat(f"chat stop stream={stream}", stop=["\n", "lo"], max_tokens=16, **s),
            _chat(
                f"chat json_object stream={stream}",
                max_tokens=24,
                response_format={"type": "json_object"},
                **s,
            ),
            _chat(
                f"chat json_schema stream={stream}",
                max_tokens=40,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": SCHEMA},
                },
                **s,
            ),
            _chat(f"chat tools auto stream={stream}", tools=[WEATHER], max_tokens=24, **s),
            _chat(
                f"chat tools required stream={stream}",
                tools=[WEATHER],
                max_tokens=30,
                tool_choice="required",
                **s,
            ),
            _chat(
                f"chat tools named stream={stream}",
                tools=[WEATHER],
                max_tokens=30,
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                **s,
            ),
            _chat(
                f"chat tool history stream={stream}",
                tools=[WEATHER],
                messages=[
                    *HI,
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {
                                    "name": "get_weather",
                                    "arguments": '{"city": "Paris"}',
                                },
                            }
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
                ],
                **s,
            ),
            _chat(
                f"chat penalties stream={stream}",
                presence_penalty=1.5,
                frequency_penalty=0.5,
                repeat_penalty=1.2,
                repeat_last_n=-1,
                **s,
            ),
            _chat(
                f"chat seeded sampling stream={stream}",
                temperature=0.9,
                seed=7,
                top_k=20,
                top_p=0.9,
                min_p=0.1,
                **s,
            ),
            _chat(f"chat logit_bias stream={stream}", logit_bias={"1": -100, "9": 5}, **s),
            _chat(
                f"chat think off stream={stream}",
                think=False,
                chat_template_kwargs={"enable_thinking": True},
                **s,
            ),
            _chat(f"chat max_completion_tokens stream={stream}", max_completion_tokens=3, **s),
            _chat(f"chat ignore_eos n=1 stream={stream}", ignore_eos=True, n=1, **s),
            _chat(f"chat nulls stream={stream}", model=None, top_p=None, stop=None, **s),
        ]
    cases.append(_chat("chat usage", stream=True, stream_options={"include_usage": True}))
    cases.append(_chat("chat model name", model="gpt-4o"))
    # -- valid: text completions
    for stream in (False, True):
        s = {"stream": stream}
        cases += [
            _text(f"text plain stream={stream}", **s),
            _text(f"text ids stream={stream}", prompt=[2, 818, 5279, 529], **s),
            _text(f"text one string stream={stream}", prompt=["The sky is"], **s),
            _text(f"text one ids stream={stream}", prompt=[[2, 818, 5279]], **s),
            _text(f"text logprobs stream={stream}", logprobs=2, **s),
            _text(f"text stop stream={stream}", stop="\n", max_tokens=20, **s),
            _text(f"text echo false best_of stream={stream}", echo=False, best_of=1, **s),
            _text(
                f"text json stream={stream}",
                max_tokens=20,
                response_format={"type": "json_object"},
                **s,
            ),
        ]
    cases.append(_text("text default max_tokens", max_tokens=None))
    cases.append(_text("text usage", stream=True, stream_options={"include_usage": True}))
    # -- refusals: every simple field, every kind of fault
    numbers = {
        "temperature": (-0.5, 2.5),
        "top_p": (0, 1.5),
        "min_p": (-0.1, 1.1),
        "presence_penalty": (-3, 3),
        "frequency_penalty": (-3, 3),
        "repeat_penalty": (0, 11),
    }
    for field, (low, high) in numbers.items():
        for path, maker in ((CHAT, _chat), (TEXT, _text)):
            where = "chat" if path == CHAT else "text"
            cases += [
                maker(f"{where} {field} below", **{field: low}),
                maker(f"{where} {field} above", **{field: high}),
                maker(f"{where} {field} string", **{field: "1"}),
                maker(f"{where} {field} bool", **{field: True}),
                maker(f"{where} {field} huge int", **{field: 10**400}),
            ]
    integers = {
        "top_k": (-1, 2**31),
        "seed": (-(2**63) - 1, 2**63),
        "max_tokens": (0, 2**31),
        "repeat_last_n": (-2, 2**31),
        "n": (0, 2),
    }
    for field, (low, high) in integers.items():
        for path, maker in ((CHAT, _chat), (TEXT, _text)):
            where = "chat" if path == CHAT else "text"
            cases += [
                maker(f"{where} {field} below", **{field: low}),
                maker(f"{where} {field} above", **{field: high}),
                maker(f"{where} {field} decimal", **{field: 1.5}),
                maker(f"{where} {field} string", **{field: "3"}),
            ]
    cases += [
        _chat("chat max_completion_tokens 0", max_completion_tokens=0),
        _chat("chat top_logprobs 21", logprobs=True, top_logprobs=21),
        _chat("chat top_logprobs without logprobs", top_logprobs=2),
        _chat("chat logprobs int", logprobs=3),
        _text("text logprobs 21", logprobs=21),
        _text("text logprobs bool", logprobs=True),
        _text("text best_of 2", best_of=2),
        _text("text echo", echo=True),
        _text("text suffix", suffix="end"),
        _chat("chat stream string", stream="yes"),
        _chat("chat stream_options without stream", stream_options={"include_usage": True}),
        _chat("chat stream_options not object", stream=True, stream_options=1),
        _chat("chat include_usage not bool", stream=True, stream_options={"include_usage": 1}),
        _chat("chat think string", think="yes"),
        _chat("chat template kwargs list", chat_template_kwargs=[]),
        _chat("chat enable_thinking string", chat_template_kwargs={"enable_thinking": "x"}),
        _chat("chat ignore_eos int", ignore_eos=1),
        _chat("chat model int", model=3),
        _chat("chat think with grammar", think=True, response_format={"type": "json_object"}),
    ]
    for field in (
        "audio",
        "modalities",
        "prediction",
        "web_search_options",
        "functions",
        "function_call",
        "reasoning_effort",
        "verbosity",
    ):
        cases.append(_chat(f"chat refused {field}", **{field: ["x"]}))
    cases.append(_chat("chat modalities text", modalities=["text"]))
    # messages
    cases += [
        Case("chat messages missing", body={"max_tokens": 4}),
        _chat("chat messages string", messages="hi"),
        _chat("chat messages empty", messages=[]),
        _chat("chat message not object", messages=["hi"]),
        _chat("chat role missing", messages=[{"content": "hi"}]),
        _chat("chat role int", messages=[{"role": 1, "content": "hi"}]),
        _chat("chat role function", messages=[{"role": "function", "content": "hi"}]),
        _chat("chat role bad", messages=[{"role": "robot", "content": "hi"}]),
        _chat("chat content missing", messages=[{"role": "user"}]),
        _chat("chat content int", messages=[{"role": "user", "content": 5}]),
        _chat("chat content empty parts", messages=[{"role": "user", "content": []}]),
        _chat("chat part not object", messages=[{"role": "user", "content": ["x"]}]),
        _chat(
            "chat part image",
            messages=[
                {
                    "role": "user",
                    "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                }
            ],
        ),
        _chat("chat part no type", messages=[{"role": "user", "content": [{"text": "x"}]}]),
        _chat(
            "chat part text int",
            messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}],
        ),
        _chat("chat name int", messages=[{"role": "user", "content": "hi", "name": 5}]),
        _chat("chat surrogate", messages=[{"role": "user", "content": "a\ud800b"}]),
        _chat("chat assistant no content", messages=[*HI, {"role": "assistant"}, *HI]),
        _chat(
            "chat tool_call_id int", messages=[{"role": "tool", "content": "x", "tool_call_id": 3}]
        ),
        _chat(
            "chat tool_calls not list",
            messages=[{"role": "assistant", "content": "", "tool_calls": "x"}],
        ),
    ]
    # stop, logit_bias
    cases += [
        _chat("chat stop int", stop=5),
        _chat("chat stop item int", stop=["a", 5]),
        _chat("chat stop empty", stop=""),
        _chat("chat stop item empty", stop=["a", ""]),
        _chat("chat stop too many", stop=["a", "b", "c", "d", "e"]),
        _chat("chat stop too long", stop="x" * 300),
        _text("text stop too many", stop=list("abcde")),
        _chat("chat logit_bias list", logit_bias=[[1, 2]]),
        _chat("chat logit_bias key", logit_bias={"abc": 1}),
        _chat("chat logit_bias negative key", logit_bias={"-1": 1}),
        _chat("chat logit_bias huge key", logit_bias={"99999999999": 1}),
        _chat("chat logit_bias above", logit_bias={"5": 101}),
        _chat("chat logit_bias below", logit_bias={"5": -101}),
        _chat("chat logit_bias string", logit_bias={"5": "1"}),
        _text("text logit_bias above", logit_bias={"5": 101}),
    ]
    # tools, response_format
    cases += [
        _chat("chat tools not list", tools={}),
        _chat("chat tool not object", tools=[1]),
        _chat("chat tool type", tools=[{"type": "code", "function": {"name": "x"}}]),
        _chat("chat tool no function", tools=[{"type": "function"}]),
        _chat("chat tool no name", tools=[{"type": "function", "function": {}}]),
        _chat("chat tool twice", tools=[WEATHER, WEATHER]),
        _chat("chat tool_choice bad", tools=[WEATHER], tool_choice="always"),
        _chat(
            "chat tool_choice unknown",
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        ),
        _chat("chat tool_choice no tools", tool_choice="required"),
        _chat("chat tool_choice int", tools=[WEATHER], tool_choice=3),
        _chat("chat parallel not bool", tools=[WEATHER], parallel_tool_calls="no"),
        _chat("chat response_format string", response_format="json"),
        _chat("chat response_format type", response_format={"type": "xml"}),
        _chat("chat json_schema missing", response_format={"type": "json_schema"}),
        _chat(
            "chat json_schema no name",
            response_format={"type": "json_schema", "json_schema": {"schema": SCHEMA}},
        ),
        _chat(
            "chat json_schema strict string",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": SCHEMA, "strict": "yes"},
            },
        ),
        _chat(
            "chat json_schema unsupported",
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "object", "properties": {"a": {"not": {}}}},
                },
            },
        ),
    ]
    # completions prompts
    cases += [
        Case("text prompt missing", path=TEXT, body={"max_tokens": 3}),
        _text("text prompt empty", prompt=""),
        _text("text prompt int", prompt=5),
        _text("text prompt two", prompt=["a", "b"]),
        _text("text prompt mixed", prompt=[1, "a"]),
        _text("text prompt empty list", prompt=[]),
        _text("text prompt bool ids", prompt=[True]),
        _text("text prompt too long", prompt="word " * 800),
    ]
    # bodies and HTTP
    cases += [
        Case("body not json", raw=b"{nope"),
        Case("body array", raw=b"[1, 2]"),
        Case("body utf-8", raw=b'{"messages": "\xff"}'),
        Case("body NaN", raw=b'{"messages": [], "temperature": NaN}'),
        Case("body empty", raw=b""),
        Case("text body not json", path=TEXT, raw=b"{"),
        Case(
            "chat prompt too long", body={"messages": [{"role": "user", "content": "word " * 800}]}
        ),
        Case("get chat", method="GET"),
        Case("put text", method="PUT", path=TEXT, body={}),
        Case("unknown path", path="/v1/nothing", body={}),
        Case("get unknown", method="GET", path="/v2/models"),
        Case("models", method="GET", path="/v1/models"),
        Case("page", method="GET", path="/"),
        Case("too large", raw=b'{"messages": "' + b"x" * (1 << 20) + b'"}'),
        Case(
            "foreign origin",
            headers={"origin": "https://evil.example"},
            body={"messages": HI, "max_tokens": 2},
        ),
        Case(
            "bad request id",
            headers={"x-request-id": "a b"},
            body={"messages": HI, "max_tokens": 2, "temperature": 0},
        ),
    ]
    # aborted streams
    for i, maker in enumerate((_chat, _text)):
        cases.append(attrs.evolve(maker(f"abort {i}", stream=True, max_tokens=40), abort=2))
        cases.append(attrs.evolve(maker(f"abort late {i}", stream=True, max_tokens=40), abort=8))
    return cases


# -- running -----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: ("<masked>" if k in _MASKED else _masked(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    return value


def _events(text: str) -> list[Any]:
    out: list[Any] = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[6:]
            out.append(data if data == "[DONE]" else _masked(json.loads(data)))
    return out


def _answer(client: httpx.Client, base: str, case: Case) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"headers": case.headers}
    raw = case.raw
    if raw is None and case.body is not None:
        raw = json.dumps(case.body).encode()  # ASCII: lone surrogates stay escaped
    if raw is not None:
        kwargs["content"] = raw
        kwargs["headers"] = {"content-type": "application/json", **case.headers}
    with client.stream(case.method, base + case.path, **kwargs) as response:
        kind = response.headers.get("content-type", "").split(";")[0]
        if case.abort is not None and kind == "text/event-stream":
            events = []
            lines = response.iter_lines()
            for line in lines:
                if line.startswith("data: "):
                    events.append(_masked(json.loads(line[6:])) if line[6:] != "[DONE]" else "D")
                    if len(events) == case.abort:
                        break
            return {"status": response.status_code, "type": kind, "events": events}
        response.read()
    out: dict[str, Any] = {"status": response.status_code, "type": kind}
    if kind == "text/event-stream":
        out["events"] = _events(response.text)
    elif kind == "application/json":
        body = response.json()
        if case.path == "/v1/models":
            for model in body.get("data", []):
                model["id"] = "<model>"
        out["json"] = _masked(body)
    else:
        out["length"] = len(response.content)
    out["allow"] = response.headers.get("allow")
    out["retry_after"] = response.headers.get("retry-after")
    return out


def run_server(python: str, cases: list[Case], model: Path, log: Path) -> list[dict[str, Any]]:
    """Start ``llmtrio serve`` with ``python``, answer ``cases`` one by one, stop it."""
    port = _free_port()
    argv = [python, "-m", "llmtrio", "serve", "--model", str(model), "--port", str(port),
            "--max-inflight", "2", "--ctx-size", "512", "--threads", "2",
            "--no-prompt-cache", "--no-spec", "--request-timeout", "0"]  # fmt: skip
    # Run from the log's folder: ``python -m`` puts the working directory first on sys.path,
    # so run from a source tree it would import that tree's llmtrio, not ``python``'s install.
    with log.open("wb") as out:
        server = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent)
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(timeout=600) as client:
            for _ in range(6000):
                try:
                    if client.get(base + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            answers = []
            for i, case in enumerate(cases):
                try:
                    answers.append(_answer(client, base, case))
                except httpx.HTTPError as exc:  # e.g. a 413 sent while the body still goes
                    answers.append({"transport_error": type(exc).__name__})
                if (i + 1) % 25 == 0:
                    print(f"  {python}: {i + 1}/{len(cases)}", file=sys.stderr, flush=True)
            return answers
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(60)


def _diff(a: Any, b: Any, path: str = "") -> Iterator[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a:
                yield f"{path}.{key}: only new: {json.dumps(b[key])[:160]}"
            elif key not in b:
                yield f"{path}.{key}: only base: {json.dumps(a[key])[:160]}"
            else:
                yield from _diff(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"{path}: {len(a)} items in base, {len(b)} in new"
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            yield from _diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"{path}: {json.dumps(a)[:160]} -> {json.dumps(b)[:160]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base install's python")
    parser.add_argument("--new", default=sys.executable, help="this install's python")
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: gemma)")
    parser.add_argument("--out", type=Path, default=Path("differential-out"))
    parser.add_argument("--show-equal", action="store_true")
    args = parser.parse_args()
    model = args.model or demo_model_path()
    cases = corpus()
    args.out.mkdir(exist_ok=True)
    print(f"{len(cases)} requests", file=sys.stderr)
    base = run_server(args.base, cases, model, args.out / "base.log")
    new = run_server(args.new, cases, model, args.out / "new.log")
    (args.out / "answers.json").write_text(json.dumps({"base": base, "new": new}, indent=1))
    differing = 0
    for case, a, b in zip(cases, base, new, strict=True):
        diffs = list(_diff(a, b))
        if diffs:
            differing += 1
            print(f"== {case.name} ({case.method} {case.path})")
            for line in diffs:
                print(f"   {line}")
        elif args.show_equal:
            print(f"== {case.name}: equal")
    print(f"{differing} of {len(cases)} requests differ")


if __name__ == "__main__":
    main()
