"""A chat completions request body in, an engine request out. Pure.

The fields are read and checked as the field table (``llmtrio.api._fields``) says, nested ones
included; what is left here (and in ``_features`` for tools and structured output) is what the
table cannot say: a message's role picks which fields it has, its content is a string or
text parts, and rules across fields. Every refusal is an :class:`ApiError` (400) naming
the field.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import attrs

from ..api import (
    AUDIO_PARTS,
    IMAGE_PARTS,
    IMAGE_URL_PART,
    MESSAGE_FIELDS,
    MESSAGE_ROLES,
    TEXT_PARTS,
    Body,
    RequestLimits,
    check,
    checked_text,
    choices,
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
    InvalidRequestError,
    Media,
    Sampling,
)
from ._audio import audio_from_part
from ._encoding import from_engine_error
from ._features import (
    ToolChoice,
    parse_assistant_tool_calls,
    parse_response_format,
    parse_tools,
)
from ._images import image_from_part
from ._reasoning import Reasoning, for_effort
from ._requests import (
    json_body,
    parse_logit_bias,
    parse_max_tokens,
    parse_sampling,
    parse_stop,
    parse_stream,
    reject_refused,
)

__all__ = ["ChatCompletionRequest", "parse_chat_request"]

#: The ``type`` of chat's image and audio parts.
_IMAGE = IMAGE_PARTS[Body.CHAT]
_AUDIO = AUDIO_PARTS[Body.CHAT]

_NO_LIMITS = RequestLimits()

# Text parts of one message's content are joined the way llama.cpp's server joins them
# before templating (common_chat_msg::to_json_oaicompat with concat_typed_text).
_PART_SEPARATOR = "\n"


@attrs.frozen
class ChatCompletionRequest:
    """A parsed ``POST /v1/chat/completions``.

    ``model`` is the name the client asked for (``None`` when absent); ``include_usage`` is
    ``stream_options.include_usage`` (a usage chunk before ``[DONE]``); ``tools`` says which
    tools the reply may call (and whether to look for calls); ``logprobs`` whether to report
    log-probabilities.
    """

    model: str | None
    generate: GenerateRequest
    stream: bool = False
    include_usage: bool = False
    tools: ToolChoice = attrs.field(factory=ToolChoice)
    logprobs: bool = False


def parse_chat_request(body: bytes, limits: RequestLimits = _NO_LIMITS) -> ChatCompletionRequest:
    """Parse and validate a chat completions request body.

    Accepted: the chat fields of the field table (``llmtrio.api.FIELDS``): ``model``,
    ``messages``, ``max_tokens``, ``max_completion_tokens`` (wins over ``max_tokens``), the
    sampling fields and penalties, ``seed``, ``stop``, ``stream``,
    ``stream_options.include_usage``, ``n`` (1 only), ``think`` and
    ``chat_template_kwargs.enable_thinking`` (``think`` wins), ``reasoning_effort``
    (thinking on or off and a reasoning budget, ``_reasoning.EFFORTS``; an explicit
    ``think``/``enable_thinking`` wins on the switch, the budget holds whenever the model
    thinks), ``ignore_eos``,
    ``cache_prompt`` (llama.cpp's: ``false`` reuses no earlier prompt's memory),
    ``logit_bias``, ``logprobs`` and ``top_logprobs``, ``response_format``, ``tools``,
    ``tool_choice`` and ``parallel_tool_calls``. An OpenAI field this server does not
    implement (``audio``, ``modalities``, ``prediction``, ...) is a 400 naming it; other
    fields are ignored; ``null`` is the same as absent.

    A grammar (``response_format`` json, a forced tool call) turns thinking off unless the
    request asks for it with ``think``/``enable_thinking``, which is a 400: the grammar
    holds from the first token (a ``reasoning_effort`` is then moot, not refused).

    Sampling fields left out take the engine's :class:`Sampling` defaults, which are
    llama.cpp server's (temperature 0.8, top_p 0.95, top_k 40, min_p 0.05) rather than
    OpenAI's (temperature 1, top_p 1): OpenAI's defaults are tuned for its own models, while a
    small local model sampled at temperature 1 with no truncation drifts into noise, and users
    of local OpenAI-compatible servers expect llama.cpp's behaviour.

    The body's size is the ingress's to limit (``--max-body-bytes``), once.

    Error handling: raises :class:`ApiError`, 400 for anything wrong (invalid UTF-8 or
    JSON, a body that is not an object, a field of the wrong type or out of range, an
    unsupported message, a request over one of ``limits``), naming the offending field in
    ``param``.
    """
    data = json_body(body)
    reject_refused(data, Body.CHAT, limits)
    model = read(data, Body.CHAT, "model", limits)
    messages = _parse_messages(data, limits)
    max_tokens = parse_max_tokens(data, Body.CHAT, limits)
    sampling = parse_sampling(data, Body.CHAT, limits)
    logprobs = _parse_logprobs(data, limits)
    tools = parse_tools(data, limits)
    output_format = parse_response_format(data, Body.CHAT, limits)
    if tools.forced:
        output_format = {}  # a forced call wins over the format of a plain reply
    stop = parse_stop(data.get("stop"), limits)
    read(data, Body.CHAT, "n", limits)
    stream, include_usage = parse_stream(data, Body.CHAT, limits)
    think = _parse_think(data, limits)
    reasoning = _parse_effort(data, limits)
    asked = think  # the request's own switch wins over its effort's
    if think is None:
        think = reasoning.think
    if output_format or tools.forced:
        if asked:
            raise invalid_value(
                "think",
                "thinking cannot be combined with 'response_format' json or a forced tool "
                "call: the grammar holds from the first token.",
            )
        think = False
    try:
        generate = GenerateRequest(
            messages=messages,
            max_tokens=max_tokens,
            sampling=Sampling(**sampling),
            stop=stop,
            think=think,
            ignore_eos=read(data, Body.CHAT, "ignore_eos", limits) or False,
            cache_prompt=read(data, Body.CHAT, "cache_prompt", limits) is not False,
            logit_bias=parse_logit_bias(data.get("logit_bias")),
            logprobs=logprobs,
            reasoning_budget=reasoning.budget,
            **output_format,
            **tools.generate_options(),
        )
    except InvalidRequestError as exc:
        raise from_engine_error(exc) from None
    return ChatCompletionRequest(
        model=model,
        generate=generate,
        stream=stream,
        include_usage=include_usage,
        tools=tools,
        logprobs=logprobs is not None,
    )


def _parse_logprobs(data: dict[str, Any], limits: RequestLimits) -> int | None:
    """``logprobs`` (a boolean) and ``top_logprobs`` (only with ``logprobs``): the number of
    alternatives to report, or ``None`` for no log-probabilities."""
    logprobs = read(data, Body.CHAT, "logprobs", limits)
    top = read(data, Body.CHAT, "top_logprobs", limits)
    if top is not None and not logprobs:
        raise invalid_value(
            "top_logprobs", "'logprobs' must be set to true when 'top_logprobs' is used."
        )
    return (top or 0) if logprobs else None


def _parse_effort(data: dict[str, Any], limits: RequestLimits) -> Reasoning:
    """``reasoning_effort``: thinking on or off and a budget (``_reasoning.EFFORTS``)."""
    effort: str | None = read(data, Body.CHAT, "reasoning_effort", limits)
    return Reasoning() if effort is None else for_effort(effort)


def _parse_think(data: dict[str, Any], limits: RequestLimits) -> bool | None:
    """``think``, else ``chat_template_kwargs.enable_thinking``."""
    think: bool | None = read(data, Body.CHAT, "think", limits)
    kwargs = read(data, Body.CHAT, "chat_template_kwargs", limits)
    if kwargs is not None and think is None:
        think = kwargs.get("enable_thinking")
    return think


def _parse_messages(data: dict[str, Any], limits: RequestLimits) -> list[ChatMessage]:
    """``messages``: the array as the field table bounds it, each message's fields as the
    table says for its role, and its content."""
    messages = []
    for i, item in enumerate(read(data, Body.CHAT, "messages", limits)):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise invalid_type(where, "an object", item)
        role = _parse_role(item.get("role"), f"{where}.role")
        content = ""
        media: list[Media] = []
        for part in MESSAGE_FIELDS[role].properties:
            at = f"{where}.{part.name}"
            if part.name == "content":
                value = item.get("content")
                if role == "user" and _has_media(value):
                    content, media = _parse_media_content(value, at, limits)
                else:
                    content = _parse_content(value, at, role, limits)
            else:
                check(part, item.get(part.name, part.default), limits, at)
        calls = parse_assistant_tool_calls(item.get("tool_calls")) if role == "assistant" else []
        if role == "tool":
            messages.append(ChatMessage("tool", content, tool_call_id=item.get("tool_call_id")))
        else:
            role = "system" if role == "developer" else role
            messages.append(ChatMessage(role, content, tool_calls=calls, media=media))
    return messages


def _has_media(value: object) -> TypeGuard[list[Any]]:
    return isinstance(value, list) and any(
        isinstance(part, dict) and part.get("type") in (_IMAGE, _AUDIO) for part in value
    )


def _parse_media_content(
    value: list[Any], where: str, limits: RequestLimits
) -> tuple[str, list[Media]]:
    """A user message's parts with media: text parts (``TextPart``), ``image_url`` parts
    (``IMAGE_URL_PART``) and ``input_audio`` parts (``INPUT_AUDIO_PART``), each image or
    audio file a media marker in the text (parts joined by newlines) and an :class:`Image`
    or :class:`Audio`, its header read and checked (``max_image_pixels``,
    ``max_audio_seconds``).

    Error handling: :class:`ApiError` (400) naming the part: a part of the wrong shape, a
    URL neither a ``data:`` URI nor an ``http(s)`` URL of an allowed host (fetched later, by
    the endpoint's ``run``), bytes that are not an image or an audio file, too many pixels,
    audio too long."""
    texts: list[str] = []
    media: list[Media] = []
    for i, part in enumerate(value):
        at = f"{where}[{i}]"
        if isinstance(part, dict) and part.get("type") == _IMAGE:
            checked = check(IMAGE_URL_PART, part, limits, at)
            media.append(
                image_from_part(checked["image_url"]["url"], f"{at}.image_url.url", limits)
            )
            texts.append(MEDIA_MARKER)
        elif isinstance(part, dict) and part.get("type") == _AUDIO:
            media.append(audio_from_part(part, at, limits))
            texts.append(MEDIA_MARKER)
        else:
            assert TEXT_PARTS.items is not None
            texts.append(check(TEXT_PARTS.items, part, limits, at).get("text") or "")
    return _PART_SEPARATOR.join(texts), media


def _parse_role(role: object, param: str) -> str:
    """A message's ``role``, which says what else the message may hold."""
    if role is None:
        raise missing(param)
    if not isinstance(role, str):
        raise invalid_type(param, "a string", role)
    if role not in MESSAGE_ROLES:
        hint = " (use 'tool')" if role == "function" else ""
        raise invalid_request(
            f"Invalid value for '{param}': {show(role)}{hint}. Supported values are: "
            f"{choices(MESSAGE_ROLES)}.",
            param=param,
            code="invalid_value",
        )
    return role


def _parse_content(value: object, where: str, role: str, limits: RequestLimits) -> str:
    """A message's content: a string, or text parts (``TEXT_PARTS``) joined."""
    if isinstance(value, str):
        return checked_text(value, where)
    if value is None:
        if role == "assistant":
            return ""
        raise missing(where, " (only assistant messages may omit it)")
    if not isinstance(value, list):
        raise invalid_type(where, "a string or an array of text parts", value)
    parts = check(TEXT_PARTS, value, limits, where)
    return _PART_SEPARATOR.join(part["text"] for part in parts)
