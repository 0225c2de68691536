"""The request fields of OpenAI's chat completions, text completions and embeddings
(``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``), nested ones included: a
message's content parts, tools, tool calls, ``tool_choice``, ``response_format``. Pure; a part
of the field table (``llmtrio.api._fields``)."""

from __future__ import annotations

from typing import Final

from ._errors import ApiError
from ._field_spec import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    MAX_TOP_LOGPROBS,
    Field,
    RequestLimits,
    Schema,
    custom,
    invalid_type,
    invalid_value,
    missing,
    part,
    ref,
    refused,
)
from ._routes import IMAGE_PARTS, Body

__all__ = [
    "CHAT_FIELDS",
    "IMAGE_URL_PART",
    "MESSAGE_FIELDS",
    "MESSAGE_ROLES",
    "NAMED_TOOL_CHOICE",
    "RESPONSE_FORMATS",
    "RESPONSE_FORMAT_JSON_SCHEMA",
    "TEXT_PARTS",
    "TOOL_CHOICE_MODE",
    "chat_components",
]


def _both(*names: str) -> frozenset[str]:
    return frozenset(names or (Body.CHAT, Body.COMPLETIONS))


def _stop_shape(limits: RequestLimits) -> Schema:
    text = {"type": "string", "minLength": 1, "maxLength": limits.max_stop_chars}
    return {"anyOf": [text, {"type": "array", "items": text, "maxItems": limits.max_stop}]}


_TOKEN_IDS: Schema = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
_TEXT: Schema = {"type": "string", "minLength": 1}
_PROMPT: Schema = {
    "anyOf": [
        _TEXT,
        _TOKEN_IDS,
        {"type": "array", "items": _TEXT, "minItems": 1, "maxItems": 1},
        {"type": "array", "items": _TOKEN_IDS, "minItems": 1, "maxItems": 1},
    ]
}
_LOGIT_BIAS: Schema = {
    "type": "object",
    "propertyNames": {"pattern": "^[0-9]+$"},
    "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
}


def _embedding_input_shape(limits: RequestLimits) -> Schema:
    many = {"minItems": 1, "maxItems": limits.max_embedding_inputs}
    return {
        "anyOf": [
            _TEXT,
            {"type": "array", "items": _TEXT, **many},
            _TOKEN_IDS,
            {"type": "array", "items": _TOKEN_IDS, **many},
        ]
    }


def _as_missing(param: str, value: object) -> ApiError:
    return missing(param)


# -- nested fields: messages ----------------------------------------------------------------

#: A message's roles (``developer`` is read as ``system``), in the order errors list them.
MESSAGE_ROLES: Final = ("system", "developer", "user", "assistant", "tool")

_TEXT_PART = part("", "object", nullable=False, component="TextPart", properties=(
    part("type", "string", required=True, enum=("text",), refusal="Invalid value for "
          "'{param}': {value}. This server accepts text content parts ('text'), and image "
          "parts ('image_url') and audio parts ('input_audio') in user messages."),
    part("text", "string", nullable=False, text=True),
))  # fmt: skip
#: A message's content when it is not a string.
TEXT_PARTS: Final = part("content", "array", items=_TEXT_PART,
                          empty="a string or at least one text part")  # fmt: skip
