"""A chat completions request body in, an engine request out. Pure.

The fields are read as the field table (``llmtrio._fields``) says; ``messages`` and the
tools and structured-output fields (``_features``) have parsers of their own. Every refusal
is an :class:`OpenAIError` (400) naming the field.
"""

from __future__ import annotations

from typing import Any

import attrs

from .._fields import (
    CHAT,
    RequestLimits,
    checked_text,
    invalid_type,
    invalid_value,
    missing,
    read,
    show,
)
from .._openai_errors import invalid_request
from ..engine import ChatMessage, GenerateRequest, InvalidRequestError, Sampling
from ._features import (
    ToolChoice,
    parse_assistant_tool_calls,
    parse_response_format,
    parse_tools,
    tool_message,
)
from ._requests import (
    json_body,
    parse_logit_bias,
    parse_max_tokens,
    parse_sampling,
    parse_stop,
    parse_stream,
    reject_refused,
)
from ._responses import from_engine_error

__all__ = ["ChatCompletionRequest", "parse_chat_request"]

_NO_LIMITS = RequestLimits()

# Text parts of one message's content are joined the way llama.cpp's server joins them
# before templating (common_chat_msg::to_json_oaicompat with concat_typed_text).
_PART_SEPARATOR = "\n"
_ROLES = ("system", "user", "assistant", "tool")


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

    Accepted: the chat fields of the field table (``llmtrio._fields.FIELDS``): ``model``,
    ``messages``, ``max_tokens``, ``max_completion_tokens`` (wins over ``max_tokens``), the
    sampling fields and penalties, ``seed``, ``stop``, ``stream``,
    ``stream_options.include_usage``, ``n`` (1 only), ``think`` and
    ``chat_template_kwargs.enable_thinking`` (``think`` wins), ``ignore_eos``,
    ``cache_prompt`` (llama.cpp's: ``false`` reuses no earlier prompt's memory),
    ``logit_bias``, ``logprobs`` and ``top_logprobs``, ``response_format``, ``tools``,
    ``tool_choice`` and ``parallel_tool_calls``. An OpenAI field this server does not
    implement (``audio``, ``modalities``, ``prediction``, ...) is a 400 naming it; other
    fields are ignored; ``null`` is the same as absent.

    A grammar (``response_format`` json, a forced tool call) turns thinking off unless the
    request asks for it, which is a 400: the grammar holds from the first token.

    Sampling fields left out take the engine's :class:`Sampling` defaults, which are
    llama.cpp server's (temperature 0.8, top_p 0.95, top_k 40, min_p 0.05) rather than
    OpenAI's (temperature 1, top_p 1): OpenAI's defaults are tuned for its own models, while a
    small local model sampled at temperature 1 with no truncation drifts into noise, and users
    of local OpenAI-compatible servers expect llama.cpp's behaviour.

    The body's size is the ingress's to limit (``--max-body-bytes``), once.

    Error handling: raises :class:`OpenAIError`, 400 for anything wrong (invalid UTF-8 or
    JSON, a body that is not an object, a field of the wrong type or out of range, an
    unsupported message, a request over one of ``limits``), naming the offending field in
    ``param``.
    """
    data = json_body(body)
    reject_refused(data, CHAT, limits)
    model = read(data, CHAT, "model", limits)
    messages = _parse_messages(data.get("messages"), limits.max_messages)
    max_tokens = parse_max_tokens(data, CHAT, limits)
    sampling = parse_sampling(data, CHAT, limits)
    logprobs = _parse_logprobs(data, limits)
    tools = parse_tools(data)
    grammar = parse_response_format(data.get("response_format"))
    tool_grammar = tools.grammar()
    if tool_grammar is not None:
        grammar = tool_grammar  # a forced call wins over the format of a plain reply
    stop = parse_stop(data.get("stop"), limits)
    read(data, CHAT, "n", limits)
    stream, include_usage = parse_stream(data, CHAT, limits)
    think = _parse_think(data, limits)
    if grammar is not None:
        if think:
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
            ignore_eos=read(data, CHAT, "ignore_eos", limits) or False,
            cache_prompt=read(data, CHAT, "cache_prompt", limits) is not False,
            logit_bias=parse_logit_bias(data.get("logit_bias")),
            grammar=grammar,
            logprobs=logprobs,
            tools=tools.tools if tools.mode != "none" else (),
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
    logprobs = read(data, CHAT, "logprobs", limits)
    top = read(data, CHAT, "top_logprobs", limits)
    if top is not None and not logprobs:
        raise invalid_value(
            "top_logprobs", "'logprobs' must be set to true when 'top_logprobs' is used."
        )
    return (top or 0) if logprobs else None


def _parse_think(data: dict[str, Any], limits: RequestLimits) -> bool | None:
    """``think``, else ``chat_template_kwargs.enable_thinking``."""
    think: bool | None = read(data, CHAT, "think", limits)
    kwargs = data.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise invalid_type("chat_template_kwargs", "an object", kwargs)
        enable = kwargs.get("enable_thinking")
        if enable is not None and not isinstance(enable, bool):
            raise invalid_type("chat_template_kwargs.enable_thinking", "a boolean", enable)
        if think is None:
            think = enable
    return think


def _parse_messages(value: object, limit: int) -> list[ChatMessage]:
    if value is None:
        raise missing("messages")
    if not isinstance(value, list):
        raise invalid_type("messages", "an array", value)
    if not value:
        raise invalid_value(
            "messages", "empty array. Expected an array with at least one message.", "empty_array"
        )
    if len(value) > limit:
        raise invalid_value(
            "messages",
            f"array too long. Expected an array with maximum length {limit}, but got an array "
            f"with length {len(value)} instead.",
            "array_above_max_length",
        )
    messages = []
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise invalid_type(where, "an object", item)
        role = item.get("role")
        if role is None:
            raise missing(f"{where}.role")
        if not isinstance(role, str):
            raise invalid_type(f"{where}.role", "a string", role)
        if role == "developer":
            role = "system"
        elif role not in _ROLES:
            hint = " (use 'tool')" if role == "function" else ""
            raise invalid_request(
                f"Invalid value for '{where}.role': {show(role)}{hint}. Supported values are: "
                f"'system', 'developer', 'user', 'assistant' and 'tool'.",
                param=f"{where}.role",
                code="invalid_value",
            )
        name = item.get("name")
        if name is not None and not isinstance(name, str):  # a participant's name: unused
            raise invalid_type(f"{where}.name", "a string", name)
        calls = (
            parse_assistant_tool_calls(item.get("tool_calls"), f"{where}.tool_calls")
            if role == "assistant"
            else []
        )
        content = _parse_content(item.get("content"), f"{where}.content", role)
        if role == "tool":
            messages.append(tool_message(content, item, where))
        else:
            messages.append(ChatMessage(role, content, tool_calls=calls))
    return messages


def _parse_content(value: object, where: str, role: str) -> str:
    if isinstance(value, str):
        return checked_text(value, where)
    if value is None:
        if role == "assistant":
            return ""
        raise missing(where, " (only assistant messages may omit it)")
    if not isinstance(value, list):
        raise invalid_type(where, "a string or an array of text parts", value)
    if not value:
        raise invalid_value(
            where, "empty array. Expected a string or at least one text part.", "empty_array"
        )
    texts = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise invalid_type(at, "an object", part)
        kind = part.get("type")
        if kind != "text":
            if kind is None:
                raise missing(f"{at}.type")
            raise invalid_request(
                f"Invalid value for '{at}.type': {show(kind)}. This server accepts text "
                f"content parts only ('text').",
                param=f"{at}.type",
                code="invalid_value",
            )
        piece = part.get("text")
        if not isinstance(piece, str):
            raise invalid_type(f"{at}.text", "a string", piece)
        texts.append(checked_text(piece, f"{at}.text"))
    return _PART_SEPARATOR.join(texts)
