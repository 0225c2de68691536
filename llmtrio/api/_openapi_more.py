"""What the routes beyond OpenAI's answer, for ``/openapi.json``: Anthropic's Messages API (a
message, its stream's events, Anthropic's error shape), llama.cpp's ``/tokenize`` and
``/detokenize``, OpenAI's audio transcriptions and translations, reranking (Jina's,
Cohere's and vLLM's answers), and the names a model's context length goes under in
``/v1/models``. Pure data."""

from __future__ import annotations

from typing import Any

from ._errors import ANTHROPIC_TYPES
from ._field_spec import nullable

__all__ = [
    "ANTHROPIC_ERROR",
    "CONTEXT_LENGTHS",
    "CONTEXT_LENGTH_NAMES",
    "DETOKENIZED",
    "MESSAGE_EVENT",
    "MESSAGE_OBJECT",
    "RERANK_ANSWERS",
    "RERANK_SCHEMAS",
    "TOKEN_LIST",
    "TRANSCRIPTION",
    "TRANSCRIPTION_ANSWER",
    "TRANSCRIPTION_VERBOSE",
]

#: The names ``/v1/models`` gives a model's context length under, those clients read:
#: llama.cpp's and OpenRouter's ``context_length``, vLLM's ``max_model_len``, LM Studio's
#: ``max_context_length``.
CONTEXT_LENGTH_NAMES = ("context_length", "max_model_len", "max_context_length")
#: A model's context length in ``/v1/models``, under each of ``CONTEXT_LENGTH_NAMES``.
CONTEXT_LENGTHS: dict[str, Any] = {
    name: {
        "type": "integer",
        "minimum": 1,
        "description": "The most tokens one request may use, prompt and output (the least its "
        "workers take), under each name clients read: ``context_length``, vLLM's "
        "``max_model_len``, LM Studio's ``max_context_length`` (absent: not stated).",
    }
    for name in CONTEXT_LENGTH_NAMES
}

ANTHROPIC_USAGE = {
    "type": "object",
    "required": ["input_tokens", "output_tokens"],
    "properties": {
        "input_tokens": {"type": "integer", "minimum": 0},
        "output_tokens": {"type": "integer", "minimum": 0},
        "cache_read_input_tokens": {"type": "integer", "minimum": 0},
        "cache_creation_input_tokens": {"type": "integer", "minimum": 0},
    },
}
ANTHROPIC_BLOCK: dict[str, Any] = {
    "anyOf": [
        {
            "type": "object",
            "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
        },
        {
            "type": "object",
            "required": ["type", "thinking", "signature"],
            "properties": {
                "type": {"const": "thinking"},
                "thinking": {"type": "string"},
                "signature": {"type": "string"},
            },
        },
        {
            "type": "object",
            "required": ["type", "id", "name", "input"],
            "properties": {
                "type": {"const": "tool_use"},
                "id": {"type": "string"},
                "name": {"type": "string"},
                "input": {"type": "object"},
            },
        },
    ]
}
MESSAGE_OBJECT: dict[str, Any] = {
    "type": "object",
    "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "message"},
        "role": {"const": "assistant"},
        "model": {"type": "string"},
        "content": {"type": "array", "items": ANTHROPIC_BLOCK},
        "stop_reason": nullable({"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"]}),
        "stop_sequence": nullable({"type": "string"}),
        "usage": ANTHROPIC_USAGE,
    },
}
ANTHROPIC_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {
                "type": {"enum": sorted(set(ANTHROPIC_TYPES.values()))},
                "message": {"type": "string"},
            },
        },
    },
}
MESSAGE_EVENT: dict[str, Any] = {
    "type": "object",
    "description": (
        "With ``stream: true``: server-sent events, each ``event: <type>`` and ``data: "
        "<JSON>`` with the same ``type``: ``message_start``, per content block "
        "``content_block_start``, ``content_block_delta`` (``text_delta``, ``thinking_delta``, "
        "``signature_delta``, ``input_json_delta``) and ``content_block_stop``, then "
        "``message_delta`` and ``message_stop``; ``ping`` while a long prompt is ingested; "
        "a failure after the stream started is one ``error`` event in Anthropic's shape."
    ),
    "required": ["event", "data"],
    "properties": {
        "event": {
            "enum": [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
                "ping",
                "error",
            ]
        },
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
}

# What each operation of the route table answers, by its operation id (the errors aside).


TOKEN_LIST: dict[str, Any] = {
    "type": "object",
    "required": ["tokens"],
    "properties": {
        "tokens": {
            "type": "array",
            "items": {
                "anyOf": [
                    {"type": "integer", "minimum": 0},
                    {
                        "type": "object",
                        "required": ["id", "piece"],
                        "properties": {
                            "id": {"type": "integer", "minimum": 0},
                            "piece": {
                                "anyOf": [
                                    {"type": "string"},
                                    {"type": "array", "items": {"type": "integer"}},
                                ]
                            },
                        },
                    },
                ]
            },
        }
    },
}
DETOKENIZED: dict[str, Any] = {
    "type": "object",
    "required": ["content"],
    "properties": {"content": {"type": "string"}},
}

_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
    },
}
_SCORE = {
    "type": "number",
    "description": "The model's score of the pair: an encoder's logit, or a decoder's "
    "probability of its first label (``yes``), as llama.cpp's server gives it.",
}
_RESULTS = {
    "type": "array",
    "description": "Best first (ties by index), at most ``top_n``.",
    "items": {
        "type": "object",
        "required": ["index", "relevance_score"],
        "properties": {
            "index": {"type": "integer", "minimum": 0, "description": "The document's index."},
            "relevance_score": _SCORE,
            "document": {
                "type": "object",
                "required": ["text"],
                "properties": {"text": {"type": "string"}},
                "description": "With ``return_documents`` (default true).",
            },
        },
    },
}
#: The reranking answers' schemas, by component name.
RERANK_SCHEMAS: dict[str, Any] = {
    "RerankList": {
        "type": "object",
        "required": ["id", "object", "model", "usage", "results"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "list"},
            "model": {"type": "string"},
            "usage": _USAGE,
            "results": _RESULTS,
        },
    },
    "CohereRerank": {
        "type": "object",
        "required": ["id", "results", "meta"],
        "properties": {
            "id": {"type": "string"},
            "results": _RESULTS,
            "meta": {
                "type": "object",
                "properties": {
                    "api_version": {
                        "type": "object",
                        "properties": {"version": {"const": "2"}},
                    },
                    "tokens": {
                        "type": "object",
                        "properties": {
                            "input_tokens": {"type": "integer", "minimum": 0},
                            "output_tokens": {"type": "integer", "minimum": 0},
                        },
                    },
                },
            },
        },
    },
    "ScoreList": {
        "type": "object",
        "required": ["id", "object", "created", "model", "data", "usage"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "list"},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "data": {
                "type": "array",
                "description": "One score a pair, in the pairs' order.",
                "items": {
                    "type": "object",
                    "required": ["index", "object", "score"],
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "object": {"const": "score"},
                        "score": _SCORE,
                    },
                },
            },
            "usage": _USAGE,
        },
    },
}


