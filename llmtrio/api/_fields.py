"""The API's request fields, written once: type, bounds, nullability, the endpoints that take
each one, the server limit that bounds it, and the shape of the nested ones (a message's
content parts, tools, tool calls, ``response_format``, ...).

Pure: no I/O. Two things are made from this one table, so that they cannot drift:

- the worker's validators: :func:`read` checks a field whole, nested parts included (the
  running server's :class:`RequestLimits` too) and raises one kind of error per kind of fault,
  with OpenAI's own codes (``invalid_type``, ``decimal_below_min_value``,
  ``decimal_above_max_value``, ``integer_below_min_value``, ``integer_above_max_value``,
  ``missing_required_parameter``, ...), ``param`` naming the field or the part of it;
- the request schemas of ``/openapi.json`` (:func:`request_schema` and the schemas they refer
  to, :func:`component_schemas`), with the same bounds and the same limits.

What the table cannot say is the endpoint's: which branch of a union a value takes (a
message's ``role``, a content that is a string or parts, ``tool_choice``'s string or object,
``prompt``, ``input``, ``stop``, ``logit_bias``) and rules across fields or items (a tool
named twice, a forced tool that is not offered). Each branch is a field of this table checked
with :func:`check`, and the errors use the same helpers (:func:`invalid_type`,
:func:`invalid_value`, :func:`missing`). The vocabulary (:class:`Field`, :func:`check`) is
``llmtrio.api._field_spec``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from ._errors import OpenAIError, invalid_request
from ._field_spec import (
    Field,
    RequestLimits,
    Schema,
    check,
    checked_text,
    choices,
    clip,
    describe,
    invalid_type,
    invalid_value,
    missing,
    show,
)

__all__ = [
    "ANTHROPIC_BLOCKS",
    "ANTHROPIC_IMAGE_SOURCE",
    "ANTHROPIC_MESSAGE",
    "ANTHROPIC_OUTPUT_CONFIG",
    "ANTHROPIC_REFUSED_BLOCKS",
    "ANTHROPIC_RESULT_BLOCKS",
    "ANTHROPIC_TEXT_BLOCKS",
    "ANTHROPIC_THINKING",
    "ANTHROPIC_TOOL",
    "ANTHROPIC_TOOL_CHOICE",
    "CHAT",
    "COMPLETIONS",
    "COUNT_TOKENS",
    "DETOKENIZE",
    "EMBEDDINGS",
    "FIELDS",
    "IMAGE_URL_PART",
    "INT32_MAX",
    "MAX_TOP_LOGPROBS",
    "MESSAGES",
    "MESSAGES_API",
    "MESSAGE_ROLES",
    "MODELS",
    "NAMED_TOOL_CHOICE",
    "RESPONSES",
    "RESPONSES_FORMAT",
    "RESPONSES_IMAGE_PART",
    "RESPONSES_TOOL",
    "RESPONSE_FORMAT_JSON_SCHEMA",
    "TEXT_PARTS",
    "TOKENIZE",
    "TOOL_CHOICE_MODE",
    "Field",
    "RequestLimits",
    "check",
    "checked_text",
    "choices",
    "clip",
    "component_schemas",
    "describe",
    "field",
    "invalid_type",
    "invalid_value",
    "missing",
    "read",
    "request_schema",
    "show",
]

CHAT: Final = "chat"
COMPLETIONS: Final = "completions"
EMBEDDINGS: Final = "embeddings"
#: OpenAI's Responses API (``POST /v1/responses`` and ``/v1/responses/input_tokens``).
RESPONSES: Final = "responses"
#: ``/models/load`` and ``/models/unload``.
MODELS: Final = "models"
TOKENIZE: Final = "tokenize"
DETOKENIZE: Final = "detokenize"

INT32_MAX: Final = 2**31 - 1  # values that reach llama.cpp as C ints
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
#: OpenAI's bound on alternatives per token (``top_logprobs``, legacy ``logprobs``).
MAX_TOP_LOGPROBS: Final = 20


def _both(*names: str) -> frozenset[str]:
    return frozenset(names or (CHAT, COMPLETIONS))


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


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


#: ``/tokenize``'s ``content``: a text, or texts and token ids (llama.cpp's mixed prompt).
_TOKENIZE_CONTENT: Schema = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]},
        },
    ]
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


def _fixed(schema: Schema) -> Callable[[RequestLimits], Schema]:
    return lambda limits: schema


def _custom(name: str, schema: Schema, *endpoints: str, **kwargs: Any) -> Field:
    return Field(name, "custom", _both(*endpoints), shape=_fixed(schema), **kwargs)


def _refused(name: str, what: str, *endpoints: str, allowed: tuple[Any, ...] = ()) -> Field:
    return Field(name, "custom", _both(*endpoints), refused=what, allowed=allowed)


def _part(name: str, type: str, description: str = "", **kwargs: Any) -> Field:
    """A property or an item of a nested field (its strings pass as they come unless
    ``text=True``)."""
    return Field(name, type, frozenset(), description, **{"text": False, **kwargs})


def _as_missing(param: str, value: object) -> OpenAIError:
    return missing(param)


# -- nested fields: messages ----------------------------------------------------------------

#: A message's roles (``developer`` is read as ``system``), in the order errors list them.
MESSAGE_ROLES: Final = ("system", "developer", "user", "assistant", "tool")

_TEXT_PART = _part("", "object", nullable=False, component="TextPart", properties=(
    _part("type", "string", required=True, enum=("text",), refusal="Invalid value for "
          "'{param}': {value}. This server accepts text content parts ('text'), and image "
          "parts ('image_url') in user messages."),
    _part("text", "string", nullable=False, text=True),
))  # fmt: skip
#: A message's content when it is not a string.
TEXT_PARTS: Final = _part("content", "array", items=_TEXT_PART,
                          empty="a string or at least one text part")  # fmt: skip
#: An image in a user message (a model with a vision projector): a ``data:`` URI, or an
#: ``http(s)`` URL of a host the server fetches from (``--allowed-media-domains``).
IMAGE_URL_PART: Final = _part("", "object", nullable=False, component="ImageUrlPart", properties=(
    _part("type", "string", required=True, enum=("image_url",)),
    _part("image_url", "object", required=True, nullable=False, properties=(
        _part("url", "string", required=True, nullable=False,
              description="A data: URI with a base64 PNG, JPEG, WebP or GIF (its first "
                          "frame), or an http(s) URL of a host the server fetches from "
                          "(--allowed-media-domains); the type is read from the bytes."),
        _part("detail", "string", enum=("auto", "low", "high"),
              description="Accepted and unused: the projector sets the resolution."),
    )),
))  # fmt: skip
_CONTENT: Schema = {
    "anyOf": [
        {"type": "string"},
        TEXT_PARTS.body(RequestLimits()),
        {"type": "array", "minItems": 1, "items": {"anyOf": [_ref("TextPart"),
                                                             _ref("ImageUrlPart")]}},
    ],
    "description": "A text, or text parts (joined by newlines); a user message's parts may "
    "hold images (image_url) for a model that takes them.",
}  # fmt: skip
_TOOL_CALL = _part("", "object", nullable=False, properties=(
    _part("id", "any", "Kept when a string; a new id otherwise."),
    _part("function", "object", nullable=False, whole=True,
          fault=lambda param, value: invalid_type(param, 'an object with a "name"', value),
          properties=(
              _part("name", "string", nullable=False),
              _part("arguments", "any", "A JSON object, as text (other JSON is read as its text)."),
          )),
))  # fmt: skip


def _message(roles: tuple[str, ...], *properties: Field) -> Field:
    """A message of ``roles``: its role, a participant's ``name`` (unused) and ``properties``,
    in the order they are checked."""
    role = _part("role", "string", required=True, enum=roles)
    return _part("", "object", nullable=False, properties=(role, _part("name", "string"),
                                                           *properties))  # fmt: skip


def _content(required: bool = True) -> Field:
    """A message's content: a string or ``TEXT_PARTS``, the endpoint's to tell apart."""
    return _part("content", "custom", required=required, shape=lambda limits: _ref("Content"))


_SAYS = _message(("system", "developer", "user"), _content())
#: A message's fields by its role, in the order they are checked (its ``content`` is parsed
#: by the endpoint: a string or ``TEXT_PARTS``).
MESSAGES: Final = {
    "system": _SAYS,
    "developer": _SAYS,
    "user": _SAYS,
    "assistant": _message(("assistant",), _part("tool_calls", "array", items=_TOOL_CALL),
                          _content(required=False)),
    "tool": _message(("tool",), _content(), _part("tool_call_id", "string")),
}  # fmt: skip

# -- nested fields: tools and structured output ---------------------------------------------

_TOOL = _part("", "object", nullable=False, component="Tool", properties=(
    _part("type", "string", nullable=False, default="function", enum=("function",),
          refusal="Invalid '{param}': {value}. This server supports 'function' tools only."),
    _part("function", "object", nullable=False, properties=(
        _part("name", "string", nullable=False, min_length=1, expected="a non-empty string"),
        _part("description", "string", falsy_is_null=True),
        _part("parameters", "object", "The arguments' JSON Schema; none (or {}) takes none."),
        _part("strict", "any", "Accepted and not read."),
    )),
))  # fmt: skip
#: ``tool_choice`` as a string.
TOOL_CHOICE_MODE: Final = _part("tool_choice", "string", enum=("none", "auto", "required"),
                                refusal="Invalid '{param}': {value}. Supported values are: "
                                "'none', 'auto', 'required' or a named function.")  # fmt: skip
#: ``tool_choice`` as an object: the one function the reply must call.
NAMED_TOOL_CHOICE: Final = _part(
    "tool_choice", "object", "The one function the reply must call.", nullable=False,
    component="NamedToolChoice", whole=True,
    fault=lambda param, value: invalid_value(
        param, 'expected {"type": "function", "function": {"name": ...}}.'),
    properties=(
        _part("type", "string", nullable=False, enum=("function",)),
        _part("function", "object", nullable=False,
              properties=(_part("name", "string", nullable=False),)),
    ),
)  # fmt: skip
_FORMATS = ("text", "json_object", "json_schema")
#: ``response_format.json_schema``, read when ``response_format.type`` is ``json_schema``.
RESPONSE_FORMAT_JSON_SCHEMA: Final = _part(
    "json_schema", "object", required=True, fault=_as_missing, properties=(
        _part("name", "string", required=True, fault=_as_missing),
        _part("strict", "boolean", "Whatever it says, the schema is enforced."),
        _part("schema", "schema", nullable=False, default={}, expected="a JSON schema object"),
    ))  # fmt: skip


def _response_format(limits: RequestLimits) -> Schema:
    return {
        "description": "``json_object`` and ``json_schema`` constrain the output by a grammar.",
        "anyOf": [
            {
                "type": "object",
                "required": ["type"],
                "properties": {"type": {"enum": list(_FORMATS[:2])}},
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


# -- nested fields: the Responses API ---------------------------------------------------------

#: A ``function`` tool in the Responses API's flat shape (tools of other types are the
#: endpoint's to leave out).
RESPONSES_TOOL: Final = _part("", "object", nullable=False, component="ResponsesFunctionTool",
                              properties=(
    _part("type", "string", required=True, enum=("function",)),
    _part("name", "string", nullable=False, min_length=1, expected="a non-empty string"),
    _part("description", "string", falsy_is_null=True),
    _part("parameters", "object", "The arguments' JSON Schema; none (or {}) takes none."),
    _part("strict", "any", "Accepted; the parameters' schema is enforced whatever it says."),
))  # fmt: skip
#: ``text.format``: ``json_schema`` is flat (``name``, ``schema``, ``strict`` beside ``type``).
RESPONSES_FORMAT: Final = _part("format", "object", component="ResponsesTextFormat",
                                properties=(
    _part("type", "string", required=True, enum=_FORMATS),
    _part("name", "string"),
    _part("schema", "schema", expected="a JSON schema object"),
    _part("strict", "boolean", "Whatever it says, the schema is enforced."),
    _part("description", "string"),
))  # fmt: skip
#: An ``input_image`` part of a user message (a model with a vision projector): a ``data:``
#: URI; a ``file_id`` refers to stored files, which this server has none of.
RESPONSES_IMAGE_PART: Final = _part("", "object", nullable=False,
                                    component="ResponsesInputImage", properties=(
    _part("type", "string", required=True, enum=("input_image",)),
    _part("image_url", "string", description="A data: URI with a base64 PNG, JPEG, WebP or GIF "
          "(its first frame), or an http(s) URL of a host the server fetches from "
          "(--allowed-media-domains); the type is read from the bytes."),
    _part("file_id", "string", "Refused (a 400 naming it): nothing is stored here."),
    _part("detail", "string", enum=("auto", "low", "high", "original"),
          description="Accepted and unused: the projector sets the resolution."),
))  # fmt: skip
_RESPONSES_PART: Schema = {
    "anyOf": [
        _ref("ResponsesInputImage"),
        {
            "type": "object",
            "required": ["type", "text"],
            "properties": {
                "type": {"enum": ["input_text", "output_text"]},
                "text": {"type": "string"},
            },
        },
        {
            "type": "object",
            "required": ["type", "refusal"],
            "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
        },
    ]
}
_RESPONSES_INPUT: Schema = {
    "description": "A text (the user's message), or input items: messages (``role`` user, "
    "system, developer or assistant; ``content`` a string or ``input_text``/``output_text`` "
    "parts, and a user message's ``input_image`` parts), ``function_call`` and "
    "``function_call_output`` items, ``reasoning`` items.",
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {
                "anyOf": [
                    {
                        "type": "object",
                        "required": ["role", "content"],
                        "properties": {
                            "type": {"const": "message"},
                            "role": {"enum": ["user", "system", "developer", "assistant"]},
                            "content": {
                                "anyOf": [
                                    {"type": "string"},
                                    {"type": "array", "items": _RESPONSES_PART},
                                ]
                            },
                        },
                    },
                    {
                        "type": "object",
                        "required": ["type", "call_id", "name", "arguments"],
                        "properties": {
                            "type": {"const": "function_call"},
                            "call_id": {"type": "string"},
                            "name": {"type": "string", "minLength": 1},
                            "arguments": {"type": "string"},
                        },
                    },
                    {
                        "type": "object",
                        "required": ["type", "call_id", "output"],
                        "properties": {
                            "type": {"const": "function_call_output"},
                            "call_id": {"type": "string"},
                            "output": {
                                "anyOf": [
                                    {"type": "string"},
                                    {"type": "array", "items": _RESPONSES_PART},
                                ]
                            },
                        },
                    },
                    {
                        "type": "object",
                        "required": ["type"],
                        "properties": {"type": {"const": "reasoning"}},
                    },
                ]
            },
        },
    ],
}
_RESPONSES_TOOLS: Schema = {
    "anyOf": [
        _ref("ResponsesFunctionTool"),
        {
            "type": "object",
            "description": "A tool of another type: left out of what the model is offered.",
            "required": ["type"],
            "properties": {"type": {"type": "string", "not": {"const": "function"}}},
        },
    ]
}
_RESPONSES_TOOL_CHOICE: Schema = {
    "anyOf": [
        {"enum": ["none", "auto", "required"]},
        {
            "type": "object",
            "required": ["type", "name"],
            "properties": {"type": {"const": "function"}, "name": {"type": "string"}},
        },
    ]
}
#: ``reasoning.effort``'s values (``none`` and ``minimal`` turn thinking off).
RESPONSES_EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def _ignored(name: str, type: str, *endpoints: str, **kwargs: Any) -> Field:
    """A field that changes nothing here, accepted (and checked for its type) and ignored."""
    return Field(name, type, frozenset(endpoints), "Accepted and ignored.", **kwargs)


def component_schemas(limits: RequestLimits) -> dict[str, Schema]:
    """The schemas the request schemas refer to (``#/components/schemas/<name>``)."""
    return {
        "ChatMessage": {
            "description": "A message; only an assistant message may leave out its content.",
            "anyOf": [MESSAGES[role].body(limits) for role in ("user", "assistant", "tool")],
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
        "ResponsesFunctionTool": RESPONSES_TOOL.body(limits),
        "ResponsesTextFormat": RESPONSES_FORMAT.body(limits),
        "AnthropicMessage": ANTHROPIC_MESSAGE.body(limits),
        "AnthropicTextBlock": _A_TEXT_BLOCK.body(limits),
        "AnthropicImageBlock": _A_IMAGE_BLOCK.body(limits),
        "ResponsesInputImage": RESPONSES_IMAGE_PART.body(limits),
        "AnthropicTool": ANTHROPIC_TOOL.body(limits),
    }


# -- Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) ---------------

#: The Messages API's endpoints: a message, and the count of a message request's input tokens
#: (the same body; ``max_tokens`` and ``stream`` mean nothing there).
MESSAGES_API: Final = "messages"
COUNT_TOKENS: Final = "count_tokens"


def _anthropic(*names: str) -> frozenset[str]:
    return frozenset(names or (MESSAGES_API, COUNT_TOKENS))


def _anthropic_ignored(
    name: str, *endpoints: str, description: str = "Accepted and ignored."
) -> Field:
    return Field(name, "any", _anthropic(*endpoints), description)


def _block_type(name: str) -> Field:
    return _part("type", "string", required=True, enum=(name,))


_CACHE_CONTROL = _part("cache_control", "any", "Accepted and ignored (prompt reuse is automatic).")
_A_TEXT_BLOCK = _part("", "object", nullable=False, component="AnthropicTextBlock", properties=(
    _block_type("text"), _part("text", "string", nullable=False, text=True), _CACHE_CONTROL,
    _part("citations", "any", "Accepted and ignored."),
))  # fmt: skip
#: ``system`` (or a tool result's content) when it is not a string.
ANTHROPIC_TEXT_BLOCKS: Final = _part("content", "array", items=_A_TEXT_BLOCK)
_A_TEXT_OR_BLOCKS: Schema = {
    "anyOf": [{"type": "string"}, ANTHROPIC_TEXT_BLOCKS.body(RequestLimits())]
}
#: An ``image`` block's ``source`` (a model with a vision projector): ``base64`` data, or a
#: ``url`` of a host the server fetches from (``--allowed-media-domains``); a ``file`` source
#: is refused.
ANTHROPIC_IMAGE_SOURCE: Final = _part("source", "object", required=True, nullable=False,
                                      properties=(
    _part("type", "string", required=True, enum=("base64", "url", "file"),
          description="``base64``, or ``url`` (an http(s) URL of a host the server fetches "
                      "from: --allowed-media-domains); ``file`` is refused (a 400 naming it)."),
    _part("media_type", "string", enum=("image/jpeg", "image/png", "image/gif", "image/webp"),
          description="Required with ``base64``; the type is read from the bytes."),
    _part("data", "string", "The image's base64 bytes (PNG, JPEG, WebP or a GIF's first frame)."),
    _part("url", "string", "An http(s) URL (a ``url`` source), fetched when its host is "
          "allowed (--allowed-media-domains)."),
    _part("file_id", "string", "Refused: nothing is stored here."),
))  # fmt: skip
_A_IMAGE_BLOCK = _part("", "object", nullable=False, component="AnthropicImageBlock",
                       properties=(
    _block_type("image"), ANTHROPIC_IMAGE_SOURCE, _CACHE_CONTROL,
))  # fmt: skip
#: A tool result's content when it is not a string: text and image blocks.
ANTHROPIC_RESULT_BLOCKS: Final = {"text": _A_TEXT_BLOCK, "image": _A_IMAGE_BLOCK}
_A_RESULT_CONTENT: Schema = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"anyOf": [_ref("AnthropicTextBlock"),
                                              _ref("AnthropicImageBlock")]}},
    ]
}  # fmt: skip
#: A message's content blocks by ``type``, each with its fields in the order they are checked
#: (a ``tool_result``'s ``content`` is a string or text blocks, the endpoint's to tell apart).
ANTHROPIC_BLOCKS: Final = {
    "text": _A_TEXT_BLOCK,
    "tool_use": _part("", "object", nullable=False, properties=(
        _block_type("tool_use"), _part("id", "string", nullable=False),
        _part("name", "string", nullable=False), _part("input", "object", default={}),
        _CACHE_CONTROL)),
    "tool_result": _part("", "object", nullable=False, properties=(
        _block_type("tool_result"), _part("tool_use_id", "string", nullable=False),
        _part("content", "custom", shape=_fixed(_A_RESULT_CONTENT),
              description="A string, or text and image blocks."),
        _part("is_error", "boolean", "An error result reaches the model as 'Error: ...'."),
        _CACHE_CONTROL)),
    "thinking": _part("", "object", nullable=False, properties=(
        _block_type("thinking"), _part("thinking", "string", nullable=False),
        _part("signature", "string", "Not checked."))),
    "redacted_thinking": _part("", "object", nullable=False, properties=(
        _block_type("redacted_thinking"), _part("data", "string"))),
    "image": _A_IMAGE_BLOCK,
}  # fmt: skip
#: Content blocks this server cannot take yet, and what they are.
ANTHROPIC_REFUSED_BLOCKS: Final = {
    "document": "document input",
    "search_result": "search results",
    "server_tool_use": "server tools",
    "web_search_tool_result": "server tools",
    "web_fetch_tool_result": "server tools",
    "code_execution_tool_result": "server tools",
    "bash_code_execution_tool_result": "server tools",
    "text_editor_code_execution_tool_result": "server tools",
    "tool_search_tool_result": "server tools",
    "container_upload": "container uploads",
}
_A_CONTENT: Schema = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "items": {"anyOf": [b.body(RequestLimits()) for b in ANTHROPIC_BLOCKS.values()]},
        },
    ],
    "description": "A text, or content blocks (text, tool_use, tool_result, thinking, "
    "redacted_thinking, and a user turn's image blocks for a model that takes them).",
}
#: One message of ``messages``: its role, and its content (a string or ``ANTHROPIC_BLOCKS``,
#: the endpoint's to tell apart).
ANTHROPIC_MESSAGE: Final = _part("", "object", nullable=False, component="AnthropicMessage",
                                 properties=(
    _part("role", "string", required=True, enum=("user", "assistant")),
    _part("content", "custom", required=True, shape=_fixed(_A_CONTENT)),
))  # fmt: skip
#: A tool the model may call (``type`` ``custom`` or absent; server tools are left out).
ANTHROPIC_TOOL: Final = _part("", "object", nullable=False, component="AnthropicTool", properties=(
    _part("name", "string", required=True, min_length=1, expected="a non-empty string"),
    _part("description", "string", falsy_is_null=True),
    _part("input_schema", "schema", nullable=False, default={}, expected="a JSON schema object"),
    _part("type", "string", "``custom``; a server tool's type (``web_search_20250305``, ...) "
          "is left out of what the model is offered."),
    _CACHE_CONTROL, _part("strict", "any", "Accepted: the schema is enforced on a call."),
))  # fmt: skip
ANTHROPIC_TOOL_CHOICE: Final = _part("tool_choice", "object", properties=(
    _part("type", "string", required=True, enum=("auto", "any", "tool", "none")),
    _part("name", "string", "The tool ``tool`` forces."),
    _part("disable_parallel_tool_use", "boolean"),
))  # fmt: skip
ANTHROPIC_THINKING: Final = _part("thinking", "object", properties=(
    _part("type", "string", required=True,
          enum=("enabled", "adaptive", "between_tools", "disabled")),
    _part("budget_tokens", "integer", "With ``enabled``: the reasoning budget (Anthropic's "
          "bounds, at least 1024 and below ``max_tokens``, are not enforced).",
          minimum=0, maximum=INT32_MAX),
    _part("display", "string", "Accepted and ignored.", enum=("summarized", "omitted")),
))  # fmt: skip
ANTHROPIC_OUTPUT_CONFIG: Final = _part("output_config", "object", properties=(
    _part("effort", "string", enum=("low", "medium", "high", "xhigh", "max")),
    _part("format", "object", "The reply's JSON schema, enforced by a grammar.", properties=(
        _part("type", "string", required=True, enum=("json_schema",)),
        _part("schema", "schema", required=True, expected="a JSON schema object"),
    )),
))  # fmt: skip

