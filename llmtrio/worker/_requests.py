"""Reading a request body: what every endpoint's parser shares. Pure.

The JSON body once (:func:`json_body`), then its fields as the field table
(``llmtrio.api._fields``) says: the sampling fields, ``stop``, ``logit_bias``, ``stream`` and
``stream_options``, ``max_tokens``, and the refusal of fields this server does not implement.
Every refusal is an :class:`ApiError` (400) naming the field.
"""

from __future__ import annotations

import json
import math
from typing import Any, NoReturn

from ..api import (
    FIELDS,
    INT32_MAX,
    ApiError,
    RequestLimits,
    checked_text,
    clip,
    describe,
    invalid_request,
    invalid_type,
    invalid_value,
    read,
    show,
)

__all__ = [
    "json_body",
    "parse_logit_bias",
    "parse_max_tokens",
    "parse_sampling",
    "parse_stop",
    "parse_stream",
    "reject_refused",
]

_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repeat_penalty",
    "repeat_last_n",
)


def json_body(body: bytes) -> dict[str, Any]:
    """The body as a JSON object.

    Error handling: :class:`ApiError` (400) for invalid UTF-8, invalid JSON (``NaN`` and
    ``Infinity`` included) or a body that is not an object.
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
            f"We could not parse the JSON body of your request: {clip(str(exc), 200)}."
        ) from None
    if not isinstance(data, dict):
        raise invalid_request(
            f"The request body must be a JSON object, but got {describe(data)}.",
            code="invalid_type",
        )
    return data


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def reject_refused(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> None:
    """A 400 ``unsupported_parameter`` for the first field set that this server does not
    implement on ``endpoint``. (Bookkeeping fields that change no output, such as ``user``,
    ``metadata``, ``store`` or ``service_tier``, are accepted and ignored.)"""
    for spec in FIELDS:
        if spec.refused is not None and endpoint in spec.endpoints:
            read(data, endpoint, spec.name, limits)


def parse_sampling(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> dict[str, Any]:
    """The sampling fields present in the body (``temperature``, ``top_p``, ``top_k``,
    ``min_p``, ``seed`` and the penalties) as :class:`~llmtrio.engine.Sampling` arguments.
    ``repeat_last_n`` of -1 (llama.cpp's "all") becomes a window larger than any context."""
    sampling = {}
    for name in _SAMPLING:
        value = read(data, endpoint, name, limits)
        if value is not None:
            sampling[name] = value
    if sampling.get("repeat_last_n") == -1:
        sampling["repeat_last_n"] = 1 << 30
    return sampling


def parse_max_tokens(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> int | None:
    """``max_tokens``, or ``max_completion_tokens`` where the endpoint takes it (it wins);
    ``limits.default_max_tokens`` when the request names neither."""
    value: int | None = read(data, endpoint, "max_tokens", limits)
    if endpoint == "chat":
        wins = read(data, endpoint, "max_completion_tokens", limits)
        if wins is not None:
            value = wins
    return value if value is not None else limits.default_max_tokens


def parse_stream(data: dict[str, Any], endpoint: str, limits: RequestLimits) -> tuple[bool, bool]:
    """``stream`` and ``stream_options.include_usage``.

    Error handling: :class:`ApiError` (400) for a wrong type, or ``stream_options`` on a
    request that does not stream (OpenAI refuses it)."""
    stream = read(data, endpoint, "stream", limits) or False
    options = data.get("stream_options")
    if options is None:
        return stream, False
    if not stream:
        raise invalid_value(
            "stream_options", "it is only allowed when 'stream' is enabled.", "invalid_value"
        )
    options = read(data, endpoint, "stream_options", limits)
    return stream, bool(options.get("include_usage"))


def parse_stop(value: object, limits: RequestLimits) -> tuple[str, ...]:
    """``stop``: a string or up to ``limits.max_stop`` strings of at most
    ``limits.max_stop_chars`` characters each (the field table documents the same bounds)."""
    if value is None:
        return ()
    if isinstance(value, str):
        items: list[object] = [value]
    elif isinstance(value, list):
        items = value
        if len(items) > limits.max_stop:
            raise invalid_value(
                "stop",
                f"array too long. Expected an array with maximum length {limits.max_stop}, "
                f"but got an array with length {len(items)} instead.",
                "array_above_max_length",
            )
    else:
        raise invalid_type("stop", "a string or an array of strings", value)
    stops = []
    for i, item in enumerate(items):
        where = "stop" if isinstance(value, str) else f"stop[{i}]"
        if not isinstance(item, str):
            raise invalid_type(where, "a string", item)
        if not item:
            raise invalid_value(where, "stop sequences must not be empty.")
        if len(item) > limits.max_stop_chars:
            raise invalid_value(
                where,
                f"string too long. Expected a string with maximum length "
                f"{limits.max_stop_chars}, but got a string with length {len(item)} instead.",
                "string_above_max_length",
            )
        stops.append(checked_text(item, where))
    return tuple(stops)


def parse_logit_bias(value: object) -> list[tuple[int, float]]:
    """``logit_bias``: token ids (as strings) to biases from -100 to 100; -100 bans the token
    (as in OpenAI's API), which the engine does with ``-inf``."""
    if value is None:
        return []
    if not isinstance(value, dict):
        raise invalid_type("logit_bias", "an object mapping token ids to biases", value)
    biases = []
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit() and len(key) <= 10 and int(key) <= INT32_MAX):
            raise invalid_value(
                "logit_bias",
                f"keys must be token ids (non-negative integers written as strings), but got "
                f"{show(key)}.",
            )
        where = f"logit_bias.{key}"
        if isinstance(bias, bool) or not isinstance(bias, int | float):
            raise invalid_type(where, "a number", bias)
        if bias < -100:
            raise _out_of_range(where, ">= -100", bias, "decimal_below_min_value")
        if bias > 100:
            raise _out_of_range(where, "<= 100", bias, "decimal_above_max_value")
        biases.append((int(key), -math.inf if bias == -100 else float(bias)))
    return biases


def _out_of_range(param: str, bound: str, value: object, code: str) -> ApiError:
    which = "below minimum" if "below" in code else "above maximum"
    return invalid_request(
        f"Invalid '{param}': decimal {which} value. Expected a value {bound}, but got "
        f"{show(value)} instead.",
        param=param,
        code=code,
    )
