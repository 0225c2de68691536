"""OpenAI's audio transcriptions and translations (``POST /v1/audio/transcriptions``,
``/v1/audio/translations``): a ``multipart/form-data`` request in, a chat generation on the
audio out, the transcript answered as the request's ``response_format`` asks. Pure.

The request becomes one user message, as llama.cpp's server makes it: its instruction
(``Transcribe audio to text``; a translation's ``Translate audio to English text``), the
``language`` when given (``(language: en)``), the ``prompt`` when given (as context: the
words of a previous segment, names, spelling), then the audio. Greedy unless ``temperature``
says otherwise.

The model gives no timestamps: ``verbose_json`` has one segment and ``srt``/``vtt`` one
cue, each the whole file (from 0 to its length, read from its header).
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import attrs

from ..api import (
    OPENAI_ERRORS,
    ApiError,
    Body,
    RequestLimits,
    dumps,
    form_values,
    invalid_value,
    missing,
    read,
    read_form,
    sse,
)
from ..engine import (
    MEDIA_MARKER,
    Audio,
    ChatMessage,
    Done,
    GenerateRequest,
    InvalidRequestError,
    Sampling,
    Token,
)
from ._audio import audio_from_bytes
from ._encoding import ResponseMeta, from_engine_error
from ._requests import reject_refused

__all__ = [
    "TranscriptBody",
    "TranscriptStream",
    "TranscriptionRequest",
    "parse_transcription_request",
]

#: What the model is asked, by task (llama.cpp's server's words for a transcription).
_INSTRUCTIONS = {
    Body.TRANSCRIPTIONS: "Transcribe audio to text",
    Body.TRANSLATIONS: "Translate audio to English text",
}
_TASKS = {Body.TRANSCRIPTIONS: "transcribe", Body.TRANSLATIONS: "translate"}
#: The formats a stream may be asked in (OpenAI streams the text's deltas only).
_STREAMED = ("json", "text")


@attrs.frozen
class TranscriptionRequest:
    """A parsed transcription (or translation): the generation on its audio, and how to
    answer it."""

    model: str | None
    generate: GenerateRequest
    audio: Audio
    task: str = "transcribe"
    response_format: str = "json"
    stream: bool = False
    language: str | None = None
    temperature: float = 0.0


def parse_transcription_request(
    body: bytes, limits: RequestLimits, endpoint: Body = Body.TRANSCRIPTIONS
) -> TranscriptionRequest:
    """Parse and validate a transcription (``endpoint`` ``TRANSCRIPTIONS``) or translation
    (``TRANSLATIONS``) form: its fields as the field table says (``file``, ``model``,
    ``language``, ``prompt``, ``response_format``, ``temperature``, ``stream``,
    ``max_tokens``, ``timestamp_granularities``; ``include`` and ``chunking_strategy``
    refused), the file's header read and checked (``max_audio_seconds``).

    Error handling: :class:`ApiError` (400) naming the field: a body that is no form, no
    ``file``, a field of the wrong type or value, a stream in a format that cannot stream,
    audio the server cannot read or that is too long."""
    form = read_form(body)
    data = form_values(form, endpoint)
    reject_refused(data, endpoint, limits)
    upload = form.files.get("file")
    if upload is None:
        if "file" in form.fields:
            raise invalid_value("file", "it must be a file (a part with a filename).")
        raise missing("file")
    audio = audio_from_bytes(upload.data, "file", limits)
    model = read(data, endpoint, "model", limits)
    language = read(data, endpoint, "language", limits) if endpoint == Body.TRANSCRIPTIONS else None
    prompt = read(data, endpoint, "prompt", limits)
    response_format = read(data, endpoint, "response_format", limits) or "json"
    temperature = read(data, endpoint, "temperature", limits) or 0.0
    stream = bool(endpoint == Body.TRANSCRIPTIONS and read(data, endpoint, "stream", limits))
    if endpoint == Body.TRANSCRIPTIONS:
        read(data, endpoint, "timestamp_granularities", limits)
    if stream and response_format not in _STREAMED:
        raise invalid_value(
            "stream",
            f"a transcript in '{response_format}' cannot stream: ask for 'json' or 'text'.",
        )
    max_tokens = read(data, endpoint, "max_tokens", limits)
    text = _INSTRUCTIONS[endpoint]
    if language:
        text += f" (language: {language})"
    if prompt:
        text += f"\nContext (earlier words, names, spelling): {prompt}\n"
    try:
        generate = GenerateRequest(
            messages=[ChatMessage("user", text + MEDIA_MARKER, media=[audio])],
            max_tokens=max_tokens if max_tokens is not None else limits.default_max_tokens,
            sampling=Sampling(temperature=temperature),
            think=False,
            logprobs=0 if response_format == "verbose_json" else None,
        )
    except InvalidRequestError as exc:
        raise from_engine_error(exc) from None
    return TranscriptionRequest(
        model=model,
        generate=generate,
        audio=audio,
        task=_TASKS[endpoint],
        response_format=response_format,
        stream=stream,
        language=language,
        temperature=temperature,
    )


def _usage(done: Done) -> dict[str, Any]:
    """OpenAI's usage of a token-billed transcript: the audio's tokens apart."""
    return {
        "type": "tokens",
        "input_tokens": done.prompt_tokens,
        "input_token_details": {
            "text_tokens": done.prompt_tokens - done.audio_tokens,
            "audio_tokens": done.audio_tokens,
        },
        "output_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


def _clock(seconds: float, separator: str) -> str:
    ms = round(seconds * 1000)
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{separator}{ms:03d}"


class TranscriptBody:
    """A transcript answered whole, in the request's ``response_format``: JSON (``json``,
    ``verbose_json``) or text (``text``, ``srt``, ``vtt``); ``content_type`` says which."""

    streaming = False

    def __init__(self, request: TranscriptionRequest, meta: ResponseMeta) -> None:
        self._request = request
        self._text: list[str] = []
        self._logprobs: list[float] = []
        self.content_type = (
            "application/json"
            if request.response_format in ("json", "verbose_json")
            else "text/plain; charset=utf-8"
        )

    def start(self) -> bytes:
        return b""

    def event(self, token: Token) -> bytes:
        if not token.reasoning:
            self._text.append(token.text)
            self._logprobs += [entry.logprob for entry in token.logprobs]
        return b""

    def finish(self, done: Done) -> bytes:
        request = self._request
        text = "".join(self._text).strip()
        end = request.audio.seconds
        if request.response_format == "json":
            return dumps({"text": text, "usage": _usage(done)})
        if request.response_format == "text":
            return text.encode() + b"\n"
        if request.response_format == "srt":
            return f"1\n{_clock(0, ',')} --> {_clock(end, ',')}\n{text}\n\n".encode()
        if request.response_format == "vtt":
            return f"WEBVTT\n\n{_clock(0, '.')} --> {_clock(end, '.')}\n{text}\n\n".encode()
        encoded = text.encode()
        segment = {
            "id": 0,
            "seek": 0,
            "start": 0.0,
            "end": end,
            "text": text,
            "temperature": request.temperature,
            "avg_logprob": sum(self._logprobs) / len(self._logprobs) if self._logprobs else 0.0,
            # Whisper's measure: how much the text compresses (repetition compresses well)
            "compression_ratio": len(encoded) / len(zlib.compress(encoded)) if encoded else 0.0,
        }
        return dumps(
            {
                "task": request.task,
                "language": request.language or "",
                "duration": end,
                "text": text,
                "segments": [segment],
                "usage": {"type": "duration", "seconds": math.ceil(end)},
            }
        )

    def finish_reason(self, done: Done) -> str:
        return done.stop.finish_reason

    def failure(self, error: ApiError) -> bytes:
        return OPENAI_ERRORS.event(error)


class TranscriptStream:
    """A transcript streamed as OpenAI streams one: ``transcript.text.delta`` events as the
    text comes, then ``transcript.text.done`` with the whole text and the usage."""

    streaming = True

    def __init__(self, request: TranscriptionRequest, meta: ResponseMeta) -> None:
        self._text: list[str] = []

    def start(self) -> bytes:
        return b""

    def event(self, token: Token) -> bytes:
        if token.reasoning or not token.text:
            return b""
        self._text.append(token.text)
        return sse(dumps({"type": "transcript.text.delta", "delta": token.text}))

    def finish(self, done: Done) -> bytes:
        text = "".join(self._text).strip()
        return sse(dumps({"type": "transcript.text.done", "text": text, "usage": _usage(done)}))

    def finish_reason(self, done: Done) -> str:
        return done.stop.finish_reason

    def failure(self, error: ApiError) -> bytes:
        return OPENAI_ERRORS.event(error)