_ANTHROPIC_FIELDS: Final = (
    Field("model", "string", _anthropic(), "The model's name (resolved as every route's)."),
    Field("max_tokens", "integer", _anthropic(MESSAGES_API), required=True, minimum=1,
          maximum=INT32_MAX, limit="max_tokens"),
    Field("max_tokens", "integer", _anthropic(COUNT_TOKENS), "Accepted and ignored.", minimum=0,
          maximum=INT32_MAX),
    Field("messages", "array", _anthropic(), required=True, limit="max_messages",
          items=_part("", "custom", nullable=False, component="AnthropicMessage"),
          empty="an array with at least one message"),
    Field("system", "custom", _anthropic(), "A text, or text blocks (joined by newlines).",
          shape=_fixed(_A_TEXT_OR_BLOCKS)),
    Field("stop_sequences", "array", _anthropic(), limit="max_stop",
          items=_part("", "string", nullable=False, min_length=1,
                      expected="a non-empty string")),
    Field("stream", "boolean", _anthropic(MESSAGES_API)),
    Field("temperature", "number", _anthropic(), minimum=0, maximum=1),
    Field("top_p", "number", _anthropic(), minimum=0, maximum=1, exclusive_minimum=True),
    Field("top_k", "integer", _anthropic(), "0 keeps every token.", minimum=0, maximum=INT32_MAX),
    Field("tools", "array", _anthropic(), items=ANTHROPIC_TOOL),
    Field("tool_choice", "object", _anthropic(), properties=ANTHROPIC_TOOL_CHOICE.properties),
    Field("thinking", "object", _anthropic(), "``enabled`` (on, within ``budget_tokens``), "
          "``adaptive`` and ``between_tools`` (on, within ``output_config.effort``'s budget, "
          "medium's by default), ``disabled`` (off); absent: the template's default.",
          properties=ANTHROPIC_THINKING.properties),
    Field("output_config", "object", _anthropic(), properties=ANTHROPIC_OUTPUT_CONFIG.properties),
    Field("ignore_eos", "boolean", _anthropic(MESSAGES_API),
          "llama.cpp's extension: generate through end-of-generation tokens (benchmarks)."),
    Field("metadata", "object", _anthropic(), "Accepted and ignored.",
          properties=(_part("user_id", "any"),)),
    _anthropic_ignored("cache_control"),
    _anthropic_ignored("service_tier"),
    _anthropic_ignored("speed"),
    _anthropic_ignored("container"),
    _anthropic_ignored("inference_geo"),
    _anthropic_ignored("diagnostics"),
    _anthropic_ignored("context_management"),
    _refused("mcp_servers", "remote MCP servers", MESSAGES_API, COUNT_TOKENS),
)  # fmt: skip


