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

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from ._anthropic_fields import ANTHROPIC_FIELDS, anthropic_components
from ._audio_fields import AUDIO_FIELDS, audio_components
from ._chat_fields import CHAT_FIELDS, chat_components
from ._durations import keep_alive_seconds
from ._errors import invalid_request
from ._field_spec import (
    INT32_MAX,
    Field,
    RequestLimits,
    Schema,
    check,
    custom,
    invalid_value,
    missing,
    part,
)
from ._forms import Form, form_field, is_form
from ._rerank_fields import RERANK_FIELDS, rerank_components
from ._responses_fields import RESPONSES_FIELDS, responses_components
from ._routes import (
    Body,
)

__all__ = [
    "FIELDS",
    "component_schemas",
    "field",
    "form_values",
    "read",
    "read_keep_alive",
    "request_schema",
]

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


#: Ollama's ``keep_alive``, on every ring route: how long an on-demand model stays loaded
#: after this request (read by the worker's host as ``llmtrio.api.keep_alive_seconds`` does).
_KEEP_ALIVE = custom(
    "keep_alive",
    {"anyOf": [{"type": "number"}, {"type": "string"}]},
    *Body,
    description="A model on demand stays loaded this long after the request: seconds, or a "
    'duration such as "10m" or "1h30m"; negative: for ever; 0: unloaded once idle. The '
    "model's own keep-alive when absent; a model loaded at start is never unloaded.",
)  # fmt: skip

#: Every endpoint's fields: OpenAI's chat, completions and embeddings, the Responses API,
#: Anthropic's Messages API, reranking, then llama.cpp's router and tokenizer endpoints.
FIELDS: Final[tuple[Field, ...]] = (
    *CHAT_FIELDS,
    *RESPONSES_FIELDS,
    *ANTHROPIC_FIELDS,
    *RERANK_FIELDS,
    *AUDIO_FIELDS,
    Field("model", "string", frozenset({Body.MODELS}), required=True,
          description="A catalog model's name (never a path or a repository)."),
    Field("model", "string", frozenset({Body.TOKENIZE, Body.DETOKENIZE}),
          "Whose tokenizer: any model served, of any kind."),
    custom("content", _TOKENIZE_CONTENT, Body.TOKENIZE, required=True,
            description="A text, or an array of texts and token ids (the ids kept as they "
            "are)."),
    Field("add_special", "boolean", frozenset({Body.TOKENIZE}),
          "Add the special tokens the model adds to a prompt (its BOS); default false."),
    Field("parse_special", "boolean", frozenset({Body.TOKENIZE}),
          "Read special-token text (``<|im_end|>``) as those tokens; default true."),
    Field("with_pieces", "boolean", frozenset({Body.TOKENIZE}),
          "Each token as ``{\"id\", \"piece\"}``: its text, or its bytes as an array of "
          "numbers where they are not UTF-8 on their own."),
    Field("tokens", "array", frozenset({Body.DETOKENIZE}), "Token ids of the model's vocabulary.",
          required=True,
          items=part("", "integer", nullable=False, minimum=0, maximum=INT32_MAX)),
    _KEEP_ALIVE,
)  # fmt: skip


def component_schemas(limits: RequestLimits) -> dict[str, Schema]:
    """The schemas the request schemas refer to (``#/components/schemas/<name>``)."""
    return {
        **chat_components(limits),
        **responses_components(limits),
        **anthropic_components(limits),
        **rerank_components(limits),
        **audio_components(limits),
    }


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

    Error handling: :class:`ApiError` (400) naming the field: ``missing_required_parameter``,
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


def read_keep_alive(body: bytes) -> float | None:
    """A request body's ``keep_alive`` (:data:`_KEEP_ALIVE`, on every ring route) in seconds,
    ``None`` when absent or null, or when the body is not a JSON object (the endpoint answers
    that body's own error). The model host reads it before the endpoint parses the body, since
    a model on demand loads first. A form's (``multipart/form-data``) is its text field.

    Error handling: :class:`ApiError` (400) naming ``keep_alive``."""
    if is_form(body):
        value: object = form_field(body, "keep_alive")
        if value is None:
            return None
    else:
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or data.get("keep_alive") is None:
            return None
        value = data["keep_alive"]
    try:
        return keep_alive_seconds(value)
    except ValueError as exc:
        raise invalid_request(f"'keep_alive' {exc}", param="keep_alive") from None


def form_values(form: Form, endpoint: str) -> dict[str, Any]:
    """``form``'s text fields as JSON values, typed as the field table types ``endpoint``'s
    fields (a field the table does not know stays text; an array's items are typed as its
    items), for :func:`llmtrio.api.read` to check as it checks a JSON body.

    Error handling: :class:`ApiError` (400) naming a field whose text is not of its type."""
    known = {f.name: f for f in FIELDS if endpoint in f.endpoints}
    values: dict[str, Any] = {}
    for name, texts in form.fields.items():
        spec = known.get(name)
        if spec is not None and spec.type == "array" and spec.items is not None:
            values[name] = [_typed(spec.items, text, name) for text in texts]
        else:
            values[name] = _typed(spec, texts[-1], name) if spec is not None else texts[-1]
    return values


def _typed(spec: Field, text: str, name: str) -> object:
    if spec.type == "boolean":
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise invalid_value(name, f"must be true or false, not {text!r}.")
    if spec.type == "integer":
        try:
            return int(text)
        except ValueError:
            raise invalid_value(name, f"must be an integer, not {text!r}.") from None
    if spec.type == "number":
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise invalid_value(name, f"must be a number, not {text!r}.")
        return number
    return text