def _answer(description: str, name: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{name}"}
    return {
        "200": {"description": description, "content": {"application/json": {"schema": schema}}}
    }


_RANKED = "The documents' scores, best first."
#: What each reranking operation answers, by its operation id (the errors aside).
RERANK_ANSWERS: dict[str, dict[str, Any]] = {
    "rerank": _answer(_RANKED, "RerankList"),
    "rerankUnversioned": _answer(_RANKED, "RerankList"),
    "rerankV2": _answer(_RANKED, "CohereRerank"),
    "score": _answer("Each pair's score, in the pairs' order.", "ScoreList"),
}

_TOKEN_COUNT = {"type": "integer", "minimum": 0}
#: A transcript's usage, as OpenAI counts a ``gpt-4o-transcribe`` one: tokens, the audio's
#: apart.
_TRANSCRIPT_USAGE = {
    "type": "object",
    "required": ["type", "input_tokens", "output_tokens", "total_tokens"],
    "properties": {
        "type": {"const": "tokens"},
        "input_tokens": _TOKEN_COUNT,
        "input_token_details": {
            "type": "object",
            "properties": {"text_tokens": _TOKEN_COUNT, "audio_tokens": _TOKEN_COUNT},
        },
        "output_tokens": _TOKEN_COUNT,
        "total_tokens": _TOKEN_COUNT,
    },
}
#: ``response_format: json`` (the default).
TRANSCRIPTION: dict[str, Any] = {
    "type": "object",
    "required": ["text"],
    "properties": {"text": {"type": "string"}, "usage": _TRANSCRIPT_USAGE},
}
#: ``response_format: verbose_json``: one segment, the whole file (the model gives no times).
TRANSCRIPTION_VERBOSE: dict[str, Any] = {
    "type": "object",
    "required": ["task", "language", "duration", "text", "segments"],
    "properties": {
        "task": {"enum": ["transcribe", "translate"]},
        "language": {"type": "string"},
        "duration": {"type": "number", "minimum": 0},
        "text": {"type": "string"},
        "segments": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "seek", "start", "end", "text", "tokens", "temperature"],
                "properties": {
                    "id": _TOKEN_COUNT,
                    "seek": _TOKEN_COUNT,
                    "start": {"type": "number"},
                    "end": {"type": "number"},
                    "text": {"type": "string"},
                    "tokens": {"type": "array", "items": {"type": "integer"}},
                    "temperature": {"type": "number"},
                    "avg_logprob": {"type": "number"},
                    "compression_ratio": {"type": "number"},
                    "no_speech_prob": {"type": "number"},
                },
            },
        },
        "usage": {
            "type": "object",
            "required": ["type", "seconds"],
            "properties": {"type": {"const": "duration"}, "seconds": {"type": "number"}},
        },
    },
}
_TRANSCRIPT_EVENT = {
    "type": "object",
    "description": "One server-sent event: ``data: `` and a JSON object, "
    "``transcript.text.delta`` events, then one ``transcript.text.done`` (or an error).",
    "required": ["data"],
    "properties": {
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {
                "anyOf": [
                    {
                        "type": "object",
                        "required": ["type", "delta"],
                        "properties": {
                            "type": {"const": "transcript.text.delta"},
                            "delta": {"type": "string"},
                        },
                    },
                    {
                        "type": "object",
                        "required": ["type", "text"],
                        "properties": {
                            "type": {"const": "transcript.text.done"},
                            "text": {"type": "string"},
                            "usage": _TRANSCRIPT_USAGE,
                        },
                    },
                    {"type": "object", "required": ["error"]},
                ]
            },
        }
    },
}
#: What a transcription or translation answers: by its ``response_format``.
TRANSCRIPTION_ANSWER: dict[str, Any] = {
    "description": "The transcript: JSON (``json``, ``verbose_json``), text (``text``, "
    "``srt``, ``vtt``), or an event stream (``stream: true``).",
    "content": {
        "application/json": {
            "schema": {
                "anyOf": [
                    {"$ref": "#/components/schemas/Transcription"},
                    {"$ref": "#/components/schemas/TranscriptionVerbose"},
                ]
            }
        },
        "text/plain": {"schema": {"type": "string"}},
        "text/event-stream": {"schema": _TRANSCRIPT_EVENT},
    },
}
