"""OpenAI chat completions, translated: request bodies in, response bytes out.

Pure: no I/O, no clock, no randomness except :func:`new_completion_id`. The HTTP layer reads
the body, calls :func:`parse_chat_request`, runs the :class:`GenerateRequest` it carries, and
writes what :class:`ChatCompletionStream` or :func:`completion_body` return; every refusal is
an :class:`OpenAIError` (``llmtrio._openai_errors``, shared with the ingress) that knows its
HTTP status and renders its own body.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Sequence
from json.encoder import encode_basestring as _encode_basestring
from typing import Any, NoReturn

import attrs

from .._openai_errors import (
    DEFAULT_MAX_BODY_BYTES,
    OpenAIError,
    dumps,
    invalid_request,
    method_not_allowed,
    not_found,
    request_too_large,
    ring_full,
    server_error,
)
from ..engine import (
    ChatMessage,
    Done,
    EngineClosedError,
    EngineError,
    EngineFailedError,
    GenerateRequest,
    InvalidRequestError,
    PromptTooLongError,
    RequestError,
    Sampling,
    Token,
    TokenLogprob,
    ToolCall,
)
from ._features import (
    ToolChoice,
    parse_assistant_tool_calls,
    parse_chat_logprobs,
    parse_penalties,
    parse_response_format,
    parse_tools,
    reject_unimplemented,
    tool_message,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "ChatCompletionRequest",
    "ChatCompletionStream",
    "OpenAIError",
    "RequestLimits",
    "completion_body",
    "from_engine_error",
    "invalid_request",
    "method_not_allowed",
    "new_completion_id",
    "not_found",
    "parse_chat_request",
    "request_too_large",
    "ring_full",
    "server_error",
]

# Text parts of one message's content are joined the way llama.cpp's server joins them
# before templating (common_chat_msg::to_json_oaicompat with concat_typed_text).
_PART_SEPARATOR = "\n"
_MAX_STOP = 4  # OpenAI: "Up to 4 sequences where the API will stop generating"
_INT32_MAX = 2**31 - 1  # values that reach llama.cpp as C ints
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


# ----------------------------------------------------------------------------------------------
# Errors


def from_engine_error(exc: EngineError) -> OpenAIError:
    """The OpenAI error for an exception the engine raised or reported.

    A :class:`PromptTooLongError` becomes OpenAI's 400 ``context_length_exceeded`` on
    ``messages`` (worded as OpenAI words it: clients match "maximum context length"); any other
    :class:`RequestError` a 400 naming its ``param``; :class:`EngineClosedError` a 503; anything
    else a 500.
    """
    if isinstance(exc, PromptTooLongError):
        return invalid_request(
            f"This model's maximum context length is {exc.ctx_size} tokens. However, your "
            f"messages resulted in {exc.prompt_tokens} tokens (at least one token must be left "
            f"to generate). Please reduce the length of the messages.",
            param="messages",
            code="context_length_exceeded",
        )
    if isinstance(exc, RequestError):
        return invalid_request(str(exc), param=exc.param, code="invalid_value")
    if isinstance(exc, EngineFailedError):
        return OpenAIError(503, "The model failed and cannot serve requests.", type="server_error")
    if isinstance(exc, EngineClosedError):
        return OpenAIError(503, "The model is shutting down.", type="server_error")
    return server_error(f"The model failed while generating: {exc}")


# ----------------------------------------------------------------------------------------------
# Requests


@attrs.frozen
class RequestLimits:
    """What one request body may ask for, beyond the body's size (the ingress's) and the
    slot's context (the engine's); a request over a limit is a 400 naming the field.

    ``max_messages`` bounds ``messages`` (OpenAI's own bound is 2048), ``max_tokens`` what a
    request may ask to generate (``max_tokens``/``max_completion_tokens``; ``None``: only the
    context bounds it), ``max_stop`` the stop sequences (OpenAI's 4) and ``max_stop_chars``
    each one's length."""

    max_messages: int = 2048
    max_tokens: int | None = None
    max_stop: int = _MAX_STOP
    max_stop_chars: int = 256

    def __attrs_post_init__(self) -> None:
        for name in ("max_messages", "max_stop", "max_stop_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("--max-tokens-limit must be at least 1")

    def check_max_tokens(self, value: int | None, param: str) -> None:
        if value is not None and self.max_tokens is not None and value > self.max_tokens:
            raise invalid_request(
                f"Invalid '{param}': {value} is too large. This server generates at most "
                f"{self.max_tokens} tokens per request.",
                param=param,
                code="invalid_value",
            )


@attrs.frozen
class ChatCompletionRequest:
    """A parsed ``POST /v1/chat/completions``.

    ``model`` is the name the client asked for (``None`` when absent), echoed back in
    responses; ``include_usage`` is ``stream_options.include_usage`` (a usage chunk before
    ``[DONE]``); ``tools`` says which tools the reply may call (and whether to look for
    calls); ``logprobs`` whether to report log-probabilities.
    """

    model: str | None
    generate: GenerateRequest
    stream: bool = False
    include_usage: bool = False
    tools: ToolChoice = attrs.field(factory=ToolChoice)
    logprobs: bool = False


def parse_chat_request(
    body: bytes, limits: RequestLimits = RequestLimits()
) -> ChatCompletionRequest:
    """Parse and validate a chat completions request body.

    Accepted: ``model``, ``messages``, ``max_tokens``, ``max_completion_tokens`` (wins over
    ``max_tokens``), ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``,
    ``stream``, ``stream_options.include_usage``, ``n`` (1 only), ``think`` and
    ``chat_template_kwargs.enable_thinking`` (``think`` wins), ``ignore_eos`` and
    ``logit_bias``; ``presence_penalty``, ``frequency_penalty``, ``repeat_penalty`` and
    ``repeat_last_n``; ``logprobs`` and ``top_logprobs``; ``response_format``; ``tools``,
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
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_request(
            f"The request body is not valid UTF-8 (invalid byte at offset {exc.start})."
        ) from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise invalid_request(
            f"We could not parse the JSON body of your request: {_clip(str(exc), 200)}."
        ) from None
    if not isinstance(data, dict):
        raise invalid_request(
            f"The request body must be a JSON object, but got {_kind(data)}.", code="invalid_type"
        )

    reject_unimplemented(data)
    model = _opt_str(data, "model")
    messages = _parse_messages(data.get("messages"), limits.max_messages)

    max_tokens = _opt_int(data, "max_tokens", 1, _INT32_MAX)
    limits.check_max_tokens(max_tokens, "max_tokens")
    max_completion_tokens = _opt_int(data, "max_completion_tokens", 1, _INT32_MAX)
    limits.check_max_tokens(max_completion_tokens, "max_completion_tokens")
    if max_completion_tokens is not None:
        max_tokens = max_completion_tokens

    sampling_args = parse_sampling(data)
    logprobs = parse_chat_logprobs(data)
    tools = parse_tools(data)
    grammar = parse_response_format(data.get("response_format"))
    tool_grammar = tools.grammar()
    if tool_grammar is not None:
        grammar = tool_grammar  # a forced call wins over the format of a plain reply

    stop = _parse_stop(data.get("stop"), limits)

    n = _opt_int(data, "n", None, None)
    if n is not None and n != 1:
        raise invalid_request(
            f"Invalid 'n': this server generates one choice per request, so n must be 1, "
            f"but got {n}.",
            param="n",
            code="invalid_value",
        )

    stream, include_usage = parse_stream(data)

    think = _opt_bool(data, "think", "think")
    template_kwargs = data.get("chat_template_kwargs")
    if template_kwargs is not None:
        if not isinstance(template_kwargs, dict):
            raise _invalid_type("chat_template_kwargs", "an object", template_kwargs)
        enable_thinking = _opt_bool(
            template_kwargs, "enable_thinking", "chat_template_kwargs.enable_thinking"
        )
        if think is None:
            think = enable_thinking
    if grammar is not None:
        if think:
            raise invalid_request(
                "Thinking cannot be combined with 'response_format' json or a forced tool "
                "call: the grammar holds from the first token.",
                param="think",
                code="invalid_value",
            )
        think = False

    ignore_eos = _opt_bool(data, "ignore_eos", "ignore_eos") or False
    logit_bias = _parse_logit_bias(data.get("logit_bias"))

    try:
        generate = GenerateRequest(
            messages=messages,
            max_tokens=max_tokens,
            sampling=Sampling(**sampling_args),
            stop=stop,
            think=think,
            ignore_eos=ignore_eos,
            logit_bias=logit_bias,
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


def parse_sampling(data: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields present in a chat or text completions body (``temperature``,
    ``top_p``, ``top_k``, ``min_p``, ``seed`` and the penalties), as ``Sampling`` arguments.

    Error handling: :class:`OpenAIError` (400) naming a field of the wrong type or out of
    range."""
    sampling: dict[str, Any] = {}
    for key, low, high, low_open in (
        ("temperature", 0.0, 2.0, False),
        ("top_p", 0.0, 1.0, True),
        ("min_p", 0.0, 1.0, False),
    ):
        number = _opt_number(data, key, low, high, low_open=low_open)
        if number is not None:
            sampling[key] = number
    top_k = _opt_int(data, "top_k", 0, _INT32_MAX)
    if top_k is not None:
        sampling["top_k"] = top_k
    seed = _opt_int(data, "seed", _INT64_MIN, _INT64_MAX)
    if seed is not None:
        sampling["seed"] = seed
    sampling.update(parse_penalties(data))
    return sampling


def parse_stream(data: dict[str, Any]) -> tuple[bool, bool]:
    """``stream`` and ``stream_options.include_usage`` of a completions body.

    Error handling: :class:`OpenAIError` (400) for a wrong type, or ``stream_options`` on a
    request that does not stream (OpenAI refuses it)."""
    stream = _opt_bool(data, "stream", "stream") or False
    stream_options = data.get("stream_options")
    if stream_options is None:
        return stream, False
    if not stream:
        raise invalid_request(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            param="stream_options",
            code="invalid_value",
        )
    if not isinstance(stream_options, dict):
        raise _invalid_type("stream_options", "an object", stream_options)
    include_usage = _opt_bool(stream_options, "include_usage", "stream_options.include_usage")
    return stream, include_usage or False


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _parse_messages(value: object, limit: int) -> list[ChatMessage]:
    if value is None:
        raise invalid_request(
            "Missing required parameter: 'messages'.",
            param="messages",
            code="missing_required_parameter",
        )
    if not isinstance(value, list):
        raise _invalid_type("messages", "an array", value)
    if not value:
        raise invalid_request(
            "Invalid 'messages': empty array. Expected an array with at least one message.",
            param="messages",
            code="empty_array",
        )
    if len(value) > limit:
        raise invalid_request(
            f"Invalid 'messages': array too long. Expected an array with maximum length "
            f"{limit}, but got an array with length {len(value)} instead.",
            param="messages",
            code="array_above_max_length",
        )
    messages = []
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise _invalid_type(where, "an object", item)
        role = item.get("role")
        if role is None:
            raise invalid_request(
                f"Missing required parameter: '{where}.role'.",
                param=f"{where}.role",
                code="missing_required_parameter",
            )
        if not isinstance(role, str):
            raise _invalid_type(f"{where}.role", "a string", role)
        if role == "developer":
            role = "system"
        elif role not in ("system", "user", "assistant", "tool"):
            hint = " (use 'tool')" if role == "function" else ""
            raise invalid_request(
                f"Invalid value for '{where}.role': {_show(role)}{hint}. Supported values are: "
                f"'system', 'developer', 'user', 'assistant' and 'tool'.",
                param=f"{where}.role",
                code="invalid_value",
            )
        name = item.get("name")
        if name is not None and not isinstance(name, str):  # a participant's name: unused
            raise _invalid_type(f"{where}.name", "a string", name)
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
        return _checked_text(value, where)
    if value is None:
        if role == "assistant":
            return ""
        raise invalid_request(
            f"Missing required parameter: '{where}' (only assistant messages may omit it).",
            param=where,
            code="missing_required_parameter",
        )
    if not isinstance(value, list):
        raise _invalid_type(where, "a string or an array of text parts", value)
    if not value:
        raise invalid_request(
            f"Invalid '{where}': empty array. Expected a string or at least one text part.",
            param=where,
            code="empty_array",
        )
    texts = []
    for j, part in enumerate(value):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise _invalid_type(at, "an object", part)
        kind = part.get("type")
        if kind != "text":
            if kind is None:
                raise invalid_request(
                    f"Missing required parameter: '{at}.type'.",
                    param=f"{at}.type",
                    code="missing_required_parameter",
                )
            raise invalid_request(
                f"Invalid value for '{at}.type': {_show(kind)}. This server accepts text "
                f"content parts only ('text').",
                param=f"{at}.type",
                code="invalid_value",
            )
        piece = part.get("text")
        if not isinstance(piece, str):
            raise _invalid_type(f"{at}.text", "a string", piece)
        texts.append(_checked_text(piece, f"{at}.text"))
    return _PART_SEPARATOR.join(texts)


def _parse_stop(value: object, limits: RequestLimits) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        items: list[object] = [value]
    elif isinstance(value, list):
        items = value
        if len(items) > limits.max_stop:
            raise invalid_request(
                f"Invalid 'stop': array too long. Expected at most {limits.max_stop} stop "
                f"sequences, but got {len(items)}.",
                param="stop",
                code="array_above_max_length",
            )
    else:
        raise _invalid_type("stop", "a string or an array of strings", value)
    stops = []
    for i, item in enumerate(items):
        where = "stop" if isinstance(value, str) else f"stop[{i}]"
        if not isinstance(item, str):
            raise _invalid_type(where, "a string", item)
        if not item:
            raise invalid_request(
                f"Invalid '{where}': stop sequences must not be empty.",
                param="stop",
                code="invalid_value",
            )
        if len(item) > limits.max_stop_chars:
            raise invalid_request(
                f"Invalid '{where}': string too long. Expected a string with maximum length "
                f"{limits.max_stop_chars}, but got a string with length {len(item)} instead.",
                param="stop",
                code="string_above_max_length",
            )
        stops.append(_checked_text(item, "stop"))
    return tuple(stops)


def _parse_logit_bias(value: object) -> list[tuple[int, float]]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise _invalid_type("logit_bias", "an object mapping token ids to biases", value)
    biases = []
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10 and int(key) <= _INT32_MAX):
            raise invalid_request(
                f"Invalid 'logit_bias': keys must be token ids (non-negative integers written "
                f"as strings), but got {_show(key)}.",
                param="logit_bias",
                code="invalid_value",
            )
        if not _is_number(bias):
            raise _invalid_type(f"logit_bias.{key}", "a number", bias)
        if not -100.0 <= bias <= 100.0:
            raise invalid_request(
                f"Invalid 'logit_bias.{key}': expected a number from -100 to 100, "
                f"but got {_show(bias)}.",
                param="logit_bias",
                code="invalid_value",
            )
        # -100 bans the token, as in OpenAI's API; the engine bans with -inf.
        biases.append((int(key), -math.inf if bias == -100 else float(bias)))
    return biases


def _opt_str(obj: dict[str, Any], key: str) -> str | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _invalid_type(key, "a string", value)
    return _checked_text(value, key)


def _opt_bool(obj: dict[str, Any], key: str, param: str) -> bool | None:
    value = obj.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise _invalid_type(param, "a boolean", value)


def _opt_int(obj: dict[str, Any], key: str, low: int | None, high: int | None) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid_type(key, "an integer", value)
    if low is not None and value < low:
        raise invalid_request(
            f"Invalid '{key}': integer below minimum value. Expected a value >= {low}, "
            f"but got {_show(value)} instead.",
            param=key,
            code="integer_below_min_value",
        )
    if high is not None and value > high:
        raise invalid_request(
            f"Invalid '{key}': integer above maximum value. Expected a value <= {high}, "
            f"but got {_show(value)} instead.",
            param=key,
            code="integer_above_max_value",
        )
    return value


def _opt_number(
    obj: dict[str, Any], key: str, low: float, high: float, *, low_open: bool = False
) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if not _is_number(value):
        raise _invalid_type(key, "a number", value)
    # An integer compares exactly however large it is; only a float can be infinite (JSON's
    # 1e999). math.isfinite(10**400) would raise OverflowError.
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid_request(
            f"Invalid '{key}': expected a finite number, but got {_show(value)} instead.",
            param=key,
            code="invalid_value",
        )
    if value < low or (low_open and value == low):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        raise invalid_request(
            f"Invalid '{key}': number below minimum value. Expected a value {bound}, "
            f"but got {_show(value)} instead.",
            param=key,
            code="decimal_below_min_value",
        )
    if value > high:
        raise invalid_request(
            f"Invalid '{key}': number above maximum value. Expected a value <= {high:g}, "
            f"but got {_show(value)} instead.",
            param=key,
            code="decimal_above_max_value",
        )
    return float(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _checked_text(value: str, param: str) -> str:
    """``value``, refused when it holds a lone surrogate (JSON's ``"\\ud800"``): that is not
    Unicode text and cannot reach the tokenizer as UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid_request(
            f"Invalid '{param}': it contains a lone UTF-16 surrogate "
            f"(\\u{ord(value[exc.start]):04x}), which is not valid Unicode text.",
            param=param,
            code="invalid_value",
        ) from None
    return value


def _invalid_type(param: str, expected: str, value: object) -> OpenAIError:
    return invalid_request(
        f"Invalid type for '{param}': expected {expected}, but got {_kind(value)} instead.",
        param=param,
        code="invalid_type",
    )


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _show(value: object) -> str:
    """A user-supplied value for an error message, quoted and clipped."""
    if isinstance(value, str):
        return "'" + _clip(value, 40) + "'"
    return _clip(repr(value), 40)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------------------
# Responses


def new_completion_id() -> str:
    """A fresh ``chatcmpl-...`` id."""
    return "chatcmpl-" + secrets.token_hex(12)


_DONE = b"data: [DONE]\n\n"


@attrs.frozen
class ChatCompletionStream:
    """The server-sent events of one streamed chat completion, each returned as bytes ready to
    write (``data: {...}\\n\\n``).

    Send :meth:`role` first, then :meth:`token` for each piece, then :meth:`finish`, then
    :meth:`usage` when the client asked for it (``include_usage``: every other chunk then
    carries ``"usage": null``, as OpenAI's do), then :meth:`done`. An error after the first
    chunk goes out as :meth:`OpenAIError.sse`.

    The JSON around a piece is encoded once, here; a token costs one string escape and two
    concatenations.
    """

    id: str
    created: int
    model: str
    include_usage: bool = False
    system_fingerprint: str | None = None

    _head: bytes = attrs.field(init=False, repr=False)
    _content_open: bytes = attrs.field(init=False, repr=False)
    _reasoning_open: bytes = attrs.field(init=False, repr=False)
    _tail: bytes = attrs.field(init=False, repr=False)
    _token_close: bytes = attrs.field(init=False, repr=False)

    @_head.default
    def _make_head(self) -> bytes:
        fingerprint = (
            b""
            if self.system_fingerprint is None
            else b',"system_fingerprint":' + _json_string(self.system_fingerprint)
        )
        return (
            b'data: {"id":'
            + _json_string(self.id)
            + b',"object":"chat.completion.chunk","created":'
            + str(int(self.created)).encode()
            + b',"model":'
            + _json_string(self.model)
            + fingerprint
            + b',"choices":['
        )

    @_content_open.default
    def _make_content_open(self) -> bytes:
        return self._head + b'{"index":0,"delta":{"content":'

    @_reasoning_open.default
    def _make_reasoning_open(self) -> bytes:
        return self._head + b'{"index":0,"delta":{"reasoning_content":'

    @_tail.default
    def _make_tail(self) -> bytes:
        return (b',"usage":null' if self.include_usage else b"") + b"}\n\n"

    @_token_close.default
    def _make_token_close(self) -> bytes:
        return b'},"logprobs":null,"finish_reason":null}]' + self._tail

    def role(self) -> bytes:
        """The first chunk: ``delta: {"role": "assistant", "content": ""}``."""
        return (
            self._head
            + b'{"index":0,"delta":{"role":"assistant","content":""},'
            + b'"logprobs":null,"finish_reason":null}]'
            + self._tail
        )

    def token(self, token: Token) -> bytes:
        """A ``content`` delta, or a ``reasoning_content`` delta for a piece of a think
        block."""
        opening = self._reasoning_open if token.reasoning else self._content_open
        return opening + _json_string(token.text) + self._token_close

    def finish(self, done: Done, *, finish_reason: str | None = None) -> bytes:
        """The last choice chunk: an empty delta and the ``finish_reason`` (``done``'s unless
        given), with llama.cpp's non-standard ``timings``."""
        return (
            self._head
            + b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"'
            + (finish_reason or done.stop.finish_reason).encode()
            + b'"}]'
            + (b',"usage":null' if self.include_usage else b"")
            + b',"timings":'
            + dumps(_timings(done))
            + b"}\n\n"
        )

    def usage(self, done: Done) -> bytes:
        """The usage chunk: ``"choices": []`` and the token counts."""
        return self._head + b'],"usage":' + dumps(_usage(done)) + b"}\n\n"

    def done(self) -> bytes:
        """The stream's terminator, ``data: [DONE]\\n\\n``."""
        return _DONE


def completion_body(
    text: str,
    reasoning: str,
    done: Done,
    *,
    model: str,
    id: str,
    created: int,
    system_fingerprint: str | None = None,
    tool_calls: Sequence[ToolCall] = (),
    logprobs: Sequence[TokenLogprob] | None = None,
) -> bytes:
    """The ``chat.completion`` response body of a request that did not stream.

    ``message.reasoning_content`` is present only when ``reasoning`` is not empty; the
    non-standard ``timings`` follows llama.cpp's server. With ``tool_calls`` the message
    carries them (``content`` is then ``null`` when empty) and ``finish_reason`` is
    ``tool_calls``; ``logprobs`` (when asked for) go in OpenAI's ``{"content": [...]}``.
    """
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["content"] = text.strip() or None
        message["tool_calls"] = [tool_call_json(call) for call in tool_calls]
    body: dict[str, Any] = {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
    }
    if system_fingerprint is not None:
        body["system_fingerprint"] = system_fingerprint
    body["choices"] = [
        {
            "index": 0,
            "message": message,
            "logprobs": None if logprobs is None else chat_logprobs_json(logprobs),
            "finish_reason": "tool_calls" if tool_calls else done.stop.finish_reason,
        }
    ]
    body["usage"] = _usage(done)
    body["timings"] = _timings(done)
    return dumps(body)


def tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """A call in OpenAI's ``tool_calls`` shape (with ``index`` in a streamed delta)."""
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update(
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    )
    return out


def token_logprob_json(entry: TokenLogprob) -> dict[str, Any]:
    """One token of OpenAI's chat ``logprobs.content``."""
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.piece),
        "top_logprobs": [
            {"token": text, "logprob": logprob, "bytes": list(piece)}
            for text, piece, logprob in entry.top
        ],
    }


def chat_logprobs_json(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    return {"content": [token_logprob_json(e) for e in entries], "refusal": None}


def _usage(done: Done) -> dict[str, Any]:
    """OpenAI's usage: ``prompt_tokens`` counts the reused ones too, and
    ``prompt_tokens_details.cached_tokens`` says how many of them were reused."""
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": done.cached_tokens},
    }


def _timings(done: Done) -> dict[str, float | int | None]:
    """llama.cpp server's ``timings`` fields, plus the time spent waiting for a slot.

    ``prompt_ms`` runs until the first token was sampled, so the decode rate counts the
    tokens after the first over ``predicted_ms``. As in llama.cpp's server, ``cache_n``
    prompt tokens were reused from memory and ``prompt_n`` were ingested, and ``draft_n``
    draft tokens were verified (speculative decoding), ``draft_n_accepted`` of them right.
    """
    t = done.timings
    decoded_after_first = max(done.completion_tokens - 1, 0)
    ingested = done.prompt_tokens - done.cached_tokens
    return {
        "queue_ms": _ms(t.queue_s),
        "cache_n": done.cached_tokens,
        "prompt_n": ingested,
        "prompt_ms": _ms(t.prefill_s),
        "prompt_per_second": _rate(ingested, t.prefill_s),
        "predicted_n": done.completion_tokens,
        "predicted_ms": _ms(t.decode_s),
        "predicted_per_second": _rate(decoded_after_first, t.decode_s),
        "draft_n": done.draft_tokens,
        "draft_n_accepted": done.accepted_tokens,
    }


def _ms(seconds: float) -> float | None:
    return round(seconds * 1000.0, 3) if math.isfinite(seconds) else None


def _rate(count: int, seconds: float) -> float | None:
    if count <= 0 or not (seconds > 0.0 and math.isfinite(seconds)):
        return None
    return round(count / seconds, 2)


def _json_string(text: str) -> bytes:
    """``text`` as a JSON string literal in UTF-8; lone surrogates (not encodable) become
    U+FFFD."""
    literal = _encode_basestring(text)
    try:
        return literal.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", literal).encode()
