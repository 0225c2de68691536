"""The API's request fields, written once: type, bounds, nullability, the endpoints that take
each one and the server limit that bounds it.

Pure: no I/O. Two things are made from this one table, so that they cannot drift:

- the worker's validators: :func:`read` checks a field's type and bounds (the running
  server's :class:`RequestLimits` included) and raises one kind of error per kind of fault,
  with OpenAI's own codes (``invalid_type``, ``decimal_below_min_value``,
  ``decimal_above_max_value``, ``integer_below_min_value``, ``integer_above_max_value``,
  ``missing_required_parameter``), ``param`` naming the field;
- the request schemas of ``/openapi.json`` (:func:`request_schema`), with the same bounds and
  the same limits.

Fields whose shape is more than a type and bounds (``messages``, ``stop``, ``tools``, ...)
carry their schema here (as a function of the limits) and are parsed by their endpoint; their
errors use the same helpers (:func:`invalid_type`, :func:`invalid_value`, :func:`missing`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

import attrs

from ._openai_errors import OpenAIError, invalid_request

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "EMBEDDINGS",
    "FIELDS",
    "INT32_MAX",
    "MAX_TOP_LOGPROBS",
    "Field",
    "RequestLimits",
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

INT32_MAX: Final = 2**31 - 1  # values that reach llama.cpp as C ints
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
#: OpenAI's bound on alternatives per token (``top_logprobs``, legacy ``logprobs``).
MAX_TOP_LOGPROBS: Final = 20


@attrs.frozen
class RequestLimits:
    """What one request may ask for, beyond the body's size (the ingress's) and the slot's
    context (the engine's); a request over a limit is a 400 naming the field.

    ``max_messages`` bounds ``messages`` (OpenAI's own bound is 2048), ``max_tokens`` what a
    request may ask to generate (``max_tokens``/``max_completion_tokens``; ``None``: only the
    context bounds it), ``max_stop`` the stop sequences (OpenAI's 4), ``max_stop_chars``
    each one's length and ``max_embedding_inputs`` the inputs of one embeddings request
    (OpenAI's 2048).

    Error handling: ``ValueError`` naming the field for a limit below 1.
    """

    max_messages: int = 2048
    max_tokens: int | None = None
    max_stop: int = 4
    max_stop_chars: int = 256
    max_embedding_inputs: int = 2048

    def __attrs_post_init__(self) -> None:
        names = ("max_messages", "max_tokens", "max_stop", "max_stop_chars")
        for name in (*names, "max_embedding_inputs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")


Schema = dict[str, Any]


@attrs.frozen
class Field:
    """One request field.

    ``type`` is ``boolean``, ``integer``, ``number`` or ``string`` for a field :func:`read`
    checks whole; any other field is ``custom``: its endpoint parses it and ``shape`` gives
    its schema. ``minimum``/``maximum`` bound a number or integer (``exclusive_minimum``: the
    minimum itself is refused); ``limit`` names the :class:`RequestLimits` attribute that
    lowers ``maximum`` on this server. ``refused`` fields are OpenAI's that this server does
    not implement: a value other than null (or ``allowed``) is a 400 naming it.
    """

    name: str
    type: str
    endpoints: frozenset[str]
    description: str = ""
    minimum: int | float | None = None
    maximum: int | float | None = None
    exclusive_minimum: bool = False
    limit: str | None = None
    required: bool = False
    shape: Callable[[RequestLimits], Schema] | None = None
    refused: str | None = None
    allowed: tuple[Any, ...] = ()

    def upper(self, limits: RequestLimits) -> int | float | None:
        """The maximum on a server with ``limits``."""
        lowered: int | None = None if self.limit is None else getattr(limits, self.limit)
        if lowered is None:
            return self.maximum
        return lowered if self.maximum is None else min(lowered, self.maximum)

    def schema(self, limits: RequestLimits) -> Schema:
        """The field's JSON schema on a server with ``limits`` (``null`` allowed unless the
        field is required)."""
        if self.shape is not None:
            schema = self.shape(limits)
        elif self.refused is not None:
            schema = {"enum": list(self.allowed)} if self.allowed else {"not": {}}
            schema["description"] = f"Not implemented: {self.refused}."
        else:
            schema = {"type": self.type}
            if self.minimum is not None:
                key = "exclusiveMinimum" if self.exclusive_minimum else "minimum"
                schema[key] = self.minimum
            upper = self.upper(limits)
            if upper is not None:
                schema["maximum"] = upper
        if self.description:
            schema = {**schema, "description": self.description}
        return schema if self.required else {"anyOf": [schema, {"type": "null"}]}


def _both(*names: str) -> frozenset[str]:
    return frozenset(names or (CHAT, COMPLETIONS))


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _stop_shape(limits: RequestLimits) -> Schema:
    text = {"type": "string", "minLength": 1, "maxLength": limits.max_stop_chars}
    return {"anyOf": [text, {"type": "array", "items": text, "maxItems": limits.max_stop}]}


def _messages_shape(limits: RequestLimits) -> Schema:
    return {
        "type": "array",
        "items": _ref("ChatMessage"),
        "minItems": 1,
        "maxItems": limits.max_messages,
    }


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
_TOOL_CHOICE: Schema = {"anyOf": [{"enum": ["none", "auto", "required"]}, _ref("NamedToolChoice")]}
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


def _fixed(schema: Schema) -> Callable[[RequestLimits], Schema]:
    return lambda limits: schema


def _custom(name: str, schema: Schema, *endpoints: str, **kwargs: Any) -> Field:
    return Field(name, "custom", _both(*endpoints), shape=_fixed(schema), **kwargs)


def _refused(name: str, what: str, *endpoints: str, allowed: tuple[Any, ...] = ()) -> Field:
    return Field(name, "custom", _both(*endpoints), refused=what, allowed=allowed)


FIELDS: Final[tuple[Field, ...]] = (
    Field("model", "string", _both(), "The model's name (any name is served by this model)."),
    Field("messages", "custom", _both(CHAT), required=True, shape=_messages_shape),
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
    _custom("stream_options", {
        "type": "object",
        "properties": {"include_usage": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}},
    }, description="Only with ``stream: true``: a usage chunk before ``[DONE]``."),
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
    _custom("response_format", _ref("ResponseFormat")),
    _custom("tools", {"type": "array", "items": _ref("Tool")}, CHAT),
    _custom("tool_choice", _TOOL_CHOICE, CHAT),
    Field("parallel_tool_calls", "boolean", _both(CHAT)),
    Field("think", "boolean", _both(CHAT), "Let the model reason first."),
    _custom("chat_template_kwargs", {
        "type": "object",
        "properties": {"enable_thinking": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}},
    }, CHAT),
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
    _refused("reasoning_effort",
             "reasoning effort (use 'think' or 'chat_template_kwargs.enable_thinking')", CHAT),
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


# -- reading a field ---------------------------------------------------------------------------


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


def check(spec: Field, value: object, limits: RequestLimits, param: str) -> Any:
    """``value`` checked as ``spec`` says (see :func:`read`); ``param`` names it in errors."""
    kind = spec.type
    if kind == "boolean":
        if not isinstance(value, bool):
            raise invalid_type(param, "a boolean", value)
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise invalid_type(param, "a string", value)
        return checked_text(value, param)
    if kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid_type(param, "an integer", value)
    elif kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise invalid_type(param, "a number", value)
    else:
        raise AssertionError(f"{spec.name} is parsed by its endpoint")
    # Integers compare exactly however large they are (10**400 must not overflow a float);
    # JSON's 1e999 is a float infinity, beyond any bound.
    what = "integer" if kind == "integer" else "decimal"
    low = spec.minimum
    if low is not None and (value < low or (spec.exclusive_minimum and value == low)):
        relation = ">" if spec.exclusive_minimum else ">="
        raise invalid_request(
            f"Invalid '{param}': {what} below minimum value. Expected a value {relation} "
            f"{_number(low)}, but got {show(value)} instead.",
            param=param,
            code=f"{what}_below_min_value",
        )
    high = spec.upper(limits)
    if high is not None and value > high:
        ours = " (this server's limit)" if high != spec.maximum else ""
        raise invalid_request(
            f"Invalid '{param}': {what} above maximum value. Expected a value <= "
            f"{_number(high)}{ours}, but got {show(value)} instead.",
            param=param,
            code=f"{what}_above_max_value",
        )
    return value if kind == "integer" else float(value)


# -- errors, one shape -------------------------------------------------------------------------


def missing(param: str, note: str = "") -> OpenAIError:
    """400 ``missing_required_parameter``."""
    return invalid_request(
        f"Missing required parameter: '{param}'{note}.",
        param=param,
        code="missing_required_parameter",
    )


def invalid_type(param: str, expected: str, value: object) -> OpenAIError:
    """400 ``invalid_type``: ``expected`` says what would do ("a string")."""
    return invalid_request(
        f"Invalid type for '{param}': expected {expected}, but got {describe(value)} instead.",
        param=param,
        code="invalid_type",
    )


def invalid_value(param: str, message: str, code: str = "invalid_value") -> OpenAIError:
    """400 naming ``param``: ``message`` says what is wrong with its value."""
    return invalid_request(f"Invalid '{param}': {message}", param=param, code=code)


def checked_text(value: str, param: str) -> str:
    """``value``, refused when it holds a lone surrogate (JSON's ``"\\ud800"``): that is not
    Unicode text and cannot reach the tokenizer as UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise invalid_value(
            param,
            f"it contains a lone UTF-16 surrogate (\\u{ord(value[exc.start]):04x}), which is "
            f"not valid Unicode text.",
        ) from None
    return value


def describe(value: object) -> str:
    """What kind of JSON value ``value`` is, for an error message ("a string")."""
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


def show(value: object) -> str:
    """A user-supplied value for an error message, quoted and clipped."""
    if isinstance(value, str):
        return "'" + clip(value, 40) + "'"
    if isinstance(value, float) and not math.isfinite(value):
        return "infinity" if value > 0 else "-infinity"
    return clip(repr(value), 40)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
