"""An Anthropic Messages API request body in, an engine request out. Pure.

The fields are read and checked as the field table (``llmtrio.api._fields``, the Messages API's
section) says; what is left here is what the table cannot say: a content block's ``type``
picks its fields, content is a string or blocks, and rules across fields. The conversation
becomes chat messages for the model's template, as chat completions' do:

- ``system`` (a string or text blocks, joined by newlines) is the first, system, message; a
  block that is Claude Code's ``x-anthropic-billing-header:`` has its per-request ``cch=``
  stamp normalized, as llama.cpp's server does (:func:`normalize_billing_header`), so the
  prompt after it is reused from one request to the next;
- a ``system`` message in ``messages`` (a string or text blocks) is a system message where
  it stands (Claude Code sends one after the first user turn); the engine folds it into a
  user turn for a template that takes a system message only first;
- a user turn's ``tool_result`` blocks become ``tool`` messages, in order, before the text
  of the turn (an error result reads ``Error: ...``); its text blocks are joined by newlines;
- an ``image`` block (in a user turn, or in a tool result's content) with a ``base64``
  source is a media marker where it stands in the text and an image of the message (see
  ``worker._images``); a ``url`` or ``file`` source is a 400 naming it (remote URLs are not
  fetched);
- an assistant turn's text blocks are its content and its ``tool_use`` blocks its calls;
  ``thinking`` and ``redacted_thinking`` blocks from earlier turns are accepted and not
  replayed (templates drop earlier reasoning; their ``signature`` is not checked);
- a conversation that ends with an assistant turn (Anthropic's "prefill") is a 400: the
  template opens a new turn after it.

Every refusal is an :class:`ApiError` (400) naming the field or the block, told in
Anthropic's error shape by the route (``llmtrio.api.error_family``).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from typing import Any

import attrs

from ..api import (
    ANTHROPIC_BLOCKS,
    ANTHROPIC_MESSAGE,
    ANTHROPIC_REFUSED_BLOCKS,
    ANTHROPIC_RESULT_BLOCKS,
    ANTHROPIC_TEXT_BLOCKS,
    ANTHROPIC_TOOL,
    IMAGE_PARTS,
    Body,
    RequestLimits,
    check,
    checked_text,
    invalid_request,
    invalid_type,
    invalid_value,
    missing,
    read,
    show,
)
from ..engine import (
    MEDIA_MARKER,
    ChatMessage,
    GenerateRequest,
    Image,
    InvalidRequestError,
    Sampling,
    Tool,
    ToolCall,
)
from ._encoding import from_engine_error
from ._features import ToolChoice, choose_tools
from ._fetch import is_remote
from ._images import image_from_bytes, remote_image
from ._reasoning import ADAPTIVE_EFFORT, Reasoning, for_effort
from ._requests import json_body, parse_max_tokens, reject_refused

__all__ = [
    "BILLING_HEADER",
    "MessagesRequest",
    "normalize_billing_header",
    "parse_messages_request",
]

#: The ``type`` of Anthropic's image blocks.
_IMAGE = IMAGE_PARTS[Body.MESSAGES]

logger = logging.getLogger("llmtrio.worker")

_NO_LIMITS = RequestLimits()
# Text blocks are joined as chat completions' text parts are.
_SEPARATOR = "\n"


@attrs.frozen
class MessagesRequest:
    """A parsed ``POST /v1/messages`` (or ``/v1/messages/count_tokens``: then ``generate``'s
    prompt is what is counted). ``tools`` says which tools the reply may call;
    ``stop_sequences`` are the request's, to name the one that stopped the reply."""

    model: str | None
    generate: GenerateRequest
    stream: bool = False
    tools: ToolChoice = attrs.field(factory=ToolChoice)


