"""What each operation of the public API answers: the response bodies and event streams of
``/openapi.json`` (the request bodies come from the field table, the refusals from the error
catalog; ``llmtrio.api._openapi`` puts them together). Pure data."""

from __future__ import annotations

import copy
from typing import Any

from ._field_spec import nullable, ref
from ._openapi_more import (
    ANTHROPIC_ERROR,
    CONTEXT_LENGTHS,
    DETOKENIZED,
    MESSAGE_EVENT,
    MESSAGE_OBJECT,
    RERANK_ANSWERS,
    RERANK_SCHEMAS,
    TOKEN_LIST,
    TRANSCRIPTION,
    TRANSCRIPTION_ANSWER,
    TRANSCRIPTION_VERBOSE,
)

__all__ = ["ANSWERS", "STREAM_OPTIONS_NEED_STREAM", "response_schemas"]


_SSE_DESCRIPTION = (
    "With ``stream: true``: server-sent events, each ``data: <JSON>`` followed by a blank "
    "line, then ``data: [DONE]``. Each JSON is a {chunk}; a failure after the stream "
    'started arrives as one event ``data: {{"error": {{...}}}}`` in the shape of ``Error``, '
    "and the stream ends without ``[DONE]``."
)

_STREAM_OPTIONS_NEED_STREAM = {
    "stream_options": {
        "anyOf": [
            {"properties": {"stream_options": {"type": "null"}}},
            {"required": ["stream"], "properties": {"stream": {"const": True}}},
        ]
    }
}

_USAGE = {
    "type": "object",
    "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "prompt_tokens_details": {
            "type": "object",
            "properties": {
                "cached_tokens": {"type": "integer", "minimum": 0},
                "audio_tokens": {"type": "integer", "minimum": 0},
            },
        },
    },
}

_FINISH_REASON = nullable(
    {"type": "string", "enum": ["stop", "length", "tool_calls", "content_filter"]}
)


def _completion_object(
    kind: str, content: dict[str, Any], *, usage_required: bool
) -> dict[str, Any]:
    """A completion response (or chunk): OpenAI's envelope around choices that carry
    ``content`` (their ``message``, ``delta`` or ``text``) beside index, logprobs and finish
    reason; ``usage`` is required, or may be absent or null."""
    (field,) = content
    return {
        "type": "object",
        "required": ["id", "object", "created", "model", "choices"]
        + (["usage"] if usage_required else []),
        "properties": {
            "id": {"type": "string"},
            "object": {"const": kind},
            "created": {"type": "integer"},
            "model": {"type": "string"},
            "choices": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["index", field, "finish_reason"],
                    "properties": {
                        "index": {"type": "integer"},
                        **content,
                        "logprobs": {"type": ["object", "null"]},
                        "finish_reason": _FINISH_REASON,
                    },
                },
            },
            "usage": _USAGE if usage_required else nullable(_USAGE),
        },
    }