#: An image in a user message (a model with a vision projector): a ``data:`` URI, or an
#: ``http(s)`` URL of a host the server fetches from (``--allowed-media-domains``).
IMAGE_URL_PART: Final = part("", "object", nullable=False, component="ImageUrlPart", properties=(
    part("type", "string", required=True, enum=(IMAGE_PARTS[Body.CHAT],)),
    part("image_url", "object", required=True, nullable=False, properties=(
        part("url", "string", required=True, nullable=False,
              description="A data: URI with a base64 PNG, JPEG, WebP or GIF (its first "
                          "frame), or an http(s) URL of a host the server fetches from "
                          "(--allowed-media-domains); the type is read from the bytes."),
        part("detail", "string", enum=("auto", "low", "high"),
              description="Accepted and unused: the projector sets the resolution."),
    )),
))  # fmt: skip
_CONTENT: Schema = {
    "anyOf": [
        {"type": "string"},
        TEXT_PARTS.body(RequestLimits()),
        {"type": "array", "minItems": 1, "items": {"anyOf": [ref("TextPart"),
                                                             ref("ImageUrlPart"),
                                                             ref("InputAudioPart")]}},
    ],
    "description": "A text, or text parts (joined by newlines); a user message's parts may "
    "hold images (image_url) and audio (input_audio) for a model that takes them.",
}  # fmt: skip
_TOOL_CALL = part("", "object", nullable=False, properties=(
    part("id", "any", "Kept when a string; a new id otherwise."),
    part("function", "object", nullable=False, whole=True,
          fault=lambda param, value: invalid_type(param, 'an object with a "name"', value),
          properties=(
              part("name", "string", nullable=False),
              part("arguments", "any", "A JSON object, as text (other JSON is read as its text)."),
          )),
))  # fmt: skip


def _message(roles: tuple[str, ...], *properties: Field) -> Field:
    """A message of ``roles``: its role, a participant's ``name`` (unused) and ``properties``,
    in the order they are checked."""
    role = part("role", "string", required=True, enum=roles)
    return part("", "object", nullable=False, properties=(role, part("name", "string"),
                                                           *properties))  # fmt: skip


def _content(required: bool = True) -> Field:
    """A message's content: a string or ``TEXT_PARTS``, the endpoint's to tell apart."""
    return part("content", "custom", required=required, shape=lambda limits: ref("Content"))


_SAYS = _message(("system", "developer", "user"), _content())
#: A message's fields by its role, in the order they are checked (its ``content`` is parsed
#: by the endpoint: a string or ``TEXT_PARTS``).
MESSAGE_FIELDS: Final = {
    "system": _SAYS,
    "developer": _SAYS,
    "user": _SAYS,
    "assistant": _message(("assistant",), part("tool_calls", "array", items=_TOOL_CALL),
                          _content(required=False)),
    "tool": _message(("tool",), _content(), part("tool_call_id", "string")),
}  # fmt: skip

# -- nested fields: tools and structured output ---------------------------------------------

_TOOL = part("", "object", nullable=False, component="Tool", properties=(
    part("type", "string", nullable=False, default="function", enum=("function",),
          refusal="Invalid '{param}': {value}. This server supports 'function' tools only."),
    part("function", "object", nullable=False, properties=(
        part("name", "string", nullable=False, min_length=1, expected="a non-empty string"),
        part("description", "string", falsy_is_null=True),
        part("parameters", "object", "The arguments' JSON Schema; none (or {}) takes none."),
        part("strict", "any", "true: a keyword the grammar cannot enforce is refused; "
                                "else it is relaxed."),
    )),
))  # fmt: skip
#: ``tool_choice`` as a string.
TOOL_CHOICE_MODE: Final = part("tool_choice", "string", enum=("none", "auto", "required"),
                                refusal="Invalid '{param}': {value}. Supported values are: "
                                "'none', 'auto', 'required' or a named function.")  # fmt: skip
#: ``tool_choice`` as an object: the one function the reply must call.
NAMED_TOOL_CHOICE: Final = part(
    "tool_choice", "object", "The one function the reply must call.", nullable=False,
    component="NamedToolChoice", whole=True,
    fault=lambda param, value: invalid_value(
        param, 'expected {"type": "function", "function": {"name": ...}}.'),
    properties=(
        part("type", "string", nullable=False, enum=("function",)),
        part("function", "object", nullable=False,
              properties=(part("name", "string", nullable=False),)),
    ),
)  # fmt: skip
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
#: ``response_format.json_schema``, read when ``response_format.type`` is ``json_schema``.
RESPONSE_FORMAT_JSON_SCHEMA: Final = part(
    "json_schema", "object", required=True, fault=_as_missing, properties=(
        part("name", "string", required=True, fault=_as_missing),
        part("strict", "boolean", "true: a keyword the grammar cannot enforce is refused; "
                                    "else it is relaxed."),
        part("schema", "schema", nullable=False, default={}, expected="a JSON schema object"),
    ))  # fmt: skip