def parse_messages_request(
    body: bytes, limits: RequestLimits = _NO_LIMITS, *, endpoint: str = Body.MESSAGES
) -> MessagesRequest:
    """Parse and validate a Messages API request body (``endpoint``: ``messages`` or
    ``count_tokens``, which takes the same body without needing ``max_tokens``).

    Honoured: ``model``, ``max_tokens``, ``system``, ``messages``, ``stop_sequences``,
    ``stream``, ``temperature``, ``top_p``, ``top_k``, ``tools``, ``tool_choice`` (``auto``,
    ``any``, ``tool``, ``none``; ``disable_parallel_tool_use``), ``thinking`` and
    ``output_config`` (``effort``, ``format``), and llama.cpp's ``ignore_eos``.
    ``metadata``, ``cache_control``, ``service_tier``, ``speed``, ``container``,
    ``inference_geo``, ``diagnostics`` and ``context_management`` are accepted and
    ignored; ``image`` blocks with a ``base64`` source are taken by a model with a vision
    projector; ``mcp_servers``, image ``url``/``file`` sources, document and server-tool
    blocks are 400s naming them.

    Reasoning: ``thinking.type`` ``enabled`` turns thinking on within ``budget_tokens``
    (Anthropic's bounds, at least 1024 and below ``max_tokens``, are not enforced: a local
    model's context is small, and ``max_tokens`` ends a reply still thinking as it ends any
    other); ``adaptive`` and ``between_tools`` turn it on within ``output_config.effort``'s
    budget (``worker._reasoning``; medium's when none is named); ``disabled`` turns it off;
    absent, ``output_config.effort`` alone picks the budget, or the template's default holds.
    A forced tool call (``any``, ``tool``) or ``output_config.format`` turns thinking off
    (their grammar holds from the first token); with thinking asked for, that is a 400.

    Error handling: raises :class:`ApiError`, 400 naming the field or block.
    """
    data = json_body(body)
    reject_refused(data, endpoint, limits)
    model = read(data, endpoint, "model", limits)
    for name in ("metadata", "cache_control", "service_tier", "speed", "container"):
        read(data, endpoint, name, limits)
    messages = [*_system(data, endpoint, limits), *_messages(data, endpoint, limits)]
    if endpoint == Body.MESSAGES:
        max_tokens = parse_max_tokens(data, endpoint, limits)
        stream = bool(read(data, endpoint, "stream", limits))
    else:
        read(data, endpoint, "max_tokens", limits)
        max_tokens, stream = None, False
    sampling = {
        name: value
        for name in ("temperature", "top_p", "top_k")
        if (value := read(data, endpoint, name, limits)) is not None
    }
    stop = _stop_sequences(data, endpoint, limits)
    tools = _tools(data, endpoint, limits)
    output_format = _output_format(data, endpoint, limits)
    if tools.forced:
        output_format = {}  # a forced call wins over the format of a plain reply
    reasoning = _reasoning(data, endpoint, limits)
    if output_format or tools.forced:
        asked = (read(data, endpoint, "thinking", limits) or {}).get("type", "disabled")
        if asked != "disabled":
            what = "a forced tool call" if tools.forced else "'output_config.format'"
            raise invalid_value(
                "thinking",
                f"thinking cannot be combined with {what}: its grammar holds from the first token.",
            )
        reasoning = Reasoning(think=False)  # an effort alone asks for no thinking here
    try:
        generate = GenerateRequest(
            messages=messages,
            max_tokens=max_tokens,
            sampling=Sampling(**sampling),
            stop=stop,
            think=reasoning.think,
            ignore_eos=endpoint == Body.MESSAGES
            and bool(read(data, endpoint, "ignore_eos", limits)),
            reasoning_budget=reasoning.budget if reasoning.think else None,
            **output_format,
            **_tool_options(tools),
        )
    except InvalidRequestError as exc:
        raise from_engine_error(exc) from None
    return MessagesRequest(model=model, generate=generate, stream=stream, tools=tools)