_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "description": "OpenAI's error shape.",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["message", "type", "param", "code"],
                "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                },
            }
        },
    },
    "ToolCall": {
        "type": "object",
        "required": ["id", "type", "function"],
        "properties": {
            "id": {"type": "string"},
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name", "arguments"],
                "properties": {
                    "name": {"type": "string"},
                    "arguments": {"type": "string", "description": "A JSON object, as text."},
                },
            },
        },
    },
    "ChatCompletion": _completion_object(
        "chat.completion",
        {
            "message": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"const": "assistant"},
                    "content": {"type": ["string", "null"]},
                    "reasoning_content": {"type": "string"},
                    "tool_calls": {"type": "array", "items": ref("ToolCall")},
                },
            },
        },
        usage_required=True,
    ),
    "ChatCompletionChunk": _completion_object(
        "chat.completion.chunk",
        {
            "delta": {
                "type": "object",
                "properties": {
                    "role": {"const": "assistant"},
                    "content": {"type": ["string", "null"]},
                    "reasoning_content": {"type": "string"},
                    "tool_calls": {"type": "array"},
                },
            },
        },
        usage_required=False,
    ),
    "Completion": _completion_object(
        "text_completion", {"text": {"type": "string"}}, usage_required=False
    ),
    "Model": {
        "type": "object",
        "required": ["id", "object", "created", "owned_by"],
        "properties": {
            "id": {"type": "string"},
            "object": {"const": "model"},
            "created": {"type": "integer"},
            "owned_by": {"type": "string"},
            "kind": {
                "enum": ["chat", "embedding", "rerank"],
                "description": "``chat``: chat and text completions; ``embedding``: embeddings; "
                "``rerank``: reranking and scores.",
            },
            "input_modalities": {
                "type": "array",
                "items": {"enum": ["text", "image", "audio"]},
                "description": "What its prompts may hold: ``image`` for a model with a "
                "vision projector (chat messages' ``image_url`` parts), ``audio`` for one "
                "with an audio projector (``input_audio`` parts, transcriptions).",
            },
            "workers": {
                "type": "integer",
                "minimum": 0,
                "description": "Workers serving it now (0: its last one left within the park "
                "timeout; its requests park).",
            },
            "state": {
                "enum": ["loaded", "loading", "unloaded"],
                "description": "Loaded on some worker, else loading, else unloaded (loaded "
                "on its first request).",
            },
            **CONTEXT_LENGTHS,
            "bytes": {
                "type": "integer",
                "minimum": 1,
                "description": "The estimated memory of its loaded copies (a model loaded "
                "on demand).",
            },
            "unload_in_s": {
                "type": "integer",
                "minimum": -1,
                "description": "Seconds until the idle model unloads (-1: never; absent: "
                "busy, or not loaded on demand).",
            },
        },
    },
    "ModelState": {
        "type": "object",
        "required": ["success", "model", "state"],
        "properties": {
            "success": {"const": True},
            "model": {"type": "string"},
            "state": {"enum": ["loaded", "unloading", "unloaded"]},
        },
    },
    "ModelList": {
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": {"const": "list"},
            "data": {"type": "array", "items": ref("Model")},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "model", "capacity", "ring", "workers"],
        "properties": {
            "status": {
                "enum": ["ok", "no_workers", "draining"],
                "description": "``ok`` (200); ``no_workers`` or ``draining`` (503).",
            },
            "model": {"type": "string"},
            "reason": {"type": "string", "description": "Why the last worker detached."},
            "capacity": {
                "type": "object",
                "required": ["inflight", "decoding", "max_inflight", "available_slots"],
                "properties": {
                    key: {"type": "integer", "minimum": 0}
                    for key in ("inflight", "decoding", "max_inflight", "available_slots")
                },
            },
            "ring": {
                "type": "object",
                "required": ["parked", "serving", "max_streams", "workers"],
                "properties": {
                    key: {"type": "integer", "minimum": 0}
                    for key in ("parked", "serving", "max_streams", "workers")
                },
            },
            "workers": {"type": "array", "items": {"type": "object"}},
        },
    },
}


def _sse_event(chunk: str) -> dict[str, Any]:
    """One server-sent event of a completion stream (OpenAPI 3.1 has ``schema`` describe each
    event of a ``text/event-stream``; 3.2 names it ``itemSchema``)."""
    return {
        "type": "object",
        "description": _SSE_DESCRIPTION.format(chunk=f"``{chunk}``"),
        "required": ["data"],
        "properties": {
            "event": {"type": "string"},
            "data": {
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": [ref(chunk), ref("Error")]},
                    },
                ]
            },
        },
    }


def _completion_answer(response: str, chunk: str) -> dict[str, Any]:
    return {
        "description": "The completion: one JSON body, or an event stream.",
        "headers": {
            "X-Request-Id": {
                "description": "This request's id, as the server logs it.",
                "schema": {"type": "string"},
            }
        },
        "content": {
            "application/json": {"schema": ref(response)},
            "text/event-stream": {"schema": _sse_event(chunk)},
        },
    }


def _json_answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_EMBEDDING_LIST: dict[str, Any] = {
    "type": "object",
    "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"const": "list"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["object", "index", "embedding"],
                "properties": {
                    "object": {"const": "embedding"},
                    "index": {"type": "integer", "minimum": 0},
                    "embedding": {
                        "anyOf": [
                            {"type": "array", "items": {"type": "number"}},
                            {"type": "string"},
                        ],
                        "description": (
                            "L2-normalized; a base64 string with ``encoding_format: base64``."
                        ),
                    },
                },
            },
        },
        "model": {"type": "string"},
        "usage": {
            "type": "object",
            "required": ["prompt_tokens", "total_tokens"],
            "properties": {
                "prompt_tokens": {"type": "integer", "minimum": 0},
                "total_tokens": {"type": "integer", "minimum": 0},
            },
        },
    },
}


