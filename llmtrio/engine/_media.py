"""Images in: bytes decoded with Pillow into the RGB pixels the multimodal binding takes.

Pure (no llama.cpp): :func:`decode_image` reads an image's size from its header, so
``max_pixels`` refuses a decompression bomb before memory is spent (the request's parse, on
the event loop, costs no decoding); its pixels are decoded by :meth:`Image.pixels` when the
engine prepares the prompt, in a worker thread. PNG, JPEG, WebP and GIF (its first frame)
are read, the type sniffed from the bytes (never from a declared media type).
:func:`image_from_url` takes a ``data:`` URI, as chat completions' ``image_url`` parts and
the Responses API's ``input_image`` carry it; Anthropic's ``image`` blocks (a base64
``source``) call :func:`decode_image` on the decoded bytes.

Each image part of a message becomes :data:`MEDIA_MARKER` in the message's text (a random
string per process, so no user text can forge one) and an :class:`Image` in its ``images``;
the engine splits the templated prompt at the markers (llama.cpp's ``mtmd_tokenize``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import secrets
import warnings
from typing import Final

import attrs

from ._errors import InvalidRequestError

__all__ = [
    "IMAGE_FORMATS",
    "MEDIA_MARKER",
    "Image",
    "decode_image",
    "image_from_url",
]

#: Where an image goes in a message's text (random per process: never in user text).
MEDIA_MARKER: Final = f"<__llmtrio_media_{secrets.token_hex(8)}__>"
#: Pillow's names of the formats read.
IMAGE_FORMATS: Final = ("PNG", "JPEG", "WEBP", "GIF")
_MEDIA_TYPES: Final = {
    "image/png",
    "image/jpeg",
    "image/jpg",
    "image/webp",
    "image/gif",
}


@attrs.frozen(eq=False)
class Image:
    """An image of a request: ``width`` x ``height`` pixels, and the SHA-256 (hex) of its
    bytes (``digest``): the id llama.cpp's chunks carry and the prompt cache recognizes a
    repeated image by. Made by :func:`decode_image` from a file's bytes (its header read and
    checked; its pixels decoded by :meth:`pixels`, in the engine's preparing thread) or by
    :meth:`of_rgb` from pixels. ``param`` names where it came from, for errors."""

    width: int
    height: int
    digest: str
    param: str = "image"
    _encoded: bytes | None = attrs.field(default=None, repr=False, alias="encoded")
    _rgb: bytes | None = attrs.field(default=None, repr=False, alias="rgb")

    @classmethod
    def of_rgb(cls, width: int, height: int, rgb: bytes, *, param: str = "image") -> Image:
        """Pixels as they are: ``width * height`` RGB triples, row-major."""
        if len(rgb) != width * height * 3:
            raise ValueError(f"{width}x{height} RGB needs {width * height * 3} bytes")
        return cls(width, height, hashlib.sha256(rgb).hexdigest(), param, rgb=rgb)

    def pixels(self) -> bytes:
        """The RGB pixels (``width * height * 3`` bytes), decoded now if they came as a file.

        Error handling: :class:`InvalidRequestError` naming :attr:`param` for a file that
        cannot be decoded (truncated, corrupt)."""
        if self._rgb is not None:
            return self._rgb
        assert self._encoded is not None
        from PIL import Image as PILImage

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
                with PILImage.open(io.BytesIO(self._encoded), formats=IMAGE_FORMATS) as opened:
                    opened.seek(0)  # a GIF's (or an animated WebP's) first frame
                    rgb = opened.convert("RGB")
                    if rgb.size != (self.width, self.height):
                        raise ValueError("its frame is not the size its header says")
                    pixels = rgb.tobytes()
        except Exception as exc:  # Pillow's decoders raise more than OSError
            raise InvalidRequestError(
                f"the image at '{self.param}' could not be decoded ({_reason(exc)})",
                param=self.param,
            ) from None
        return pixels


def decode_image(data: bytes, *, max_pixels: int, param: str) -> Image:
    """``data`` (PNG, JPEG, WebP or GIF: sniffed from the bytes) as an :class:`Image`, its
    header read and checked now, its pixels decoded later (:meth:`Image.pixels`).

    Error handling: :class:`InvalidRequestError` naming ``param`` for bytes that are not
    one of those formats, or an image of more than ``max_pixels`` pixels (refused from its
    header, before anything is decoded)."""
    from PIL import Image as PILImage

    try:
        with warnings.catch_warnings():
            # Pillow's own bomb check warns or raises at its default limit; ours may be below.
            warnings.simplefilter("ignore", PILImage.DecompressionBombWarning)
            with PILImage.open(io.BytesIO(data), formats=IMAGE_FORMATS) as opened:
                width, height = opened.size
    except PILImage.DecompressionBombError:
        raise InvalidRequestError(
            f"the image has more than the {max_pixels} pixels this server takes "
            "(--max-image-pixels)",
            param=param,
        ) from None
    except Exception as exc:  # Pillow's header parsers raise more than OSError
        raise InvalidRequestError(
            f"the data is not a PNG, JPEG, WebP or GIF image ({_reason(exc)})", param=param
        ) from None
    if width < 1 or height < 1:
        raise InvalidRequestError("the image has no pixels", param=param)
    if width * height > max_pixels:
        raise InvalidRequestError(
            f"the image is {width}x{height} = {width * height} pixels, more than the "
            f"{max_pixels} this server takes (--max-image-pixels)",
            param=param,
        )
    return Image(width, height, hashlib.sha256(data).hexdigest(), param, encoded=data)


def image_from_url(url: str, *, max_pixels: int, param: str) -> Image:
    """An image part's URL, decoded: a ``data:`` URI (``data:image/png;base64,...``; its
    declared type must be an image type, the bytes decide which).

    Error handling: :class:`InvalidRequestError` naming ``param`` for another URL scheme,
    a malformed URI, bad base64, or bytes :func:`decode_image` refuses."""
    if not url.startswith("data:"):
        scheme = url.split(":", 1)[0] if ":" in url else url[:16]
        raise InvalidRequestError(
            f"image URLs must be data: URIs (base64); {scheme!r} URLs are not fetched by "
            "this server",
            param=param,
        )
    header, comma, payload = url[5:].partition(",")
    if not comma:
        raise InvalidRequestError("the data: URI has no ',' before its data", param=param)
    media_type, *options = header.split(";")
    if media_type and media_type.lower() not in _MEDIA_TYPES:
        raise InvalidRequestError(
            f"the data: URI's type {media_type!r} is not an image type (PNG, JPEG, WebP, GIF)",
            param=param,
        )
    if "base64" not in (option.strip().lower() for option in options):
        raise InvalidRequestError("the data: URI must be base64 (';base64,')", param=param)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError("the data: URI's base64 is malformed", param=param) from None
    return decode_image(data, max_pixels=max_pixels, param=param)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 120 else text[:117] + "..."
