"""The request fields of OpenAI's Responses API (``/v1/responses`` and
``/v1/responses/input_tokens``; stateless: nothing is stored), nested ones included: input
items, tools, ``text.format``. Pure; a part of the field table (``llmtrio.api._fields``)."""

from __future__ import annotations

from typing import Final

from ._chat_fields import RESPONSE_FORMATS
from ._field_spec import (
    INT32_MAX,
    MAX_TOP_LOGPROBS,
    Field,
    RequestLimits,
    Schema,
    custom,
    fixed,
    ignored,
    part,
    ref,
    refused,
)
from ._routes import IMAGE_PARTS, Body

__all__ = [
    "RESPONSES_CUSTOM_TOOL",
    "RESPONSES_EFFORTS",
    "RESPONSES_FIELDS",
    "RESPONSES_FORMAT",
    "RESPONSES_IMAGE_PART",
    "RESPONSES_NAMESPACE_TOOL",
    "RESPONSES_TOOL",
    "RESPONSES_TOOL_TYPES",
    "responses_components",
]

_RESPONSES: Final = frozenset({Body.RESPONSES})

# -- nested fields ---------------------------------------------------------

#: A ``function`` tool in the Responses API's flat shape (tools of other types are the
#: endpoint's to leave out).
RESPONSES_TOOL: Final = part("", "object", nullable=False, component="ResponsesFunctionTool",
                              properties=(
    part("type", "string", required=True, enum=("function",)),
    part("name", "string", nullable=False, min_length=1, expected="a non-empty string"),
    part("description", "string", falsy_is_null=True),
    part("parameters", "object", "The arguments' JSON Schema; none (or {}) takes none."),
    part("strict", "any", "true: a keyword the grammar cannot enforce is refused; else it "
                          "is relaxed."),
))  # fmt: skip
#: A ``custom`` tool: its input is text, free or held to a grammar (``format``).
RESPONSES_CUSTOM_TOOL: Final = part("", "object", nullable=False,
                                     component="ResponsesCustomTool", properties=(
    part("type", "string", required=True, enum=("custom",)),
    part("name", "string", nullable=False, min_length=1, expected="a non-empty string"),
    part("description", "string", falsy_is_null=True),
    part("format", "object", "``{\"type\": \"text\"}`` (the default: any text) or "
         "``{\"type\": \"grammar\", \"syntax\": \"lark\" | \"regex\", \"definition\"}``: "
         "a grammar the engine cannot translate leaves the text free, with a warning.",
         properties=(
        part("type", "string", required=True, enum=("text", "grammar")),
        part("syntax", "string", enum=("lark", "regex")),
        part("definition", "string"),
    )),
))  # fmt: skip
#: A ``namespace`` tool: function and custom tools under one name; the model sees each as a
#: tool named ``namespace.name``, and its calls carry their ``namespace``.
RESPONSES_NAMESPACE_TOOL: Final = part("", "object", nullable=False,
                                        component="ResponsesNamespaceTool", properties=(
    part("type", "string", required=True, enum=("namespace",)),
    part("name", "string", nullable=False, min_length=1, expected="a non-empty string"),
    part("description", "string", falsy_is_null=True),
    part("tools", "array", required=True, description="``function`` and ``custom`` tools; "
         "others are left out of what the model is offered.",
         items=part("", "object", nullable=False, properties=(
             part("type", "string", required=True),
         ))),
))  # fmt: skip
#: ``text.format``: ``json_schema`` is flat (``name``, ``schema``, ``strict`` beside ``type``).
RESPONSES_FORMAT: Final = part("format", "object", component="ResponsesTextFormat",
                                properties=(
    part("type", "string", required=True, enum=RESPONSE_FORMATS),
    part("name", "string"),
    part("schema", "schema", expected="a JSON schema object"),
    part("strict", "boolean", "true: a keyword the grammar cannot enforce is refused; else "
                              "it is relaxed."),
    part("description", "string"),
))  # fmt: skip
#: An ``input_image`` part of a user message (a model with a vision projector): a ``data:``
#: URI; a ``file_id`` refers to stored files, which this server has none of.
RESPONSES_IMAGE_PART: Final = part("", "object", nullable=False,
                                    component="ResponsesInputImage", properties=(
    part("type", "string", required=True, enum=(IMAGE_PARTS[Body.RESPONSES],)),
    part("image_url", "string", description="A data: URI with a base64 PNG, JPEG, WebP or GIF "
          "(its first frame), or an http(s) URL of a host the server fetches from "
          "(--allowed-media-domains); the type is read from the bytes."),
    part("file_id", "string", "Refused (a 400 naming it): nothing is stored here."),
    part("detail", "string", enum=("auto", "low", "high", "original"),
          description="Accepted and unused: the projector sets the resolution."),
))  # fmt: skip
_RESPONSES_PART: Schema = {
    "anyOf": [
        ref("ResponsesInputImage"),
        ref("InputAudioPart"),
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
    "parts, and a user message's ``input_image`` and ``input_audio`` parts), "
    "``function_call`` and ``function_call_output`` items, ``custom_tool_call`` and "
    "``custom_tool_call_output`` items, ``reasoning`` items.",
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
                            "namespace": {"type": "string"},
                            "arguments": {"type": "string"},
                        },
                    },
                    {
                        "type": "object",
                        "required": ["type", "call_id", "name", "input"],
                        "properties": {
                            "type": {"const": "custom_tool_call"},
                            "call_id": {"type": "string"},
                            "name": {"type": "string", "minLength": 1},
                            "namespace": {"type": "string"},
                            "input": {"type": "string"},
                        },
                    },
                    {
                        "type": "object",
                        "required": ["type", "call_id", "output"],
                        "properties": {
                            "type": {"enum": ["function_call_output", "custom_tool_call_output"]},
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
#: The tool types the model is offered (the others are left out).
RESPONSES_TOOL_TYPES: Final = ("function", "custom", "namespace")
_RESPONSES_TOOLS: Schema = {
    "anyOf": [
        ref("ResponsesFunctionTool"),
        ref("ResponsesCustomTool"),
        ref("ResponsesNamespaceTool"),
        {
            "type": "object",
            "description": "A tool of another type: left out of what the model is offered.",
            "required": ["type"],
            "properties": {"type": {"type": "string", "not": {"enum": list(RESPONSES_TOOL_TYPES)}}},
        },
    ]
}
_RESPONSES_TOOL_CHOICE: Schema = {
    "anyOf": [
        {"enum": ["none", "auto", "required"]},
        {
            "type": "object",
            "description": "A tool the reply must call: a function (a namespace's as "
            "``namespace.name``, or with its ``namespace``) or a custom tool.",
            "required": ["type", "name"],
            "properties": {
                "type": {"enum": ["function", "custom"]},
                "name": {"type": "string"},
                "namespace": {"type": "string"},
            },
        },
    ]
}
#: ``reasoning.effort``'s values (``none`` and ``minimal`` turn thinking off).
RESPONSES_EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def responses_components(limits: RequestLimits) -> dict[str, Schema]:
    """The Responses API's schemas that the request schemas refer to."""
    return {
        "ResponsesFunctionTool": RESPONSES_TOOL.body(limits),
        "ResponsesCustomTool": RESPONSES_CUSTOM_TOOL.body(limits),
        "ResponsesNamespaceTool": RESPONSES_NAMESPACE_TOOL.body(limits),
        "ResponsesTextFormat": RESPONSES_FORMAT.body(limits),
        "ResponsesInputImage": RESPONSES_IMAGE_PART.body(limits),
    }


#: The fields of the Responses API.
RESPONSES_FIELDS: Final[tuple[Field, ...]] = (
    Field("model", "string", _RESPONSES, "The model's name."),
    Field("input", "custom", _RESPONSES, required=True,
          shape=fixed(_RESPONSES_INPUT), description=_RESPONSES_INPUT["description"]),
    Field("instructions", "string", _RESPONSES, "A system message before the input."),
    Field("max_output_tokens", "integer", _RESPONSES,
          "The server's ``--default-max-tokens`` when absent.",
          minimum=1, maximum=INT32_MAX, limit="max_tokens"),
    Field("temperature", "number", _RESPONSES, minimum=0, maximum=2),
    Field("top_p", "number", _RESPONSES, minimum=0, maximum=1, exclusive_minimum=True),
    Field("top_logprobs", "integer", _RESPONSES,
          "Alternatives per token, reported with ``include: "
          "[\"message.output_text.logprobs\"]``.", minimum=0, maximum=MAX_TOP_LOGPROBS),
    Field("stream", "boolean", _RESPONSES),
    ignored("stream_options", "object", Body.RESPONSES),
    Field("tools", "array", _RESPONSES,
          items=part("", "custom", nullable=False, shape=fixed(_RESPONSES_TOOLS)),
          description="``function`` and ``custom`` tools, and ``namespace`` tools (the "
          "model sees each of theirs as ``namespace.name``); tools of other types "
          "(``web_search``, ``file_search``, ...) are left out of what the model is offered."),
    custom("tool_choice", _RESPONSES_TOOL_CHOICE, Body.RESPONSES),
    Field("parallel_tool_calls", "boolean", _RESPONSES),
    Field("max_tool_calls", "integer", _RESPONSES,
          "At most this many function calls in the output (0: none).",
          minimum=0, maximum=INT32_MAX),
    Field("text", "object", _RESPONSES, properties=(
        RESPONSES_FORMAT, part("verbosity", "any", "Accepted and ignored."))),
    Field("reasoning", "object", _RESPONSES, properties=(
        part("effort", "string", enum=RESPONSES_EFFORTS),
        part("summary", "any", "Accepted and ignored: the reasoning text is given whole."),
        part("generate_summary", "any", "Accepted and ignored."),
        part("context", "any", "Accepted and ignored."),
        part("mode", "any", "Accepted and ignored."),
    )),
    Field("metadata", "object", _RESPONSES, "Echoed in the response."),
    Field("store", "boolean", _RESPONSES,
          "Accepted; nothing is stored (the response says ``store: false``)."),
    Field("user", "string", _RESPONSES, "Accepted and ignored."),
    Field("include", "array", _RESPONSES, "``message.output_text.logprobs`` reports "
          "log-probabilities; the other values are accepted and ignored.",
          items=part("", "string", nullable=False)),
    ignored("prompt_cache_key", "string", Body.RESPONSES),
    ignored("prompt_cache_retention", "string", Body.RESPONSES),
    ignored("prompt_cache_options", "object", Body.RESPONSES),
    ignored("safety_identifier", "string", Body.RESPONSES),
    ignored("service_tier", "string", Body.RESPONSES),
    ignored("truncation", "string", Body.RESPONSES),
    ignored("moderation", "any", Body.RESPONSES),
    ignored("context_management", "any", Body.RESPONSES),
    refused("previous_response_id", "stored responses (this server is stateless)", Body.RESPONSES),
    refused("conversation", "conversations (this server is stateless)", Body.RESPONSES),
    refused("background", "background responses", Body.RESPONSES, allowed=(False,)),
    refused("background_options", "background responses", Body.RESPONSES),
    refused("prompt", "stored prompts", Body.RESPONSES),
    refused("image", "image generation", Body.RESPONSES),
)  # fmt: skip