_RESPONSE_OBJECT: dict[str, Any] = {
    "type": "object",
    "description": "OpenAI's ``response`` object (stateless: ``store`` is false).",
    "required": ["id", "object", "created_at", "status", "model", "output", "tools",
                 "tool_choice", "parallel_tool_calls"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {"enum": ["completed", "incomplete", "in_progress", "failed"]},
        "incomplete_details": nullable({
            "type": "object", "properties": {"reason": {"const": "max_output_tokens"}}}),
        "model": {"type": "string"},
        "output": {
            "type": "array",
            "description": "``reasoning``, ``message`` and ``function_call`` items.",
            "items": {
                "type": "object",
                "required": ["id", "type"],
                "properties": {
                    "id": {"type": "string"},
                    "type": {"enum": ["reasoning", "message", "function_call"]},
                    "call_id": {"type": "string"},
                    "name": {"type": "string"},
                    "arguments": {"type": "string", "description": "A JSON object, as text."},
                    "content": {"type": "array", "items": {"type": "object"}},
                },
            },
        },
        "tools": {"type": "array"},
        "parallel_tool_calls": {"type": "boolean"},
        "store": {"const": False},
        "usage": nullable({
            "type": "object",
            "required": ["input_tokens", "output_tokens", "total_tokens"],
            "properties": {
                key: {"type": "integer", "minimum": 0}
                for key in ("input_tokens", "output_tokens", "total_tokens")
            },
        }),
    },
}  # fmt: skip
_RESPONSE_EVENT: dict[str, Any] = {
    "type": "object",
    "description": "With ``stream: true``: server-sent events ``event: <type>`` and ``data: "
    "<JSON>``, each JSON with its ``type`` and a rising ``sequence_number``: "
    "``response.created``, ``response.in_progress``, the output's events, then one of "
    "``response.completed``, ``response.incomplete`` or ``response.failed``; no ``[DONE]``.",
    "required": ["data"],
    "properties": {
        "event": {"type": "string"},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": {
                "type": "object",
                "required": ["type", "sequence_number"],
                "properties": {
                    "type": {"type": "string"},
                    "sequence_number": {"type": "integer", "minimum": 0},
                },
            },
        },
    },
}
_INPUT_TOKENS: dict[str, Any] = {
    "type": "object",
    "required": ["object", "input_tokens"],
    "properties": {
        "object": {"const": "response.input_tokens"},
        "input_tokens": {"type": "integer", "minimum": 0},
    },
}

_ANSWERS: dict[str, dict[str, Any]] = {
    "createChatCompletion": {"200": _completion_answer("ChatCompletion", "ChatCompletionChunk")},
    "createCompletion": {"200": _completion_answer("Completion", "Completion")},
    "createEmbedding": {
        "200": _json_answer(
            "One vector per input, in the order of the inputs.", ref("EmbeddingList")
        )
    },
    "createResponse": {
        "200": {
            "description": "The response: one JSON body, or an event stream.",
            "content": {
                "application/json": {"schema": ref("Response")},
                "text/event-stream": {"schema": _RESPONSE_EVENT},
            },
        }
    },
    "countResponseInputTokens": {
        "200": _json_answer("The input's tokens, as a generation counts them.", _INPUT_TOKENS)
    },
    "listModels": {"200": _json_answer("The models.", ref("ModelList"))},
    "health": {
        "200": _json_answer("Workers are attached: send requests here.", ref("Health")),
        "503": _json_answer(
            "No worker is attached, or the server is draining: send requests elsewhere.",
            ref("Health"),
        ),
    },
    "openapi": {"200": _json_answer("The OpenAPI 3.1 document.", {"type": "object"})},
    "createMessage": {
        "200": {
            "description": "The message: one JSON body, or an event stream.",
            "content": {
                "application/json": {"schema": ref("Message")},
                "text/event-stream": {"schema": MESSAGE_EVENT},
            },
        }
    },
    "countMessageTokens": {
        "200": _json_answer(
            "The prompt's length in tokens, templated as a generation's (its "
            "``input_tokens`` plus ``cache_read_input_tokens``).",
            {
                "type": "object",
                "required": ["input_tokens"],
                "properties": {"input_tokens": {"type": "integer", "minimum": 0}},
            },
        )
    },
    "loadModel": {"200": _json_answer("The model is loaded.", ref("ModelState"))},
    "unloadModel": {"200": _json_answer("The model is unloading or unloaded.", ref("ModelState"))},
    "tokenize": {"200": _json_answer("The token ids (with their pieces).", ref("TokenList"))},
    "detokenize": {"200": _json_answer("The tokens' text.", ref("Detokenized"))},
    **RERANK_ANSWERS,
    "createTranscription": {"200": TRANSCRIPTION_ANSWER},
    "createTranslation": {"200": TRANSCRIPTION_ANSWER},
}


#: ``/tokenize``'s answer: ids, or ``{"id", "piece"}`` with a piece's text or bytes.
def response_schemas() -> dict[str, Any]:
    """The response bodies' schemas, by component name (a new dict each call)."""
    return copy.deepcopy(
        {
            **_SCHEMAS,
            "EmbeddingList": _EMBEDDING_LIST,
            "Message": MESSAGE_OBJECT,
            "AnthropicError": ANTHROPIC_ERROR,
            "Response": _RESPONSE_OBJECT,
            "TokenList": TOKEN_LIST,
            "Detokenized": DETOKENIZED,
            **RERANK_SCHEMAS,
            "Transcription": TRANSCRIPTION,
            "TranscriptionVerbose": TRANSCRIPTION_VERBOSE,
        }
    )


#: What each operation of the route table answers, by its operation id (the errors aside).
ANSWERS = _ANSWERS
#: OpenAI's one rule across fields: ``stream_options`` only on a request that streams.
STREAM_OPTIONS_NEED_STREAM = _STREAM_OPTIONS_NEED_STREAM
