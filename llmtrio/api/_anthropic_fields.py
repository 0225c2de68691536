"""The request fields of Anthropic's Messages API (``/v1/messages`` and
``/v1/messages/count_tokens``, the same body; ``max_tokens`` and ``stream`` mean nothing to the
count), nested ones included: content blocks, tools, ``tool_choice``, ``thinking``,
``output_config``. Pure; a part of the field table (``llmtrio.api._fields``)."""

from __future__ import annotations

from typing import Final

from ._field_spec import (
    INT32_MAX,
    Field,
    RequestLimits,
    Schema,
    fixed,
    part,
    ref,
    refused,
)
from ._routes import IMAGE_PARTS, Body

__all__ = [
    "ANTHROPIC_BLOCKS",
    "ANTHROPIC_FIELDS",
    "ANTHROPIC_IMAGE_SOURCE",
    "ANTHROPIC_MESSAGE",
    "ANTHROPIC_OUTPUT_CONFIG",
    "ANTHROPIC_REFUSED_BLOCKS",
    "ANTHROPIC_RESULT_BLOCKS",
    "ANTHROPIC_TEXT_BLOCKS",
    "ANTHROPIC_THINKING",
    "ANTHROPIC_TOOL",
    "ANTHROPIC_TOOL_CHOICE",
    "anthropic_components",
]

#: The ``type`` of an image block.
_IMAGE = IMAGE_PARTS[Body.MESSAGES]


def _anthropic(*names: str) -> frozenset[str]:
    return frozenset(names or (Body.MESSAGES, Body.COUNT_TOKENS))


def _anthropic_ignored(
    name: str, *endpoints: str, description: str = "Accepted and ignored."
) -> Field:
    return Field(name, "any", _anthropic(*endpoints), description)


def _block_type(name: str) -> Field:
    return part("type", "string", required=True, enum=(name,))