FIELDS: Final[tuple[Field, ...]] = (
    Field("model", "string", _both(), "The model's name (any name is served by this model)."),
    Field("messages", "array", _both(CHAT), required=True, limit="max_messages",
          items=_part("", "custom", nullable=False, component="ChatMessage"),
          empty="an array with at least one message"),
    _custom("prompt", _PROMPT, COMPLETIONS, required=True,
            description="A text, or token ids; one prompt per request."),
    Field("max_tokens", "integer", _both(CHAT), minimum=1, maximum=INT32_MAX, limit="max_tokens"),
    Field("max_tokens", "integer", _both(COMPLETIONS), "16 when absent, as OpenAI's.",
          minimum=1, maximum=INT32_MAX, limit="max_tokens"),
    Field("max_completion_tokens", "integer", _both(CHAT), "Wins over ``max_tokens``.",
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
          properties=(_part("include_usage", "boolean"),)),
    Field("n", "integer", _both(), "One choice per request.", minimum=1, maximum=1),
    Field("best_of", "integer", _both(COMPLETIONS), "One completion per request.",
          minimum=1, maximum=1),
    _refused("echo", "echoing the prompt back", COMPLETIONS, allowed=(False,)),
    _refused("suffix", "a suffix (fill-in-the-middle)", COMPLETIONS),
    Field("logprobs", "boolean", _both(CHAT)),
    Field("top_logprobs", "integer", _both(CHAT), "Only with ``logprobs: true``.",
          minimum=0, maximum=MAX_TOP_LOGPROBS),
    Field("logprobs", "integer", _both(COMPLETIONS), "Alternatives per token.",
          minimum=0, maximum=MAX_TOP_LOGPROBS),
    _custom("logit_bias", _LOGIT_BIAS,
            description="Token id to a bias from -100 (never) to 100 (always)."),
    Field("response_format", "object", _both(), component="ResponseFormat", properties=(
        _part("type", "string", nullable=False, enum=_FORMATS),)),
    Field("tools", "array", _both(CHAT), items=_TOOL),
    _custom("tool_choice", {"anyOf": [TOOL_CHOICE_MODE.body(RequestLimits()),
                                      _ref("NamedToolChoice")]}, CHAT),
    Field("parallel_tool_calls", "boolean", _both(CHAT)),
    Field("think", "boolean", _both(CHAT), "Let the model reason first."),
    Field("chat_template_kwargs", "object", _both(CHAT),
          properties=(_part("enable_thinking", "boolean"),)),
    Field("ignore_eos", "boolean", _both(), "llama.cpp's extension."),
    Field("cache_prompt", "boolean", _both(),
          "llama.cpp's extension: false ingests the whole prompt, reusing no earlier "
          "request's memory (default true)."),
    _refused("audio", "audio output", CHAT),
    _refused("modalities", "output modalities other than text", CHAT, allowed=(["text"],)),
    _refused("prediction", "predicted outputs", CHAT),
    _refused("web_search_options", "web search", CHAT),
    _refused("functions", "the deprecated 'functions' (use 'tools')", CHAT),
    _refused("function_call", "the deprecated 'function_call' (use 'tool_choice')", CHAT),
    Field("reasoning_effort", "string", _both(CHAT),
          "How much the model may reason: ``none`` and ``minimal`` turn thinking off; "
          "``low`` to ``xhigh`` turn it on with a budget of reasoning tokens that grows "
          "with the effort (README, Reasoning), after which the think block is closed; "
          "``max`` (llmtrio's) on without a budget. ``think`` or "
          "``chat_template_kwargs.enable_thinking``, when given, wins on whether to think.",
          enum=("none", "minimal", "low", "medium", "high", "xhigh", "max")),
    _refused("verbosity", "verbosity", CHAT),
    Field("model", "string", _both(EMBEDDINGS), "The embedding model's name."),
    Field("input", "custom", _both(EMBEDDINGS), required=True, shape=_embedding_input_shape,
          description="A text, an array of texts, an array of token ids or an array of "
          "arrays of token ids; one vector per text or token array, none of them empty, "
          "none longer than the model's context."),
    _custom("encoding_format", {"enum": ["float", "base64"]}, EMBEDDINGS,
            description="``float`` (default): arrays of numbers; ``base64``: each vector's "
            "little-endian float32 bytes, base64-encoded."),
    _refused("dimensions", "shortened embeddings (no GGUF field says a model was trained for "
             "truncated vectors)", EMBEDDINGS),
    Field("user", "string", _both(EMBEDDINGS), "Accepted and ignored."),
    # The Responses API (stateless: nothing is stored).
    Field("model", "string", _both(RESPONSES), "The model's name."),
    Field("input", "custom", _both(RESPONSES), required=True,
          shape=_fixed(_RESPONSES_INPUT), description=_RESPONSES_INPUT["description"]),
    Field("instructions", "string", _both(RESPONSES), "A system message before the input."),
    Field("max_output_tokens", "integer", _both(RESPONSES),
          "The server's ``--default-max-tokens`` when absent.",
          minimum=1, maximum=INT32_MAX, limit="max_tokens"),
    Field("temperature", "number", _both(RESPONSES), minimum=0, maximum=2),
    Field("top_p", "number", _both(RESPONSES), minimum=0, maximum=1, exclusive_minimum=True),
    Field("top_logprobs", "integer", _both(RESPONSES),
          "Alternatives per token, reported with ``include: "
          "[\"message.output_text.logprobs\"]``.", minimum=0, maximum=MAX_TOP_LOGPROBS),
    Field("stream", "boolean", _both(RESPONSES)),
    _ignored("stream_options", "object", RESPONSES),
    Field("tools", "array", _both(RESPONSES),
          items=_part("", "custom", nullable=False, shape=_fixed(_RESPONSES_TOOLS)),
          description="``function`` tools; tools of other types (``web_search``, "
          "``file_search``, ...) are left out of what the model is offered."),
    _custom("tool_choice", _RESPONSES_TOOL_CHOICE, RESPONSES),
    Field("parallel_tool_calls", "boolean", _both(RESPONSES)),
    Field("max_tool_calls", "integer", _both(RESPONSES),
          "At most this many function calls in the output (0: none).",
          minimum=0, maximum=INT32_MAX),
    Field("text", "object", _both(RESPONSES), properties=(
        RESPONSES_FORMAT, _part("verbosity", "any", "Accepted and ignored."))),
    Field("reasoning", "object", _both(RESPONSES), properties=(
        _part("effort", "string", enum=RESPONSES_EFFORTS),
        _part("summary", "any", "Accepted and ignored: the reasoning text is given whole."),
        _part("generate_summary", "any", "Accepted and ignored."),
        _part("context", "any", "Accepted and ignored."),
        _part("mode", "any", "Accepted and ignored."),
    )),
    Field("metadata", "object", _both(RESPONSES), "Echoed in the response."),
    Field("store", "boolean", _both(RESPONSES),
          "Accepted; nothing is stored (the response says ``store: false``)."),
    Field("user", "string", _both(RESPONSES), "Accepted and ignored."),
    Field("include", "array", _both(RESPONSES), "``message.output_text.logprobs`` reports "
          "log-probabilities; the other values are accepted and ignored.",
          items=_part("", "string", nullable=False)),
    _ignored("prompt_cache_key", "string", RESPONSES),
    _ignored("prompt_cache_retention", "string", RESPONSES),
    _ignored("prompt_cache_options", "object", RESPONSES),
    _ignored("safety_identifier", "string", RESPONSES),
    _ignored("service_tier", "string", RESPONSES),
    _ignored("truncation", "string", RESPONSES),
    _ignored("moderation", "any", RESPONSES),
    _ignored("context_management", "any", RESPONSES),
    _refused("previous_response_id", "stored responses (this server is stateless)", RESPONSES),
    _refused("conversation", "conversations (this server is stateless)", RESPONSES),
    _refused("background", "background responses", RESPONSES, allowed=(False,)),
    _refused("background_options", "background responses", RESPONSES),
    _refused("prompt", "stored prompts", RESPONSES),
    _refused("image", "image generation", RESPONSES),
    *_ANTHROPIC_FIELDS,
    Field("model", "string", _both(MODELS), required=True,
          description="A catalog model's name (never a path or a repository)."),
    Field("model", "string", _both(TOKENIZE, DETOKENIZE),
          "Whose tokenizer: any model served, a chat or an embedding model."),
    _custom("content", _TOKENIZE_CONTENT, TOKENIZE, required=True,
            description="A text, or an array of texts and token ids (the ids kept as they "
            "are)."),
    Field("add_special", "boolean", _both(TOKENIZE),
          "Add the special tokens the model adds to a prompt (its BOS); default false."),
    Field("parse_special", "boolean", _both(TOKENIZE),
          "Read special-token text (``<|im_end|>``) as those tokens; default true."),
    Field("with_pieces", "boolean", _both(TOKENIZE),
          "Each token as ``{\"id\", \"piece\"}``: its text, or its bytes as an array of "
          "numbers where they are not UTF-8 on their own."),
    Field("tokens", "array", _both(DETOKENIZE), "Token ids of the model's vocabulary.",
          required=True,
          items=_part("", "integer", nullable=False, minimum=0, maximum=INT32_MAX)),
)  # fmt: skip

