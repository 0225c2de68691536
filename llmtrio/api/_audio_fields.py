"""The request fields of audio input: chat's and the Responses API's ``input_audio`` part,
and OpenAI's audio transcriptions and translations (``/v1/audio/transcriptions``,
``/v1/audio/translations``: ``multipart/form-data``, its text fields typed by this table).
Pure; a part of the field table (``llmtrio.api._fields``)."""

from __future__ import annotations

from typing import Final

from ._field_spec import Field, RequestLimits, Schema, custom, part, refused
from ._routes import AUDIO_PARTS, Body

__all__ = [
    "AUDIO_FIELDS",
    "INPUT_AUDIO_PART",
    "TRANSCRIPT_FORMATS",
    "audio_components",
]

#: The formats of an ``input_audio`` part, as OpenAI names them (``flac`` is llmtrio's too).
_INPUT_AUDIO_FORMATS: Final = ("wav", "mp3", "flac")

#: An audio file in a user message (a model with an audio projector): base64 WAV, MP3 or
#: FLAC; the format is read from the bytes.
INPUT_AUDIO_PART: Final = part("", "object", nullable=False, component="InputAudioPart",
                                properties=(
    part("type", "string", required=True, enum=(AUDIO_PARTS[Body.CHAT],)),
    part("input_audio", "object", required=True, nullable=False, properties=(
        part("data", "string", required=True, nullable=False,
              description="The file's bytes, base64: WAV, MP3 or FLAC (read from the bytes), "
                          "at most --max-audio-seconds long."),
        part("format", "string", required=True, enum=_INPUT_AUDIO_FORMATS,
              description="The file's format as the client says it; the bytes decide."),
    )),
))  # fmt: skip

#: What a transcript may be answered as (``json`` when absent).
TRANSCRIPT_FORMATS: Final = ("json", "text", "srt", "verbose_json", "vtt")

_BOTH = (Body.TRANSCRIPTIONS, Body.TRANSLATIONS)
_FILE: Schema = {
    "type": "string",
    "format": "binary",
    "description": "The audio file: WAV, MP3 or FLAC (read from its bytes), at most "
    "--max-audio-seconds long.",
}

#: The fields of a transcription or translation form.
AUDIO_FIELDS: Final[tuple[Field, ...]] = (
    custom("file", _FILE, *_BOTH, required=True),
    Field("model", "string", frozenset(_BOTH),
          "The model's name (OpenAI's whisper-1 or gpt-4o-transcribe is served by the default "
          "model when no such model is served)."),
    Field("language", "string", frozenset({Body.TRANSCRIPTIONS}),
          "The audio's language (ISO-639-1, as ``en``), told to the model.",
          min_length=1, expected="a non-empty string"),
    Field("prompt", "string", frozenset(_BOTH),
          "Text to guide the transcript: the words of a previous segment, names, spelling; "
          "told to the model after its instruction."),
    Field("response_format", "string", frozenset(_BOTH),
          "``json`` (default), ``text``, ``verbose_json`` (one segment: the whole file), "
          "``srt`` or ``vtt`` (one cue: the whole file); a stream is ``json`` or ``text``.",
          enum=TRANSCRIPT_FORMATS),
    Field("temperature", "number", frozenset(_BOTH), "0 (default) is greedy.", minimum=0,
          maximum=1),
    Field("stream", "boolean", frozenset({Body.TRANSCRIPTIONS}),
          "Server-sent ``transcript.text.delta`` events, then ``transcript.text.done``."),
    Field("max_tokens", "integer", frozenset(_BOTH),
          "llama.cpp's extension: the most tokens the transcript may take.", minimum=1,
          maximum=2**31 - 1, limit="max_tokens"),
    Field("timestamp_granularities", "array", frozenset({Body.TRANSCRIPTIONS}),
          "``segment`` only (one segment: the whole file): the model gives no word times.",
          items=part("", "string", nullable=False, enum=("segment",),
                     refusal="Invalid value for '{param}': {value}. Only 'segment' "
                             "timestamps are given (the whole file), no word times.")),
    refused("include", "log-probabilities of a transcript", Body.TRANSCRIPTIONS),
    refused("chunking_strategy", "a chunking strategy (audio is read in 30-second windows)",
            *_BOTH),
)  # fmt: skip


def audio_components(limits: RequestLimits) -> dict[str, Schema]:
    """The audio schemas the request schemas refer to."""
    return {"InputAudioPart": INPUT_AUDIO_PART.body(limits)}