def _response_format(limits: RequestLimits) -> Schema:
    return {
        "description": "``json_object`` and ``json_schema`` constrain the output by a grammar.",
        "anyOf": [
            {
                "type": "object",
                "required": ["type"],
                "properties": {"type": {"enum": list(RESPONSE_FORMATS[:2])}},
            },
            {
                "type": "object",
                "required": ["type", "json_schema"],
                "properties": {
                    "type": {"const": "json_schema"},
                    "json_schema": RESPONSE_FORMAT_JSON_SCHEMA.schema(limits),
                },
            },
        ],
    }


def chat_components(limits: RequestLimits) -> dict[str, Schema]:
    """The chat endpoints' schemas that the request schemas refer to."""
    return {
        "ChatMessage": {
            "description": "A message; only an assistant message may leave out its content.",
            "anyOf": [MESSAGE_FIELDS[role].body(limits) for role in ("user", "assistant", "tool")],
        },
        "Content": _CONTENT,
        "TextPart": _TEXT_PART.body(limits),
        "ImageUrlPart": IMAGE_URL_PART.body(limits),
        "Tool": _TOOL.body(limits),
        "NamedToolChoice": {
            **NAMED_TOOL_CHOICE.body(limits),
            "description": NAMED_TOOL_CHOICE.description,
        },
        "ResponseFormat": _response_format(limits),
    }


