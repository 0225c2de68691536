"""``multipart/form-data`` bodies (OpenAI's audio transcriptions and translations: a file
beside its fields), read with python-multipart's parser. Pure: bytes in, values out.

The ingress relays a form's bytes through the ring as it relays JSON; it reads only its
``model`` (:func:`form_field`) to route it. The worker reads the whole form
(:func:`read_form`) and its fields as the field table types them
(``llmtrio.api.form_values``).

The boundary is read from the body's first line, the delimiter every client sends first (a
preamble before it, which RFC 2046 allows and no client sends, is refused), so a body is
read the same way wherever it is, without its ``Content-Type`` header.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs
from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from ._errors import ApiError, invalid_request

__all__ = ["Form", "Upload", "form_field", "is_form", "read_form"]

#: A boundary is 1 to 70 characters (RFC 2046).
_MAX_BOUNDARY: Final = 70


@attrs.frozen
class Upload:
    """A file of a form: its field's ``name``, the ``filename`` and ``content_type`` the
    client gave, and its bytes."""

    name: str
    filename: str
    content_type: str
    data: bytes = attrs.field(repr=False)


@attrs.frozen
class Form:
    """A form's text ``fields`` (each name's values, in order; ``name[]`` is read as
    ``name``) and its ``files`` (by field name, the first of each)."""

    fields: Mapping[str, tuple[str, ...]]
    files: Mapping[str, Upload]


def is_form(body: bytes) -> bool:
    """Whether ``body`` reads as a ``multipart/form-data`` body (it opens with a
    delimiter)."""
    return body.startswith(b"--") and _boundary(body) is not None


def _boundary(body: bytes) -> bytes | None:
    end = body.find(b"\r\n", 0, _MAX_BOUNDARY + 4)
    if end < 3:
        return None
    return body[2:end].rstrip(b" \t")


def read_form(body: bytes) -> Form:
    """``body``'s fields and files.

    Error handling: :class:`ApiError` (400) for a body that is not ``multipart/form-data``,
    a malformed one, a part without a name, or a field that is not UTF-8."""
    boundary = _boundary(body) if body.startswith(b"--") else None
    if boundary is None:
        raise invalid_request(
            "The request body must be multipart/form-data (a file and its fields), opening "
            "with its boundary line.",
            param=None,
        )
    parts: list[tuple[dict[bytes, bytes], bytearray]] = []
    headers: dict[bytes, bytes] = {}
    field, value = bytearray(), bytearray()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        field.extend(data[start:end])

    def on_header_value(data: bytes, start: int, end: int) -> None:
        value.extend(data[start:end])

    def on_header_end() -> None:
        headers[bytes(field).lower()] = bytes(value)
        field.clear()
        value.clear()

    def on_part_begin() -> None:
        headers.clear()
        parts.append(({}, bytearray()))

    def on_headers_finished() -> None:
        parts[-1][0].update(headers)

    def on_part_data(data: bytes, start: int, end: int) -> None:
        parts[-1][1].extend(data[start:end])

    parser = MultipartParser(
        boundary,
        {
            "on_part_begin": on_part_begin,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
            "on_part_data": on_part_data,
        },
    )
    try:
        parser.write(body)
        parser.finalize()
    except MultipartParseError as exc:
        raise invalid_request(
            f"The multipart/form-data body is malformed: {exc}", param=None
        ) from None
    fields: dict[str, list[str]] = {}
    files: dict[str, Upload] = {}
    for part_headers, data in parts:
        disposition, options = parse_options_header(part_headers.get(b"content-disposition", b""))
        name = options.get(b"name")
        if disposition != b"form-data" or name is None:
            raise invalid_request(
                "A part of the multipart/form-data body has no 'Content-Disposition: "
                "form-data' with a name.",
                param=None,
            )
        key = _text(name, "a field name")
        if key.endswith("[]"):
            key = key[:-2]
        if b"filename" in options:
            if key not in files:
                files[key] = Upload(
                    key,
                    _text(options[b"filename"], f"'{key}''s file name"),
                    _text(part_headers.get(b"content-type", b""), f"'{key}''s content type"),
                    bytes(data),
                )
            continue
        fields.setdefault(key, []).append(_text(bytes(data), f"'{key}'"))
    return Form({k: tuple(v) for k, v in fields.items()}, files)


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise invalid_request(f"The form's {what} is not UTF-8 text.", param=None) from None


def form_field(body: bytes, name: str) -> str | None:
    """The first value of the text field ``name`` of a form ``body``; ``None`` when it has
    none or the body is not a readable form (the worker answers that body's own error)."""
    try:
        values = read_form(body).fields.get(name)
    except ApiError:
        return None
    return values[0] if values else None
