"""What a request field is (:class:`Field`), how a value is checked against one
(:func:`check`) and the one shape of a field's errors. Pure: no I/O.

The table of the API's fields, nested ones included, is ``llmtrio.api._fields``; this module is
the vocabulary it is written in.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

import attrs

from ._errors import ApiError, invalid_request

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "INT64_MIN",
    "MAX_TOP_LOGPROBS",
    "Field",
    "RequestLimits",
    "Schema",
    "check",
    "checked_text",
    "choices",
    "clip",
    "custom",
    "describe",
    "fixed",
    "ignored",
    "invalid_type",
    "invalid_value",
    "missing",
    "nullable",
    "part",
    "ref",
    "refused",
    "show",
]

Schema = dict[str, Any]

INT32_MAX: Final = 2**31 - 1  # values that reach llama.cpp as C ints
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
#: OpenAI's bound on alternatives per token (``top_logprobs``, legacy ``logprobs``).
MAX_TOP_LOGPROBS: Final = 20


def _domains(value: object) -> tuple[str, ...]:
    """Allowed media hosts, given one by one or comma-separated: lower case, no trailing dot,
    IPv6 addresses without brackets."""
    items = [value] if isinstance(value, str) else list(value)  # type: ignore[call-overload]
    hosts: list[str] = []
    for item in items:
        for host in str(item).split(","):
            host = host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")
            if not host:
                continue
            if "/" in host or (":" in host and host.count(":") < 2):
                raise ValueError(f"allowed_media_domains: {host!r} is not a host name")
            hosts.append(host)
    return tuple(dict.fromkeys(hosts))


@attrs.frozen
class RequestLimits:
    """What one request may ask for, beyond the body's size (the ingress's) and the slot's
    context (the engine's); a request over a limit is a 400 naming the field.

    ``max_messages`` bounds ``messages`` (OpenAI's own bound is 2048), ``max_tokens`` what a
    request may ask to generate (``max_tokens``/``max_completion_tokens``; ``None``: only the
    context bounds it), ``max_stop`` the stop sequences (OpenAI's 4), ``max_stop_chars``
    each one's length, ``max_embedding_inputs`` the inputs of one embeddings request
    (OpenAI's 2048) and ``max_rerank_documents`` the documents of one reranking request (or
    the pairs of one ``/v1/score``; Cohere's limit is 1000). ``default_max_tokens`` is what
    a request that names no output limit generates at most, on every route (``None``: until
    the end of generation or of the context). ``max_image_pixels`` bounds an image's width
    times height, read from its header before anything is decoded (2**25: about 33
    megapixels). ``max_audio_seconds`` bounds an audio file's length, read from its header
    before anything is decoded (600: ten minutes).

    ``allowed_media_domains`` are the hosts whose ``http(s)`` image URLs are fetched (none:
    remote URLs are refused): exact host names or IP addresses, ``*.example.com`` for its
    subdomains, ``*`` for any host; a host matched only by a pattern must resolve to public
    addresses (``llmtrio.worker._fetch``). A fetch may take ``media_fetch_timeout`` seconds,
    redirects included, and ``max_media_fetch_bytes`` bytes.

    Error handling: ``ValueError`` naming the field for a limit below 1, or for a
    ``default_max_tokens`` above ``max_tokens``.
    """

    max_messages: int = 2048
    max_tokens: int | None = None
    max_stop: int = 4
    max_stop_chars: int = 256
    max_embedding_inputs: int = 2048
    max_rerank_documents: int = 1000
    default_max_tokens: int | None = None
    max_image_pixels: int = 2**25
    max_audio_seconds: float = 600.0
    allowed_media_domains: tuple[str, ...] = attrs.field(default=(), converter=_domains)
    media_fetch_timeout: float = 10.0
    max_media_fetch_bytes: int = 20 * 2**20

    def __attrs_post_init__(self) -> None:
        names = ("max_messages", "max_tokens", "max_stop", "max_stop_chars", "default_max_tokens")
        counts = ("max_embedding_inputs", "max_rerank_documents", "max_image_pixels")
        for name in (*names, *counts, "max_media_fetch_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        default, most = self.default_max_tokens, self.max_tokens
        if default is not None and most is not None and default > most:
            raise ValueError(f"default_max_tokens ({default}) must not exceed max_tokens ({most})")
        if not self.max_audio_seconds > 0:
            raise ValueError(f"max_audio_seconds must be above 0, not {self.max_audio_seconds}")
        if not self.media_fetch_timeout > 0:
            raise ValueError(f"media_fetch_timeout must be above 0, not {self.media_fetch_timeout}")


#: A wrong value's error, given the field's ``param`` and the value.
Fault = Callable[[str, object], ApiError]

_EXPECTED = {
    "boolean": "a boolean",
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "object": "an object",
    "array": "an array",
    "schema": "a JSON schema",
}


@attrs.frozen
class Field:
    """One request field, or one property or item of a nested one.

    ``type`` is ``boolean``, ``integer``, ``number``, ``string``, ``object`` (its
    ``properties`` checked in their order), ``array`` (of ``items``), ``schema`` (a JSON
    Schema: an object or a boolean) or ``any``: :func:`check` checks those whole. A ``custom``
    field is parsed by its endpoint and ``shape`` gives its schema (an object's ``custom``
    properties and an array's ``custom`` items are the endpoint's too).

    ``minimum``/``maximum`` bound a number or an integer (``exclusive_minimum``: the minimum
    itself is refused), or an array's length; ``limit`` names the :class:`RequestLimits`
    attribute that lowers ``maximum`` on this server. ``refused`` fields are OpenAI's that
    this server does not implement: a value other than null (or ``allowed``) is a 400 naming
    it.

    Nested: null is the same as absent unless the field is not ``nullable`` (null is then a
    wrong value); with ``falsy_is_null`` so are ``false``, ``0``, ``""``, ``[]`` and ``{}``; an
    absent property reads as ``default``. A ``text`` string is refused when it is not Unicode
    (a lone surrogate); the others pass as they come. ``enum`` lists the values allowed,
    whatever their type (``refusal`` words the 400 for another, with ``{param}`` and
    ``{value}``); ``expected`` words the type a 400 asks for ("a non-empty string");
    ``min_length`` bounds a string; ``empty``, what an array that must not be empty should
    hold ("an array with at least one message"). ``fault`` is the 400 for a wrong value
    instead of the generic one (with ``whole``: for any fault inside the value too).
    ``component`` names its schema in the API's document (``#/components/schemas/...``).
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
    properties: tuple[Field, ...] = ()
    items: Field | None = None
    nullable: bool = True
    default: Any = None
    enum: tuple[Any, ...] = ()
    refusal: str = ""
    expected: str = ""
    min_length: int | None = None
    empty: str = ""
    fault: Fault | None = None
    whole: bool = False
    component: str | None = None
    falsy_is_null: bool = False
    text: bool = True

    def upper(self, limits: RequestLimits) -> int | float | None:
        """The maximum on a server with ``limits``."""
        lowered: int | None = None if self.limit is None else getattr(limits, self.limit)
        if lowered is None:
            return self.maximum
        return lowered if self.maximum is None else min(lowered, self.maximum)

    @property
    def present(self) -> bool:
        """Whether a request must give it (a value other than null)."""
        return self.required or (not self.nullable and self.default is None)

    def schema(self, limits: RequestLimits) -> Schema:
        """The field's JSON schema on a server with ``limits``, where it is used: its
        component's reference if it has one, with its description, ``null`` allowed where
        the field may be null."""
        schema = ref(self.component) if self.component else self.body(limits)
        if self.description:
            schema = {**schema, "description": self.description}
        nullable = self.nullable and not self.required and self.type != "any"
        return {"anyOf": [schema, {"type": "null"}]} if nullable else schema

    def body(self, limits: RequestLimits) -> Schema:
        """The JSON schema of a value other than null."""
        if self.shape is not None:
            return self.shape(limits)
        schema: Schema
        if self.refused is not None:
            schema = {"enum": list(self.allowed)} if self.allowed else {"not": {}}
            return {**schema, "description": f"Not implemented: {self.refused}."}
        if self.enum:
            return {"enum": list(self.enum)}
        if self.type == "object":
            schema = {"type": "object"}
            if self.properties:
                required = [p.name for p in self.properties if p.present]
                schema |= {"required": required} if required else {}
                schema["properties"] = {p.name: p.schema(limits) for p in self.properties}
            return schema
        if self.type in ("any", "schema"):
            return {} if self.type == "any" else {"type": ["object", "boolean"]}
        schema = {"type": self.type}
        if self.items is not None:
            schema["items"] = self.items.schema(limits)
        if self.min_length is not None:
            schema["minLength"] = self.min_length
        low, high = ("minItems", "maxItems") if self.type == "array" else ("minimum", "maximum")
        if self.empty:
            schema[low] = 1
        if self.minimum is not None:
            schema["exclusiveMinimum" if self.exclusive_minimum else low] = self.minimum
        upper = self.upper(limits)
        if upper is not None:
            schema[high] = upper
        return schema


def check(spec: Field, value: object, limits: RequestLimits, param: str) -> Any:
    """``value`` checked as ``spec`` says; ``param`` names it in errors. ``None`` for an
    absent or null value that may be left out; a ``float`` for a number, an ``int`` for an
    integer; any other value itself (an object or an array whole, each part checked).

    Error handling: :class:`ApiError` (400) naming the field, or the part of it that is
    wrong: ``missing_required_parameter``, ``invalid_type``, ``invalid_value`` (a value not
    in ``enum``, text that is not Unicode), ``empty_array``, ``array_above_max_length``,
    ``decimal_below_min_value``/``decimal_above_max_value`` or
    ``integer_below_min_value``/``integer_above_max_value``; or the field's ``fault``.
    """
    if not spec.whole:
        return _check(spec, value, limits, param)
    try:
        return _check(spec, value, limits, param)
    except ApiError:
        assert spec.fault is not None
        raise spec.fault(param, value) from None


def _check(spec: Field, value: object, limits: RequestLimits, param: str) -> Any:
    if spec.falsy_is_null and not value:
        value = None
    if value is None and (spec.nullable or spec.required):
        if not spec.required:
            return None
        raise spec.fault(param, value) if spec.fault else missing(param)
    if spec.enum:
        if value in spec.enum and type(value) is type(spec.enum[0]):
            return value
        refusal = spec.refusal or "Invalid '{param}': {value}. Supported values are: {choices}."
        message = refusal.format(param=param, value=show(value), choices=choices(spec.enum))
        raise invalid_request(message, param=param, code="invalid_value")
    kind = spec.type
    if kind == "any":
        return value
    if not _has_type(kind, value):
        if spec.fault is not None:
            raise spec.fault(param, value)
        raise invalid_type(param, spec.expected or _EXPECTED[kind], value)
    if kind == "object":
        assert isinstance(value, dict)
        for part in spec.properties:
            if part.type != "custom":
                check(part, value.get(part.name, part.default), limits, f"{param}.{part.name}")
        return value
    if kind == "array":
        assert isinstance(value, list)
        _check_length(spec, value, limits, param)
        if spec.items is not None and spec.items.type != "custom":
            for i, item in enumerate(value):
                check(spec.items, item, limits, f"{param}[{i}]")
        return value
    if kind == "string":
        assert isinstance(value, str)
        if spec.min_length is not None and len(value) < spec.min_length:
            raise invalid_type(param, spec.expected, value)
        return checked_text(value, param) if spec.text else value
    if kind in ("boolean", "schema"):
        return value
    return _check_number(spec, value, limits, param)


def _has_type(kind: str, value: object) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("integer", "number"):
        number = int if kind == "integer" else int | float
        return isinstance(value, number) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "schema":
        return isinstance(value, dict | bool)
    raise AssertionError(f"a {kind} field is parsed by its endpoint")


def _check_length(spec: Field, value: list[Any], limits: RequestLimits, param: str) -> None:
    if spec.empty and not value:
        raise invalid_value(param, f"empty array. Expected {spec.empty}.", "empty_array")
    high = spec.upper(limits)
    if high is not None and len(value) > high:
        raise invalid_value(
            param,
            f"array too long. Expected an array with maximum length {high}, but got an array "
            f"with length {len(value)} instead.",
            "array_above_max_length",
        )


def _check_number(spec: Field, value: Any, limits: RequestLimits, param: str) -> Any:
    # Integers compare exactly however large they are (10**400 must not overflow a float);
    # JSON's 1e999 is a float infinity, beyond any bound.
    what = "integer" if spec.type == "integer" else "decimal"
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
    return value if spec.type == "integer" else float(value)


# -- errors, one shape -------------------------------------------------------------------------


def missing(param: str, note: str = "") -> ApiError:
    """400 ``missing_required_parameter``."""
    return invalid_request(
        f"Missing required parameter: '{param}'{note}.",
        param=param,
        code="missing_required_parameter",
    )


def invalid_type(param: str, expected: str, value: object) -> ApiError:
    """400 ``invalid_type``: ``expected`` says what would do ("a string")."""
    return invalid_request(
        f"Invalid type for '{param}': expected {expected}, but got {describe(value)} instead.",
        param=param,
        code="invalid_type",
    )


def invalid_value(param: str, message: str, code: str = "invalid_value") -> ApiError:
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


def choices(values: tuple[Any, ...]) -> str:
    """``values`` as an error message lists them: ``'a', 'b' and 'c'``."""
    quoted = [f"'{value}'" for value in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


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


# -- the table's shorthands -------------------------------------------------------------------


def ref(name: str) -> Schema:
    """A reference to the component schema ``name`` of ``/openapi.json``."""
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """``schema``, or null."""
    return {"anyOf": [schema, {"type": "null"}]}


def fixed(schema: Schema) -> Callable[[RequestLimits], Schema]:
    """A field's shape that no limit changes."""
    return lambda limits: schema


def part(name: str, type: str, description: str = "", **kwargs: Any) -> Field:
    """A property or an item of a nested field (its strings pass as they come unless
    ``text=True``)."""
    return Field(name, type, frozenset(), description, **{"text": False, **kwargs})


def custom(name: str, schema: Schema, *endpoints: str, **kwargs: Any) -> Field:
    """A field of ``endpoints`` whose shape is ``schema`` (a union the endpoint tells apart)."""
    return Field(name, "custom", frozenset(endpoints), shape=fixed(schema), **kwargs)


def refused(name: str, what: str, *endpoints: str, allowed: tuple[Any, ...] = ()) -> Field:
    """A field of ``endpoints`` this server does not implement (``what`` it would do): a 400
    naming it, unless its value is one of ``allowed`` (which changes nothing)."""
    return Field(name, "custom", frozenset(endpoints), refused=what, allowed=allowed)


def ignored(name: str, type: str, *endpoints: str, **kwargs: Any) -> Field:
    """A field that changes nothing here, accepted (and checked for its type) and ignored."""
    return Field(name, type, frozenset(endpoints), "Accepted and ignored.", **kwargs)