_CACHE_CONTROL = part("cache_control", "any", "Accepted and ignored (prompt reuse is automatic).")
_A_TEXT_BLOCK = part("", "object", nullable=False, component="AnthropicTextBlock", properties=(
    _block_type("text"), part("text", "string", nullable=False, text=True), _CACHE_CONTROL,
    part("citations", "any", "Accepted and ignored."),
))  # fmt: skip
#: ``system`` (or a tool result's content) when it is not a string.
ANTHROPIC_TEXT_BLOCKS: Final = part("content", "array", items=_A_TEXT_BLOCK)
_A_TEXT_OR_BLOCKS: Schema = {
    "anyOf": [{"type": "string"}, ANTHROPIC_TEXT_BLOCKS.body(RequestLimits())]
}
#: An ``image`` block's ``source`` (a model with a vision projector): ``base64`` data, or a
#: ``url`` of a host the server fetches from (``--allowed-media-domains``); a ``file`` source
#: is refused.
ANTHROPIC_IMAGE_SOURCE: Final = part("source", "object", required=True, nullable=False,
                                      properties=(
    part("type", "string", required=True, enum=("base64", "url", "file"),
          description="``base64``, or ``url`` (an http(s) URL of a host the server fetches "
                      "from: --allowed-media-domains); ``file`` is refused (a 400 naming it)."),
    part("media_type", "string", enum=("image/jpeg", "image/png", "image/gif", "image/webp"),
          description="Required with ``base64``; the type is read from the bytes."),
    part("data", "string", "The image's base64 bytes (PNG, JPEG, WebP or a GIF's first frame)."),
    part("url", "string", "An http(s) URL (a ``url`` source), fetched when its host is "
          "allowed (--allowed-media-domains)."),
    part("file_id", "string", "Refused: nothing is stored here."),
))  # fmt: skip
_A_IMAGE_BLOCK = part("", "object", nullable=False, component="AnthropicImageBlock",
                       properties=(
    _block_type(_IMAGE), ANTHROPIC_IMAGE_SOURCE, _CACHE_CONTROL,
))  # fmt: skip
#: A tool result's content when it is not a string: text and image blocks.
ANTHROPIC_RESULT_BLOCKS: Final = {"text": _A_TEXT_BLOCK, _IMAGE: _A_IMAGE_BLOCK}
_A_RESULT_CONTENT: Schema = {
    "anyOf": [
        {"type": "string"},
        {"type": "array", "items": {"anyOf": [ref("AnthropicTextBlock"),
                                              ref("AnthropicImageBlock")]}},
    ]
}  # fmt: skip
#: A message's content blocks by ``type``, each with its fields in the order they are checked
#: (a ``tool_result``'s ``content`` is a string or text blocks, the endpoint's to tell apart).
ANTHROPIC_BLOCKS: Final = {
    "text": _A_TEXT_BLOCK,
    "tool_use": part("", "object", nullable=False, properties=(
        _block_type("tool_use"), part("id", "string", nullable=False),
        part("name", "string", nullable=False), part("input", "object", default={}),
        _CACHE_CONTROL)),
    "tool_result": part("", "object", nullable=False, properties=(
        _block_type("tool_result"), part("tool_use_id", "string", nullable=False),
        part("content", "custom", shape=fixed(_A_RESULT_CONTENT),
              description="A string, or text and image blocks."),
        part("is_error", "boolean", "An error result reaches the model as 'Error: ...'."),
        _CACHE_CONTROL)),
    "thinking": part("", "object", nullable=False, properties=(
        _block_type("thinking"), part("thinking", "string", nullable=False),
        part("signature", "string", "Not checked."))),
    "redacted_thinking": part("", "object", nullable=False, properties=(
        _block_type("redacted_thinking"), part("data", "string"))),
    _IMAGE: _A_IMAGE_BLOCK,
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
    # Anthropic's API has no audio block; a client that sends OpenAI's part here is told where
    # audio goes
    "audio": "audio (Anthropic's Messages API has no audio block: send audio as an "
    "'input_audio' part to /v1/chat/completions, or to /v1/audio/transcriptions)",
    "input_audio": "audio (Anthropic's Messages API has no audio block: send audio as an "
    "'input_audio' part to /v1/chat/completions, or to /v1/audio/transcriptions)",
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
ANTHROPIC_MESSAGE: Final = part("", "object", nullable=False, component="AnthropicMessage",
                                 properties=(
    part("role", "string", required=True, enum=("user", "assistant", "system"),
          description="``system``: a system message where it stands (a string or text "
          "blocks); a template that takes one only first gets it folded into a user turn."),
    part("content", "custom", required=True, shape=fixed(_A_CONTENT)),
))  # fmt: skip
#: A tool the model may call (``type`` ``custom`` or absent; server tools are left out).
ANTHROPIC_TOOL: Final = part("", "object", nullable=False, component="AnthropicTool", properties=(
    part("name", "string", required=True, min_length=1, expected="a non-empty string"),
    part("description", "string", falsy_is_null=True),
    part("input_schema", "schema", nullable=False, default={}, expected="a JSON schema object"),
    part("type", "string", "``custom``; a server tool's type (``web_search_20250305``, ...) "
          "is left out of what the model is offered."),
    _CACHE_CONTROL, part("strict", "any", "true: a keyword the grammar cannot enforce is "
                                         "refused; else it is relaxed."),
))  # fmt: skip
ANTHROPIC_TOOL_CHOICE: Final = part("tool_choice", "object", properties=(
    part("type", "string", required=True, enum=("auto", "any", "tool", "none")),
    part("name", "string", "The tool ``tool`` forces."),
    part("disable_parallel_tool_use", "boolean"),
))  # fmt: skip
ANTHROPIC_THINKING: Final = part("thinking", "object", properties=(
    part("type", "string", required=True,
          enum=("enabled", "adaptive", "between_tools", "disabled")),
    part("budget_tokens", "integer", "With ``enabled``: the reasoning budget (Anthropic's "
          "bounds, at least 1024 and below ``max_tokens``, are not enforced).",
          minimum=0, maximum=INT32_MAX),
    part("display", "string", "Accepted and ignored.", enum=("summarized", "omitted")),
))  # fmt: skip
ANTHROPIC_OUTPUT_CONFIG: Final = part("output_config", "object", properties=(
    part("effort", "string", enum=("low", "medium", "high", "xhigh", "max")),
    part("format", "object", "The reply's JSON schema, enforced by a grammar.", properties=(
        part("type", "string", required=True, enum=("json_schema",)),
        part("schema", "schema", required=True, expected="a JSON schema object"),
    )),
))  # fmt: skip

#: The fields of the Messages API and its token count.
ANTHROPIC_FIELDS: Final[tuple[Field, ...]] = (
    Field("model", "string", _anthropic(), "The model's name (resolved as every route's)."),
    Field("max_tokens", "integer", _anthropic(Body.MESSAGES), required=True, minimum=1,
          maximum=INT32_MAX, limit="max_tokens"),
    Field("max_tokens", "integer", _anthropic(Body.COUNT_TOKENS), "Accepted and ignored.",
          minimum=0, maximum=INT32_MAX),
    Field("messages", "array", _anthropic(), required=True, limit="max_messages",
          items=part("", "custom", nullable=False, component="AnthropicMessage"),
          empty="an array with at least one message"),
    Field("system", "custom", _anthropic(), "A text, or text blocks (joined by newlines).",
          shape=fixed(_A_TEXT_OR_BLOCKS)),
    Field("stop_sequences", "array", _anthropic(), limit="max_stop",
          items=part("", "string", nullable=False, min_length=1,
                      expected="a non-empty string")),
    Field("stream", "boolean", _anthropic(Body.MESSAGES)),
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
    Field("ignore_eos", "boolean", _anthropic(Body.MESSAGES),
          "llama.cpp's extension: generate through end-of-generation tokens (benchmarks)."),
    Field("metadata", "object", _anthropic(), "Accepted and ignored.",
          properties=(part("user_id", "any"),)),
    _anthropic_ignored("cache_control"),
    _anthropic_ignored("service_tier"),
    _anthropic_ignored("speed"),
    _anthropic_ignored("container"),
    _anthropic_ignored("inference_geo"),
    _anthropic_ignored("diagnostics"),
    _anthropic_ignored("context_management"),
    refused("mcp_servers", "remote MCP servers", Body.MESSAGES, Body.COUNT_TOKENS),
)  # fmt: skip


def anthropic_components(limits: RequestLimits) -> dict[str, Schema]:
    """The Messages API's schemas that the request schemas refer to."""
    return {
        "AnthropicMessage": ANTHROPIC_MESSAGE.body(limits),
        "AnthropicTextBlock": _A_TEXT_BLOCK.body(limits),
        "AnthropicImageBlock": _A_IMAGE_BLOCK.body(limits),
        "AnthropicTool": ANTHROPIC_TOOL.body(limits),
    }