_BY_KEY: Final = {(e, f.name): f for f in FIELDS for e in f.endpoints}


def field(endpoint: str, name: str) -> Field:
    """The field ``name`` of ``endpoint``; ``KeyError`` if it has none."""
    return _BY_KEY[endpoint, name]


def request_schema(endpoint: str, limits: RequestLimits) -> Schema:
    """The JSON schema of ``endpoint``'s request body on a server with ``limits`` (a field
    this server refuses may only be null, or one of the values it allows)."""
    fields = [f for f in FIELDS if endpoint in f.endpoints]
    return {
        "type": "object",
        "required": [f.name for f in fields if f.required],
        "properties": {f.name: f.schema(limits) for f in fields},
    }


def read(data: Mapping[str, Any], endpoint: str, name: str, limits: RequestLimits) -> Any:
    """The value of field ``name`` in ``data`` (a parsed body), checked against the table and
    ``limits``: ``None`` when absent or null; a ``float`` for a number, an ``int`` for an
    integer; the value itself for a boolean or a string. A refused field's allowed value
    reads as ``None``.

    Error handling: :class:`OpenAIError` (400) naming the field: ``missing_required_parameter``,
    ``invalid_type``, ``decimal_below_min_value``/``decimal_above_max_value``,
    ``integer_below_min_value``/``integer_above_max_value``, or ``unsupported_parameter`` for a
    field this server does not implement.
    """
    spec = field(endpoint, name)
    value = data.get(name)
    if value is None:
        if spec.required:
            raise missing(name)
        return None
    if spec.refused is not None:
        if value in spec.allowed:
            return None
        raise invalid_request(
            f"Unsupported parameter: '{name}': this server does not implement {spec.refused}.",
            param=name,
            code="unsupported_parameter",
        )
    return check(spec, value, limits, name)