#: The fields of chat completions, text completions and embeddings.
CHAT_FIELDS: Final[tuple[Field, ...]] = (
    Field("model", "string", _both(), "The model's name (any name is served by this model)."),
    Field("messages", "array", _both(Body.CHAT), required=True, limit="max_messages",
          items=part("", "custom", nullable=False, component="ChatMessage"),
          empty="an array with at least one message"),
    custom("prompt", _PROMPT, Body.COMPLETIONS, required=True,
            description="A text, or token ids; one prompt per request."),
    Field("max_tokens", "integer", _both(Body.CHAT), minimum=1, maximum=INT32_MAX,
          limit="max_tokens"),
    Field("max_tokens", "integer", _both(Body.COMPLETIONS), "16 when absent, as OpenAI's.",
          minimum=1, maximum=INT32_MAX, limit="max_tokens"),
    Field("max_completion_tokens", "integer", _both(Body.CHAT), "Wins over ``max_tokens``.",
          minimum=1, maximum=INT32_MAX, limit="max_tokens"),
    Field("temperature", "number", _both(), minimum=0, maximum=2),
    Field("top_p", "number", _both(), minimum=0, maximum=1, exclusive_minimum=True),
    Field("top_k", "integer", _both(), "llama.cpp's extension; 0 keeps every token.",
          minimum=0, maximum=INT32_MAX),
    Field("min_p", "number", _both(), "llama.cpp's extension.", minimum=0, maximum=1),
    Field("seed", "integer", _both(), minimum=INT64_MIN, maximum=INT64_MAX),
    Field("presence_penalty", "number", _both(), minimum=-2, maximum=2),
    Field("frequency_penalty", "number", _both(), minimum=-2, maximum=2),
    Field("repeat_penalty", "number", _both(), "llama.cpp's extension; 1 is off.",
          minimum=0, maximum=10, exclusive_minimum=True),
    Field("repeat_last_n", "integer", _both(),
          "llama.cpp's extension: how many recent tokens the repeat penalty sees (-1: all).",
          minimum=-1, maximum=INT32_MAX),
    Field("stop", "custom", _both(), "Generation stops before any of these strings.",
          shape=_stop_shape),
    Field("stream", "boolean", _both()),
    Field("stream_options", "object", _both(),
          "Only with ``stream: true``: a usage chunk before ``[DONE]``.",
          properties=(part("include_usage", "boolean"),)),
    Field("n", "integer", _both(), "One choice per request.", minimum=1, maximum=1),
    Field("best_of", "integer", _both(Body.COMPLETIONS), "One completion per request.",
          minimum=1, maximum=1),
    refused("echo", "echoing the prompt back", Body.COMPLETIONS, allowed=(False,)),
    refused("suffix", "a suffix (fill-in-the-middle)", Body.COMPLETIONS),
    Field("logprobs", "boolean", _both(Body.CHAT)),
    Field("top_logprobs", "integer", _both(Body.CHAT), "Only with ``logprobs: true``.",
          minimum=0, maximum=MAX_TOP_LOGPROBS),
    Field("logprobs", "integer", _both(Body.COMPLETIONS), "Alternatives per token.",
          minimum=0, maximum=MAX_TOP_LOGPROBS),
    custom("logit_bias", _LOGIT_BIAS, Body.CHAT, Body.COMPLETIONS,
            description="Token id to a bias from -100 (never) to 100 (always)."),
    Field("response_format", "object", _both(), component="ResponseFormat", properties=(
        part("type", "string", nullable=False, enum=RESPONSE_FORMATS),)),
    Field("tools", "array", _both(Body.CHAT), items=_TOOL),
    custom("tool_choice", {"anyOf": [TOOL_CHOICE_MODE.body(RequestLimits()),
                                      ref("NamedToolChoice")]}, Body.CHAT),
    Field("parallel_tool_calls", "boolean", _both(Body.CHAT)),
    Field("think", "boolean", _both(Body.CHAT), "Let the model reason first."),
    Field("chat_template_kwargs", "object", _both(Body.CHAT),
          properties=(part("enable_thinking", "boolean"),)),
    Field("ignore_eos", "boolean", _both(), "llama.cpp's extension."),
    Field("cache_prompt", "boolean", _both(),
          "llama.cpp's extension: false ingests the whole prompt, reusing no earlier "
          "request's memory (default true)."),
    refused("audio", "audio output", Body.CHAT),
    refused("modalities", "output modalities other than text", Body.CHAT, allowed=(["text"],)),
    refused("prediction", "predicted outputs", Body.CHAT),
    refused("web_search_options", "web search", Body.CHAT),
    refused("functions", "the deprecated 'functions' (use 'tools')", Body.CHAT),
    refused("function_call", "the deprecated 'function_call' (use 'tool_choice')", Body.CHAT),
    Field("reasoning_effort", "string", _both(Body.CHAT),
          "How much the model may reason: ``none`` and ``minimal`` turn thinking off; "
          "``low`` to ``xhigh`` turn it on with a budget of reasoning tokens that grows "
          "with the effort (README, Reasoning), after which the think block is closed; "
          "``max`` (llmtrio's) on without a budget. ``think`` or "
          "``chat_template_kwargs.enable_thinking``, when given, wins on whether to think.",
          enum=("none", "minimal", "low", "medium", "high", "xhigh", "max")),
    refused("verbosity", "verbosity", Body.CHAT),
    Field("model", "string", _both(Body.EMBEDDINGS), "The embedding model's name."),
    Field("input", "custom", _both(Body.EMBEDDINGS), required=True, shape=_embedding_input_shape,
          description="A text, an array of texts, an array of token ids or an array of "
          "arrays of token ids; one vector per text or token array, none of them empty, "
          "none longer than the model's context."),
    custom("encoding_format", {"enum": ["float", "base64"]}, Body.EMBEDDINGS,
            description="``float`` (default): arrays of numbers; ``base64``: each vector's "
            "little-endian float32 bytes, base64-encoded."),
    refused("dimensions", "shortened embeddings (no GGUF field says a model was trained for "
             "truncated vectors)", Body.EMBEDDINGS),
    Field("user", "string", _both(Body.EMBEDDINGS), "Accepted and ignored."),
)  # fmt: skip
