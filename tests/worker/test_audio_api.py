"""Audio over HTTP: chat's and the Responses API's ``input_audio`` parts and OpenAI's
``/v1/audio/transcriptions`` and ``/v1/audio/translations``, through the ring (the qwen35
tiny model with a random ``qwen2a`` projector, tests/_projector.py), with the official
``openai`` client and raw bodies; a remote worker over mutual TLS; refusals are 400s naming
the part (413 over the body limits). The parsers and encoders in process too."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import openai
import pytest
import trio
import trustme

from llmtrio.api import TRANSCRIPTIONS_PATH, Body, RequestLimits, read_form
from llmtrio.engine import Done, Engine, StopReason, Timings, Token
from llmtrio.ring import (
    ControlConfig,
    Ring,
    client_ssl_context,
    connect_ring,
    serve_control,
    server_ssl_context,
)
from llmtrio.web import ServeConfig, serve_ingress
from llmtrio.worker import serve_link
from llmtrio.worker._encoding import ResponseMeta
from llmtrio.worker._transcriptions import (
    TranscriptBody,
    TranscriptStream,
    parse_transcription_request,
)

from .._audio import encode, input_audio, noise, silence, tone
from .._helpers import engine_config, eventually
from .._projector import QWEN2A_WINDOW_TOKENS, write_qwen2a_projector
from .._server import LiveServer, start_server

WAV = encode(tone(440, 2.0), "wav")
LIMITS = RequestLimits(max_audio_seconds=120)


@pytest.fixture(scope="module")
def projector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen2a_projector(tmp_path_factory.mktemp("audio-api") / "mmproj-qwen2a.gguf")


@pytest.fixture(scope="module")
def server(projector: Path, qwen35_path: Path) -> Iterator[LiveServer]:
    """Two models: ``listener`` (an audio projector) and ``text-only``."""
    configs = [
        engine_config(qwen35_path, model_name="listener", mmproj=projector, threads=1,
                      max_inflight=2, ctx_size=4096),
        engine_config(qwen35_path, model_name="text-only", threads=1, max_inflight=1),
    ]  # fmt: skip
    serve = ServeConfig(port=0, max_body_bytes=4096, max_audio_body_bytes=2 * 2**20)
    live = start_server(configs, serve, LIMITS)
    try:
        yield live
    finally:
        live.stop()


def chat(server: LiveServer, parts: list[dict[str, object]], **fields: object) -> httpx.Response:
    body = {
        "model": "listener",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Listen."}, *parts]}],
        "max_tokens": 4,
        "temperature": 0,
        **fields,
    }
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def transcribe(server: LiveServer, files: dict[str, object], **data: object) -> httpx.Response:
    fields = {"model": "listener", "max_tokens": "4", **{k: str(v) for k, v in data.items()}}
    return httpx.post(server.url + TRANSCRIPTIONS_PATH, files=files, data=fields, timeout=120)


# -- chat and the Responses API ---------------------------------------------------------------


def test_openai_client_input_audio(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    reply = client.chat.completions.create(
        model="listener",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is said?"},
                    {
                        "type": "input_audio",
                        "input_audio": {"data": base64.b64encode(WAV).decode(), "format": "wav"},
                    },
                ],
            }
        ],
        max_tokens=4,
        temperature=0,
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.prompt_tokens > QWEN2A_WINDOW_TOKENS
    details = reply.usage.prompt_tokens_details
    assert details is not None and details.audio_tokens == QWEN2A_WINDOW_TOKENS


def test_responses_input_audio(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    response = client.responses.create(
        model="listener",
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is said?"},
                    input_audio(encode(noise(1.5), "mp3"), "mp3"),  # type: ignore[list-item]
                ],
            }
        ],
        max_output_tokens=4,
        temperature=0,
    )
    assert response.usage is not None
    assert response.usage.input_tokens > QWEN2A_WINDOW_TOKENS


def test_a_body_with_audio_may_be_larger_than_the_body_limit(server: LiveServer) -> None:
    # 4096 bytes is the plain limit; 2 MiB with audio; more is a 413
    reply = chat(server, [input_audio(encode(tone(300, 20.0), "flac"), "flac")])
    assert reply.status_code == 200, reply.text
    large = encode(noise(70.0), "wav")  # 2.2 MB
    too_large = chat(server, [input_audio(large)])
    assert too_large.status_code == 413
    plain = httpx.post(
        server.url + "/v1/chat/completions",
        json={"model": "listener", "messages": [{"role": "user", "content": "x" * 5000}]},
        timeout=60,
    )
    assert plain.status_code == 413


@pytest.mark.parametrize(
    ("part", "param", "reason"),
    [
        (input_audio(WAV[:-100]), "messages[0].content[1].input_audio.data", "truncated"),
        (input_audio(b"\x00" * 64), "messages[0].content[1].input_audio.data", "not a WAV"),
        (input_audio(encode(silence(0), "wav")), "messages[0].content[1].input_audio.data",
         "no samples"),
        (input_audio(encode(silence(200), "flac"), "flac"),
         "messages[0].content[1].input_audio.data", "longer than the 2.0 min"),
        ({"type": "input_audio", "input_audio": {"data": "@@@", "format": "wav"}},
         "messages[0].content[1].input_audio.data", "base64"),
        ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}},
         "messages[0].content[1].input_audio.format", "ogg"),
        ({"type": "input_audio", "input_audio": {"format": "wav"}},
         "messages[0].content[1].input_audio.data", "Missing"),
    ],
    ids=["truncated", "not-audio", "zero-samples", "too-long", "base64", "format", "no-data"],
)  # fmt: skip
def test_bad_audio_parts_are_400s_naming_the_part(
    server: LiveServer, part: dict[str, object], param: str, reason: str
) -> None:
    reply = chat(server, [part])
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert reason in error["message"]


def test_audio_to_a_model_without_an_audio_projector(server: LiveServer) -> None:
    reply = chat(server, [input_audio(WAV)], model="text-only")
    assert reply.status_code == 400
    assert "takes no audio" in reply.json()["error"]["message"]


def test_audio_on_anthropics_api_is_a_clear_400(server: LiveServer) -> None:
    body = {
        "model": "listener",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"},
                                                   input_audio(WAV)]}],
    }  # fmt: skip
    reply = httpx.post(server.url + "/v1/messages", json=body, timeout=60)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "no audio block" in error["message"] and "/v1/audio/transcriptions" in error["message"]


def test_models_list_audio(server: LiveServer) -> None:
    models = httpx.get(server.url + "/v1/models", timeout=10).json()["data"]
    modalities = {model["id"]: model["input_modalities"] for model in models}
    assert modalities == {"listener": ["text", "audio"], "text-only": ["text"]}


# -- transcriptions and translations ----------------------------------------------------------


def test_openai_client_transcription(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    transcript = client.audio.transcriptions.create(
        model="listener", file=("clip.wav", WAV, "audio/wav"), language="en",
        extra_body={"max_tokens": 4},
    )  # fmt: skip
    assert transcript.text
    usage = transcript.usage
    assert usage is not None and usage.type == "tokens"
    assert usage.input_token_details is not None
    assert usage.input_token_details.audio_tokens == QWEN2A_WINDOW_TOKENS
    assert usage.output_tokens == 4
    verbose = client.audio.transcriptions.create(
        model="listener", file=("clip.flac", encode(tone(440, 2.0), "flac")),
        response_format="verbose_json", extra_body={"max_tokens": 4},
    )  # fmt: skip
    assert verbose.duration == pytest.approx(2.0)
    assert verbose.segments is not None and len(verbose.segments) == 1
    assert verbose.segments[0].end == pytest.approx(2.0)


def test_openai_client_transcription_stream(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    stream = client.audio.transcriptions.create(
        model="listener", file=("clip.wav", WAV), stream=True, extra_body={"max_tokens": 4}
    )
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    (done,) = [e for e in events if e.type == "transcript.text.done"]
    assert deltas and "".join(deltas).strip() == done.text
    assert done.usage is not None and done.usage.output_tokens == 4


def test_openai_client_translation(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    translation = client.audio.translations.create(
        model="listener", file=("clip.mp3", encode(tone(300, 3.0), "mp3")),
        extra_body={"max_tokens": 3},
    )  # fmt: skip
    assert translation.text


@pytest.mark.parametrize("fmt", ["text", "srt", "vtt"])
def test_transcript_formats(server: LiveServer, fmt: str) -> None:
    reply = transcribe(server, {"file": ("a.wav", WAV, "audio/wav")}, response_format=fmt)
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    if fmt == "srt":
        assert reply.text.startswith("1\n00:00:00,000 --> 00:00:02,000\n")
    elif fmt == "vtt":
        assert reply.text.startswith("WEBVTT\n\n00:00:00.000 --> 00:00:02.000\n")
    else:
        assert reply.text.strip()


@pytest.mark.parametrize(
    ("files", "data", "param", "reason"),
    [
        ({}, {}, "file", "Missing required parameter"),
        ({"file": ("a.wav", WAV[:-50])}, {}, "file", "truncated"),
        ({"file": ("a.bin", b"random bytes" * 20)}, {}, "file", "not a WAV"),
        ({"file": ("a.flac", encode(silence(7200), "flac"))}, {}, "file", "2.0 h long"),
        ({"file": ("a.wav", WAV)}, {"temperature": "warm"}, "temperature", "number"),
        ({"file": ("a.wav", WAV)}, {"temperature": "3"}, "temperature", "1"),
        ({"file": ("a.wav", WAV)}, {"response_format": "xml"}, "response_format", "xml"),
        ({"file": ("a.wav", WAV)}, {"stream": "true", "response_format": "srt"}, "stream",
         "cannot stream"),
        ({"file": ("a.wav", WAV)}, {"timestamp_granularities[]": "word"},
         "timestamp_granularities[0]", "word"),
        ({"file": ("a.wav", WAV)}, {"include[]": "logprobs"}, "include", "log-probabilities"),
    ],
    ids=["no-file", "truncated", "random", "two-hours", "temperature-type",
         "temperature-range", "format", "stream-srt", "word-times", "include"],
)  # fmt: skip
def test_bad_transcriptions_are_400s_naming_the_field(
    server: LiveServer, files: dict[str, object], data: dict[str, object], param: str, reason: str
) -> None:
    if not files:  # a form with no file at all
        reply = httpx.post(
            server.url + TRANSCRIPTIONS_PATH, files={"model": (None, "listener")}, timeout=60
        )
    else:
        reply = transcribe(server, files, **data)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert reason in error["message"]


def test_a_body_that_is_no_form_is_a_400(server: LiveServer) -> None:
    reply = httpx.post(server.url + TRANSCRIPTIONS_PATH, json={"model": "listener"}, timeout=60)
    assert reply.status_code == 400
    assert "multipart/form-data" in reply.json()["error"]["message"]


def test_a_transcription_over_the_audio_body_limit_is_a_413(server: LiveServer) -> None:
    reply = transcribe(server, {"file": ("a.wav", encode(noise(70.0), "wav"))})
    assert reply.status_code == 413


def test_a_transcription_for_a_model_without_audio(server: LiveServer) -> None:
    reply = transcribe(server, {"file": ("a.wav", WAV)}, model="text-only")
    assert reply.status_code == 400
    assert "takes no audio" in reply.json()["error"]["message"]


# -- in process: the parser and the encoders --------------------------------------------------


def form_body(fields: dict[str, str], file: bytes | None = WAV) -> bytes:
    request = httpx.Request(
        "POST", "http://x/", data=fields, files={"file": ("a.wav", file)} if file else None
    )
    return request.read()


def test_the_form_is_read_with_its_fields_typed() -> None:
    body = form_body({"model": "m", "temperature": "0.5", "stream": "true", "language": "fr",
                      "prompt": "Names: Ada."})  # fmt: skip
    form = read_form(body)
    assert form.files["file"].data == WAV and form.fields["model"] == ("m",)
    request = parse_transcription_request(body, LIMITS)
    assert request.stream and request.temperature == 0.5 and request.model == "m"
    (message,) = request.generate.messages or ()
    assert message.content.startswith("Transcribe audio to text (language: fr)")
    assert "Names: Ada." in message.content and len(message.audio) == 1
    translation = parse_transcription_request(body, LIMITS, Body.TRANSLATIONS)
    assert translation.task == "translate" and not translation.stream
    assert translation.language is None  # a translation takes no language


def test_the_encoders() -> None:
    request = parse_transcription_request(form_body({"response_format": "verbose_json"}), LIMITS)
    done = Done(StopReason.MAX_TOKENS, 760, 2, Timings(0, 0, 0), audio_tokens=750)
    meta = ResponseMeta("transcript-1", 0, "m")
    body = TranscriptBody(request, meta)
    body.event(Token(" Hello"))
    body.event(Token(" there."))
    verbose = json.loads(body.finish(done))
    assert verbose["text"] == "Hello there." and verbose["duration"] == pytest.approx(2.0)
    assert verbose["segments"][0]["end"] == pytest.approx(2.0)
    streamed = parse_transcription_request(form_body({"stream": "true"}), LIMITS)
    stream = TranscriptStream(streamed, meta)
    events = stream.event(Token(" Hi")) + stream.finish(done)
    datas = [json.loads(line[6:]) for line in events.decode().split("\n") if line]
    assert datas[0] == {"type": "transcript.text.delta", "delta": " Hi"}
    assert datas[1]["type"] == "transcript.text.done" and datas[1]["text"] == "Hi"
    assert datas[1]["usage"]["input_token_details"] == {"text_tokens": 10, "audio_tokens": 750}


# -- a remote worker, over mutual TLS ---------------------------------------------------------


async def test_a_transcription_through_a_remote_worker(
    tmp_path: Path, projector: Path, qwen35_path: Path
) -> None:
    """The ingress relays the form's bytes through the ring to a worker attached over mutual
    TLS, which says its model takes audio."""
    ingress_ca, worker_ca = trustme.CA(), trustme.CA()
    cert = ingress_ca.issue_cert("127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "ingress.pem"))
    ingress_ca.cert_pem.write_to_path(str(tmp_path / "ingress-ca.pem"))
    worker_ca.cert_pem.write_to_path(str(tmp_path / "worker-ca.pem"))
    worker_ca.issue_cert("w1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp_path / "w1.pem")
    )
    config = engine_config(qwen35_path, model_name="listener", mmproj=projector, threads=1,
                           max_inflight=1, ctx_size=2048)  # fmt: skip
    ring = Ring()
    async with Engine.open(config) as engine, trio.open_nursery() as nursery:
        control = ControlConfig(
            server_ssl_context(
                tmp_path / "ingress.pem", tmp_path / "ingress.pem", tmp_path / "worker-ca.pem"
            ),
            port=0,
        )
        url = await nursery.start(serve_control, ring, control)
        binds = await nursery.start(
            partial(serve_ingress, ring, ServeConfig(port=0), model_name="listener",
                    shutdown=trio.Event())
        )  # fmt: skip
        context = client_ssl_context(tmp_path / "w1.pem", None, tmp_path / "ingress-ca.pem")

        async def worker() -> None:
            async with connect_ring(
                [url], context, worker_id="w1", max_inflight=1, models=["listener"],
                kinds=["chat"], audio=["listener"],
            ) as link:  # fmt: skip
                await serve_link(engine, link, limits=LIMITS)

        nursery.start_soon(worker)
        async with httpx.AsyncClient(base_url=binds[0], timeout=120) as client:

            async def listed() -> list[dict[str, object]]:
                data: list[dict[str, object]] = (await client.get("/v1/models")).json()["data"]
                return data if all(model["workers"] for model in data) else []

            models = await eventually(listed)
            assert [m["input_modalities"] for m in models] == [["text", "audio"]]
            reply = await client.post(
                TRANSCRIPTIONS_PATH,
                files={"file": ("a.wav", WAV)},
                data={"model": "listener", "max_tokens": "3"},
            )
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["input_token_details"]["audio_tokens"] == 750
        nursery.cancel_scope.cancel()