def _system(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> list[ChatMessage]:
    value = data.get("system")
    if value is None:
        return []
    if isinstance(value, str):
        value = normalize_billing_header(value)
    elif isinstance(value, list):
        value = [
            {**block, "text": normalize_billing_header(block["text"])}
            if isinstance(block, dict) and isinstance(block.get("text"), str)
            else block
            for block in value
        ]
    text = _text_or_blocks(value, "system", limits)
    return [ChatMessage("system", text)] if text else []


#: How Claude Code's attribution block starts (a system block of its own, first).
BILLING_HEADER = "x-anthropic-billing-header:"
_STAMP = "cch="
_STAMP_LENGTH = 5


def normalize_billing_header(text: str) -> str:
    """``text`` with the 5-character ``cch=`` stamp of a leading
    ``x-anthropic-billing-header:`` written ``fffff``, as llama.cpp's server does
    (``normalize_anthropic_billing_header``, llama.cpp PR 21793): Claude Code stamps each
    request anew, and the stamp, at the very start of the prompt, would keep the prompt cache
    from reusing anything after it. Any other text is returned as it is."""
    if not text.startswith(BILLING_HEADER):
        return text
    at = text.find(_STAMP, len(BILLING_HEADER))
    if at < 0:
        return text
    start = at + len(_STAMP)
    end = start + _STAMP_LENGTH
    if end >= len(text) or text[end] != ";":
        logger.warning("an x-anthropic-billing-header block not as expected: %r", text[:200])
        return text
    return text[:start] + "f" * _STAMP_LENGTH + text[end:]


def _text_or_blocks(value: object, where: str, limits: RequestLimits) -> str:
    """A string, or text blocks joined (``system``, a tool result's content)."""
    if isinstance(value, str):
        return checked_text(value, where)
    if not isinstance(value, list):
        raise invalid_type(where, "a string or an array of text blocks", value)
    for i, block in enumerate(value):
        _refuse_block(block, f"{where}[{i}]", ("text",))
    blocks = check(ANTHROPIC_TEXT_BLOCKS, value, limits, where)
    return _SEPARATOR.join(block["text"] for block in blocks)


def _refuse_block(block: object, where: str, allowed: tuple[str, ...]) -> str:
    """A block's ``type``, refused with a 400 naming the block unless it is ``allowed``."""
    if not isinstance(block, dict):
        raise invalid_type(where, "an object", block)
    kind = block.get("type")
    if kind is None:
        raise missing(f"{where}.type")
    if kind in allowed:
        return str(kind)
    if kind in ANTHROPIC_REFUSED_BLOCKS:
        raise invalid_request(
            f"Unsupported content block at '{where}': this server does not take "
            f"{ANTHROPIC_REFUSED_BLOCKS[kind]} ({show(kind)} blocks).",
            param=f"{where}.type",
            code="unsupported_parameter",
        )
    raise invalid_value(
        f"{where}.type", f"{show(kind)}. Supported values here are: {', '.join(allowed)}."
    )


_USER_BLOCKS = ("text", _IMAGE, "tool_result")
_RESULT_BLOCKS = ("text", _IMAGE)
_ASSISTANT_BLOCKS = ("text", "tool_use", "thinking", "redacted_thinking")


def _messages(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> list[ChatMessage]:
    """``messages``, each turn as the chat messages it makes (see the module's doc)."""
    items = read(data, endpoint, "messages", limits)
    messages: list[ChatMessage] = []
    for i, item in enumerate(items):
        where = f"messages[{i}]"
        check(ANTHROPIC_MESSAGE, item, limits, where)
        role, content = item["role"], item.get("content")
        if content is None:
            raise missing(f"{where}.content")
        if role == "assistant" and i == len(items) - 1:
            raise invalid_value(
                where,
                "the last message must be the user's: this server does not continue an "
                "assistant turn (prefill).",
            )
        if role == "system":
            text = _text_or_blocks(content, f"{where}.content", limits)
            messages.append(ChatMessage("system", text))
        elif isinstance(content, str):
            messages.append(ChatMessage(role, checked_text(content, f"{where}.content")))
        elif not isinstance(content, list):
            raise invalid_type(f"{where}.content", "a string or an array of blocks", content)
        elif role == "user":
            messages += _user_blocks(content, f"{where}.content", limits)
        else:
            messages.append(_assistant_blocks(content, f"{where}.content", limits))
    return messages


def _user_blocks(blocks: list[Any], where: str, limits: RequestLimits) -> list[ChatMessage]:
    results: list[ChatMessage] = []
    texts: list[str] = []
    images: list[Image] = []
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]"
        kind = _refuse_block(block, at, _USER_BLOCKS)
        check(ANTHROPIC_BLOCKS[kind], block, limits, at)
        if kind == "text":
            texts.append(block["text"])
            continue
        if kind == _IMAGE:
            images.append(_image(block, at, limits))
            texts.append(MEDIA_MARKER)
            continue
        results.append(_tool_result(block, at, limits))
    if texts or not results:
        results.append(ChatMessage("user", _SEPARATOR.join(texts), media=images))
    return results


def _tool_result(block: dict[str, Any], where: str, limits: RequestLimits) -> ChatMessage:
    """A ``tool_result`` block as a ``tool`` message: its content a string, or text and
    image blocks (each image a media marker where it stands)."""
    result = block.get("content")
    images: list[Image] = []
    if result is None:
        text = ""
    elif isinstance(result, list):
        texts = []
        for i, item in enumerate(result):
            at = f"{where}.content[{i}]"
            kind = _refuse_block(item, at, _RESULT_BLOCKS)
            check(ANTHROPIC_RESULT_BLOCKS[kind], item, limits, at)
            if kind == _IMAGE:
                images.append(_image(item, at, limits))
                texts.append(MEDIA_MARKER)
            else:
                texts.append(item["text"])
        text = _SEPARATOR.join(texts)
    else:
        text = _text_or_blocks(result, f"{where}.content", limits)
    if block.get("is_error"):
        text = f"Error: {text}" if text else "Error"
    return ChatMessage("tool", text, tool_call_id=block["tool_use_id"], media=images)


def _image(block: dict[str, Any], where: str, limits: RequestLimits) -> Image:
    """An ``image`` block (checked against the table): its ``base64`` source's bytes, their
    header read and checked (``worker._images``); the declared ``media_type`` must be an image
    type, the bytes decide which. A ``url`` source is a ``RemoteImage``, fetched by the
    endpoint's ``run``.

    Error handling: :class:`ApiError` (400) naming the source's field: a ``url`` source
    of a host not allowed, a ``file`` source, a missing ``media_type`` or ``data``, bad
    base64, bytes that are no image."""
    source = block["source"]
    at = f"{where}.source"
    kind = source["type"]
    if kind == "url":
        url = source.get("url")
        if url is None:
            raise missing(f"{at}.url", " (a 'url' source has one)")
        if not is_remote(url):
            raise invalid_value(f"{at}.url", "not an http(s) URL.")
        return remote_image(url, f"{at}.url", limits)
    if kind == "file":
        raise invalid_request(
            f"Unsupported image source at '{at}': 'file' sources refer to stored files, and "
            "nothing is stored here; send the image as a 'base64' source.",
            param=f"{at}.type",
            code="unsupported_parameter",
        )
    for name in ("media_type", "data"):
        if source.get(name) is None:
            raise missing(f"{at}.{name}", " (a 'base64' source has both)")
    try:
        data = base64.b64decode(source["data"], validate=True)
    except (binascii.Error, ValueError):
        raise invalid_value(f"{at}.data", "not valid base64.") from None
    return image_from_bytes(data, f"{at}.data", limits)


def _assistant_blocks(blocks: list[Any], where: str, limits: RequestLimits) -> ChatMessage:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for i, block in enumerate(blocks):
        at = f"{where}[{i}]"
        kind = _refuse_block(block, at, _ASSISTANT_BLOCKS)
        check(ANTHROPIC_BLOCKS[kind], block, limits, at)
        if kind == "text":
            texts.append(block["text"])
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append(ToolCall(block["id"], block["name"], arguments))
        # thinking and redacted_thinking: accepted, not replayed (see the module's doc)
    return ChatMessage("assistant", _SEPARATOR.join(texts), tool_calls=calls)


def _stop_sequences(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> tuple[str, ...]:
    stops = read(data, endpoint, "stop_sequences", limits) or []
    for i, stop in enumerate(stops):
        if len(stop) > limits.max_stop_chars:
            raise invalid_value(
                f"stop_sequences[{i}]",
                f"string too long. Expected a string with maximum length "
                f"{limits.max_stop_chars}, but got a string with length {len(stop)} instead.",
                "string_above_max_length",
            )
    return tuple(stops)


def _tools(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> ToolChoice:
    """``tools`` (custom tools; server tools are left out with a warning, as clients send
    them beside their own) and ``tool_choice``."""
    tools: list[Tool] = []
    for i, item in enumerate(read(data, endpoint, "tools", limits) or ()):
        at = f"tools[{i}]"
        if not isinstance(item, dict):
            raise invalid_type(at, "an object", item)
        kind = item.get("type")
        if kind not in (None, "custom"):
            logger.warning("left out %s: a server tool (%r) this server cannot run", at, kind)
            continue
        check(ANTHROPIC_TOOL, item, limits, at)
        name = item["name"]
        if any(t.name == name for t in tools):
            raise invalid_value("tools", f"the name {show(name)} is used twice.")
        schema = item.get("input_schema") or {"type": "object", "properties": {}}
        strict = item.get("strict") is True
        tools.append(Tool(name, item.get("description") or "", schema, strict=strict))
    choice = read(data, endpoint, "tool_choice", limits) or {}
    parallel = not choice.get("disable_parallel_tool_use", False)
    kind = choice.get("type", "auto")
    if kind == "tool":
        name = choice.get("name")
        if name is None:
            raise missing("tool_choice.name", " (tool_choice 'tool' names the tool)")
        return choose_tools(tools, "required", name=name, parallel=parallel,
                            param="tool_choice.name")  # fmt: skip
    mode = "required" if kind == "any" else kind
    return choose_tools(tools, mode, parallel=parallel, said=kind)


def _tool_options(tools: ToolChoice) -> dict[str, Any]:
    """The :class:`GenerateRequest` tool arguments. Unlike chat's ``none``, Anthropic's
    ``none`` still shows the tools to the template (they are defined, only not to be called
    now): the prompt stays the one the conversation's other turns have, so it is reused."""
    if tools.mode == "none" and tools.tools:
        return {"tools": tools.tools, "tool_choice": "none"}
    return tools.generate_options()


def _output_format(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> dict[str, Any]:
    config = read(data, endpoint, "output_config", limits) or {}
    output_format = config.get("format")
    if output_format is None:
        return {}
    # Anthropic's structured outputs are always exact: a keyword the grammar cannot enforce
    # is refused, as Anthropic's API refuses it.
    return {"json_schema": output_format["schema"], "json_schema_strict": True}


def _reasoning(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> Reasoning:
    """``thinking`` and ``output_config.effort`` as one :class:`Reasoning` (see
    :func:`parse_messages_request`)."""
    thinking = read(data, endpoint, "thinking", limits)
    effort = (read(data, endpoint, "output_config", limits) or {}).get("effort")
    kind = None if thinking is None else thinking["type"]
    if kind == "disabled":
        return Reasoning(think=False)
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if budget is None:
            raise missing("thinking.budget_tokens", " (thinking 'enabled' sets a budget)")
        return Reasoning(think=True, budget=budget)
    if kind is not None:  # adaptive, between_tools
        return for_effort(effort or ADAPTIVE_EFFORT)
    return Reasoning() if effort is None else for_effort(effort)
